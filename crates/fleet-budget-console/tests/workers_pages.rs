//! The workers' page and `/api/workers` over a large registry (issue 32, page weights at
//! scale): 50 entries a page, worst first (in fallback, unreadable, silent, reporting), each
//! page labelled with what it shows of how many, the counts of every entry read beside it, and
//! every entry on exactly one page; the JSON held to
//! `docs/schemas/console/workers.schema.json` by the suite's validator
//! (`crates/budgetctl/tests/cli/validate_json.py`, Python `jsonschema`: `FLEET_BUDGET_PYTHON`,
//! else the repository's `.venv`, else `python3`), which refuses it with a field renamed.
//! Against a console on a Redis of the test's own (the registry written as `heartbeat.lua`
//! writes it) and the shared RabbitMQ (a topology prefix of its own).
//!
//! No timed assertion: the wait for the console's reading is a hang check.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use fleet_budget::testing::RedisServer;
use fleet_budget_amqp::WorkerConfig;
use fleet_budget_amqp::testing::{TestBroker, unique_prefix};
use fleet_budget_console::{ConsoleSettings, Token, Viewers};
use serde_json::{Value, json};
use support::{get, validate};

/// The states of the page's rows, in order.
fn states(page: &str) -> Vec<String> {
    page.split("<tr data-state=\"")
        .skip(1)
        .map(|r| r[..r.find('"').unwrap()].to_owned())
        .collect()
}

