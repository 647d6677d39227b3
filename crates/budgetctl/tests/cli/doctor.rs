//! `budgetctl doctor` against servers set up the way production sets them (issue 33): private
//! redis-servers with an eviction policy, with persistence, with `SCRIPT` renamed, with an ACL
//! user missing `EVALSHA` and keys; a private RabbitMQ node with the management plugin and a
//! `max-length` policy on the dead-letter queue; two such nodes joined in a cluster. Each risk is named with its check, the exit code
//! is the verdict (3 risk, 0 none), and every `--json` run is held to
//! `docs/schemas/doctor.schema.json` ([`crate::run`]).

use std::time::{Duration, Instant};

use fleet_budget::testing::{RedisServer, free_port};
use serde_json::Value;

use crate::{run, stdout};

#[path = "../../../../tests/game_day/rabbit_node.rs"]
#[allow(dead_code)]
mod rabbit_node;

/// `doctor --json` with the global flags `global` and doctor's own `args`: its exit code and
/// document.
fn doctor(global: &[&str], args: &[&str]) -> (i32, Value) {
    let mut all = global.to_vec();
    all.push("doctor");
    all.extend(args);
    all.push("--json");
    let o = run(&all);
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap_or_else(|e| {
        panic!(
            "doctor --json printed no JSON ({e}): {}\n{}",
            stdout(&o),
            crate::stderr(&o)
        )
    });
    (o.status.code().unwrap_or(-1), v)
}

/// The check `service`/`name` of a doctor document.
fn check<'a>(v: &'a Value, service: &str, name: &str) -> &'a Value {
    v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["service"] == service && c["check"] == name)
        .unwrap_or_else(|| panic!("no check {service}/{name} in {v:#}"))
}

fn redis_doctor(url: &str) -> (i32, Value) {
    doctor(&["--redis-url", url], &["--no-rabbitmq"])
}

#[test]
fn an_eviction_policy_is_named_with_what_it_costs() {
    let server = RedisServer::start_with(
        &["--maxmemory", "8mb", "--maxmemory-policy", "allkeys-lru"],
        &[],
    );
    let (code, v) = redis_doctor(&server.url());
    let c = check(&v, "redis", "maxmemory_policy");
    eprintln!("exit {code}; maxmemory_policy: {c:#}");
    assert_eq!(c["state"], "risk", "{v:#}");
    assert!(c["found"].as_str().unwrap().contains("allkeys-lru"), "{c}");
    assert!(c["cost"].as_str().unwrap().contains("freeze"), "{c}");
    assert!(c["action"].as_str().unwrap().contains("noeviction"), "{c}");
    assert_eq!(v["verdict"], "risk");
    assert_eq!(code, 3, "a risk exits 3");

    // The text names it too, with the cost and what to do.
    let o = run(&["--redis-url", &server.url(), "doctor", "--no-rabbitmq"]);
    assert_eq!(o.status.code(), Some(3));
    let text = stdout(&o);
    assert!(text.contains("RISK redis maxmemory_policy"), "{text}");
    assert!(text.contains("what it costs:"), "{text}");
    assert!(text.contains("what to do:"), "{text}");
}

#[test]
fn noeviction_with_persistence_is_no_risk() {
    let server = RedisServer::start_with(
        &["--maxmemory-policy", "noeviction", "--appendonly", "yes"],
        &[],
    );
    let (code, v) = redis_doctor(&server.url());
    eprintln!("exit {code}; latency {}", v["latency"]);
    assert_eq!(
        check(&v, "redis", "maxmemory_policy")["state"],
        "ok",
        "{v:#}"
    );
    assert_eq!(check(&v, "redis", "persistence")["state"], "ok", "{v:#}");
    for name in [
        "reachable",
        "version",
        "mode",
        "scripts",
        "evalsha",
        "acl_keys",
    ] {
        assert_eq!(check(&v, "redis", name)["state"], "ok", "{name}: {v:#}");
    }
    assert_eq!(v["risks"], 0, "{v:#}");
    assert_eq!(code, 0, "no risk, every check made: exit 0");
    assert!(v["latency"]["samples"].as_u64().unwrap() >= 1, "{v:#}");
}

