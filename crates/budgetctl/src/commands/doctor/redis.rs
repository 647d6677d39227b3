//! The Redis checks of `doctor`: the server, the settings of `fleet_budget::risks`, latency,
//! the scripts, `EVALSHA` and the key patterns under the user's ACL.
//!
//! Every call goes through `RedisStore::query` or `read_status` (the store's deadline). The one
//! key touched is the budget key of the dependency `fleet-budget-doctor`, read by `status.lua`
//! (which writes nothing), so doctor can run against a live fleet.

use std::time::{Duration, Instant};

use fleet_budget::keys::{budget_key, dead_letters_key, workers_key, workers_seen_key};
use fleet_budget::redact::redact_text;
use fleet_budget::risks::{self, Finding, short};
use fleet_budget::store::RedisStore;
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
    out.extend(server(&store).await);
    for risk in risks::read_redis_risks(&store).await {
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
    out.push(acl_keys(&store, config).await);
    (out, latency)
}

/// Version, mode (standalone, cluster, sentinel; a replica is a risk) and, on a cluster, slot
/// coverage. `HELLO` first (every user may send it, so no ACL refusal is logged), `INFO` else.
async fn server(store: &RedisStore) -> Vec<Check> {
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
        out.push(cluster_slots(store).await);
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

/// The commands the workers run on each kind of key, asked of `ACL DRYRUN` for the current user.
async fn acl_keys(store: &RedisStore, config: &WorkerConfig) -> Check {
    const CHECK: &str = "acl_keys";
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
    let prefix = &config.budget.redis.key_prefix;
    let Ok(dependency) = Dependency::new(DOCTOR_DEPENDENCY) else {
        return Check::not_checked(SERVICE, CHECK, "no doctor dependency name");
    };
    let budget = budget_key(prefix, &dependency);
    let dead = dead_letters_key(prefix, &Topology::new(&config.amqp).dead_queue);
    // The commands of the worker's ACL line (lua/README.md) that the scripts run, each on the
    // kind of key it runs on.
    let workers = workers_key(prefix);
    let seen = workers_seen_key(prefix);
    let line = |what: &'static str, words: &[&str]| -> (&'static str, Vec<String>) {
        (what, words.iter().map(|w| (*w).to_owned()).collect())
    };
    let probes: Vec<(&str, Vec<String>)> = vec![
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
    ];
    let mut denied: Vec<(String, String)> = Vec::new();
    for (what, args) in &probes {
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
    if denied.is_empty() {
        Check::ok(
            SERVICE,
            CHECK,
            format!(
                "user {user:?} may run the workers' commands on every kind of key under {prefix}:v1: (ACL DRYRUN)"
            ),
        )
    } else {
        Check::risk(
            SERVICE,
            CHECK,
            format!(
                "user {user:?} is refused {} of {} commands the workers run: {} (first: {})",
                denied.len(),
                probes.len(),
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
