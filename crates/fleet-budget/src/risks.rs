//! Settings of the Redis server that take budgets away without an error.
//!
//! Why this exists: an eviction policy other than `noeviction` lets Redis drop any key when
//! memory is full, and a budget's hash, an operator's freeze, an open breaker, a concurrency lease
//! or the audit trail is a key like any cache entry: the budget grants again, the freeze is lifted,
//! and no script, log or metric notices (issue 33). A server without persistence forgets the same
//! keys on every restart. Neither is an error a call returns, so the budget checks the settings
//! once when a worker's store connects ([`log_redis_risks_once`]), `budgetctl doctor` checks them
//! with the rest of what the project depends on, and the exporter serves them as
//! `fleet_budget_redis_risk{check}` ([`RedisRiskSource`]).
//!
//! The settings are read with `CONFIG GET`, else with `INFO` (a managed Redis often renames
//! `CONFIG` or an ACL forbids it). Under an ACL user a worker sends only `INFO memory` and
//! `INFO persistence`, which the ACL lines of `lua/README.md` grant (and nothing else of
//! `INFO`), so nothing lands in `ACL LOG`. What is not shown is reported [`Finding::NotChecked`]
//! with the server's reason, never guessed. The calls
//! go through [`RedisStore::query`] (its deadline); nothing here writes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use prometheus::{IntGaugeVec, Opts, Registry};
use redis::Value;

use crate::metrics::{ExporterSource, ReadFuture};
use crate::redact::redact_text;
use crate::store::{RedisStore, RedisTarget};

/// The longest text kept from a Redis reply or error (a hostile reply is cut, never grown).
const MAX_TEXT: usize = 200;

/// One setting checked: a bounded label value (`check` of the metric, `check` of `doctor --json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RedisCheck {
    /// `maxmemory-policy`: anything but `noeviction` can drop budgets and overrides.
    MaxmemoryPolicy,
    /// RDB and AOF: without either, a restart forgets every key.
    Persistence,
}

impl RedisCheck {
    /// Every check, in the order they are reported.
    pub const ALL: [Self; 2] = [Self::MaxmemoryPolicy, Self::Persistence];

    /// The label value: `maxmemory_policy`, `persistence`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MaxmemoryPolicy => "maxmemory_policy",
            Self::Persistence => "persistence",
        }
    }
}

/// What a check found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Finding {
    /// No risk; `found` says what was read.
    Ok {
        /// What was read (`maxmemory-policy noeviction`).
        found: String,
    },
    /// A risk: what was read, what it costs the budgets and what to do.
    Risk {
        /// What was read (`maxmemory-policy allkeys-lru, maxmemory 8388608`).
        found: String,
        /// What it costs.
        cost: &'static str,
        /// What to do.
        action: &'static str,
    },
    /// The server would not say (`CONFIG` and `INFO` refused or renamed); `why` is its answer.
    NotChecked {
        /// Why (the server's error, passwords redacted, cut to a bounded length).
        why: String,
    },
}

impl Finding {
    /// `ok`, `risk` or `not_checked`.
    #[must_use]
    pub fn state(&self) -> &'static str {
        match self {
            Self::Ok { .. } => "ok",
            Self::Risk { .. } => "risk",
            Self::NotChecked { .. } => "not_checked",
        }
    }

    /// Whether it is a risk.
    #[must_use]
    pub fn is_risk(&self) -> bool {
        matches!(self, Self::Risk { .. })
    }
}

/// One check and what it found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisRisk {
    /// The setting.
    pub check: RedisCheck,
    /// What was found.
    pub finding: Finding,
}

/// What an eviction policy costs.
pub const EVICTION_COST: &str = "when memory is full Redis may evict any key the policy \
     covers: a budget's counters (the budget starts again at its floor and grants retries it had \
     refused), an operator's freeze or set override (lifted without a word), an open breaker, a \
     concurrency lease and the audit trail; no script, log or metric notices";