#[test]
fn a_redis_without_persistence_is_named() {
    // The harness's default: `--save ""`, `--appendonly no`.
    let server = RedisServer::start();
    let (code, v) = redis_doctor(&server.url());
    let c = check(&v, "redis", "persistence");
    assert_eq!(c["state"], "risk", "{v:#}");
    assert!(c["cost"].as_str().unwrap().contains("restart"), "{c}");
    assert_eq!(code, 3);
}

#[test]
fn a_renamed_script_command_is_named() {
    let server = RedisServer::start_with(
        &["--rename-command", "SCRIPT", "fleet-doctor-hidden-script"],
        &[],
    );
    let (code, v) = redis_doctor(&server.url());
    let c = check(&v, "redis", "scripts");
    eprintln!("exit {code}; scripts: {c:#}");
    assert_eq!(c["state"], "risk", "{v:#}");
    assert!(c["found"].as_str().unwrap().contains("renamed"), "{c}");
    // EVALSHA of a script the server never cached needs SCRIPT LOAD: refused too.
    assert_eq!(check(&v, "redis", "evalsha")["state"], "risk", "{v:#}");
    assert_eq!(code, 3);
}

#[test]
fn an_acl_user_missing_evalsha_and_keys_is_named() {
    let server = RedisServer::start();
    // Every command but EVALSHA, and only the budget keys (not the worker registry nor the
    // dead-letter index).
    let ok: String = server.cmd(&[
        "ACL",
        "SETUSER",
        "doctor-partial",
        "on",
        ">doctor-pw",
        "resetkeys",
        "~fb:v1:{*}",
        "+@all",
        "-evalsha",
    ]);
    assert_eq!(ok, "OK");
    let url = format!(
        "redis://doctor-partial:doctor-pw@127.0.0.1:{}",
        server.port()
    );
    let (code, v) = redis_doctor(&url);
    let evalsha = check(&v, "redis", "evalsha");
    let keys = check(&v, "redis", "acl_keys");
    eprintln!("exit {code}; evalsha: {evalsha:#}; acl_keys: {keys:#}");
    assert_eq!(evalsha["state"], "risk", "{v:#}");
    assert!(
        evalsha["found"]
            .as_str()
            .unwrap()
            .contains("no permissions to run the 'evalsha'"),
        "{evalsha}"
    );
    assert_eq!(keys["state"], "risk", "{v:#}");
    let found = keys["found"].as_str().unwrap();
    assert!(found.contains("worker registry"), "{found}");
    assert!(found.contains("dead-letter index"), "{found}");
    assert!(
        !found.contains("budget HSET"),
        "the budget keys are granted: {found}"
    );
    assert_eq!(code, 3);
    // The password never prints.
    assert!(!v.to_string().contains("doctor-pw"), "{v}");
}

#[test]
fn a_documented_least_privilege_user_reads_the_policy_from_info_and_guesses_no_rdb() {
    // The worker's ACL line of lua/README.md grants no CONFIG, and INFO of two sections only.
    let server = RedisServer::start();
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../lua/README.md"))
            .unwrap();
    let line = readme
        .lines()
        .find(|l| l.starts_with("ACL SETUSER fleet-worker "))
        .unwrap()
        .replace(">CHANGE-ME", ">worker-pw");
    let args: Vec<&str> = line.split_whitespace().collect();
    let ok: String = server.cmd(&args);
    assert_eq!(ok, "OK");
    let url = format!("redis://fleet-worker:worker-pw@127.0.0.1:{}", server.port());
    let (code, v) = redis_doctor(&url);
    eprintln!("exit {code}: {v:#}");
    let policy = check(&v, "redis", "maxmemory_policy");
    assert_eq!(policy["state"], "ok", "{policy}");
    assert!(
        policy["found"].as_str().unwrap().contains("(INFO memory)"),
        "{policy}"
    );
    // INFO shows AOF off but not the RDB schedule: not checked, not guessed.
    let persistence = check(&v, "redis", "persistence");
    assert_eq!(persistence["state"], "not_checked", "{persistence}");
    let found = persistence["found"].as_str().unwrap();
    assert!(found.contains("AOF off (INFO persistence)"), "{found}");
    assert!(
        found.contains("not sent: the user may not run it"),
        "CONFIG GET asked of the server's rights, not sent: {found}"
    );
    // HELLO answers every user: the version is known all the same.
    assert_eq!(check(&v, "redis", "version")["state"], "ok", "{v:#}");
    assert_eq!(check(&v, "redis", "evalsha")["state"], "ok", "{v:#}");
    let keys = check(&v, "redis", "acl_keys");
    assert_eq!(keys["state"], "ok", "{keys}");
    assert!(
        keys["found"]
            .as_str()
            .unwrap()
            .contains("redis.acl_check_cmd"),
        "{keys}"
    );
    assert_eq!(code, 4, "nothing at risk, some checks not made: exit 4");
}

