//! The Redis checks of `doctor`: the server, the settings of `fleet_budget::risks`, latency,
//! the scripts, `EVALSHA`, the key patterns under the user's ACL, and whether the overrides
//! keeper could restore under this user (`keeper_rights`).
//!
//! Every call goes through `RedisStore::query` or `read_status` (the store's deadline). The one
//! key touched is the budget key of the dependency `fleet-budget-doctor`, read by `status.lua`
//! (which writes nothing), so doctor can run against a live fleet.

use std::time::{Duration, Instant};

use fleet_budget::control::keeper::lift_key;
use fleet_budget::keys::{audit_key, budget_key, dead_letters_key, workers_key, workers_seen_key};
use fleet_budget::redact::redact_text;
use fleet_budget::risks::{self, Finding, short};
use fleet_budget::store::{OVERRIDE_SCRIPT, RedisStore};
use fleet_budget::{BudgetPolicy, Dependency};
use fleet_budget_amqp::{Topology, WorkerConfig};
use redis::Value;

use super::{Check, Latency};
use crate::redis_conn;

const SERVICE: &str = "redis";
/// The dependency whose budget key the script calls read (it never has one: nothing is written).
const DOCTOR_DEPENDENCY: &str = "fleet-budget-doctor";
/// Timed round trips of each kind.
const SAMPLES: usize = 5;

/// Every Redis check, and the latency measured (when Redis answered).
pub(super) async fn checks(config: &WorkerConfig) -> (Vec<Check>, Option<Latency>) {
    let budget = &config.budget;
    let timeout = redis_conn::cli_timeout(budget);
    let store = match redis_conn::connect(budget, timeout).await {
        Ok(store) => store,
        Err(e) => {
            return (
                vec![Check::risk(
                    SERVICE,
                    "reachable",
                    redact_text(&format!("{e:#}")),
                    "workers decide from their in-process fallback: each grants its own retries, \
                     so the fleet grants up to N times the budget, and overrides are not seen",
                    "start Redis or point --redis-url / redis.url at it",
                )],
                None,
            );
        }
    };
    let mut out = vec![Check::ok(SERVICE, "reachable", budget.redis_display())];
    // What the user may run, asked first, so that nothing sent below is refused (a refusal is
    // an entry in ACL LOG, which operators watch for intrusions).
    let probes = acl_probes(config);
    let mut asked: Vec<Vec<String>> = vec![
        words(&["CONFIG", "GET", "maxmemory-policy"]),
        words(&["CONFIG", "GET", "save"]),
        words(&["CLUSTER", "INFO"]),
    ];
    asked.extend(probes.iter().map(|(_, args)| args.clone()));
    let keeper = KeeperProbes::new(config);
    asked.extend(keeper.reads.iter().map(|(_, args)| args.clone()));
    asked.extend(keeper.writes.iter().map(|(_, args)| args.clone()));
    let rights = may_run(&store, &asked).await;
    let allowed = |i: usize| rights.as_ref().and_then(|r| r.get(i).copied());
    // Unknown rights (Redis before 7.0, EVALSHA refused): CONFIG only as the default user.
    let named_user = risks::acl_user(store.target()).is_some();
    let config_allowed = match (allowed(0), allowed(1)) {
        (Some(a), Some(b)) => a && b,
        _ => !named_user,
    };
    let cluster_allowed = allowed(2).unwrap_or(!named_user);
    out.extend(server(&store, cluster_allowed).await);
    for risk in risks::read_redis_risks_info_first(&store, config_allowed).await {
        let check = risk.check.as_str();
        out.push(match risk.finding {
            Finding::Ok { found } => Check::ok(SERVICE, check, found),
            Finding::Risk {
                found,
                cost,
                action,
            } => Check::risk(SERVICE, check, found, cost, action),
            Finding::NotChecked { why } => Check::not_checked(SERVICE, check, why),
            _ => Check::not_checked(SERVICE, check, "a finding this doctor does not know"),
        });
    }
    out.push(scripts(&store).await);
    let (evalsha, latency) = evalsha_and_latency(&store).await;
    out.push(evalsha);
    let workers_end = 3 + probes.len();
    let keeper_rights_asked = rights
        .as_ref()
        .and_then(|r| r.get(workers_end..).map(<[bool]>::to_vec));
    let probe_rights = rights.and_then(|r| r.get(3..workers_end).map(<[bool]>::to_vec));
    out.push(acl_keys(&store, config, &probes, probe_rights).await);
    out.push(keeper.check(keeper_rights_asked.as_deref()));
    (out, latency)
}

