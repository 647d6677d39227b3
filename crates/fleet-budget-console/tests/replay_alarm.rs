//! The console's replay under a RabbitMQ resource alarm (issue 33, item 4), driven over HTTP:
//! the real `budgetctl console` on a private RabbitMQ node (`tests/game_day/rabbit_node.rs`; the
//! shared broker is never changed) whose memory watermark is set near zero, and a private Redis.
//!
//! A replay started from the console while the alarm holds: its page and `/api/replay/ID` say
//! `blocked` with the broker's reason (`low on memory`) and nothing moves (the work queue stays
//! empty) for three publish deadlines; once the alarm is cleared it goes on by itself and moves
//! every dead letter once: each in the work queue exactly once, none left, none parked. Every
//! `/api/replay` answer read is held to `docs/schemas/console/replay.schema.json`.
//!
//! No timed assertion: each wait is a hang check; the figures are printed.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod support;

#[allow(dead_code)]
#[path = "browser/webdriver.rs"]
mod webdriver;

#[allow(dead_code)]
#[path = "../../../tests/game_day/rabbit_node.rs"]
mod rabbit_node;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fleet_budget::DeadLetterReason;
use fleet_budget::control::DeadLetterIndex;
use fleet_budget::store::{RedisStore, RedisTarget};
use fleet_budget::testing::{RedisServer, free_port};
use fleet_budget_amqp::testing::{TestBroker, unique_prefix};
use fleet_budget_amqp::{Replayer, WorkerConfig, headers};
use serde_json::Value;
use tokio::process::{Child, Command};

use rabbit_node::RabbitNode;
use support::{csrf_of, location, set_cookie};
use webdriver::http;

const OPERATOR: &str = "operator-token-alarm-0123456789";
/// Dead letters the replay moves.
const DEAD: usize = 100;
/// The replay's publish deadline (`amqp.operation_timeout_ms`).
const OPERATION_TIMEOUT_MS: u64 = 2000;
/// How long the alarm is held after the console said the replay was blocked: three publish
/// deadlines, so that a copy timed out while blocked would show (as a duplicate or a park).
const HOLD: Duration = Duration::from_millis(3 * OPERATION_TIMEOUT_MS);

fn budgetctl() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .map(|dir| dir.join(format!("budgetctl{}", std::env::consts::EXE_SUFFIX)))
        .unwrap();
    assert!(
        bin.exists(),
        "{} is not built: `cargo build -p budgetctl` first",
        bin.display()
    );
    bin
}

/// Starts `budgetctl console` on `addr` with `config_path` and one operator token; waits until
/// it answers.
async fn console(config_path: &Path, tokens: &Path, addr: &str) -> Child {
    let child = Command::new(budgetctl())
        .arg("--config")
        .arg(config_path)
        .args(["console", "--bind", addr, "--no-viewer-token"])
        .arg("--operator-token-file")
        .arg(tokens)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let started = Instant::now();
    loop {
        let answered =
            tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect(addr))
                .await;
        if matches!(answered, Ok(Ok(_))) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the console never listened"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    child
}

async fn login(addr: &str) -> String {
    let (_, head, _) = http(addr, "GET", "/login", &[], None).await;
    let nonce = set_cookie(&head, "fbc_login");
    let form = format!("token={OPERATOR}&login_csrf={nonce}");
    let (status, head, _) = http(
        addr,
        "POST",
        "/login",
        &[("Cookie", &format!("fbc_login={nonce}"))],
        Some(("application/x-www-form-urlencoded", form.as_bytes())),
    )
    .await;
    assert_eq!(status, 303, "{head}");
    format!("fbc_session={}", set_cookie(&head, "fbc_session"))
}

async fn get(addr: &str, cookie: &str, path: &str) -> (u16, String, String) {
    let (status, head, body) = http(addr, "GET", path, &[("Cookie", cookie)], None).await;
    (status, head, String::from_utf8_lossy(&body).into_owned())
}