/// Issue 33: doctor asks the server what the user may run (`redis.acl_check_cmd`) before it
/// sends `CONFIG GET`, `CLUSTER INFO` or `ACL`, so a run under each user of lua/README.md leaves
/// `ACL LOG` empty; the default user still reads the RDB schedule with `CONFIG GET`.
#[test]
fn doctor_under_the_documented_users_leaves_acl_log_empty() {
    let server = RedisServer::start();
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../lua/README.md"))
            .unwrap();
    let users: Vec<String> = readme
        .lines()
        .filter(|l| l.starts_with("ACL SETUSER "))
        .map(|l| l.replace(">CHANGE-ME", ">doctor-pw"))
        .collect();
    assert_eq!(users.len(), 3, "worker, read-only, operator");
    for line in &users {
        let args: Vec<&str> = line.split_whitespace().collect();
        let ok: String = server.cmd(&args);
        assert_eq!(ok, "OK");
    }
    let _: String = server.cmd(&["ACL", "LOG", "RESET"]);
    for line in &users {
        let user = line.split_whitespace().nth(2).unwrap();
        let url = format!("redis://{user}:doctor-pw@127.0.0.1:{}", server.port());
        let (code, v) = redis_doctor(&url);
        let log: Vec<redis::Value> = server.cmd(&["ACL", "LOG"]);
        let persistence = check(&v, "redis", "persistence");
        let keys = check(&v, "redis", "acl_keys");
        println!(
            "doctor as {user}: exit {code}; ACL LOG entries {}; persistence {}: {}; acl_keys {}",
            log.len(),
            persistence["state"],
            persistence["found"],
            keys["state"]
        );
        assert!(log.is_empty(), "{user}: refused {log:?}");
        assert_eq!(
            check(&v, "redis", "maxmemory_policy")["state"],
            "ok",
            "{v:#}"
        );
    }
    // The default user may run CONFIG GET: the RDB schedule is read.
    let (_, v) = redis_doctor(&server.url());
    let persistence = check(&v, "redis", "persistence");
    assert!(
        persistence["found"]
            .as_str()
            .unwrap()
            .contains("CONFIG GET save"),
        "{persistence}"
    );
}

