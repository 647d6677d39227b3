//! Least privilege: the Redis users of `lua/README.md` (read from it, not copied) on a private
//! server. The worker path runs under `fleet-worker`, `status` under `fleet-readonly` and `bench`
//! under `fleet-operator`, authenticated by the user name in the URL, with nothing refused
//! (`ACL LOG` stays empty); the same users are refused on another prefix, and the read-only
//! user cannot write.

use std::time::Duration;

use fleet_budget::store::{BudgetStore, RedisStore, RedisTarget};
use fleet_budget::testing::RedisServer;
use fleet_budget::{
    Admission, BudgetSource, CallOutcome, Config, Decision, Dependency, Failure, FleetBudget,
};

use crate::{assert_exit, json, run_with};

const PASSWORD: &str = "acl-test-pw";

/// The `ACL SETUSER` lines of lua/README.md, with the test's password.
fn documented_users() -> Vec<Vec<String>> {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../lua/README.md"))
            .expect("read lua/README.md");
    let users: Vec<Vec<String>> = readme
        .lines()
        .filter(|l| l.starts_with("ACL SETUSER "))
        .map(|l| {
            l.split_whitespace()
                .map(|w| {
                    if w == ">CHANGE-ME" {
                        format!(">{PASSWORD}")
                    } else {
                        w.to_owned()
                    }
                })
                .collect()
        })
        .collect();
    assert_eq!(
        users.len(),
        3,
        "lua/README.md lists the worker, read-only and operator users"
    );
    users
}

fn server_with_users() -> RedisServer {
    let server = RedisServer::start();
    for user in documented_users() {
        let args: Vec<&str> = user.iter().map(String::as_str).collect();
        let ok: String = server.cmd(&args);
        assert_eq!(ok, "OK", "{args:?}");
    }
    let _: String = server.cmd(&["ACL", "LOG", "RESET"]);
    server
}

fn url(server: &RedisServer, user: &str) -> String {
    format!("redis://{user}:{PASSWORD}@127.0.0.1:{}", server.port())
}