fn words(w: &[&str]) -> Vec<String> {
    w.iter().map(|w| (*w).to_owned()).collect()
}

/// Asks the server whether the current user may run each command of `commands` (its words),
/// without running any: `redis.acl_check_cmd` in a script (Redis 7.0+). A check is not a
/// refusal, so nothing lands in `ACL LOG`. `None` when the server cannot tell (before 7.0, no
/// `EVALSHA`, or a reply of another length).
const MAY_RUN: &str =
    "if not redis.acl_check_cmd then return redis.error_reply('no redis.acl_check_cmd') end
local out, i = {}, 1
while i <= #ARGV do
  local n = tonumber(ARGV[i])
  local w = {}
  for k = 1, n do w[k] = ARGV[i + k] end
  local ok, yes = pcall(redis.acl_check_cmd, unpack(w))
  out[#out + 1] = (ok and yes) and 1 or 0
  i = i + n + 1
end
return out";

async fn may_run(store: &RedisStore, commands: &[Vec<String>]) -> Option<Vec<bool>> {
    let script = redis::Script::new(MAY_RUN);
    let mut invocation = script.prepare_invoke();
    for command in commands {
        invocation.arg(command.len());
        for w in command {
            invocation.arg(w);
        }
    }
    let reply = store.invoke("may_run", invocation).await.ok()?;
    let rights: Vec<bool> = reply.iter().map(|v| matches!(v, Value::Int(1))).collect();
    (rights.len() == commands.len()).then_some(rights)
}

/// Version, mode (standalone, cluster, sentinel; a replica is a risk) and, on a cluster, slot
/// coverage. `HELLO` first (every user may send it, so no ACL refusal is logged), `INFO` else.
async fn server(store: &RedisStore, cluster_allowed: bool) -> Vec<Check> {
    let facts = match hello(store).await {
        Ok(facts) => Ok(facts),
        Err(hello_refused) => risks::read_server_facts(store)
            .await
            .map_err(|info_refused| format!("HELLO: {hello_refused}; INFO: {info_refused}")),
    };
    let facts = match facts {
        Ok(f) => f,
        Err(why) => {
            return vec![
                Check::not_checked(SERVICE, "version", why.clone()),
                Check::not_checked(SERVICE, "mode", why),
            ];
        }
    };
    let mut out = Vec::new();
    let version = facts.version.clone().unwrap_or_default();
    let major: u32 = version
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(0);
    out.push(if major >= 6 {
        Check::ok(SERVICE, "version", version)
    } else {
        Check::risk(
            SERVICE,
            "version",
            format!("Redis {version:?}"),
            "the scripts and the ACL lines of lua/README.md are written for Redis 6.2 and later",
            "upgrade Redis to 6.2 or later (7.x is what the project is tested on)",
        )
    });
    let mode = facts.mode.clone().unwrap_or_else(|| "unknown".to_owned());
    let role = facts.role.clone().unwrap_or_else(|| "unknown".to_owned());
    let found = format!("{mode}, role {role}");
    out.push(if mode == "sentinel" {
        Check::risk(
            SERVICE,
            "mode",
            found,
            "a Sentinel keeps no data and runs no scripts: every decision comes from the \
             workers' fallback",
            "point redis.url at the primary Sentinel names (SENTINEL get-master-addr-by-name)",
        )
    } else if role == "slave" || role == "replica" {
        Check::risk(
            SERVICE,
            "mode",
            found,
            "a replica refuses every write (READONLY): every decision comes from the workers' \
             fallback, and operators' overrides cannot be set",
            "point redis.url at the primary (through Sentinel or the provider's primary endpoint)",
        )
    } else {
        Check::ok(SERVICE, "mode", found)
    });
    if mode == "cluster" {
        out.push(if cluster_allowed {
            cluster_slots(store).await
        } else {
            Check::not_checked(
                SERVICE,
                "cluster_slots",
                "CLUSTER INFO not sent: the user may not run it (redis.acl_check_cmd)",
            )
        });
    }
    out
}

async fn hello(store: &RedisStore) -> Result<risks::ServerFacts, String> {
    let reply: Value = store
        .query(&redis::cmd("HELLO"))
        .await
        .map_err(|e| short(&e.to_string()))?;
    let pairs = risks::reply_pairs(&reply);
    let get = |name: &str| {
        pairs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    if get("version").is_none() {
        return Err("HELLO did not say the version".to_owned());
    }
    Ok(risks::ServerFacts {
        version: get("version"),
        mode: get("mode"),
        role: get("role"),
    })
}

async fn cluster_slots(store: &RedisStore) -> Check {
    let reply: Result<Value, _> = store.query(redis::cmd("CLUSTER").arg("INFO")).await;
    let text = match reply {
        Ok(v) => risks::reply_texts(&v).join("\n"),
        Err(e) => return Check::not_checked(SERVICE, "cluster_slots", short(&e.to_string())),
    };
    let pairs = risks::parse_info(&text);
    let get = |n: &str| pairs.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
    let state = get("cluster_state").unwrap_or_default();
    let ok: u32 = get("cluster_slots_ok")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let found = format!("cluster_state {state}, {ok} of 16384 slots ok");
    if state == "ok" && ok == 16_384 {
        Check::ok(SERVICE, "cluster_slots", found)
    } else {
        Check::risk(
            SERVICE,
            "cluster_slots",
            found,
            "the dependencies whose keys hash to an uncovered slot get CLUSTERDOWN: their \
             decisions come from the workers' fallback",
            "assign every slot (redis-cli --cluster fix) or fail over the missing primaries",
        )
    }
}

/// Every script of `lua/` loaded with `SCRIPT LOAD`, its SHA1 compared with the file's.
async fn scripts(store: &RedisStore) -> Check {
    let mut failed = Vec::new();
    for (name, text) in risks::SCRIPTS {
        let expected = redis::Script::new(text).get_hash().to_owned();
        let reply: Result<Value, _> = store
            .query(redis::cmd("SCRIPT").arg("LOAD").arg(text))
            .await;
        match reply {
            Ok(v) => {
                let shas = risks::reply_texts(&v);
                if !shas.contains(&expected) {
                    failed.push(format!(
                        "{name}: loaded as {:?}",
                        shas.first().map(|s| short(s))
                    ));
                }
            }
            Err(e) => failed.push(format!("{name}: {}", short(&e.to_string()))),
        }
    }
    if failed.is_empty() {
        Check::ok(
            SERVICE,
            "scripts",
            format!("all {} scripts load (SCRIPT LOAD)", risks::SCRIPTS.len()),
        )
    } else {
        let renamed = failed.iter().any(|f| f.contains("unknown command"));
        Check::risk(
            SERVICE,
            "scripts",
            format!(
                "{} of {} scripts cannot be loaded{}: {}",
                failed.len(),
                risks::SCRIPTS.len(),
                if renamed {
                    " (SCRIPT is renamed or disabled)"
                } else {
                    ""
                },
                failed.first().map_or("", String::as_str)
            ),
            "after a restart, a failover or SCRIPT FLUSH the server has no script cached: every \
             EVALSHA then needs SCRIPT LOAD, and without it every decision comes from the \
             workers' fallback and overrides cannot be set",
            "grant the user +script|load (lua/README.md's ACL lines), and ask the provider to keep \
             SCRIPT and EVALSHA enabled under their names",
        )
    }
}

/// `status.lua` through `EVALSHA` on doctor's own key, timed beside `PING`.
async fn evalsha_and_latency(store: &RedisStore) -> (Check, Option<Latency>) {
    let Ok(dependency) = Dependency::new(DOCTOR_DEPENDENCY) else {
        return (
            Check::not_checked(SERVICE, "evalsha", "no doctor dependency name"),
            None,
        );
    };
    let policy = BudgetPolicy::default();
    if let Err(e) = store.read_status(&dependency, &policy).await {
        let text = short(&e.to_string());
        let lower = text.to_ascii_lowercase();
        let refused = lower.contains("noperm") || lower.contains("unknown command");
        let check = if refused {
            Check::risk(
                SERVICE,
                "evalsha",
                format!("status.lua on {}: {text}", store.key(&dependency)),
                "every budget decision is a script run with EVALSHA: refused, every decision \
                 comes from the workers' fallback (each worker its own budget) and no override \
                 or breaker is shared",
                "grant the user +evalsha and the keys ~<prefix>:v1:* (lua/README.md's ACL lines); \
                 on a managed Redis keep EVALSHA enabled under its name",
            )
        } else {
            Check::not_checked(
                SERVICE,
                "evalsha",
                format!("status.lua on {}: {text}", store.key(&dependency)),
            )
        };
        return (check, None);
    }
    let mut pings = Vec::with_capacity(SAMPLES);
    let mut calls = Vec::with_capacity(SAMPLES);
    for _ in 0..SAMPLES {
        let started = Instant::now();
        let ping: Result<String, _> = store.query(&redis::cmd("PING")).await;
        pings.push(ping.map(|_| started.elapsed()));
        let started = Instant::now();
        let status = store.read_status(&dependency, &policy).await;
        calls.push(status.map(|_| started.elapsed()));
    }
    let check = Check::ok(
        SERVICE,
        "evalsha",
        format!(
            "status.lua runs with EVALSHA on {} (read only)",
            store.key(&dependency)
        ),
    );
    let pings: Vec<Duration> = pings.into_iter().filter_map(Result::ok).collect();
    let calls: Vec<Duration> = calls.into_iter().filter_map(Result::ok).collect();
    let latency = (!pings.is_empty() && !calls.is_empty()).then(|| Latency {
        samples: pings.len().min(calls.len()),
        ping_median_ms: median_ms(&pings),
        ping_max_ms: max_ms(&pings),
        status_script_median_ms: median_ms(&calls),
        status_script_max_ms: max_ms(&calls),
    });
    (check, latency)
}

/// The commands the workers run on each kind of key (the worker's ACL line of lua/README.md),
/// each on the kind of key it runs on: what [`acl_keys`] asks about.
fn acl_probes(config: &WorkerConfig) -> Vec<(&'static str, Vec<String>)> {
    let prefix = &config.budget.redis.key_prefix;
    let Ok(dependency) = Dependency::new(DOCTOR_DEPENDENCY) else {
        return Vec::new();
    };
    let budget = budget_key(prefix, &dependency);
    let dead = dead_letters_key(prefix, &Topology::new(&config.amqp).dead_queue);
    let workers = workers_key(prefix);
    let seen = workers_seen_key(prefix);
    let line = |what: &'static str, w: &[&str]| -> (&'static str, Vec<String>) { (what, words(w)) };
    vec![
        line("server", &["TIME"]),
        line("budget", &["HMGET", &budget, "f"]),
        line("budget", &["HSET", &budget, "f", "1"]),
        line("budget", &["HINCRBY", &budget, "f", "1"]),
        line("budget", &["HDEL", &budget, "f"]),
        line("budget", &["PEXPIREAT", &budget, "1"]),
        line("budget", &["PTTL", &budget]),
        line("budget", &["TYPE", &budget]),
        line("budget", &["ZADD", &budget, "1", "f"]),
        line("budget", &["ZREMRANGEBYSCORE", &budget, "0", "1"]),
        line("worker registry", &["HSET", &workers, "f", "1"]),
        line("worker registry", &["HDEL", &workers, "f"]),
        line("worker registry", &["ZADD", &seen, "1", "f"]),
        line("worker registry", &["ZRANGE", &seen, "0", "1"]),
        line("worker registry", &["ZREM", &seen, "f"]),
        line("dead-letter index", &["HINCRBY", &dead, "f", "1"]),
        line("dead-letter index", &["HGET", &dead, "f"]),
        line("dead-letter index", &["HLEN", &dead]),
    ]
}

/// Whether the current user may run the workers' commands on every kind of key: from `rights`
/// (asked with `redis.acl_check_cmd`, one per probe) when known, else from `ACL DRYRUN`.
async fn acl_keys(
    store: &RedisStore,
    config: &WorkerConfig,
    probes: &[(&'static str, Vec<String>)],
    rights: Option<Vec<bool>>,
) -> Check {
    const CHECK: &str = "acl_keys";
    let prefix = &config.budget.redis.key_prefix;
    if probes.is_empty() {
        return Check::not_checked(SERVICE, CHECK, "no doctor dependency name");
    }
    if let Some(rights) = rights {
        let denied: Vec<(String, String)> = probes
            .iter()
            .zip(rights)
            .filter(|(_, may)| !may)
            .map(|((what, args), _)| {
                let command = args.first().map_or("", String::as_str);
                let key = args.get(1).map_or("", String::as_str);
                (
                    format!("{what} {command} {key}"),
                    format!("the user may not run {command} on {key} (redis.acl_check_cmd)"),
                )
            })
            .collect();
        return keys_verdict(
            "the current user",
            "redis.acl_check_cmd",
            prefix,
            probes.len(),
            &denied,
        );
    }
    let whoami: Result<String, _> = store.query(redis::cmd("ACL").arg("WHOAMI")).await;
    let user = match whoami {
        Ok(user) => user,
        Err(e) => {
            return Check::not_checked(
                SERVICE,
                CHECK,
                format!(
                    "ACL WHOAMI refused ({}): the key patterns were tried only through status.lua's read above",
                    short(&e.to_string())
                ),
            );
        }
    };
    let mut denied: Vec<(String, String)> = Vec::new();
    for (what, args) in probes {
        let mut cmd = redis::cmd("ACL");
        cmd.arg("DRYRUN").arg(&user);
        for a in args {
            cmd.arg(a);
        }
        let answer: Result<Value, _> = store.query(&cmd).await;
        match answer {
            Ok(Value::Okay) => {}
            Ok(v) => {
                let text = risks::reply_texts(&v).join(" ");
                if text != "OK" {
                    let key = args.get(1).map_or("", String::as_str);
                    let command = args.first().map_or("", String::as_str);
                    denied.push((format!("{what} {command} {key}"), short(&text)));
                }
            }
            Err(e) => {
                return Check::not_checked(
                    SERVICE,
                    CHECK,
                    format!(
                        "ACL DRYRUN refused ({}): the key patterns were tried only through status.lua's read above",
                        short(&e.to_string())
                    ),
                );
            }
        }
    }
    keys_verdict(
        &format!("user {user:?}"),
        "ACL DRYRUN",
        prefix,
        probes.len(),
        &denied,
    )
}

fn keys_verdict(
    user: &str,
    via: &str,
    prefix: &str,
    probes: usize,
    denied: &[(String, String)],
) -> Check {
    const CHECK: &str = "acl_keys";
    if denied.is_empty() {
        Check::ok(
            SERVICE,
            CHECK,
            format!(
                "{user} may run the workers' commands on every kind of key under {prefix}:v1: ({via})"
            ),
        )
    } else {
        Check::risk(
            SERVICE,
            CHECK,
            format!(
                "{user} is refused {} of {probes} commands the workers run: {} (first: {})",
                denied.len(),
                denied
                    .iter()
                    .map(|(what, _)| what.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                denied.first().map_or("", |(_, why)| why.as_str())
            ),
            "a script whose command is refused fails the decision: it comes from the workers' \
             fallback (budget keys), or the worker registry or dead-letter index stops counting",
            "grant the keys ~<prefix>:v1:* and the commands of lua/README.md's ACL lines",
        )
    }
}

/// What the overrides keeper (`fleet_budget::control::keeper`, run by `budgetctl exporter` and
/// the console) runs, each on the kind of key it runs on: its reads every pass, and the writes
/// of a restore (`override.lua` through `EVALSHA` and the commands it runs, `SCRIPT LOAD` after a
/// `NOSCRIPT`, the audit entry). Asked with `redis.acl_check_cmd` beside the other rights.
struct KeeperProbes {
    reads: Vec<(&'static str, Vec<String>)>,
    writes: Vec<(&'static str, Vec<String>)>,
}

impl KeeperProbes {
    fn new(config: &WorkerConfig) -> Self {
        let prefix = &config.budget.redis.key_prefix;
        let Ok(dependency) = Dependency::new(DOCTOR_DEPENDENCY) else {
            return Self {
                reads: Vec::new(),
                writes: Vec::new(),
            };
        };
        let budget = budget_key(prefix, &dependency);
        let breaker = format!("{budget}:cb");
        let lift = lift_key(prefix, &dependency);
        let audit = audit_key(prefix);
        let sha = OVERRIDE_SCRIPT.get_hash().to_owned();
        let line =
            |what: &'static str, w: &[&str]| -> (&'static str, Vec<String>) { (what, words(w)) };
        Self {
            reads: vec![
                line("TIME", &["TIME"]),
                line("HMGET", &["HMGET", &budget, "fu"]),
                line("HMGET", &["HMGET", &breaker, "st"]),
                line("HMGET (lift record)", &["HMGET", &lift, "at"]),
                line("TYPE", &["TYPE", &audit]),
                line("XREVRANGE", &["XREVRANGE", &audit, "+", "-", "COUNT", "1"]),
            ],
            writes: vec![
                line("EVALSHA override.lua", &["EVALSHA", &sha, "1", &budget]),
                line("SCRIPT LOAD", &["SCRIPT", "LOAD", "return 1"]),
                line("override.lua's HSET", &["HSET", &budget, "fu", "1"]),
                line("override.lua's HDEL", &["HDEL", &budget, "fu"]),
                line("override.lua's PERSIST", &["PERSIST", &budget]),
                line("override.lua's HLEN", &["HLEN", &budget]),
                line("override.lua's DEL", &["DEL", &budget]),
                line("override.lua's PTTL", &["PTTL", &budget]),
                line("override.lua's PEXPIREAT", &["PEXPIREAT", &budget, "1"]),
                line(
                    "the audit XADD",
                    &["XADD", &audit, "NOMKSTREAM", "MAXLEN", "1", "*", "f", "v"],
                ),
                line("the audit XTRIM", &["XTRIM", &audit, "MINID", "0"]),
            ],
        }
    }

    /// `keeper_rights` from the answers to the reads then the writes (`None`: the server could
    /// not tell). A user that may not run the keeper's reads is not one a keeper runs under (a
    /// worker's user): `ok`, so that doctor run with a worker's configuration keeps its exit
    /// code. A user that may run the reads but not the writes is the risk: a keeper runs there
    /// (the exporter's documented user is read-only) and cannot put back what Redis lost.
    fn check(&self, rights: Option<&[bool]>) -> Check {
        const CHECK: &str = "keeper_rights";
        if self.reads.is_empty() {
            return Check::not_checked(SERVICE, CHECK, "no doctor dependency name");
        }
        let Some(rights) = rights.filter(|r| r.len() == self.reads.len() + self.writes.len())
        else {
            return Check::not_checked(
                SERVICE,
                CHECK,
                "the server cannot say what the user may run (redis.acl_check_cmd: Redis 7.0 and \
                 later, through EVALSHA)",
            );
        };
        let (read_rights, write_rights) = rights.split_at(self.reads.len());
        let refused = |probes: &[(&'static str, Vec<String>)], answers: &[bool]| -> Vec<&str> {
            let mut names: Vec<&str> = Vec::new();
            for ((what, _), may) in probes.iter().zip(answers) {
                if !may && !names.contains(what) {
                    names.push(what);
                }
            }
            names
        };
        let reads_refused = refused(&self.reads, read_rights);
        if !reads_refused.is_empty() {
            return Check::ok(
                SERVICE,
                CHECK,
                format!(
                    "no overrides keeper can run under this user: it may not run the keeper's \
                     reads ({}; redis.acl_check_cmd), as a worker's user may not; the keeper \
                     runs in budgetctl exporter and the console: run doctor under their user to \
                     check theirs",
                    reads_refused.join(", ")
                ),
            );
        }
        let writes_refused = refused(&self.writes, write_rights);
        if writes_refused.is_empty() {
            return Check::ok(
                SERVICE,
                CHECK,
                "the user may run what the overrides keeper runs: its reads, EVALSHA of \
                 override.lua and the commands it runs, and the audit XADD (redis.acl_check_cmd)",
            );
        }
        Check::risk(
            SERVICE,
            CHECK,
            format!(
                "the user may run the overrides keeper's reads but not its restore: refused {} \
                 (redis.acl_check_cmd)",
                writes_refused.join(", ")
            ),
            "a freeze lost to eviction is not put back: an operator's freeze or set override \
             that Redis loses (an allkeys-* eviction, FLUSHALL, a restart without persistence) \
             stays lost, and the frozen dependency grants its floor again; the exporter's or \
             console's keeper under this user only counts it \
             (fleet_budget_overrides_restore_failures_total{reason=\"noperm\"})",
            "run budgetctl exporter and the console under the operator's ACL user of \
             lua/README.md (fleet-operator), which may run override.lua and XADD; where no keeper \
             should write, turn it off (budgetctl exporter --keep-overrides-ms 0) and keep the \
             budgets' Redis at maxmemory-policy noeviction with persistence",
        )
    }
}

fn median_ms(samples: &[Duration]) -> f64 {
    let mut ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    ms.sort_by(f64::total_cmp);
    ms.get(ms.len() / 2).copied().unwrap_or(0.0)
}

fn max_ms(samples: &[Duration]) -> f64 {
    samples
        .iter()
        .map(|d| d.as_secs_f64() * 1000.0)
        .fold(0.0, f64::max)
}