/// `redis/keeper_rights` (issue 33): whether the user doctor runs as may run what the overrides
/// keeper runs (its reads, `EVALSHA` of `override.lua` and the commands inside it, the audit
/// `XADD`). Under each ACL user of lua/README.md: `fleet-readonly`, the exporter's documented
/// user, may read but not restore, a risk that says what it costs; `fleet-operator` and the
/// default user may restore; `fleet-worker` may not even read what the keeper reads, so no keeper
/// runs under it and doctor run with a worker's configuration keeps its exit code (0 on this
/// Redis, with AOF on). Nothing is refused (`ACL LOG` empty): the rights are asked.
#[test]
fn the_keeper_s_rights_are_a_risk_only_under_a_user_a_keeper_runs_as() {
    let server = RedisServer::start_with(&["--appendonly", "yes"], &[]);
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../lua/README.md"))
            .unwrap();
    for line in readme.lines().filter(|l| l.starts_with("ACL SETUSER ")) {
        let line = line.replace(">CHANGE-ME", ">keeper-pw");
        let args: Vec<&str> = line.split_whitespace().collect();
        let ok: String = server.cmd(&args);
        assert_eq!(ok, "OK");
    }
    let _: String = server.cmd(&["ACL", "LOG", "RESET"]);
    let mut seen = Vec::new();
    for user in [
        "fleet-worker",
        "fleet-readonly",
        "fleet-operator",
        "default",
    ] {
        let url = if user == "default" {
            server.url()
        } else {
            format!("redis://{user}:keeper-pw@127.0.0.1:{}", server.port())
        };
        let (code, v) = redis_doctor(&url);
        let c = check(&v, "redis", "keeper_rights").clone();
        println!(
            "doctor as {user}: exit {code}; keeper_rights {}: {}",
            c["state"], c["found"]
        );
        seen.push((user, code, c, v));
    }
    let log: Vec<redis::Value> = server.cmd(&["ACL", "LOG"]);
    assert!(log.is_empty(), "nothing refused: {log:?}");
    for (user, code, c, v) in &seen {
        match *user {
            "fleet-readonly" => {
                assert_eq!(c["state"], "risk", "{v:#}");
                let found = c["found"].as_str().unwrap();
                // EVALSHA is granted; the writes inside override.lua are not.
                assert!(found.contains("override.lua's HSET"), "{found}");
                assert!(found.contains("the audit XADD"), "{found}");
                assert!(
                    c["cost"]
                        .as_str()
                        .unwrap()
                        .contains("a freeze lost to eviction is not put back"),
                    "{c}"
                );
                assert!(
                    c["action"].as_str().unwrap().contains("fleet-operator"),
                    "{c}"
                );
                assert_eq!(*code, 3, "a risk exits 3");
            }
            "fleet-worker" => {
                assert_eq!(c["state"], "ok", "{v:#}");
                assert!(
                    c["found"]
                        .as_str()
                        .unwrap()
                        .contains("no overrides keeper can run under this user"),
                    "{c}"
                );
                assert_eq!(
                    v["risks"], 0,
                    "a worker's user: no risk from the keeper's rights: {v:#}"
                );
                assert_eq!(
                    *code, 0,
                    "a worker's user on a sound Redis: exit 0, as before"
                );
            }
            _ => {
                assert_eq!(c["state"], "ok", "{user}: {v:#}");
                assert!(
                    c["found"]
                        .as_str()
                        .unwrap()
                        .contains("may run what the overrides keeper runs"),
                    "{c}"
                );
            }
        }
    }
    // The text names the risk with what it costs and what to do.
    let url = format!(
        "redis://fleet-readonly:keeper-pw@127.0.0.1:{}",
        server.port()
    );
    let o = run(&["--redis-url", &url, "doctor", "--no-rabbitmq"]);
    let text = stdout(&o);
    assert!(text.contains("RISK redis keeper_rights"), "{text}");
    assert!(!text.contains("keeper-pw"), "{text}");
}

