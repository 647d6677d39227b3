//! `replay`'s pace from the CLI: held while the dependency's breaker is open (said on the
//! progress line as it happens and in the report), resuming once a probe closes it; right after
//! an outage that spent the budget, never held nor slowed, saying why the rate is what it is;
//! and the `--json` fields held to the schema.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fleet_budget::breaker::{Breaker, BreakerState, Verdict};
use fleet_budget::store::RedisStore;
use fleet_budget::testing::RedisServer;
use fleet_budget::{DeadLetterReason, Dependency, FleetBudget};
use fleet_budget_amqp::WorkerConfig;
use fleet_budget_amqp::testing::{TestBroker, block_on};

use crate::{budgetctl, json, run, run_with, schemas, stderr, temp_file, unique};

#[test]
fn replay_is_held_while_the_breaker_is_open_and_says_so() {
    let redis = RedisServer::start();
    let broker = TestBroker::new("cli-loop");
    let prefix = &broker.settings.prefix;
    let key_prefix = unique("loop");
    let text = format!(
        "[redis]\nurl = \"{}\"\nkey_prefix = \"{key_prefix}\"\ntimeout_ms = 2000\n\
         [amqp]\nprefix = \"{prefix}\"\nurl = \"{}\"\n\
         [dependencies.search]\ntasks = [\"search\"]\nmin_allowance = 1000\n\
         [dependencies.search.breaker]\nfailure_ratio = 1.0\nmin_volume = 1\nopen_secs = 2\n\
         half_open_probes = 1\nclose_after = 1\n",
        redis.url(),
        broker.url
    );
    let config = temp_file(&format!("{prefix}.toml"), &text);
    let cfg = config.to_str().unwrap();
    json(&run_with(&["--config", cfg], "migrate --json"));
    block_on(async {
        let publisher = broker.publisher().await;
        broker
            .seed_dead_letters(
                &publisher,
                3,
                "search",
                DeadLetterReason::BudgetExhausted,
                0,
                fleet_budget::clock::now_ms() - 1000,
            )
            .await;
        publisher.close().await;
    });
    // The breaker opened by a worker's failure, through the core crate's store.
    let budget = WorkerConfig::from_toml(&text, "test").unwrap().budget;
    let dep = Dependency::new("search").unwrap();
    let policy = budget.breakers[&dep];
    // One runtime for the store's connection, which lives on it.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let breaker = {
        let _in = rt.enter();
        Breaker::new(Arc::new(RedisStore::from_settings(&budget.redis).unwrap()))
    };
    let opened = rt
        .block_on(breaker.record(&dep, &policy, false, None))
        .unwrap();
    assert_eq!(opened.state, BreakerState::Open);

    let args = [
        "--config",
        cfg,
        "replay",
        "--dependency",
        "search",
        "--json",
    ];
    let mut child = budgetctl()
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = Vec::new();
    // The progress line says the run is held as it happens (a line read, not a time).
    for line in lines.by_ref() {
        let line = line.unwrap();
        seen.push(line.clone());
        if line.contains("held: breaker of search open") {
            assert!(line.contains("moved 0"), "{line}");
            break;
        }
    }
    assert!(
        seen.last().is_some_and(|l| l.contains("held:")),
        "never said held: {seen:#?}"
    );
    // A probe closes it: the first call after the open period.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Verdict::Probe { generation } =
            rt.block_on(breaker.admit(&dep, &policy)).unwrap().verdict
        {
            let d = rt
                .block_on(breaker.record(&dep, &policy, true, Some(generation)))
                .unwrap();
            assert_eq!(d.state, BreakerState::Closed);
            break;
        }
        assert!(Instant::now() < deadline, "the breaker never half-opened");
        std::thread::sleep(Duration::from_millis(100));
    }
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let o = child.wait_with_output().unwrap();
    schemas::hold_to_schema(&args, &o);
    let out = json(&o);
    assert_eq!(out["moved"], 3, "{out}\n{rest:#?}");
    assert!(out["held_breaker_secs"].as_f64().unwrap() > 0.0, "{out}");
    assert!(
        out["slowdowns"].is_u64() && out["lowest_rate"].is_number(),
        "{out}"
    );
    assert!(
        rest.iter()
            .any(|l| l.contains("moved 3") && !l.contains("held:")),
        "{rest:#?}"
    );
    drop(redis);
}

/// Issue 31: right after an outage that spent the whole allowance (`remaining` 0, the outage's
/// retries still in the window), `replay` is neither paused nor slowed: its progress lines say
/// why the rate is what it is, with an ETA, and never "held", "PAUSED" or "slowed"; its report
/// says nothing was held and the asked rate was reached.
#[test]
fn replay_right_after_an_outage_is_not_paused_and_says_why_the_rate_is_what_it_is() {
    let redis = RedisServer::start();
    let broker = TestBroker::new("cli-pace");
    let prefix = &broker.settings.prefix;
    let key_prefix = unique("pace");
    let text = format!(
        "[redis]\nurl = \"{}\"\nkey_prefix = \"{key_prefix}\"\ntimeout_ms = 2000\n\
         [amqp]\nprefix = \"{prefix}\"\nurl = \"{}\"\n\
         [dependencies.search]\ntasks = [\"search\"]\nwindow_secs = 60\nratio = 0.1\n\
         min_allowance = 10\n",
        redis.url(),
        broker.url
    );
    let config = temp_file(&format!("{prefix}.toml"), &text);
    let cfg = config.to_str().unwrap();
    json(&run_with(&["--config", cfg], "migrate --json"));
    block_on(async {
        let publisher = broker.publisher().await;
        broker
            .seed_dead_letters(
                &publisher,
                30,
                "search",
                DeadLetterReason::BudgetExhausted,
                0,
                fleet_budget::clock::now_ms() - 1000,
            )
            .await;
        publisher.close().await;
    });
    // The outage: every retry the budget grants, granted.
    let budget = WorkerConfig::from_toml(&text, "test").unwrap().budget;
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let budget = FleetBudget::from_config(&budget).await.unwrap();
        let dep = Dependency::new("search").unwrap();
        let policy = budget.policy(&dep);
        while budget.withdraw(&dep, &policy).await.0.granted {}
        assert_eq!(budget.status(&dep).await.0.remaining(), 0);
        let _ = budget.shutdown().await;
    });
    let args = [
        "--config",
        cfg,
        "replay",
        "--dependency",
        "search",
        "--rate",
        "20",
        "--json",
    ];
    let o = run(&args);
    let out = json(&o);
    let lines = stderr(&o);
    eprintln!("{lines}");
    assert_eq!(out["moved"], 30, "{out}\n{lines}");
    for quiet in ["held", "PAUSED", "SLOWED", "slowed", "paused"] {
        assert!(!lines.contains(quiet), "{quiet:?} in:\n{lines}");
    }
    assert!(
        lines
            .lines()
            .any(|l| l.contains("20.0/s, at the asked rate, ETA ")),
        "{lines}"
    );
    assert_eq!(out["paused_secs"], 0.0, "{out}");
    assert_eq!(out["held_frozen_secs"], 0.0, "{out}");
    assert_eq!(out["held_breaker_secs"], 0.0, "{out}");
    assert_eq!(out["slowdowns"], 0, "{out}");
    assert_eq!(out["highest_rate"], 20.0, "{out}");
    assert!(out["reached_rate_secs"].is_number(), "{out}");
    drop(redis);
}
