//! The keeper: a copy of the operators' overrides outside Redis, in a long-running operator
//! process (`budgetctl exporter`, the console), that puts back an override Redis lost before its
//! end, and notices an audit trail that was lost.
//!
//! Why: under an `allkeys-*` eviction policy (or `FLUSHALL`, a restart without persistence) a
//! freeze vanishes with its budget hash, and the workers' memory brings it back only when one of
//! them had seen it (`docs/semantics.md`, "Lost budgets"). A freeze set while no worker runs was
//! lost silently. Any second copy kept in the same Redis can be evicted too, so the copy lives in
//! the keeper's process:
//!
//! - every `every` (1 s by default) the keeper reads each dependency's override fields (one
//!   `HMGET` per dependency, pipelined with the breaker's below in one round trip, which also
//!   keeps the hash recently used for an LRU policy) and the server's time, and remembers the
//!   overrides in force with the hash's birth (field `e`);
//! - an override it remembers, still before its end, that the hash no longer holds, was either
//!   lifted or lost. It was lifted when the hash is the same one (same birth: a lift keeps it) or
//!   when the dependency's lift record ([`lift_key`], written by [`super::overrides::apply`]
//!   *before* every `unfreeze` and `clear`) is as recent as the override. Otherwise the keeper
//!   writes it back through `lua/override.lua` (actor `fleet-budget (restored)`, until its own
//!   end), records it in the audit trail, counts it in
//!   `fleet_budget_overrides_restored_total{dependency,kind}` and logs the first restore of each
//!   override once;
//! - in doubt (the lift record itself evicted, or unreadable) it restores: a freeze is the safe
//!   direction, and an operator lifts it again (that lift writes a new record);
//! - the audit trail: the newest entry it saw gone from the trail, when the trail is gone or
//!   started again (`trail_started`), counts one in `fleet_budget_audit_trail_lost_total`.
//!
//! What it cannot do: keep an override it never read (one set and lost within one period), or
//! restore under a Redis user that may not run `override.lua`. A restore that fails is counted
//! in `fleet_budget_overrides_restore_failures_total{reason}`, `reason` saying why: `noperm` when
//! Redis refused the user (`NOPERM`: the read-only user of `lua/README.md` may run `EVALSHA` but
//! not the writes inside `override.lua`), `error` for anything else (full memory, a timeout, a
//! connection lost). Each reason is logged once per process, not per pass: the copy is kept and
//! the restore tried again every pass, so a user that may not write would otherwise log every
//! second.
//!
//! Open circuit breakers are watched, not kept. The same read (pipelined, the breaker hash is in
//! the budget's slot) takes each dependency's breaker state (`st`, `ou`); an open breaker is
//! remembered with the end of its open period. Before that end `lua/breaker.lua` never changes
//! an open breaker (it half-opens at the first call after it), so a breaker remembered open and
//! found, before its end, absent, closed, or open with another end, was lost (an eviction,
//! `FLUSHALL`, a restart without persistence): counted in
//! `fleet_budget_breakers_lost_total{dependency}` and logged once per dependency. It is **not**
//! put back. An override is an operator's order, which nothing in the fleet would give again; a
//! breaker is the fleet's own measurement of the dependency, and the closed breaker the loss
//! leaves measures again: if the dependency still fails, the next `min_volume` calls reopen it
//! (`docs/semantics.md`, "Lost budgets"). Writing an open state back would take that measurement
//! away from the script and hold calls off a dependency that may have recovered meanwhile, on the
//! word of a copy up to one period old.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts, Registry};
use redis::Value;

use super::audit::AuditLog;
use super::overrides::{self, FIELDS, Freeze, OverrideAction, Overrides, SetOverride};
use crate::config::Config;
use crate::dependency::Dependency;
use crate::error::StoreError;
use crate::keys::{KEY_SCHEMA_VERSION, audit_key};
use crate::store::RedisStore;

/// The actor of an override the keeper (or a worker's memory) put back.
pub const RESTORED_ACTOR: &str = "fleet-budget (restored)";

/// How long a lift record lasts: the longest override, so that it outlives any override it
/// lifted.
pub const LIFT_RECORD_TTL: Duration = overrides::MAX_OVERRIDE_DURATION;