/// A private RabbitMQ node with the management plugin on a free port (never the shared broker).
async fn node_with_management() -> (rabbit_node::RabbitNode, u16) {
    rabbit_node::RabbitNode::installed().unwrap();
    let port = free_port();
    let management = free_port();
    let mut node = rabbit_node::RabbitNode::prepare(
        std::env::temp_dir().join(format!("fleet-budget-doctor-rabbit-{port}")),
        format!("fbdoctor{}x{port}@localhost", std::process::id()),
        port,
        &format!(
            "management.tcp.port = {management}\nmanagement.tcp.ip = 127.0.0.1\ncollect_statistics_interval = 500\n"
        ),
        Duration::from_secs(120),
    )
    .unwrap();
    // rabbitmq-plugins with this node's environment, offline: its enabled_plugins file only.
    node.cli(
        "rabbitmq-plugins",
        &["enable", "--offline", "rabbitmq_management"],
    )
    .or_else(|_| {
        std::fs::write(node.dir.join("enabled_plugins"), "[rabbitmq_management].\n")
            .map(|()| String::new())
            .map_err(|e| e.to_string())
    })
    .unwrap();
    node.spawn().unwrap();
    node.wait_ready().await.unwrap();
    (node, management)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_length_limit_policy_on_the_dead_letter_queue_is_named() {
    let (node, management) = node_with_management().await;
    let amqp = node.url();
    let global = ["--amqp-url", amqp.as_str()];
    let o = run(&["--amqp-url", &amqp, "migrate", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", crate::stderr(&o));
    node.ctl(&[
        "set_policy",
        "--apply-to",
        "queues",
        "dl-cap",
        r"^fleet\.dead$",
        r#"{"max-length":1000}"#,
    ])
    .unwrap();
    // And an operator policy (set by whoever runs the broker) deleting parked jobs after a minute.
    node.ctl(&[
        "set_operator_policy",
        "--apply-to",
        "queues",
        "parked-ttl",
        r"^fleet\.parked$",
        r#"{"message-ttl":60000}"#,
    ])
    .unwrap();
    let url = format!("http://guest:guest@127.0.0.1:{management}");
    // The management API shows a queue's policy once its statistics are collected (every
    // 500 ms here): asked again until it does, within a bound.
    let deadline = Instant::now() + Duration::from_secs(90);
    let (code, v) = loop {
        let (code, v) = doctor(&global, &["--no-redis", "--rabbitmq-management-url", &url]);
        let found = check(&v, "rabbitmq", "policies")["found"].to_string();
        let named = found.contains("max-length") && found.contains("message-ttl");
        if named || Instant::now() > deadline {
            break (code, v);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    eprintln!("exit {code}: {v:#}");
    let c = check(&v, "rabbitmq", "policies");
    assert_eq!(c["state"], "risk", "{v:#}");
    let found = c["found"].as_str().unwrap();
    assert!(found.contains("fleet.dead: max-length=1000"), "{found}");
    assert!(found.contains("dl-cap"), "{found}");
    assert!(
        found.contains("fleet.parked: message-ttl=60000 (operator policy \"parked-ttl\")"),
        "{found}"
    );
    assert!(c["cost"].as_str().unwrap().contains("dead letter"), "{c}");
    for name in [
        "reachable",
        "topology",
        "version",
        "quorum_queues",
        "alarms",
    ] {
        assert_eq!(check(&v, "rabbitmq", name)["state"], "ok", "{name}: {v:#}");
    }
    assert_eq!(code, 3);
    assert!(
        !v.to_string().contains("guest:guest"),
        "credentials printed: {v}"
    );

    // Wrong credentials: the management checks are not made, say why, and print no password.
    let wrong = format!("http://guest:not-the-password@127.0.0.1:{management}");
    let (code, v) = doctor(
        &global,
        &["--no-redis", "--rabbitmq-management-url", &wrong],
    );
    let c = check(&v, "rabbitmq", "policies");
    assert_eq!(c["state"], "not_checked", "{v:#}");
    assert!(c["found"].as_str().unwrap().contains("401"), "{c}");
    assert!(!v.to_string().contains("not-the-password"), "{v}");
    assert_eq!(code, 4, "{v:#}");

    // Without the policy: the same queues, no risk named by the policies check.
    node.ctl(&["clear_policy", "dl-cap"]).unwrap();
    node.ctl(&["clear_operator_policy", "parked-ttl"]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(90);
    let v = loop {
        let (_, v) = doctor(&global, &["--no-redis", "--rabbitmq-management-url", &url]);
        if check(&v, "rabbitmq", "policies")["state"] == "ok" || Instant::now() > deadline {
            break v;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(check(&v, "rabbitmq", "policies")["state"], "ok", "{v:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_topology_a_memory_alarm_and_a_lease_past_consumer_timeout_are_named() {
    let (node, management) = node_with_management().await;
    let amqp = node.url();
    // Without the management API: the topology is still checked, the rest says why not.
    let (code, v) = doctor(&["--amqp-url", &amqp], &["--no-redis"]);
    let c = check(&v, "rabbitmq", "topology");
    assert_eq!(c["state"], "risk", "{v:#}");
    assert!(c["found"].as_str().unwrap().contains("version 0 of"), "{c}");
    assert!(
        c["action"].as_str().unwrap().contains("budgetctl migrate"),
        "{c}"
    );
    assert_eq!(check(&v, "rabbitmq", "policies")["state"], "not_checked");
    assert_eq!(code, 3);

    // A lease of an hour: a job may hold its delivery past the default consumer_timeout.
    let config = crate::temp_file(
        "doctor-long-lease.toml",
        "[dependencies.slow]\ntasks = [\"t\"]\n[dependencies.slow.concurrency]\ncap = 4\n\
         planned_primary = 2\nlease_secs = 3600\n",
    );
    // The memory alarm: a watermark no node is under.
    node.ctl(&["set_vm_memory_high_watermark", "0.000001"])
        .unwrap();
    // No credentials in the management URL: those of the AMQP URL.
    let url = format!("http://127.0.0.1:{management}");
    let global = [
        "--config",
        config.to_str().unwrap(),
        "--amqp-url",
        amqp.as_str(),
    ];
    let deadline = Instant::now() + Duration::from_secs(90);
    let v = loop {
        let (_, v) = doctor(&global, &["--no-redis", "--rabbitmq-management-url", &url]);
        if check(&v, "rabbitmq", "alarms")["state"] == "risk" || Instant::now() > deadline {
            break v;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    eprintln!("{v:#}");
    let alarms = check(&v, "rabbitmq", "alarms");
    assert_eq!(alarms["state"], "risk", "{v:#}");
    assert!(
        alarms["found"].as_str().unwrap().contains("memory alarm"),
        "{alarms}"
    );
    let timeout = check(&v, "rabbitmq", "consumer_timeout");
    assert_eq!(timeout["state"], "risk", "{v:#}");
    assert!(
        timeout["found"].as_str().unwrap().contains("1h"),
        "{timeout}"
    );
    // 3.10 keeps the timeout node-wide only, which the management API does not show: said.
    let found = timeout["found"].as_str().unwrap();
    assert!(
        found.contains("only the node-wide consumer_timeout")
            && found.contains("management API does not show"),
        "{timeout}"
    );
    assert!(!v.to_string().contains("guest:guest"), "{v}");
    node.ctl(&["set_vm_memory_high_watermark", "0.4"]).unwrap();
}

#[test]
fn the_exporter_serves_the_redis_risks() {
    let evicting = RedisServer::start_with(&["--maxmemory-policy", "allkeys-lru"], &[]);
    let run =
        crate::redaction::exporter_once(&["--redis-url", &evicting.url()], &["--no-rabbitmq"], &[]);
    let risks: Vec<&str> = run
        .scrape
        .lines()
        .filter(|l| l.starts_with("fleet_budget_redis_risk"))
        .collect();
    eprintln!("{risks:#?}");
    assert!(
        risks.contains(&"fleet_budget_redis_risk{check=\"maxmemory_policy\"} 1"),
        "{}",
        run.scrape
    );
    assert!(
        risks.contains(&"fleet_budget_redis_risk{check=\"persistence\"} 1"),
        "{}",
        run.scrape
    );

    let safe = RedisServer::start_with(
        &["--maxmemory-policy", "noeviction", "--appendonly", "yes"],
        &[],
    );
    let run =
        crate::redaction::exporter_once(&["--redis-url", &safe.url()], &["--no-rabbitmq"], &[]);
    for check in ["maxmemory_policy", "persistence"] {
        let line = format!("fleet_budget_redis_risk{{check=\"{check}\"}} 0");
        assert!(run.scrape.contains(&line), "{line}: {}", run.scrape);
    }
}

/// What a subscriber wrote, shared with the test.
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// A worker's budget logs the Redis risks once when its store is made (the task it spawns runs on
/// this test's one thread, under this test's subscriber).
#[tokio::test(flavor = "current_thread")]
async fn a_worker_logs_the_redis_risks_once_at_start() {
    let server = RedisServer::start_with(&["--maxmemory-policy", "volatile-lru"], &[]);
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let config = fleet_budget::Config::from_toml(
        &format!("[redis]\nurl = \"{}\"\n", server.url()),
        "inline",
    )
    .unwrap();
    let budget = fleet_budget::FleetBudget::from_config(&config)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !captured.text().contains("persistence") && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let text = captured.text();
    eprintln!("{text}");
    assert_eq!(
        text.matches("Redis risk: maxmemory-policy volatile-lru")
            .count(),
        1,
        "{text}"
    );
    assert_eq!(text.matches("Redis risk: RDB off").count(), 1, "{text}");
    assert!(text.contains("budgetctl doctor"), "{text}");
    budget.shutdown().await.unwrap();
}

#[test]
fn a_cluster_s_mode_and_slots_are_checked() {
    let cluster =
        fleet_budget::testing::RedisCluster::start_with(3, &["--maxmemory-policy", "volatile-lru"]);
    let urls: Vec<String> = cluster.urls().iter().map(|u| format!("\"{u}\"")).collect();
    let config = crate::temp_file(
        "doctor-cluster.toml",
        &format!("[redis]\ncluster_urls = [{}]\n", urls.join(", ")),
    );
    let (code, v) = doctor(&["--config", config.to_str().unwrap()], &["--no-rabbitmq"]);
    eprintln!("exit {code}: {v:#}");
    let mode = check(&v, "redis", "mode");
    assert!(
        mode["found"].as_str().unwrap().starts_with("cluster"),
        "{mode}"
    );
    assert_eq!(check(&v, "redis", "cluster_slots")["state"], "ok", "{v:#}");
    assert_eq!(
        check(&v, "redis", "maxmemory_policy")["state"],
        "risk",
        "{v:#}"
    );
    assert_eq!(check(&v, "redis", "scripts")["state"], "ok", "{v:#}");
    assert_eq!(check(&v, "redis", "evalsha")["state"], "ok", "{v:#}");
    assert_eq!(code, 3);
}

#[test]
fn a_replica_is_named() {
    let primary = RedisServer::start();
    let port = primary.port().to_string();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port], &[]);
    let (code, v) = redis_doctor(&replica.url());
    let mode = check(&v, "redis", "mode");
    eprintln!("exit {code}; mode: {mode:#}");
    assert_eq!(mode["state"], "risk", "{v:#}");
    assert!(
        mode["found"].as_str().unwrap().contains("role replica"),
        "{mode}"
    );
    assert!(
        mode["cost"].as_str().unwrap().contains("READONLY"),
        "{mode}"
    );
    assert_eq!(code, 3);
}

/// A cluster of two private nodes, the first with the management plugin: RabbitMQ before
/// 3.10.20 (this machine's 3.10.8) is a risk there, named with the fix's versions and the guide;
/// the single node of [`node_with_management`] said it was ok, and why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_without_the_dead_letter_worker_fixes_is_a_risk() {
    let (first, management) = node_with_management().await;
    let port = free_port();
    let mut second = rabbit_node::RabbitNode::prepare(
        std::env::temp_dir().join(format!("fleet-budget-doctor-rabbit-{port}")),
        format!("fbdoctor{}x{port}@localhost", std::process::id()),
        port,
        "",
        Duration::from_secs(120),
    )
    .unwrap();
    // The first node's Erlang cookie, for the second to join its cluster.
    let cookie = first.dir.join("home").join(".erlang.cookie");
    let copied = second.dir.join("home").join(".erlang.cookie");
    std::fs::copy(&cookie, &copied).unwrap();
    second.spawn().unwrap();
    second.wait_ready().await.unwrap();
    second.ctl(&["stop_app"]).unwrap();
    second.ctl(&["join_cluster", &first.node]).unwrap();
    second.ctl(&["start_app"]).unwrap();
    second.wait_ready().await.unwrap();

    let amqp = first.url();
    let global = ["--amqp-url", amqp.as_str()];
    let url = format!("http://guest:guest@127.0.0.1:{management}");
    // The management API lists a joined node once its statistics are collected.
    let deadline = Instant::now() + Duration::from_secs(90);
    let (code, v) = loop {
        let (code, v) = doctor(&global, &["--no-redis", "--rabbitmq-management-url", &url]);
        let found = check(&v, "rabbitmq", "version")["found"].to_string();
        if found.contains("2 nodes") || Instant::now() > deadline {
            break (code, v);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    eprintln!("exit {code}: {v:#}");
    let c = check(&v, "rabbitmq", "version");
    let found = c["found"].as_str().unwrap();
    let version = found
        .strip_prefix("RabbitMQ ")
        .and_then(|r| r.split([',', ' ']).next())
        .unwrap_or_default()
        .to_owned();
    let n: Vec<u32> = version.split('.').filter_map(|p| p.parse().ok()).collect();
    let unfixed = matches!(n.as_slice(), [3, 8 | 9, ..])
        || matches!(n.as_slice(), [3, 10, p, ..] if *p < 20)
        || matches!(n.as_slice(), [3, 11, p, ..] if *p < 12);
    if unfixed {
        assert_eq!(c["state"], "risk", "{v:#}");
        assert!(found.contains("a cluster of 2 nodes"), "{found}");
        assert!(c["cost"].as_str().unwrap().contains("messages_dlx"), "{c}");
        let action = c["action"].as_str().unwrap();
        assert!(
            action.contains("3.10.20") && action.contains("docs/guides/broker-cluster.md"),
            "{action}"
        );
        assert_eq!(code, 3, "a risk exits 3");
    } else {
        assert_eq!(c["state"], "ok", "RabbitMQ {version} has the fixes: {v:#}");
    }
    drop(second);
    drop(first);
}
