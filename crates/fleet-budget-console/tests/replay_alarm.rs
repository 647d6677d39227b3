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

#[path = "support/console_process.rs"]
mod console_process;

use std::collections::BTreeMap;
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

use console_process::{get, job, job_until, login, start_console};
use rabbit_node::RabbitNode;
use support::{csrf_of, location};
use webdriver::http;

const OPERATOR: &str = "operator-token-alarm-0123456789";
/// Dead letters the replay moves.
const DEAD: usize = 100;
/// The replay's publish deadline (`amqp.operation_timeout_ms`).
const OPERATION_TIMEOUT_MS: u64 = 2000;
/// How long the alarm is held after the console said the replay was blocked: three publish
/// deadlines, so that a copy timed out while blocked would show (as a duplicate or a park).
const HOLD: Duration = Duration::from_millis(3 * OPERATION_TIMEOUT_MS);

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
    let mut child = start_console(&config_path, &tokens, &addr, &[], Stdio::inherit()).await;
    let cookie = login(&addr, OPERATOR).await;
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