/// The lift record of `dependency` under `prefix`: a hash whose field `at` is the server ms of
/// the last `unfreeze` or `clear` ([`super::overrides::apply`] writes it before the lift). After
/// `v1:` comes `l`, never `{`, so it is never a budget key; the dependency is its hash tag.
#[must_use]
pub fn lift_key(prefix: &str, dependency: &Dependency) -> String {
    format!("{prefix}:v{KEY_SCHEMA_VERSION}:lifted:{{{dependency}}}")
}

/// The fields of a breaker hash the keeper reads: its state and the end of its open period.
const BREAKER_FIELDS: [&str; 2] = ["st", "ou"];

/// What one read of a dependency holds: its budget hash's [`FIELDS`] and birth (`e`), and its
/// breaker hash's [`BREAKER_FIELDS`] (nil when absent).
type Fields = (Vec<Value>, Vec<Value>);

/// The keeper's series (module docs).
#[derive(Clone)]
struct KeeperMetrics {
    restored: IntCounterVec,
    failures: IntCounterVec,
    kept: IntGauge,
    trail_lost: IntCounter,
    breakers_lost: IntCounterVec,
}

impl KeeperMetrics {
    fn new() -> Result<Self, prometheus::Error> {
        Ok(Self {
            restored: IntCounterVec::new(
                Opts::new(
                    "fleet_budget_overrides_restored_total",
                    "Overrides (kind freeze or set) that vanished from Redis before their end and were put back by this process's keeper.",
                ),
                &["dependency", "kind"],
            )?,
            failures: IntCounterVec::new(
                Opts::new(
                    "fleet_budget_overrides_restore_failures_total",
                    "Overrides this process's keeper found lost and could not put back, by reason: noperm (the Redis user may not run override.lua) or error (Redis failed).",
                ),
                &["reason"],
            )?,
            kept: IntGauge::new(
                "fleet_budget_overrides_kept",
                "Overrides in force this process's keeper holds a copy of.",
            )?,
            trail_lost: IntCounter::new(
                "fleet_budget_audit_trail_lost_total",
                "Audit trails this process found lost: the newest entry it had read gone, with the trail gone or started again.",
            )?,
            breakers_lost: IntCounterVec::new(
                Opts::new(
                    "fleet_budget_breakers_lost_total",
                    "Open circuit breakers this process's keeper found gone from Redis before their open period ended (not put back: the next failures reopen them).",
                ),
                &["dependency"],
            )?,
        })
    }

    fn register(&self, registry: &Registry) -> Result<(), prometheus::Error> {
        registry.register(Box::new(self.restored.clone()))?;
        registry.register(Box::new(self.failures.clone()))?;
        registry.register(Box::new(self.kept.clone()))?;
        registry.register(Box::new(self.trail_lost.clone()))?;
        registry.register(Box::new(self.breakers_lost.clone()))?;
        Ok(())
    }
}

/// What the keeper remembers of one dependency.
#[derive(Debug, Clone, Default)]
struct Kept {
    /// The hash's birth when last read (`None`: no birth, e.g. a hash only `override.lua` wrote).
    birth: Option<String>,
    freeze: Option<Freeze>,
    set: Option<SetOverride>,
    /// The kinds already logged as restored (once per override kept).
    logged: HashSet<&'static str>,
}

#[derive(Debug, Default)]
struct State {
    kept: HashMap<Dependency, Kept>,
    /// The newest audit entry read.
    trail_newest: Option<String>,
    /// The reasons of failed restores already logged (once each).
    failures_logged: HashSet<&'static str>,
    /// The breakers last seen open, with the end of their open period (server ms).
    open_breakers: HashMap<Dependency, u64>,
    /// The dependencies whose lost breaker was logged (once each).
    breakers_logged: HashSet<Dependency>,
}

/// What one pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pass {
    /// Overrides held after the pass.
    pub kept: usize,
    /// Overrides put back.
    pub restored: usize,
    /// Overrides found lifted (forgotten).
    pub lifted: usize,
    /// Whether the audit trail was found lost.
    pub trail_lost: bool,
    /// Open breakers found gone before their open period ended (counted, not put back).
    pub breakers_lost: usize,
}