/// What Redis refused since the last reset: one entry per refused command, key or auth.
fn refused(server: &RedisServer) -> Vec<String> {
    let log: Vec<redis::Value> = server.cmd(&["ACL", "LOG"]);
    log.iter().map(|entry| format!("{entry:?}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_users_are_enough_and_no_more() {
    let server = server_with_users();

    // bench under the operator (first: it refuses a prefix holding budgets it did not make).
    let operator = url(&server, "fleet-operator");
    let v = json(&run_with(
        &["--redis-url", operator.as_str()],
        "bench --dependency bench-acl --successes 50 --retries 20 --json",
    ));
    assert_eq!(v["retries_granted"], 10, "{v}");

    // The worker path: attempts, successes, a retry decided by the fleet budget, the flush.
    let text = format!(
        "[redis]\nurl = \"{}\"\ntimeout_ms = 2000\nfallback = \"deny\"\n[dependencies.search]\ntasks = [\"index\"]\n",
        url(&server, "fleet-worker")
    );
    let config = Config::from_toml(&text, "acl.toml").unwrap();
    let budget = FleetBudget::from_config(&config).await.unwrap();
    for _ in 0..20 {
        budget.on_attempt("index", 1).await.unwrap();
        budget.on_success("index").await.unwrap();
    }
    budget.on_attempt("index", 1).await.unwrap();
    let decision = budget
        .on_failure("index", 1, &Failure::retryable("503"))
        .await
        .unwrap();
    assert!(
        matches!(
            decision,
            Decision::Retry {
                source: BudgetSource::Fleet,
                ..
            }
        ),
        "{decision:?}"
    );
    budget.shutdown().await.unwrap();
    let (_, source) = budget.status(&Dependency::new("search").unwrap()).await;
    assert_eq!(source, BudgetSource::Fleet);

    // status under the read-only user: both budgets, found with SCAN.
    let readonly = url(&server, "fleet-readonly");
    let v = json(&run_with(
        &["--redis-url", readonly.as_str()],
        "status --json",
    ));
    let deps = v["dependencies"].as_array().unwrap();
    let search = deps
        .iter()
        .find(|d| d["dependency"] == "search")
        .expect("search listed");
    assert_eq!(search["successes"], 20, "{v}");
    assert!(deps.iter().any(|d| d["dependency"] == "bench-acl"), "{v}");

    // exporter under the read-only user: one scrape reads every budget (and discovery SCANs).
    let deps = crate::temp_file(
        "acl-exporter.toml",
        "[dependencies.search]\ntasks = [\"index\"]\n",
    );
    let e = crate::redaction::exporter_once(
        &[
            "--config",
            deps.to_str().unwrap(),
            "--redis-url",
            readonly.as_str(),
        ],
        &["--no-rabbitmq"],
        &[],
    );
    assert!(e.served, "{}", e.stderr);
    assert!(
        e.scrape
            .contains("fleet_budget_exporter_up{source=\"redis\"} 1"),
        "{}",
        e.scrape
    );
    assert!(e.scrape.contains("dependency=\"search\""), "{}", e.scrape);
    assert!(!e.stderr.contains(PASSWORD) && !e.scrape.contains(PASSWORD));

    assert_eq!(
        refused(&server),
        Vec::<String>::new(),
        "nothing may be refused"
    );

    // The same users on another prefix: refused, named.
    let store = RedisStore::new(
        RedisTarget::Single(url(&server, "fleet-worker")),
        "other",
        Duration::from_secs(2),
    )
    .unwrap();
    let dep = Dependency::new("search").unwrap();
    let e = store
        .withdraw(&dep, &fleet_budget::BudgetPolicy::default())
        .await
        .unwrap_err();
    assert!(e.to_string().to_lowercase().contains("noperm"), "{e}");
    let o = run_with(
        &["--redis-url", operator.as_str(), "--key-prefix", "other"],
        "bench --dependency search --successes 5 --retries 1",
    );
    assert_exit(&o, 1, "no permissions");
    assert!(!String::from_utf8_lossy(&o.stderr).contains(PASSWORD));

    // The read-only user cannot write, even through a script.
    let store =
        RedisStore::new(RedisTarget::Single(readonly), "fb", Duration::from_secs(2)).unwrap();
    let hash = |server: &RedisServer| -> Vec<String> { server.cmd(&["HGETALL", "fb:v1:{search}"]) };
    let before = hash(&server);
    assert!(!before.is_empty());
    let e = store
        .withdraw(&dep, &fleet_budget::BudgetPolicy::default())
        .await
        .unwrap_err();
    assert!(e.to_string().contains("can't run this command"), "{e}");
    assert_eq!(hash(&server), before, "nothing written");
    // A wrong password for a documented user is refused too.
    let e = RedisStore::new(
        RedisTarget::Single(format!(
            "redis://fleet-worker:wrong@127.0.0.1:{}",
            server.port()
        )),
        "fb",
        Duration::from_secs(2),
    )
    .unwrap()
    .ping()
    .await
    .unwrap_err();
    assert!(!e.to_string().contains("wrong@"), "{e}");
    // The refusals above are what ACL LOG holds now: it does record them.
    assert!(refused(&server).len() >= 2, "{:?}", refused(&server));
}

/// A dependency with a concurrency budget and a circuit breaker: the leases
/// (`lease_acquire.lua`, `lease_release.lua`) and every step of `breaker.lua` (admit, record, the
/// transition to open, a hold) run under `fleet-worker`, and `status` reads the breaker under
/// `fleet-readonly`, with nothing refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_users_run_the_leases_and_the_breaker() {
    let server = server_with_users();
    let sections = "[dependencies.paid]\ntasks = [\"charge\"]\n\
                    [dependencies.paid.concurrency]\ncap = 4\nplanned_primary = 2\n\
                    [dependencies.paid.breaker]\nmin_volume = 3\nfailure_ratio = 0.5\nopen_secs = 600\n";
    let text = format!(
        "[redis]\nurl = \"{}\"\ntimeout_ms = 2000\nfallback = \"deny\"\n{sections}",
        url(&server, "fleet-worker")
    );
    let config = Config::from_toml(&text, "acl.toml").unwrap();
    let budget = FleetBudget::from_config(&config).await.unwrap();
    for _ in 0..3 {
        let Admission::Run(call) = budget.admit("charge", 1, None).await.unwrap() else {
            panic!("a closed breaker and a free slot run the call");
        };
        assert!(
            call.lease().is_some(),
            "the call holds a fleet-wide slot; refused: {:?}",
            refused(&server)
        );
        budget.finish(call, CallOutcome::Failed).await;
    }
    let held = budget.admit("charge", 1, None).await.unwrap();
    assert!(
        matches!(held, Admission::Wait(_)),
        "three failures of three calls open the breaker: {held:?}"
    );
    budget.shutdown().await.unwrap();

    let file = crate::temp_file("acl-breaker.toml", sections);
    let readonly = url(&server, "fleet-readonly");
    let v = json(&run_with(
        &[
            "--config",
            file.to_str().unwrap(),
            "--redis-url",
            readonly.as_str(),
        ],
        "status --json",
    ));
    let paid = v["dependencies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["dependency"] == "paid")
        .expect("paid listed");
    assert_eq!(paid["breaker"]["state"], "open", "{v}");

    assert_eq!(
        refused(&server),
        Vec::<String>::new(),
        "nothing may be refused"
    );
}

/// The dead letters under the documented users: a worker counts what it dead-letters into the
/// index (`dead_letters.lua`, the worker's `Tally`) under `fleet-worker`, `dlq stats` reads it
/// under `fleet-readonly`, and a replay (its intent, journal, claims, index changes and end
/// entry) runs under `fleet-operator`, with nothing refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_users_count_look_at_and_replay_dead_letters() {
    use fleet_budget::control::DeadLetterIndex;
    use fleet_budget_amqp::dead_letters::{Row, Tally};
    use fleet_budget_amqp::testing::TestBroker;

    let server = server_with_users();
    let broker = TestBroker::new("acl-dlq");
    broker.migrate().await;
    let publisher = broker.publisher().await;
    let record = broker.dead_letter_record(
        "search",
        fleet_budget::DeadLetterReason::BudgetExhausted,
        fleet_budget::clock::now_ms(),
    );
    let mut ids = Vec::new();
    for i in 0..30 {
        ids.push(
            broker
                .publish_dead_letter(&publisher, &record, format!("job {i}").as_bytes())
                .await,
        );
    }
    publisher.close().await;

    // The worker's count, under fleet-worker, as its dead-letter path does it.
    let worker = std::sync::Arc::new(
        RedisStore::new(
            RedisTarget::Single(url(&server, "fleet-worker")),
            "fb",
            Duration::from_secs(2),
        )
        .unwrap(),
    );
    let tally = Tally::new(DeadLetterIndex::new(worker));
    let row = Row::of_record(&record);
    for _ in 0..30 {
        tally.entered(&broker.topology.dead_queue, &row);
    }
    tally.flush().await;
    assert_eq!(tally.unrecorded(), 0, "the worker's counts recorded");

    let config = crate::temp_file(
        &format!("{}.toml", broker.settings.prefix),
        &format!(
            "[amqp]\nprefix = \"{}\"\nurl = \"{}\"\n",
            broker.settings.prefix, broker.url
        ),
    );
    let config = config.to_str().unwrap();
    let readonly = url(&server, "fleet-readonly");
    let stats = json(&run_with(
        &["--config", config, "--redis-url", readonly.as_str()],
        "dlq stats --json",
    ));
    assert_eq!(stats["dead_letter"]["exact"], true, "{stats}");
    assert_eq!(stats["dead_letter"]["depth"], 30, "{stats}");

    let operator = url(&server, "fleet-operator");
    let replay = json(&run_with(
        &["--config", config, "--redis-url", operator.as_str()],
        "replay --dependency search --rate 1000 --actor ann@ops --note acl --json",
    ));
    assert_eq!(replay["moved"], 30, "{replay}");
    assert_eq!(
        broker.depth(&broker.topology.work_queue).await,
        30,
        "all moved"
    );
    let trail = json(&run_with(
        &["--redis-url", readonly.as_str()],
        "audit --json",
    ));
    let actions: Vec<&str> = trail["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert!(
        actions.contains(&"replay_started") && actions.contains(&"replay"),
        "{actions:?}"
    );
    assert_eq!(
        refused(&server),
        Vec::<String>::new(),
        "nothing may be refused"
    );
}

/// The BullMQ jobs Node.js workers kept, under the documented users: the console's reading of
/// the lists (`fleet_budget::control::bullmq`) under `fleet-readonly`, and `budgetctl replay
/// --bullmq-queue` (its dry run, then the run that moves each entry to the queue's replay list)
/// under `fleet-operator`, with nothing refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_users_look_at_and_replay_kept_bullmq_jobs() {
    use fleet_budget::control::bullmq;

    let server = server_with_users();
    // Written as the Node.js client writes them (its own user: BullMQ's keys are not under
    // the prefix), here by the server's default user.
    for i in 0..5 {
        let entry = format!(
            r#"{{"v":1,"id":"job-{i}","task":"index","dependency":"search","reason":"budget_exhausted","error_class":"http_503","error":"503","at_ms":1}}"#
        );
        let _: i64 = server.cmd(&["LPUSH", "fb:v1:bullmq-kept:{jobs}", &entry]);
    }
    // A receiver as it says it is alive, holding one request.
    let _: i64 = server.cmd(&["ZADD", "fb:v1:bullmq-receivers:{jobs}", "1", "host-a"]);
    let _: i64 = server.cmd(&["RPUSH", "fb:v1:bullmq-replaying:{jobs}:host-a", "{}"]);
    let _: String = server.cmd(&["ACL", "LOG", "RESET"]);

    let readonly = RedisStore::new(
        RedisTarget::Single(url(&server, "fleet-readonly")),
        "fb",
        Duration::from_secs(2),
    )
    .unwrap();
    let found = bullmq::kept_queues(&readonly).await.unwrap();
    assert_eq!(found.queues, ["jobs"]);
    let lengths = bullmq::kept_lengths(&readonly, &found.queues)
        .await
        .unwrap();
    assert_eq!(lengths[0].kept, Some(5), "{lengths:?}");
    let jobs = bullmq::kept_jobs(&readonly, "jobs", 0, 50).await.unwrap();
    assert_eq!(jobs.len(), 5);
    let receivers = bullmq::receivers(&readonly, "jobs").await.unwrap();
    assert_eq!(receivers.known, Some(1));
    assert_eq!(
        (receivers.shown[0].id.as_str(), receivers.shown[0].in_hand),
        ("host-a", Some(1))
    );

    let operator = url(&server, "fleet-operator");
    let config = crate::temp_file(
        "acl-bullmq.toml",
        "[dependencies.search]\ntasks = [\"index\"]\n",
    );
    let config = config.to_str().unwrap();
    let global = ["--config", config, "--redis-url", operator.as_str()];
    let dry = json(&run_with(
        &global,
        "replay --bullmq-queue jobs --dry-run --json",
    ));
    assert_eq!(dry["matched"], 5, "{dry}");
    let run = json(&run_with(
        &global,
        "replay --bullmq-queue jobs --rate 1000 --actor ann@ops --note acl --json",
    ));
    assert_eq!(run["moved"], 5, "{run}");
    let moved: i64 = server.cmd(&["LLEN", "fb:v1:bullmq-replay:{jobs}"]);
    assert_eq!(moved, 5);
    assert_eq!(
        refused(&server),
        Vec::<String>::new(),
        "nothing may be refused"
    );
}