/// What the page's pager says it shows ("1–50 of 130").
fn shown(page: &str) -> String {
    let at = page.find("<span class=\"shown\">").unwrap() + "<span class=\"shown\">".len();
    let text = &page[at..at + page[at..].find(" entries").unwrap()];
    text.to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_registry_is_shown_worst_first_fifty_a_page_with_its_counts() {
    let redis = RedisServer::start();
    let broker = TestBroker::new("console-workers-pages");
    let prefix = unique_prefix("fbwp");
    let toml = format!(
        "[redis]\nurl = \"{}\"\nkey_prefix = \"{prefix}\"\ntimeout_ms = 10000\n\
         [dependencies.search]\ntasks = [\"index\"]\n\
         [amqp]\nurl = \"{}\"\nprefix = \"{}\"\n",
        redis.url(),
        broker.url,
        broker.settings.prefix
    );
    let config = WorkerConfig::from_toml(&toml, "workers pages test").unwrap();

    // 130 entries as `heartbeat.lua` writes them: 7 in fallback, 10 not a report, 20 silent
    // (last seen 10 minutes ago), 93 reporting.
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    let now_ms = secs * 1000 + micros / 1000;
    let reports = fleet_budget::keys::workers_key(&prefix);
    let seen = fleet_budget::keys::workers_seen_key(&prefix);
    let mut pipe = redis::pipe();
    let mut expected = Vec::new();
    for i in 0..130_u64 {
        let id = format!("w-{i:03}");
        let (state, report, at) = match i % 13 {
            0 => ("unreadable", "{not json".to_owned(), now_ms - i),
            1 | 2 => ("silent", String::new(), now_ms - 600_000 - i),
            _ if i % 17 == 4 => ("in fallback", String::new(), now_ms - i),
            _ => ("reporting", String::new(), now_ms - i),
        };
        let report = if report.is_empty() {
            let fallback = if state == "in fallback" {
                json!([{"dependency": "search", "for_ms": 3000}])
            } else {
                json!([])
            };
            json!({"v": 1, "id": id, "host": "h", "pid": i, "lang": "rust", "version": "0.2.0",
                   "started_ms": now_ms - 3_600_000, "interval_ms": 600_000,
                   "fallback": fallback, "fallback_more": 0})
            .to_string()
        } else {
            report
        };
        // An interval of 10 minutes: the "reporting" stay fresh for the test's length; the
        // "silent" (seen 10 minutes ago) report every second: three beats missed long ago.
        let report = if state == "silent" {
            report.replace("\"interval_ms\":600000", "\"interval_ms\":1000")
        } else {
            report
        };
        pipe.cmd("HSET").arg(&reports).arg(&id).arg(report).ignore();
        pipe.cmd("ZADD").arg(&seen).arg(at).arg(&id).ignore();
        expected.push((id, state));
    }
    let () = pipe.query_async(&mut conn).await.unwrap();
    let count = |s: &str| expected.iter().filter(|(_, st)| *st == s).count();
    assert_eq!(
        (
            count("in fallback"),
            count("unreadable"),
            count("silent"),
            count("reporting")
        ),
        (7, 10, 20, 93)
    );

    let operators = Token::parse_list("ann:operator-token-0123456789", "operator", "t").unwrap();
    let mut settings = ConsoleSettings::new(config.clone(), operators, Viewers::Open);
    settings.bind = "127.0.0.1:0".parse().unwrap();
    let console = fleet_budget_console::start(settings).await.unwrap();
    let addr = console.addr().to_string();

    // The first page, once the console's reading has the registry.
    let started = Instant::now();
    let first = loop {
        let (status, body) = get(&addr, "/api/workers").await;
        if status == 200 {
            break serde_json::from_str::<Value>(&body).unwrap();
        }
        assert!(started.elapsed() < Duration::from_secs(60), "{body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(
        first["counts"],
        json!({"reporting": 100, "in_fallback": 7, "silent": 20, "unreadable": 10,
               "total": 130, "truncated": false}),
        "{first}"
    );
    assert_eq!(
        (&first["listed"], &first["pages"], &first["per_page"]),
        (&json!(130), &json!(3), &json!(50))
    );

    // Every page of the JSON: held to the schema, worst first, each entry once.
    let mut documents = Vec::new();
    for n in 1..=4 {
        let (status, body) = get(&addr, &format!("/api/workers?page={n}")).await;
        assert_eq!(status, 200, "{body}");
        documents.push(serde_json::from_str::<Value>(&body).unwrap());
    }
    assert_eq!(documents[3]["page"], 3, "past the last page, the last");
    let refs: Vec<&Value> = documents.iter().collect();
    let verdict = validate("workers", &refs);
    assert_eq!(verdict["schemas"]["workers"], json!([]), "{verdict}");
    for (i, errors) in verdict["documents"].as_array().unwrap().iter().enumerate() {
        assert_eq!(errors, &json!([]), "page {}: {errors}", i + 1);
    }
    let mut renamed = documents[0].clone();
    let counts = renamed.as_object_mut().unwrap().remove("counts").unwrap();
    renamed["count"] = counts;
    let verdict = validate("workers", &[&renamed]);
    assert_ne!(verdict["documents"][0], json!([]), "a renamed field passed");

    let ids: Vec<String> = documents[..3]
        .iter()
        .flat_map(|d| d["workers"].as_array().unwrap().clone())
        .map(|w| w["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids.len(), 130);
    let all: BTreeSet<&str> = expected.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids.iter().map(String::as_str).collect::<BTreeSet<_>>(), all);
    let rank = |id: &str| {
        let state = expected.iter().find(|(i, _)| i == id).unwrap().1;
        ["in fallback", "unreadable", "silent", "reporting"]
            .iter()
            .position(|s| *s == state)
            .unwrap()
    };
    let ranks: Vec<usize> = ids.iter().map(|id| rank(id)).collect();
    assert!(ranks.is_sorted(), "not worst first: {ranks:?}");

    // The page: the counts of every entry, labelled, and 50 rows a page, worst first.
    let (status, page) = get(&addr, "/workers").await;
    assert_eq!(status, 200, "{page}");
    assert!(
        page.contains(
            "100 workers reporting, 7 in fallback, 20 silent, 10 unreadable, of 130 entries in \
             the worker registry"
        ),
        "{page}"
    );
    assert_eq!(shown(&page), "1–50 of 130");
    let mut states_shown = states(&page);
    assert_eq!(states_shown.len(), 50);
    assert_eq!(states_shown[..7], ["in fallback"; 7]);
    assert_eq!(states_shown[7..17], ["unreadable"; 10]);
    for n in [2, 3] {
        let (_, page) = get(&addr, &format!("/workers?page={n}")).await;
        states_shown.extend(states(&page));
        if n == 3 {
            assert_eq!(shown(&page), "101–130 of 130");
        }
    }
    assert_eq!(states_shown.len(), 130);
    assert_eq!(states_shown.iter().filter(|s| *s == "silent").count(), 20);

    console.stop().await;
}