/// The keeper (module docs). One per process; [`Keeper::run`] runs it.
pub struct Keeper {
    store: Arc<RedisStore>,
    audit: AuditLog,
    who: &'static str,
    configured: Vec<Dependency>,
    found: Mutex<Vec<Dependency>>,
    max: usize,
    state: Mutex<State>,
    metrics: KeeperMetrics,
}

/// `reason` of a restore Redis refused to the keeper's user.
const NOPERM: &str = "noperm";
/// `reason` of a restore that failed otherwise.
const ERROR: &str = "error";

/// Why a restore failed, as `fleet_budget_overrides_restore_failures_total` labels it: `noperm`
/// when Redis refused the user, `error` otherwise. A command the ACL refuses is answered
/// `NOPERM`; inside a script Redis 7.0 answers `ERR The user executing the script can't run this
/// command or subcommand` (or `... can't access at least one of the keys`), and later versions
/// `NOPERM` again: all are the user's rights.
fn failure_reason(error: &StoreError) -> &'static str {
    let refused = match error {
        StoreError::Redis(e) => {
            let text = e.to_string();
            e.code() == Some("NOPERM")
                || text.contains("NOPERM")
                || text.contains("no permissions")
                || text.contains("The user executing the script can't")
        }
        _ => false,
    };
    if refused { NOPERM } else { ERROR }
}

/// How often the keeper reads by default.
pub const DEFAULT_KEEPER_EVERY: Duration = Duration::from_secs(1);

/// The most dependencies a keeper reads (configured ones first).
pub const MAX_KEPT_DEPENDENCIES: usize = 10_000;

/// Dependencies read at once.
const CONCURRENT_READS: usize = 32;

impl Keeper {
    /// A keeper of `config`'s dependencies in `store`, recording its restores in `config`'s
    /// audit trail; `who` names the process in its logs and audit entries (`exporter`,
    /// `console`).
    ///
    /// # Errors
    /// Its metrics could not be made (never with these names).
    pub fn new(
        store: Arc<RedisStore>,
        config: &Config,
        who: &'static str,
    ) -> Result<Self, prometheus::Error> {
        let metrics = KeeperMetrics::new()?;
        // A series from zero for every configured dependency: alert on any increase.
        for d in config.policies.keys() {
            for kind in ["freeze", "set"] {
                metrics.restored.with_label_values(&[d.as_str(), kind]);
            }
        }
        for d in config.breakers.keys() {
            metrics.breakers_lost.with_label_values(&[d.as_str()]);
        }
        for reason in [NOPERM, ERROR] {
            metrics.failures.with_label_values(&[reason]);
        }
        Ok(Self {
            store,
            audit: config.audit.log(),
            who,
            configured: config.policies.keys().cloned().collect(),
            found: Mutex::new(Vec::new()),
            max: MAX_KEPT_DEPENDENCIES,
            state: Mutex::new(State::default()),
            metrics,
        })
    }

    /// Serves its series in `registry` (module docs).
    ///
    /// # Errors
    /// A series of the same name is already there.
    pub fn register(&self, registry: &Registry) -> Result<(), prometheus::Error> {
        self.metrics.register(registry)
    }

    /// Dependencies found in Redis besides the configured ones (the exporter's discovery).
    pub fn set_found(&self, found: Vec<Dependency>) {
        *self.found.lock().unwrap_or_else(PoisonError::into_inner) = found;
    }

    fn dependencies(&self) -> Vec<Dependency> {
        let mut deps = self.configured.clone();
        let found = self.found.lock().unwrap_or_else(PoisonError::into_inner);
        for d in found.iter() {
            if !deps.contains(d) {
                deps.push(d.clone());
            }
        }
        deps.truncate(self.max);
        deps
    }

    /// Runs a pass every `every` until the task is dropped; a failed pass is logged (once until
    /// one succeeds) and the next one tried.
    pub async fn run(self: Arc<Self>, every: Duration) {
        let mut failing = false;
        loop {
            match self.pass().await {
                Ok(_) => failing = false,
                Err(e) => {
                    if !failing {
                        tracing::warn!(
                            keeper = self.who,
                            error = %crate::redact::redact_text(&e.to_string()),
                            "the overrides keeper could not read Redis; it keeps its copy and tries again"
                        );
                    }
                    failing = true;
                }
            }
            tokio::time::sleep(every).await;
        }
    }