/// What to do about an eviction policy.
pub const EVICTION_ACTION: &str = "set `maxmemory-policy noeviction` on the budgets' Redis \
     (CONFIG SET maxmemory-policy noeviction, and in redis.conf or the provider's parameter \
     group), or give the budgets a Redis of their own that no cache shares";
/// What running without persistence costs.
pub const PERSISTENCE_COST: &str = "a restart empties Redis: every budget loses its window's \
     counters (each starts again at its floor), operators' overrides are gone (a freeze is \
     lifted), open breakers close, and the audit trail and the dead-letter index are lost";
/// What to do about running without persistence.
pub const PERSISTENCE_ACTION: &str = "turn on AOF (`appendonly yes`, `appendfsync everysec`) \
     or RDB snapshots (`save 60 1000`) on the budgets' Redis, or accept that a restart resets \
     budgets and lifts freezes (re-apply them after a restart)";

/// Every script of `lua/` by file name, with its text: what `budgetctl doctor` loads with
/// `SCRIPT LOAD` to prove each is loadable under the user it runs as.
pub const SCRIPTS: [(&str, &str); 11] = [
    ("spend.lua", include_str!("../lua/spend.lua")),
    ("spend_many.lua", include_str!("../lua/spend_many.lua")),
    ("spend_batch.lua", include_str!("../lua/spend_batch.lua")),
    ("deposit.lua", include_str!("../lua/deposit.lua")),
    ("status.lua", include_str!("../lua/status.lua")),
    ("override.lua", include_str!("../lua/override.lua")),
    (
        "lease_acquire.lua",
        include_str!("../lua/lease_acquire.lua"),
    ),
    (
        "lease_release.lua",
        include_str!("../lua/lease_release.lua"),
    ),
    ("breaker.lua", include_str!("../lua/breaker.lua")),
    ("heartbeat.lua", include_str!("../lua/heartbeat.lua")),
    ("dead_letters.lua", include_str!("../lua/dead_letters.lua")),
];

/// How the settings are asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Asking {
    /// `CONFIG GET` (which shows the RDB schedule), else `INFO`: the default user, and
    /// `budgetctl doctor` under any user.
    ConfigThenInfo,
    /// `INFO memory` and `INFO persistence` only: what the ACL lines of `lua/README.md` grant
    /// (`+info|memory +info|persistence`), so a worker under them leaves `ACL LOG` empty.
    InfoSections,
    /// `INFO memory` and `INFO persistence` first, and `CONFIG GET` only for what they do not
    /// show (the RDB schedule with AOF off, or everything when `INFO` is refused) and only when
    /// `config` says the user may run it: `budgetctl doctor`, which asks the server what the
    /// user may run before (so nothing it sends is refused).
    InfoFirst {
        /// Whether `CONFIG GET` may be sent.
        config: bool,
    },
}

/// Reads every [`RedisCheck`] from the server of `store` (`CONFIG GET`, else `INFO`); never
/// fails: what cannot be read is [`Finding::NotChecked`].
pub async fn read_redis_risks(store: &RedisStore) -> Vec<RedisRisk> {
    read_risks(store, Asking::ConfigThenInfo).await
}

/// [`read_redis_risks`] from `INFO memory` and `INFO persistence` first, with `CONFIG GET` only
/// for what they do not show and only when `config_get_allowed` (the caller asked the server
/// whether the user may run it): what `budgetctl doctor` sends, so that a user without `CONFIG`
/// (the ACL lines of `lua/README.md`) is refused nothing and `ACL LOG` stays empty.
pub async fn read_redis_risks_info_first(
    store: &RedisStore,
    config_get_allowed: bool,
) -> Vec<RedisRisk> {
    read_risks(
        store,
        Asking::InfoFirst {
            config: config_get_allowed,
        },
    )
    .await
}

