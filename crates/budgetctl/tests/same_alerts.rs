//! `budgetctl status --json` and the console show the same alerts for the same fleet: a real
//! Redis of its own holding six dependencies in different states (budget exhausted, frozen by an
//! operator, breaker open, a policy conflict, calls in flight, healthy), read by the real binary
//! and by a console serving in this process (its JSON and its page). Both render the library's
//! read model; this test fails if either computes an alert of its own.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use fleet_budget::breaker::{Breaker, BreakerState};
use fleet_budget::control::OverrideAction;
use fleet_budget::control::overrides;
use fleet_budget::store::{RedisStore, RedisTarget};
use fleet_budget::testing::RedisServer;
use fleet_budget::{Admission, Dependency, Failure, FleetBudget};
use fleet_budget_amqp::WorkerConfig;
use fleet_budget_console::{ConsoleSettings, Token, Viewers};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The fleet's configuration: each dependency's section, with what puts it in its state.
fn config_text(redis_url: &str, prefix: &str, ratio_of_conflict: &str) -> String {
    format!(
        "[redis]\nurl = \"{redis_url}\"\nkey_prefix = \"{prefix}\"\ntimeout_ms = 5000\n\
         [amqp]\nprefix = \"{prefix}\"\n\
         [dependencies.healthy]\ntasks = [\"h\"]\n\
         [dependencies.exhausted]\ntasks = [\"x\"]\nratio = 0.0\nmin_allowance = 2\n\
         [dependencies.frozen]\ntasks = [\"f\"]\n\
         [dependencies.tripped]\ntasks = [\"t\"]\n\
         [dependencies.tripped.breaker]\nfailure_ratio = 0.5\nmin_volume = 1\nopen_secs = 600\n\
         [dependencies.conflicted]\ntasks = [\"c\"]\nratio = {ratio_of_conflict}\n\
         [dependencies.busy]\ntasks = [\"b\"]\n\
         [dependencies.busy.concurrency]\ncap = 10\nplanned_primary = 8\n"
    )
}

fn dep(name: &str) -> Dependency {
    Dependency::new(name).unwrap()
}

/// Puts each dependency in its state, as workers and an operator would.
async fn make_states(config: &WorkerConfig, other_policy: &WorkerConfig) {
    let budget = FleetBudget::from_config(&config.budget).await.unwrap();
    let failure = Failure::retryable("503").with_class("http_503");
    // healthy: traffic, every attempt succeeding.
    for _ in 0..5 {
        budget.on_attempt("h", 1).await.unwrap();
        budget.on_success("h").await.unwrap();
    }
    // exhausted: a floor of 2 retries, 6 failures: 2 granted, 4 denied.
    for _ in 0..6 {
        budget.on_attempt("x", 1).await.unwrap();
        let _ = budget.on_failure("x", 1, &failure).await.unwrap();
    }
    // frozen: some traffic, then an operator's freeze.
    budget.on_attempt("f", 1).await.unwrap();
    // busy: three calls in flight, never finished (their leases stand).
    let mut calls = Vec::new();
    for _ in 0..3 {
        match budget.admit("b", 1, None).await.unwrap() {
            Admission::Run(call) => calls.push(call),
            other => panic!("a call under the cap was not admitted: {other:?}"),
        }
    }
    std::mem::forget(calls);
    budget.on_attempt("c", 1).await.unwrap();
    budget.shutdown().await.unwrap();

    let r = &config.budget.redis;
    let store = Arc::new(
        RedisStore::new_with_tls(
            RedisTarget::from_settings(r),
            &r.key_prefix,
            Duration::from_secs(5),
            &r.tls,
        )
        .unwrap(),
    );
    overrides::apply(
        &store,
        &config.budget.audit.log(),
        &dep("frozen"),
        OverrideAction::Freeze {
            duration: Duration::from_secs(600),
        },
        "alice",
        "incident 42",
    )
    .await
    .unwrap();
    // tripped: failures reported to its breaker until it opens.
    let breaker = Breaker::new(Arc::clone(&store));
    let policy = config.budget.breakers[&dep("tripped")];
    let mut opened = false;
    for _ in 0..50 {
        let d = breaker
            .record(&dep("tripped"), &policy, false, None)
            .await
            .unwrap();
        if d.state == BreakerState::Open {
            opened = true;
            break;
        }
    }
    assert!(opened, "50 failures did not open the breaker");
    // conflicted: a worker with another policy for it.
    let other = FleetBudget::from_config(&other_policy.budget)
        .await
        .unwrap();
    other.on_attempt("c", 1).await.unwrap();
    let _ = other.on_failure("c", 1, &failure).await.unwrap();
    other.shutdown().await.unwrap();
}