    /// One pass (module docs): reads every dependency's overrides and breaker, forgets the
    /// lifted and ended overrides, puts back the lost ones, counts the lost open breakers, then
    /// looks at the audit trail.
    ///
    /// # Errors
    /// Redis failed or passed the store's deadline (the copy is kept as it was).
    pub async fn pass(&self) -> Result<Pass, StoreError> {
        use futures::StreamExt;

        let now_ms = self.store.server_time_ms().await?;
        let deps = self.dependencies();
        let reads: Vec<(Dependency, Result<Fields, StoreError>)> =
            futures::stream::iter(deps.into_iter().map(|d| async move {
                let values = self.read(&d).await;
                (d, values)
            }))
            .buffer_unordered(CONCURRENT_READS)
            .collect()
            .await;
        let mut pass = Pass::default();
        for (dependency, values) in reads {
            let (budget, breaker) = values?;
            let (restored, lifted) = self.keep(&dependency, &budget, now_ms).await?;
            pass.restored += restored;
            pass.lifted += lifted;
            pass.breakers_lost += usize::from(self.watch_breaker(&dependency, &breaker, now_ms));
        }
        pass.trail_lost = self.watch_trail().await?;
        let kept = {
            let state = self.lock();
            state
                .kept
                .values()
                .map(|k| usize::from(k.freeze.is_some()) + usize::from(k.set.is_some()))
                .sum::<usize>()
        };
        pass.kept = kept;
        self.metrics
            .kept
            .set(i64::try_from(kept).unwrap_or(i64::MAX));
        Ok(pass)
    }

    /// One round trip for `dependency` (its budget hash and its breaker hash share a slot): the
    /// override fields and the birth (`e`), and the breaker's [`BREAKER_FIELDS`].
    async fn read(&self, dependency: &Dependency) -> Result<Fields, StoreError> {
        let mut pipe = redis::pipe();
        pipe.cmd("HMGET")
            .arg(self.store.key(dependency))
            .arg(&FIELDS)
            .arg("e")
            .cmd("HMGET")
            .arg(self.store.breaker_key(dependency))
            .arg(&BREAKER_FIELDS);
        self.store.query_pipeline(&pipe).await
    }