async fn read_risks(store: &RedisStore, asking: Asking) -> Vec<RedisRisk> {
    let mut out = Vec::with_capacity(RedisCheck::ALL.len());
    for check in RedisCheck::ALL {
        let finding = match check {
            RedisCheck::MaxmemoryPolicy => maxmemory(store, asking).await,
            RedisCheck::Persistence => persistence(store, asking).await,
        };
        out.push(RedisRisk { check, finding });
    }
    out
}

/// Logs each risk (`warn`) and each check not made (`info`) of `risks`, one line each.
pub fn log_redis_risks(risks: &[RedisRisk], server: &str) {
    for risk in risks {
        match &risk.finding {
            Finding::Risk {
                found,
                cost,
                action,
            } => tracing::warn!(
                check = risk.check.as_str(),
                redis = server,
                "Redis risk: {found}: {cost}. What to do: {action} (`budgetctl doctor` checks it)"
            ),
            Finding::NotChecked { why } => tracing::info!(
                check = risk.check.as_str(),
                redis = server,
                "Redis setting not checked: {why}"
            ),
            Finding::Ok { .. } => {}
        }
    }
}

/// Reads the risks of `store`'s server and logs them ([`log_redis_risks`]): what a worker does
/// once when its fleet store is made (spawned, so a Redis that is down delays nothing), with the
/// rights of the worker's user ([`read_redis_risks_with_client_rights`]).
pub async fn log_redis_risks_once(store: Arc<RedisStore>) {
    let risks = read_redis_risks_with_client_rights(&store).await;
    log_redis_risks(&risks, &store.target().display());
}

/// [`read_redis_risks`] as a worker or the exporter reads them: under an ACL user ([`acl_user`])
/// only `INFO memory` and `INFO persistence` are sent, the two sections the ACL lines of
/// `lua/README.md` grant (`+info|memory +info|persistence`), never `CONFIG`, which they refuse.
/// A refused command is an entry in `ACL LOG`, which operators watch for intrusions: under the
/// documented lines nothing is refused. `INFO` shows `maxmemory_policy` and whether AOF is on,
/// not the RDB schedule: with AOF off, persistence is [`Finding::NotChecked`] with what `INFO`
/// did show (`budgetctl doctor`, run by an operator with `CONFIG GET`, reads the schedule).
pub async fn read_redis_risks_with_client_rights(store: &RedisStore) -> Vec<RedisRisk> {
    let asking = if acl_user(store.target()).is_some() {
        Asking::InfoSections
    } else {
        Asking::ConfigThenInfo
    };
    read_risks(store, asking).await
}

/// The ACL user named in the target's URL (the first, for a cluster), unless it is `default`.
#[must_use]
pub fn acl_user(target: &RedisTarget) -> Option<String> {
    let url = match target {
        RedisTarget::Single(url) => url.as_str(),
        RedisTarget::Cluster(urls) => urls.first()?.as_str(),
    };
    let rest = url.split_once("://")?.1;
    let authority = rest.split('/').next().unwrap_or(rest);
    let (userinfo, _) = authority.rsplit_once('@')?;
    let user = userinfo.split(':').next().unwrap_or("");
    (!user.is_empty() && user != "default").then(|| short(user))
}

/// Facts about the server that are not risks in themselves: what `doctor` prints first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerFacts {
    /// `redis_version` (or `valkey_version`).
    pub version: Option<String>,
    /// `redis_mode`: `standalone`, `cluster` or `sentinel`.
    pub mode: Option<String>,
    /// `role`: `master` or `slave`.
    pub role: Option<String>,
}

/// Reads [`ServerFacts`] with `INFO server` and `INFO replication`.
///
/// # Errors
/// `INFO` refused, renamed or failed: the server's answer, redacted and bounded.
pub async fn read_server_facts(store: &RedisStore) -> Result<ServerFacts, String> {
    let server = info(store, "server").await?;
    let replication = info(store, "replication").await.unwrap_or_default();
    Ok(ServerFacts {
        version: first(&server, "redis_version").or_else(|| first(&server, "valkey_version")),
        mode: first(&server, "redis_mode"),
        role: first(&replication, "role"),
    })
}