/// One GET to the console (`Connection: close`): the status and the body.
async fn get(addr: &str, path: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let text = String::from_utf8(out).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, body.to_owned())
}

/// Per dependency, its alerts as `(kind, severity, text)`, worst first.
type Alerts = BTreeMap<String, Vec<(String, u64, String)>>;

fn alerts_of(rows: &[Value]) -> Alerts {
    rows.iter()
        .map(|r| {
            let alerts = r["alerts"]
                .as_array()
                .unwrap_or_else(|| panic!("no alerts in {r}"))
                .iter()
                .map(|a| {
                    (
                        a["kind"].as_str().unwrap().to_owned(),
                        a["severity"].as_u64().unwrap(),
                        a["text"].as_str().unwrap().to_owned(),
                    )
                })
                .collect();
            (r["dependency"].as_str().unwrap().to_owned(), alerts)
        })
        .collect()
}

fn kinds(alerts: &Alerts, dependency: &str) -> Vec<String> {
    alerts[dependency].iter().map(|a| a.0.clone()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_and_the_console_show_the_same_alerts_for_the_same_fleet() {
    let redis = RedisServer::start();
    let prefix = format!("same-alerts-{}", std::process::id());
    let text = config_text(&redis.url(), &prefix, "0.2");
    let config = WorkerConfig::from_toml(&text, "same-alerts").unwrap();
    let other =
        WorkerConfig::from_toml(&config_text(&redis.url(), &prefix, "0.7"), "other").unwrap();
    make_states(&config, &other).await;
    let dir = std::env::temp_dir().join(&prefix);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("fleet-budget.toml");
    std::fs::write(&path, &text).unwrap();

    // budgetctl status --json, the real binary.
    let out = Command::new(env!("CARGO_BIN_EXE_budgetctl"))
        .env_remove("FLEET_BUDGET_REDIS_URL")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .arg("--config")
        .arg(&path)
        .args(["status", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status: Value = serde_json::from_slice(&out.stdout).unwrap();
    let from_status = alerts_of(status["dependencies"].as_array().unwrap());

    // The console, its JSON and its page.
    let operators =
        Token::parse_list("test:same-alerts-token-0123456789", "operator", "t").unwrap();
    let mut settings = ConsoleSettings::new(config.clone(), operators, Viewers::Open);
    settings.bind = "127.0.0.1:0".parse().unwrap();
    settings.history_every = Duration::from_secs(3600);
    let console = fleet_budget_console::start(settings).await.unwrap();
    let addr = console.addr().to_string();
    let (code, body) = get(&addr, "/api/overview").await;
    assert_eq!(code, 200, "{body}");
    let overview: Value = serde_json::from_str(&body).unwrap();
    let from_console = alerts_of(overview["dependencies"].as_array().unwrap());
    let (code, page) = get(&addr, "/").await;
    assert_eq!(code, 200, "{page}");
    let (code, fragment) = get(&addr, "/fragments/overview").await;
    assert_eq!(code, 200, "{fragment}");
    console.stop().await;

    println!("status: {from_status:#?}\nconsole: {from_console:#?}");
    assert_eq!(from_status, from_console);

    // Each state raised what it should (so the comparison is of something).
    assert_eq!(kinds(&from_status, "healthy"), Vec::<String>::new());
    assert_eq!(kinds(&from_status, "exhausted")[0], "exhausted");
    assert_eq!(kinds(&from_status, "frozen")[0], "frozen");
    assert_eq!(kinds(&from_status, "tripped"), ["breaker"]);
    assert!(
        kinds(&from_status, "conflicted").contains(&"policy_conflict".to_owned()),
        "{from_status:?}"
    );
    assert_eq!(kinds(&from_status, "busy"), Vec::<String>::new());
    let busy = status["dependencies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["dependency"] == "busy")
        .unwrap();
    assert_eq!(busy["concurrency"]["in_flight"], 3, "{busy}");
    assert_eq!(busy["concurrency"]["cap"], 10, "{busy}");

    // The page and the live refresh's fragment: each row shows its worst alert, worst first.
    for html in [&page, &fragment] {
        let rows: Vec<&str> = html.split("<tr data-severity=").skip(1).collect();
        let mut shown = Vec::new();
        for row in &rows {
            let name = row
                .split("href=\"/dependency/")
                .nth(1)
                .and_then(|r| r.split('"').next())
                .unwrap();
            let worst = from_status[name].first().map_or("", |a| a.2.as_str());
            assert!(
                row.contains(&format!("<td class=\"alert\">{worst}</td>")),
                "{name}: {row}"
            );
            shown.push(name.to_owned());
        }
        assert_eq!(
            shown,
            [
                "frozen",
                "tripped",
                "exhausted",
                "conflicted",
                "busy",
                "healthy"
            ],
            "worst first"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
