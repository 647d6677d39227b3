//! The names of the topology: one template per object, rendered for an `[amqp]` section.
//!
//! The migration files (the repository's `migrations/`) write the same templates (`{prefix}.work`), and
//! [`super::plan`] renders them with the same function; a unit test fails when a file declares
//! a name that is not here, or misses one that is.

use std::time::Duration;

use fleet_budget::ceiling::hops;
use lapin::types::ShortString;

use crate::config::AmqpSettings;
use crate::error::AmqpError;

/// The work exchange and the work queue (one name for both).
pub const WORK: &str = "{prefix}.work";
/// The dead-letter exchange and queue.
pub const DEAD: &str = "{prefix}.dead";
/// The parked exchange and queue.
pub const PARKED: &str = "{prefix}.parked";
/// Each retry tier's exchange and queue; `{tier_ms}` is the tier's delay in milliseconds.
pub const RETRY_TIER: &str = "{prefix}.retry.{tier_ms}ms";

/// The values of a template's placeholders, for one object.
pub(crate) type Vars = Vec<(&'static str, String)>;

/// The placeholders of `settings`; with `tier`, also `{tier_ms}`.
pub(crate) fn vars(settings: &AmqpSettings, tier: Option<Duration>) -> Vars {
    let mut v = vec![
        ("prefix", settings.prefix.clone()),
        ("delivery_limit", settings.delivery_limit.to_string()),
    ];
    if let Some(t) = tier {
        v.push(("tier_ms", t.as_millis().to_string()));
    }
    v
}

/// `template` with every known `{placeholder}` replaced; unknown ones are left as they are.
pub(crate) fn render(template: &str, vars: &Vars) -> String {
    let mut out = template.to_owned();
    for (k, v) in vars {
        out = out.replace(&format!("{{{k}}}"), v);
    }
    out
}

/// `name` as an AMQP short string.
///
/// # Errors
/// [`AmqpError::InvalidName`] when it is longer than 255 bytes.
pub(crate) fn amqp_name(what: &'static str, name: &str) -> Result<ShortString, AmqpError> {
    ShortString::try_new(name).map_err(|e| AmqpError::InvalidName {
        what,
        name: name.to_owned(),
        reason: e.to_string(),
    })
}

/// A retry delay tier: an exchange and a queue whose TTL is the delay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryTier {
    /// The delay.
    pub delay: Duration,
    /// The exchange retries are published to (`<prefix>.retry.<ms>ms`).
    pub exchange: String,
    /// The queue that holds them for `delay` (same name).
    pub queue: String,
}

/// The names of everything the migrations declare, for a given `[amqp]` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    /// Jobs are published here (topic; routing key = task).
    pub work_exchange: String,
    /// The quorum work queue workers consume.
    pub work_queue: String,
    /// Dead-letters are published here (fanout).
    pub dead_exchange: String,
    /// The dead-letter queue the replayer reads.
    pub dead_queue: String,
    /// Parked messages are published here (fanout).
    pub parked_exchange: String,
    /// The parked queue.
    pub parked_queue: String,
    /// Retry tiers, shortest first.
    pub retry_tiers: Vec<RetryTier>,
}

impl Topology {
    /// The names for `settings` (prefix and retry tiers).
    #[must_use]
    pub fn new(settings: &AmqpSettings) -> Self {
        let v = vars(settings, None);
        let name = |template| render(template, &v);
        Self {
            work_exchange: name(WORK),
            work_queue: name(WORK),
            dead_exchange: name(DEAD),
            dead_queue: name(DEAD),
            parked_exchange: name(PARKED),
            parked_queue: name(PARKED),
            retry_tiers: tier_delays(settings)
                .into_iter()
                .map(|delay| {
                    let name = render(RETRY_TIER, &vars(settings, Some(delay)));
                    RetryTier {
                        delay,
                        exchange: name.clone(),
                        queue: name,
                    }
                })
                .collect(),
        }
    }

    /// The tier to wait in next with `remaining` still to wait: a delay is waited out hop by
    /// hop through the tiers, never shorter than itself and longer by less than the shortest
    /// tier ([`fleet_budget::ceiling::hops`]). `None` when the wait is over or without tiers.
    #[must_use]
    pub fn next_hop(&self, remaining: Duration) -> Option<&RetryTier> {
        let hop = hops::next_hop(remaining, &self.tier_delays())?;
        self.retry_tiers.iter().find(|t| t.delay == hop)
    }

    /// Every hop of a wait of `delay`, in order (at most 64; empty without tiers).
    #[must_use]
    pub fn hop_plan(&self, delay: Duration) -> Vec<Duration> {
        hops::hop_plan(delay, &self.tier_delays(), 64)
    }

    /// How late a wait through the tiers can end (the shortest tier); `None` without tiers.
    #[must_use]
    pub fn resolution(&self) -> Option<Duration> {
        hops::resolution(&self.tier_delays())
    }

    fn tier_delays(&self) -> Vec<Duration> {
        self.retry_tiers.iter().map(|t| t.delay).collect()
    }

    /// Every queue (work, dead-letter, parked, then the tiers).
    #[must_use]
    pub fn queues(&self) -> Vec<String> {
        let mut q = vec![
            self.work_queue.clone(),
            self.dead_queue.clone(),
            self.parked_queue.clone(),
        ];
        q.extend(self.retry_tiers.iter().map(|t| t.queue.clone()));
        q
    }

    /// Every exchange (work, dead-letter, parked, then the tiers).
    #[must_use]
    pub fn exchanges(&self) -> Vec<String> {
        let mut e = vec![
            self.work_exchange.clone(),
            self.dead_exchange.clone(),
            self.parked_exchange.clone(),
        ];
        e.extend(self.retry_tiers.iter().map(|t| t.exchange.clone()));
        e
    }
}

/// The retry tier delays of `settings`: sorted, one per millisecond value.
pub(crate) fn tier_delays(settings: &AmqpSettings) -> Vec<Duration> {
    let mut tiers: Vec<Duration> = settings.retry_tiers.clone();
    tiers.sort();
    tiers.dedup_by_key(|d| d.as_millis());
    tiers
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn the_default_tiers_are_powers_of_two_and_reach_any_delay() {
        let t = Topology::new(&AmqpSettings::default());
        assert_eq!(t.retry_tiers[0].queue, "fleet.retry.1000ms");
        assert_eq!(t.retry_tiers.len(), 11);
        assert_eq!(t.resolution(), Some(secs(1)));
        let hop = |d| t.next_hop(d).map(|t| t.delay);
        assert_eq!(hop(Duration::from_millis(10)), Some(secs(1)));
        assert_eq!(hop(secs(5)), Some(secs(4)));
        assert_eq!(hop(Duration::from_millis(4500)), Some(secs(4)));
        assert_eq!(hop(Duration::from_millis(3500)), Some(secs(4)));
        assert_eq!(hop(secs(9999)), Some(secs(1024)));
        assert_eq!(hop(Duration::ZERO), None);
        assert_eq!(t.hop_plan(secs(26)), [secs(16), secs(8), secs(2)]);
    }
}