/// `CONFIG GET` of `pattern` when `asking` allows it; `Err` (the server's answer, or that it
/// was not asked) sends the caller to `INFO`.
async fn config_get_if_asked(
    store: &RedisStore,
    pattern: &str,
    asking: Asking,
) -> Result<Vec<(String, String)>, String> {
    match asking {
        Asking::ConfigThenInfo | Asking::InfoFirst { config: true } => {
            config_get(store, pattern).await
        }
        Asking::InfoSections => Err("not asked under an ACL user".to_owned()),
        Asking::InfoFirst { config: false } => {
            Err("not sent: the user may not run it (redis.acl_check_cmd)".to_owned())
        }
    }
}

async fn maxmemory(store: &RedisStore, asking: Asking) -> Finding {
    if let Asking::InfoFirst { config } = asking {
        // INFO memory shows both settings: CONFIG GET only when it does not answer.
        if let Ok(info) = info(store, "memory").await {
            let policies = values(&info, "maxmemory_policy");
            if !policies.is_empty() {
                return memory_finding(&policies, &values(&info, "maxmemory"), "INFO memory");
            }
        }
        let then = if config {
            Asking::ConfigThenInfo
        } else {
            Asking::InfoSections
        };
        return Box::pin(maxmemory(store, then)).await;
    }
    let (policies, limits, via) = match config_get_if_asked(store, "maxmemory*", asking).await {
        Ok(pairs) => (
            values(&pairs, "maxmemory-policy"),
            values(&pairs, "maxmemory"),
            "CONFIG GET",
        ),
        Err(config_refused) => match info(store, "memory").await {
            Ok(info) => (
                values(&info, "maxmemory_policy"),
                values(&info, "maxmemory"),
                "INFO memory",
            ),
            Err(info_refused) => {
                return Finding::NotChecked {
                    why: format!(
                        "maxmemory-policy not readable: CONFIG GET: {config_refused}; INFO memory: \
                         {info_refused}{}",
                        grant_hint(&info_refused)
                    ),
                };
            }
        },
    };
    if policies.is_empty() {
        return Finding::NotChecked {
            why: format!("{via} did not show maxmemory-policy"),
        };
    }
    memory_finding(&policies, &limits, via)
}

/// The finding of the eviction policies and limits read through `via`.
fn memory_finding(policies: &[String], limits: &[String], via: &str) -> Finding {
    let limit = limits.first().map_or("unknown", String::as_str);
    let evicting: Vec<&String> = policies.iter().filter(|p| *p != "noeviction").collect();
    match evicting.first() {
        None => Finding::Ok {
            found: format!("maxmemory-policy noeviction, maxmemory {limit} ({via})"),
        },
        Some(policy) => {
            let note = if limit == "0" {
                " (no maxmemory set yet: eviction starts as soon as one is)"
            } else {
                ""
            };
            Finding::Risk {
                found: format!("maxmemory-policy {policy}, maxmemory {limit}{note} ({via})"),
                cost: EVICTION_COST,
                action: EVICTION_ACTION,
            }
        }
    }
}

/// Whether an error text is an ACL refusal (`NOPERM`).
fn is_refusal(text: &str) -> bool {
    let lower = text.to_ascii_lowercase();
    lower.contains("noperm") || lower.contains("no permissions")
}

/// What to grant when `INFO` was refused (an ACL line older than lua/README.md's).
fn grant_hint(refusal: &str) -> &'static str {
    if is_refusal(refusal) {
        " (grant the user +info|memory +info|persistence, as lua/README.md's ACL lines do)"
    } else {
        ""
    }
}