/// `job`, an answer of `/api/replay/ID`, held to `docs/schemas/console/replay.schema.json` by
/// the suite's validator (`crates/budgetctl/tests/cli/validate_json.py`, Python `jsonschema`:
/// `FLEET_BUDGET_PYTHON`, else the repository's `.venv`, else `python3`).
fn hold_to_schema(job: &Value) {
    let verdict = support::validate("replay", &[job]);
    assert_eq!(
        verdict["documents"],
        serde_json::json!([[]]),
        "/api/replay does not match docs/schemas/console/replay.schema.json: {verdict}\n{job}"
    );
}

/// `/api/replay/ID`, held to its schema.
async fn job(addr: &str, cookie: &str, id: &str) -> Value {
    let (status, _, body) = get(addr, cookie, &format!("/api/replay/{id}")).await;
    assert_eq!(status, 200, "{body}");
    let job: Value = serde_json::from_str(&body).unwrap();
    hold_to_schema(&job);
    job
}

/// GETs `/api/replay/ID` until `done` holds for its JSON (a hang check).
async fn job_until(addr: &str, cookie: &str, id: &str, done: impl Fn(&Value) -> bool) -> Value {
    let started = Instant::now();
    loop {
        let j = job(addr, cookie, id).await;
        if done(&j) {
            return j;
        }
        assert!(
            started.elapsed() < Duration::from_secs(180),
            "job {id} never showed what was awaited: {j}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[test]
fn the_console_s_replay_says_blocked_under_a_memory_alarm_moves_nothing_then_moves_each_once() {
    if let Err(why) = RabbitNode::installed() {
        eprintln!("skipped: {why}, no private node");
        return;
    }
    fleet_budget_amqp::testing::block_on(replay_under_alarm());
}

async fn replay_under_alarm() {
    let node = RabbitNode::start().await.expect("a private RabbitMQ node");
    let redis = RedisServer::start();
    let toml = format!(
        "[redis]\nurl = \"{}\"\nkey_prefix = \"{}\"\ntimeout_ms = 10000\n\
         [dependencies.search]\ntasks = [\"index\"]\n\
         [amqp]\nurl = \"{}\"\nprefix = \"{}\"\noperation_timeout_ms = {OPERATION_TIMEOUT_MS}\n",
        redis.url(),
        unique_prefix("fbca"),
        node.url(),
        unique_prefix("fbca")
    );
    let config = WorkerConfig::from_toml(&toml, "replay alarm test").unwrap();
    let broker = TestBroker::with_settings(config.amqp.clone());
    broker.migrate().await;
    let topology = broker.topology.clone();
    let publisher = broker.publisher().await;
    let ids = broker
        .seed_dead_letters(
            &publisher,
            DEAD,
            "search",
            DeadLetterReason::BudgetExhausted,
            0,
            fleet_budget::clock::now_ms() - 1000,
        )
        .await;
    publisher.close().await;
    let r = &config.budget.redis;
    let store = Arc::new(
        RedisStore::new(
            RedisTarget::from_settings(r),
            &r.key_prefix,
            Duration::from_secs(5),
        )
        .unwrap(),
    );
    Replayer::new(node.url(), topology.clone(), None)
        .with_index(Some(DeadLetterIndex::new(store)))
        .reindex()
        .await
        .unwrap();
    assert_eq!(broker.depth(&topology.dead_queue).await as usize, DEAD);

    let dir = std::env::temp_dir().join(unique_prefix("fbca-files"));
    std::fs::create_dir_all(&dir).unwrap();
    let config_path = dir.join("fleet.toml");
    std::fs::write(&config_path, &toml).unwrap();
    let tokens = dir.join("tokens");
    std::fs::write(&tokens, format!("ann:{OPERATOR}\n")).unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let mut child = console(&config_path, &tokens, &addr).await;
    let cookie = login(&addr).await;
    let (_, _, page) = get(&addr, &cookie, "/replays").await;
    let csrf = csrf_of(&page);

    // The memory alarm, then the replay.
    node.ctl(&["set_vm_memory_high_watermark", "0.000001"])
        .unwrap();
    let form = format!("csrf={csrf}&dependency=search&rate=1000&confirm=replay&note=alarm");
    let (status, head, body) = http(
        &addr,
        "POST",
        "/replay/start",
        &[("Cookie", &cookie)],
        Some(("application/x-www-form-urlencoded", form.as_bytes())),
    )
    .await;
    assert_eq!(status, 303, "{head}{}", String::from_utf8_lossy(&body));
    let id = location(&head).trim_start_matches("/replay/").to_owned();
    let blocked = job_until(&addr, &cookie, &id, |j| {
        j["state"] == "blocked" || j["done"] == true
    })
    .await;
    println!("blocked: {blocked}");
    assert_eq!(blocked["state"], "blocked", "{blocked}");
    assert!(
        blocked["blocked"]
            .as_str()
            .is_some_and(|r| r.contains("low on memory")),
        "the broker's reason: {blocked}"
    );
    assert_eq!(
        blocked["eta_secs"],
        Value::Null,
        "no time left to tell: {blocked}"
    );
    assert!(
        blocked["held_text"]
            .as_str()
            .unwrap()
            .contains("low on memory"),
        "{blocked}"
    );
    let (_, _, page) = get(&addr, &cookie, &format!("/replay/{id}")).await;
    assert!(
        page.contains("<td id=\"j-state\">blocked</td>"),
        "the page says blocked: {page}"
    );
    assert!(page.contains("low on memory"), "{page}");

    // Held three publish deadlines: still blocked, nothing moved.
    let held_from = Instant::now();
    let mut looks = 0;
    let mut moved_while_blocked = 0;
    let mut work_while_blocked = 0;
    while held_from.elapsed() < HOLD {
        let j = job(&addr, &cookie, &id).await;
        assert_eq!(j["state"], "blocked", "still blocked: {j}");
        moved_while_blocked = moved_while_blocked.max(j["moved"].as_u64().unwrap());
        work_while_blocked = work_while_blocked.max(broker.depth(&topology.work_queue).await);
        looks += 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    node.ctl(&["set_vm_memory_high_watermark", "0.4"]).unwrap();
    let done = job_until(&addr, &cookie, &id, |j| j["done"] == true).await;
    println!("after the clear: {done}");

    let in_work = broker.drain(&topology.work_queue).await;
    let mut copies: BTreeMap<String, u64> = BTreeMap::new();
    for (props, _) in &in_work {
        let id = headers::message_id(props).unwrap_or("-").to_owned();
        *copies.entry(id).or_insert(0) += 1;
    }
    let unique = ids.iter().filter(|i| copies.contains_key(*i)).count();
    let duplicates: u64 = copies.values().map(|n| n.saturating_sub(1)).sum();
    let lost = ids.len() - unique;
    let dead_left = broker.depth(&topology.dead_queue).await;
    let parked = broker.depth(&topology.parked_queue).await;
    println!(
        "console replay under a memory alarm: dead letters {DEAD}; shown blocked ({}) for {:.1} s \
         over {looks} reads, moved while blocked {moved_while_blocked}, work queue while blocked \
         {work_while_blocked}; after the clear: state {}, moved {}, in the work queue {} unique, \
         duplicates {duplicates}, lost {lost}, dead-letter queue left {dead_left}, parked {parked}",
        blocked["blocked"],
        HOLD.as_secs_f64(),
        done["state"],
        done["moved"],
        unique,
    );
    assert_eq!(moved_while_blocked, 0, "nothing moved while blocked");
    assert_eq!(work_while_blocked, 0, "nothing passed the alarm");
    assert_eq!(done["state"], "done", "{done}");
    assert_eq!(done["blocked"], Value::Null, "no longer blocked: {done}");
    assert_eq!(done["moved"].as_u64(), Some(DEAD as u64), "{done}");
    assert_eq!(lost, 0, "every dead letter is in the work queue");
    assert_eq!(duplicates, 0, "none moved twice");
    assert_eq!(dead_left, 0);
    assert_eq!(parked, 0, "nothing parked in doubt");
    child.kill().await.unwrap();
    std::fs::remove_dir_all(&dir).ok();
}
