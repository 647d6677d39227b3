//! The names of the topology: one template per object, rendered for an `[amqp]` section.
//!
//! The migration files of `migrations/` write the same templates (`{prefix}.work`), and
//! [`super::plan`] renders them with the same function; a unit test fails when a file declares
//! a name that is not here, or misses one that is.

use std::time::Duration;

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

    /// The tier a retry with backoff `delay` waits in: the shortest tier at or above `delay`,
    /// so a retry never comes back before its backoff (the jittered delay picks the tier); the
    /// longest tier when `delay` exceeds them all (the worker then sends it to wait again when
    /// it comes back early, see [`crate::headers::NOT_BEFORE_MS`]). `None` only without tiers.
    #[must_use]
    pub fn tier_for(&self, delay: Duration) -> Option<&RetryTier> {
        self.retry_tiers
            .iter()
            .find(|t| t.delay >= delay)
            .or_else(|| self.retry_tiers.last())
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

    #[test]
    fn tiers_are_never_shorter_than_the_delay() {
        let t = Topology::new(&AmqpSettings::default());
        assert_eq!(
            t.tier_for(Duration::from_millis(10)).unwrap().delay,
            Duration::from_secs(1)
        );
        assert_eq!(
            t.tier_for(Duration::from_millis(1001)).unwrap().delay,
            Duration::from_secs(5)
        );
        assert_eq!(
            t.tier_for(Duration::from_secs(5)).unwrap().delay,
            Duration::from_secs(5)
        );
        assert_eq!(
            t.tier_for(Duration::from_secs(9999)).unwrap().delay,
            Duration::from_secs(600)
        );
        assert_eq!(t.retry_tiers[0].queue, "fleet.retry.1000ms");
    }
}