async fn persistence(store: &RedisStore, asking: Asking) -> Finding {
    if let Asking::InfoFirst { config } = asking {
        return persistence_info_first(store, config).await;
    }
    match config_get_if_asked(store, "save", asking).await {
        Ok(save_pairs) => {
            let appendonly = config_get(store, "appendonly").await.unwrap_or_default();
            let save = values(&save_pairs, "save");
            let aof = values(&appendonly, "appendonly");
            let rdb_on = save.iter().any(|s| !s.trim().is_empty());
            let aof_on = aof.iter().any(|a| a == "yes");
            let found = format!(
                "RDB {} (save {:?}), AOF {} (CONFIG GET)",
                if rdb_on { "on" } else { "off" },
                save.first().map_or("", String::as_str),
                if aof_on { "on" } else { "off" },
            );
            if rdb_on || aof_on {
                Finding::Ok { found }
            } else {
                Finding::Risk {
                    found,
                    cost: PERSISTENCE_COST,
                    action: PERSISTENCE_ACTION,
                }
            }
        }
        Err(config_refused) => match info(store, "persistence").await {
            Ok(info) if values(&info, "aof_enabled").iter().any(|v| v == "1") => Finding::Ok {
                found: "AOF on (INFO persistence)".to_owned(),
            },
            Ok(info) => {
                let field = |name: &str| first(&info, name).unwrap_or_else(|| "?".to_owned());
                Finding::NotChecked {
                    why: format!(
                        "AOF off (INFO persistence), which does not show the RDB schedule \
                         (rdb_saves {} since start, rdb_changes_since_last_save {}); CONFIG GET \
                         save: {config_refused}",
                        field("rdb_saves"),
                        field("rdb_changes_since_last_save"),
                    ),
                }
            }
            Err(info_refused) => Finding::NotChecked {
                why: format!(
                    "persistence not readable: CONFIG GET: {config_refused}; INFO persistence: \
                     {info_refused}{}",
                    grant_hint(&info_refused)
                ),
            },
        },
    }
}

/// Persistence from `INFO persistence` (AOF on is enough); the RDB schedule, which it does not
/// show, from `CONFIG GET save` when `config` allows it; `INFO` refused: as
/// [`Asking::ConfigThenInfo`] when `config` allows, else not checked.
async fn persistence_info_first(store: &RedisStore, config: bool) -> Finding {
    let info = match info(store, "persistence").await {
        Ok(info) => info,
        Err(_) if config => return Box::pin(persistence(store, Asking::ConfigThenInfo)).await,
        Err(_) => return Box::pin(persistence(store, Asking::InfoSections)).await,
    };
    if values(&info, "aof_enabled").iter().any(|v| v == "1") {
        return Finding::Ok {
            found: "AOF on (INFO persistence)".to_owned(),
        };
    }
    let field = |name: &str| first(&info, name).unwrap_or_else(|| "?".to_owned());
    let save = if config {
        config_get(store, "save").await
    } else {
        Err("not sent: the user may not run it (redis.acl_check_cmd)".to_owned())
    };
    match save {
        Ok(pairs) => {
            let save = values(&pairs, "save");
            let rdb_on = save.iter().any(|s| !s.trim().is_empty());
            let found = format!(
                "RDB {} (save {:?}), AOF off (INFO persistence; CONFIG GET save)",
                if rdb_on { "on" } else { "off" },
                save.first().map_or("", String::as_str),
            );
            if rdb_on {
                Finding::Ok { found }
            } else {
                Finding::Risk {
                    found,
                    cost: PERSISTENCE_COST,
                    action: PERSISTENCE_ACTION,
                }
            }
        }
        Err(why) => Finding::NotChecked {
            why: format!(
                "AOF off (INFO persistence), which does not show the RDB schedule (rdb_saves {} \
                 since start, rdb_changes_since_last_save {}); CONFIG GET save: {why}",
                field("rdb_saves"),
                field("rdb_changes_since_last_save"),
            ),
        },
    }
}

/// `CONFIG GET pattern` as (name, value) pairs (RESP2 flat array, RESP3 map, or a map per node).
async fn config_get(store: &RedisStore, pattern: &str) -> Result<Vec<(String, String)>, String> {
    let mut cmd = redis::cmd("CONFIG");
    cmd.arg("GET").arg(pattern);
    let reply: Value = store.query(&cmd).await.map_err(|e| short(&e.to_string()))?;
    Ok(reply_pairs(&reply))
}