    /// One dependency's breaker (module docs): remembers it while open; counts and logs it when
    /// one remembered open is found, before its end, anything but open with that end. Returns
    /// whether it was lost.
    fn watch_breaker(&self, dependency: &Dependency, values: &[Value], now_ms: u64) -> bool {
        let field = |i: usize| match values.get(i) {
            Some(Value::BulkString(b)) => std::str::from_utf8(b).ok().and_then(|t| t.parse().ok()),
            _ => None,
        };
        let open_until = (field(0) == Some(1)).then(|| field(1).unwrap_or(0));
        let mut state = self.lock();
        let lost = state
            .open_breakers
            .get(dependency)
            .is_some_and(|until| *until > now_ms && open_until != Some(*until));
        match open_until {
            Some(until) if until > now_ms => {
                state.open_breakers.insert(dependency.clone(), until);
            }
            _ => {
                state.open_breakers.remove(dependency);
            }
        }
        if lost {
            self.metrics
                .breakers_lost
                .with_label_values(&[dependency.as_str()])
                .inc();
            if state.breakers_logged.insert(dependency.clone()) {
                tracing::warn!(
                    dependency = dependency.as_str(),
                    keeper = self.who,
                    "an open circuit breaker vanished from Redis before its open period ended (an \
                     eviction policy other than noeviction, FLUSHALL, or a restart without \
                     persistence): not put back, calls go through until the next failures \
                     reopen it (at most min_volume calls); further losses are counted in \
                     fleet_budget_breakers_lost_total"
                );
            }
        }
        lost
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One dependency: what the hash holds now against what was kept. Returns (restored,
    /// lifted).
    async fn keep(
        &self,
        dependency: &Dependency,
        values: &[Value],
        now_ms: u64,
    ) -> Result<(usize, usize), StoreError> {
        let stored = Overrides::from_values(values).active_at(now_ms);
        let birth = match values.get(FIELDS.len()) {
            Some(Value::BulkString(b)) => Some(String::from_utf8_lossy(b).into_owned()),
            _ => None,
        };
        let previous = self
            .lock()
            .kept
            .get(dependency)
            .cloned()
            .unwrap_or_default();
        let same_hash = previous.birth.is_some() && previous.birth == birth;
        let mut next = Kept {
            birth,
            freeze: stored.freeze.clone(),
            set: stored.set.clone(),
            logged: previous.logged.clone(),
        };
        // Lost: kept, still before its end, absent now, and the hash is not the one it was in.
        let lost_freeze = previous
            .freeze
            .filter(|f| f.until_ms > now_ms && stored.freeze.is_none());
        let lost_set = previous
            .set
            .filter(|s| s.until_ms > now_ms && stored.set.is_none());
        let (mut restored, mut lifted) = (0, 0);
        if lost_freeze.is_some() || lost_set.is_some() {
            let lift_ms = if same_hash {
                None
            } else {
                self.lift_ms(dependency).await
            };
            let was_lifted = |since_ms: u64| same_hash || lift_ms.is_some_and(|l| l >= since_ms);
            if let Some(f) = lost_freeze {
                if was_lifted(f.since_ms) {
                    lifted += 1;
                } else {
                    if self.restore_freeze(dependency, &f, now_ms, &mut next).await {
                        restored += 1;
                    }
                    // Kept as it was (put back or not: then tried again next pass).
                    next.freeze = Some(f);
                }
            }
            if let Some(s) = lost_set {
                if was_lifted(s.since_ms) {
                    lifted += 1;
                } else {
                    if self.restore_set(dependency, &s, now_ms, &mut next).await {
                        restored += 1;
                    }
                    next.set = Some(s);
                }
            }
        }
        if next.freeze.is_none() {
            next.logged.remove("freeze");
        }
        if next.set.is_none() {
            next.logged.remove("set");
        }
        let mut state = self.lock();
        if next.freeze.is_none() && next.set.is_none() {
            state.kept.remove(dependency);
        } else {
            state.kept.insert(dependency.clone(), next);
        }
        Ok((restored, lifted))
    }

    /// The dependency's last lift (server ms), `None` when there is no record or it cannot be
    /// read (then the keeper restores: the safe direction).
    async fn lift_ms(&self, dependency: &Dependency) -> Option<u64> {
        let mut hmget = redis::cmd("HMGET");
        hmget
            .arg(lift_key(self.store.prefix(), dependency))
            .arg("at");
        match self.store.query::<Vec<Option<String>>>(&hmget).await {
            Ok(values) => values
                .into_iter()
                .next()
                .flatten()
                .and_then(|t| t.parse().ok()),
            Err(e) => {
                tracing::debug!(error = %e, "keeper: the lift record could not be read");
                None
            }
        }
    }

    fn reason(&self, kind: &str, actor: &str, reason: &str) -> String {
        let text = if actor == RESTORED_ACTOR {
            reason.to_owned()
        } else {
            format!(
                "kept by the {}: {actor}'s {kind} ({reason}) vanished from Redis before its end",
                self.who
            )
        };
        let mut end = text.len().min(overrides::MAX_REASON_BYTES);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.get(..end).unwrap_or_default().to_owned()
    }

    async fn restore_freeze(
        &self,
        dependency: &Dependency,
        f: &Freeze,
        now_ms: u64,
        kept: &mut Kept,
    ) -> bool {
        let action = OverrideAction::Freeze {
            duration: Duration::from_millis(f.until_ms.saturating_sub(now_ms).max(1)),
        };
        let reason = self.reason("freeze", &f.actor, &f.reason);
        self.restore(dependency, "freeze", action, &reason, f.until_ms, kept)
            .await
    }

    async fn restore_set(
        &self,
        dependency: &Dependency,
        s: &SetOverride,
        now_ms: u64,
        kept: &mut Kept,
    ) -> bool {
        let action = OverrideAction::Set {
            duration: Duration::from_millis(s.until_ms.saturating_sub(now_ms).max(1)),
            ratio: s.ratio,
            min_allowance: s.min_allowance,
        };
        let reason = self.reason("set override", &s.actor, &s.reason);
        self.restore(dependency, "set", action, &reason, s.until_ms, kept)
            .await
    }

    async fn restore(
        &self,
        dependency: &Dependency,
        kind: &'static str,
        action: OverrideAction,
        reason: &str,
        until_ms: u64,
        kept: &mut Kept,
    ) -> bool {
        match overrides::apply(
            &self.store,
            &self.audit,
            dependency,
            action,
            RESTORED_ACTOR,
            reason,
        )
        .await
        {
            Ok(_) => {
                self.metrics
                    .restored
                    .with_label_values(&[dependency.as_str(), kind])
                    .inc();
                if kept.logged.insert(kind) {
                    tracing::warn!(
                        dependency = dependency.as_str(),
                        kind,
                        until_ms,
                        keeper = self.who,
                        "an operator's override vanished from Redis before its end (an eviction \
                         policy other than noeviction, FLUSHALL, or a restart without \
                         persistence): put back until its end; further restores of it are \
                         counted in fleet_budget_overrides_restored_total"
                    );
                }
                true
            }
            Err(e) => {
                let why = failure_reason(&e);
                self.metrics.failures.with_label_values(&[why]).inc();
                let first = self.lock().failures_logged.insert(why);
                if first {
                    let hint = if why == NOPERM {
                        "the keeper's Redis user may not run override.lua (NOPERM): run it under \
                         the operator's ACL user of lua/README.md to restore"
                    } else {
                        "Redis failed (full memory, a timeout, a lost connection?)"
                    };
                    tracing::error!(
                        dependency = dependency.as_str(),
                        kind,
                        keeper = self.who,
                        reason = why,
                        error = %crate::redact::redact_text(&e.to_string()),
                        "an operator's override vanished from Redis before its end and could \
                         not be put back: {hint}; the copy is kept and tried again every pass, \
                         further failures are counted in \
                         fleet_budget_overrides_restore_failures_total{{reason}}"
                    );
                }
                false
            }
        }
    }

    /// Whether the newest audit entry read before is gone with the trail (gone, or started
    /// again); then counts it. A trail trimmed by age or length is not lost: its stream
    /// remains, and no entry of it says it started the trail.
    async fn watch_trail(&self) -> Result<bool, StoreError> {
        let key = audit_key(self.store.prefix());
        let newest_before = self.lock().trail_newest.clone();
        let mut lost = false;
        if let Some(id) = &newest_before {
            let mut still = redis::cmd("XREVRANGE");
            still.arg(&key).arg(id).arg(id).arg("COUNT").arg(1);
            let found: Vec<Value> = self.store.query(&still).await?;
            if found.is_empty() {
                let mut kind = redis::cmd("TYPE");
                kind.arg(&key);
                let kind: String = self.store.query(&kind).await?;
                lost = kind != "stream" || {
                    let entries = self
                        .audit
                        .read(&self.store, None, None, None, usize::MAX)
                        .await?;
                    entries.iter().any(|e| e.trail_started)
                };
            }
        }
        let mut newest = redis::cmd("XREVRANGE");
        newest.arg(&key).arg("+").arg("-").arg("COUNT").arg(1);
        let newest: Vec<(String, Value)> = self.store.query(&newest).await?;
        let newest = newest.into_iter().next().map(|(id, _)| id);
        if lost {
            self.metrics.trail_lost.inc();
            tracing::warn!(
                keeper = self.who,
                "the audit trail was lost: the newest entry this process had read is gone, with \
                 the trail (an eviction policy other than noeviction, FLUSHALL, or a restart \
                 without persistence); counted in fleet_budget_audit_trail_lost_total"
            );
        }
        self.lock().trail_newest = newest;
        Ok(lost)
    }
}

/// Runs a keeper of `config`'s overrides in `store` for the process `who` in the background,
/// every [`DEFAULT_KEEPER_EVERY`], serving its series in `registry` when given: the one call a
/// long-running operator process makes (the console's). `None` when its series could not be
/// registered (logged).
#[must_use]
pub fn keep_overrides(
    store: Arc<RedisStore>,
    config: &Config,
    who: &'static str,
    registry: Option<&Registry>,
) -> Option<tokio::task::JoinHandle<()>> {
    let keeper = match Keeper::new(store, config, who) {
        Ok(k) => k,
        Err(e) => {
            tracing::error!(error = %e, "the overrides keeper could not start");
            return None;
        }
    };
    if let Some(registry) = registry
        && let Err(e) = keeper.register(registry)
    {
        tracing::error!(error = %e, "the overrides keeper's series could not be registered");
    }
    Some(tokio::spawn(Arc::new(keeper).run(DEFAULT_KEEPER_EVERY)))
}