/// `INFO section` as (field, value) pairs (a text per node on a cluster, all of them).
async fn info(store: &RedisStore, section: &str) -> Result<Vec<(String, String)>, String> {
    let mut cmd = redis::cmd("INFO");
    cmd.arg(section);
    let reply: Value = store.query(&cmd).await.map_err(|e| short(&e.to_string()))?;
    Ok(reply_texts(&reply)
        .iter()
        .flat_map(|t| parse_info(t))
        .collect())
}

/// The `field:value` lines of an `INFO` text (comments and blank lines skipped).
#[must_use]
pub fn parse_info(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (short(k.trim()), short(v.trim())))
        .collect()
}

fn values(pairs: &[(String, String)], name: &str) -> Vec<String> {
    pairs
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.clone())
        .collect()
}

fn first(pairs: &[(String, String)], name: &str) -> Option<String> {
    values(pairs, name).into_iter().next()
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        Value::Int(i) => Some(i.to_string()),
        Value::Okay => Some("OK".to_owned()),
        _ => None,
    }
}

/// The name/value pairs of a reply of any shape (`CONFIG GET`, `HELLO`): a flat RESP2 array of
/// names and values, a RESP3 map, or one of those per node on a cluster. Values that are not
/// texts (`HELLO`'s `modules`) are skipped; nesting is bounded; every text is redacted and cut.
#[must_use]
pub fn reply_pairs(reply: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    pairs_of(reply, &mut out, 0);
    out
}

/// Every text of a reply (one, or one per node on a cluster; `OK` for a simple OK); nesting is
/// bounded. Not cut: an `INFO` text is parsed line by line ([`parse_info`]), which cuts each.
#[must_use]
pub fn reply_texts(reply: &Value) -> Vec<String> {
    let mut out = Vec::new();
    texts_of(reply, &mut out, 0);
    out
}

fn pairs_of(v: &Value, out: &mut Vec<(String, String)>, depth: usize) {
    if depth > 3 {
        return;
    }
    match v {
        Value::Array(items)
            if items.len() % 2 == 0 && items.iter().step_by(2).all(|k| text(k).is_some()) =>
        {
            for pair in items.chunks_exact(2) {
                if let [k, v] = pair
                    && let (Some(k), Some(v)) = (text(k), text(v))
                {
                    out.push((short(&k), short(&v)));
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|i| pairs_of(i, out, depth + 1)),
        Value::Map(entries) => {
            for (k, v) in entries {
                match (text(k), text(v)) {
                    (Some(k), Some(v)) => out.push((short(&k), short(&v))),
                    (_, None) if matches!(v, Value::Map(_) | Value::Array(_)) => {
                        pairs_of(v, out, depth + 1);
                    }
                    _ => {}
                }
            }
        }
        _ => {}
    }
}

fn texts_of(v: &Value, out: &mut Vec<String>, depth: usize) {
    if depth > 3 {
        return;
    }
    match v {
        Value::Array(items) => items.iter().for_each(|i| texts_of(i, out, depth + 1)),
        Value::Map(entries) => entries
            .iter()
            .for_each(|(_, v)| texts_of(v, out, depth + 1)),
        other => out.extend(text(other)),
    }
}

/// `text` redacted and cut to a bounded length (200 characters and `…`): what a check shows of
/// a reply or an error, so a hostile reply is cut, never grown, and a password never shown.
#[must_use]
pub fn short(text: &str) -> String {
    let text = redact_text(text);
    if text.chars().count() > MAX_TEXT {
        let mut cut: String = text.chars().take(MAX_TEXT).collect();
        cut.push('…');
        cut
    } else {
        text
    }
}

/// The exporter's reading of the risks: `fleet_budget_redis_risk{check}` 1 for a risk, 0 for
/// none, and no series for a check the server would not answer (`budgetctl exporter`). Read with
/// the client's rights ([`read_redis_risks_with_client_rights`]); once the server has refused
/// them (`NOPERM`: a user with an ACL line older than lua/README.md's), it is not asked again,
/// so scrapes do not add to `ACL LOG`.
pub struct RedisRiskSource {
    store: Arc<RedisStore>,
    gauge: IntGaugeVec,
    refused: AtomicBool,
}

impl std::fmt::Debug for RedisRiskSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisRiskSource")
            .field("store", &self.store.target().display())
            .finish_non_exhaustive()
    }
}

impl RedisRiskSource {
    /// Registers `fleet_budget_redis_risk` in `registry`, read from `store` at each scrape.
    ///
    /// # Errors
    /// The name is registered already.
    pub fn register(store: Arc<RedisStore>, registry: &Registry) -> prometheus::Result<Self> {
        let gauge = IntGaugeVec::new(
            Opts::new(
                "fleet_budget_redis_risk",
                "1 when a setting of the budgets' Redis can drop budgets or overrides without an \
                 error (check: maxmemory_policy, persistence), 0 when not; absent when not checked",
            ),
            &["check"],
        )?;
        registry.register(Box::new(gauge.clone()))?;
        Ok(Self {
            store,
            gauge,
            refused: AtomicBool::new(false),
        })
    }
}

impl ExporterSource for RedisRiskSource {
    fn name(&self) -> &'static str {
        "redis_risks"
    }

    fn read(&self) -> ReadFuture<'_> {
        Box::pin(async move {
            if self.refused.load(Ordering::Relaxed) {
                return Ok(());
            }
            for risk in read_redis_risks_with_client_rights(&self.store).await {
                let label = [risk.check.as_str()];
                match risk.finding {
                    Finding::Risk { .. } => self.gauge.with_label_values(&label).set(1),
                    Finding::Ok { .. } => self.gauge.with_label_values(&label).set(0),
                    Finding::NotChecked { why } => {
                        if is_refusal(&why) {
                            self.refused.store(true, Ordering::Relaxed);
                        }
                        let _ = self.gauge.remove_label_values(&label);
                    }
                }
            }
            Ok(())
        })
    }

    fn clear(&self) {
        self.gauge.reset();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_text_is_read_line_by_line() {
        let pairs = parse_info("# Memory\r\nmaxmemory:0\r\nmaxmemory_policy:allkeys-lru\r\n\r\n");
        assert_eq!(values(&pairs, "maxmemory_policy"), vec!["allkeys-lru"]);
        assert_eq!(values(&pairs, "maxmemory"), vec!["0"]);
    }

    #[test]
    fn config_replies_of_every_shape_give_pairs() {
        let b = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let mut flat = Vec::new();
        pairs_of(
            &Value::Array(vec![b("maxmemory-policy"), b("noeviction")]),
            &mut flat,
            0,
        );
        assert_eq!(values(&flat, "maxmemory-policy"), vec!["noeviction"]);
        let mut per_node = Vec::new();
        pairs_of(
            &Value::Map(vec![(
                b("node-1"),
                Value::Map(vec![(b("maxmemory-policy"), b("volatile-lru"))]),
            )]),
            &mut per_node,
            0,
        );
        assert_eq!(values(&per_node, "maxmemory-policy"), vec!["volatile-lru"]);
    }

    #[test]
    fn the_acl_user_is_read_from_the_url() {
        let single = |u: &str| RedisTarget::Single(u.to_owned());
        assert_eq!(
            acl_user(&single("redis://fleet-worker:pw@h:6379/0")).as_deref(),
            Some("fleet-worker")
        );
        assert_eq!(acl_user(&single("redis://:pw@h:6379")), None);
        assert_eq!(acl_user(&single("redis://default:pw@h")), None);
        assert_eq!(acl_user(&single("redis://h:6379")), None);
    }

    #[test]
    fn hostile_text_is_cut() {
        let long = "x".repeat(10_000);
        assert!(short(&long).chars().count() <= MAX_TEXT + 1);
    }
}
