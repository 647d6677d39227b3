//! `/api/overview` held to `docs/schemas/console/overview.schema.json` (issue 32): a console on
//! a Redis of the test's own and the shared RabbitMQ (a topology prefix of its own), over a
//! fleet where every optional part of a row is there at least once (a breaker open, a call in
//! flight, a freeze, a `set` override, a switch to shadow, another policy sent, an unusable
//! key, the worker registry), its real answer validated by the suite's validator
//! (`crates/budgetctl/tests/cli/validate_json.py`, Python `jsonschema`: `FLEET_BUDGET_PYTHON`,
//! else the repository's `.venv`, else `python3`). So that the check can fail, the same answer
//! with a field renamed, one missing, one unknown and one of the wrong type is refused. Then
//! paged: 452 rows over 3 pages of one reading, every row on exactly one.
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

use std::sync::Arc;
use std::time::{Duration, Instant};

use fleet_budget::breaker::{Breaker, BreakerState};
use fleet_budget::control::{AuditLog, OverrideAction, enforcement, overrides};
use fleet_budget::store::{RedisStore, RedisTarget};
use fleet_budget::testing::RedisServer;
use fleet_budget::{Admission, Dependency, Enforcement, Failure, FleetBudget};
use fleet_budget_amqp::WorkerConfig;
use fleet_budget_amqp::testing::{TestBroker, unique_prefix};
use fleet_budget_console::{ConsoleSettings, Token, Viewers};
use serde_json::{Value, json};
use support::{get, validate};

/// The row of `dependency` in an answer.
fn row<'a>(answer: &'a Value, dependency: &str) -> &'a Value {
    answer["dependencies"]
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["dependency"] == dependency))
        .unwrap_or(&Value::Null)
}

/// Whether the answer shows every part of the fleet the test set up.
fn complete(a: &Value) -> bool {
    let (search, mail) = (row(a, "search"), row(a, "mail"));
    search["breaker"]["state"] == "open"
        && search["frozen"].is_object()
        && search["conflict"].is_string()
        && search["denied"].as_u64() > Some(0)
        && search["alerts"].as_array().is_some_and(|x| x.len() > 1)
        && mail["concurrency"]["in_flight"] == 1
        && mail["set"].is_object()
        && mail["enforcement_switch"]["expires_in_secs"].is_number()
        && mail["enforcement"] == "shadow"
        && a["unusable"].as_array().is_some_and(|u| !u.is_empty())
        && a["workers"].is_object()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_overview_json_is_held_to_its_schema() {
    let redis = RedisServer::start();
    let broker = TestBroker::new("console-overview-schema");
    let prefix = unique_prefix("fbco");
    let base = format!(
        "[redis]\nurl = \"{}\"\nkey_prefix = \"{prefix}\"\ntimeout_ms = 10000\n\
         [amqp]\nurl = \"{}\"\nprefix = \"{}\"\n\
         [dependencies.mail]\ntasks = [\"send\"]\n\
         [dependencies.mail.concurrency]\ncap = 4\nplanned_primary = 2\n\
         [dependencies.broken]\ntasks = [\"fix\"]\n",
        redis.url(),
        broker.url,
        broker.settings.prefix
    );
    let search = |ratio: f64| {
        format!(
            "[dependencies.search]\ntasks = [\"index\"]\nmin_allowance = 2\nratio = {ratio}\n\
             [dependencies.search.breaker]\nfailure_ratio = 0.5\nmin_volume = 1\n\
             open_secs = 600\nhalf_open_probes = 1\nclose_after = 1\n"
        )
    };
    let config = WorkerConfig::from_toml(&format!("{base}{}", search(0.1)), "schema test").unwrap();
    // Another worker's configuration: the same fleet with another ratio for `search`.
    let other = WorkerConfig::from_toml(&format!("{base}{}", search(0.3)), "schema test").unwrap();
    let r = &config.budget.redis;
    let store = Arc::new(
        RedisStore::new_with_tls(
            RedisTarget::from_settings(r),
            &r.key_prefix,
            Duration::from_secs(10),
            &r.tls,
        )
        .unwrap(),
    );
    let (search, mail) = (
        Dependency::new("search").unwrap(),
        Dependency::new("mail").unwrap(),
    );

    // search: its budget spent (retries denied), another policy sent, its breaker open, frozen.
    let worker = FleetBudget::from_config(&config.budget).await.unwrap();
    let failure = Failure::retryable("503").with_class("http_503");
    for _ in 0..10 {
        worker.on_attempt("index", 1).await.unwrap();
        let _ = worker.on_failure("index", 1, &failure).await.unwrap();
    }
    let stranger = FleetBudget::from_config(&other.budget).await.unwrap();
    stranger.on_attempt("index", 1).await.unwrap();
    let _ = stranger.on_failure("index", 1, &failure).await.unwrap();
    stranger.shutdown().await.unwrap();
    let policy = config.budget.breakers[&search];
    let breaker = Breaker::new(Arc::clone(&store));
    let mut opened = false;
    for _ in 0..50 {
        if breaker
            .record(&search, &policy, false, None)
            .await
            .unwrap()
            .state
            == BreakerState::Open
        {
            opened = true;
            break;
        }
    }
    assert!(opened, "50 failures did not open search's breaker");
    let audit = AuditLog::default();
    let hour = Duration::from_secs(3600);
    overrides::apply(
        &store,
        &audit,
        &search,
        OverrideAction::Freeze { duration: hour },
        "ann",
        "incident 7",
    )
    .await
    .unwrap();
    // mail: a call in flight, a `set` override, switched to shadow for an hour.
    let Admission::Run(call) = worker.admit("send", 1, None).await.unwrap() else {
        panic!("mail's first call was not admitted");
    };
    overrides::apply(
        &store,
        &audit,
        &mail,
        OverrideAction::Set {
            duration: hour,
            ratio: Some(0.5),
            min_allowance: Some(7),
        },
        "ann",
        "a slow partner",
    )
    .await
    .unwrap();
    enforcement::switch(
        &store,
        &audit,
        &mail,
        Enforcement::Shadow,
        Some(hour),
        "ann",
        "trying the new policy",
    )
    .await
    .unwrap();
    // broken: a key of another type where its budget is.
    let _: () = redis.cmd(&["RPUSH", &format!("{prefix}:v1:{{broken}}"), "not a budget"]);

    let operators = Token::parse_list("ann:operator-token-0123456789", "operator", "t").unwrap();
    let mut settings = ConsoleSettings::new(config.clone(), operators, Viewers::Open);
    settings.bind = "127.0.0.1:0".parse().unwrap();
    settings.history_every = Duration::from_secs(1);
    let console = fleet_budget_console::start(settings).await.unwrap();
    let addr = console.addr().to_string();

    // Every answer read on the way is held to the schema, the last one shows everything.
    let started = Instant::now();
    let mut answers = Vec::new();
    let answer = loop {
        let (status, body) = get(&addr, "/api/overview").await;
        assert_eq!(status, 200, "{body}");
        let a: Value = serde_json::from_str(&body).unwrap();
        let done = complete(&a);
        answers.push(a);
        if done {
            break answers.last().cloned().unwrap();
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the overview never showed the whole fleet: {body}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let verdict = validate("overview", &answers.iter().collect::<Vec<_>>());
    assert_eq!(
        verdict["schemas"]["overview"],
        json!([]),
        "the schema itself: {verdict}"
    );
    for (errors, a) in verdict["documents"]
        .as_array()
        .unwrap()
        .iter()
        .zip(&answers)
    {
        assert_eq!(
            errors,
            &json!([]),
            "/api/overview does not match docs/schemas/console/overview.schema.json: {a}"
        );
    }
    println!(
        "{} answers of /api/overview held to the schema (the last after {:.1} s)",
        answers.len(),
        started.elapsed().as_secs_f64()
    );

    // The same answer changed is refused: the schema holds every field.
    let mut renamed = answer.clone();
    let first = renamed["dependencies"][0].as_object_mut().unwrap();
    let spent = first.remove("spent").unwrap();
    first.insert("retries_spent".to_owned(), spent);
    let mut missing = answer.clone();
    missing.as_object_mut().unwrap().remove("read_age_ms");
    let mut unknown = answer.clone();
    unknown["workers"]["idle"] = json!(3);
    let mut wrong_type = answer.clone();
    let mail_row = wrong_type["dependencies"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|r| r["dependency"] == "mail")
        .unwrap();
    mail_row["concurrency"]["in_flight"] = json!("1");
    let refused = validate("overview", &[&renamed, &missing, &unknown, &wrong_type]);
    for (what, errors) in ["renamed", "missing", "unknown", "wrong type"]
        .iter()
        .zip(refused["documents"].as_array().unwrap())
    {
        assert!(
            errors.as_array().is_some_and(|e| !e.is_empty()),
            "a document with a field {what} passed: {refused}"
        );
    }

    // Paged: 450 dependencies more (copies of mail's budget key, found by the reading's scan)
    // make 452 rows, 200 a page; each page is held to the schema, and one reading's pages show
    // every row once.
    let copies =
        "for i = 1, 450 do redis.call('COPY', KEYS[1], ARGV[1] .. ':v1:{extra' .. i .. '}') end";
    let mail_key = format!("{prefix}:v1:{{mail}}");
    let _: () = redis.cmd(&["EVAL", copies, "1", &mail_key, &prefix]);
    let started = Instant::now();
    let pages = loop {
        let pages: Vec<Value> = {
            let mut pages = Vec::new();
            // Page 4 is past the last: the last again.
            for n in 1..=4 {
                let (status, body) = get(&addr, &format!("/api/overview?page={n}")).await;
                assert_eq!(status, 200, "{body}");
                pages.push(serde_json::from_str(&body).unwrap());
            }
            pages
        };
        let one_reading = pages
            .iter()
            .all(|p| p["read_at_ms"] == pages[0]["read_at_ms"]);
        if one_reading && pages[0]["listed"] == 452 {
            break pages;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the overview never listed the 452 rows in one reading: {}",
            pages[0]["listed"]
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let verdict = validate("overview", &pages.iter().collect::<Vec<_>>());
    assert!(
        verdict["documents"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e == &json!([])),
        "a page does not match the schema: {verdict}"
    );
    let mut shown: Vec<String> = pages[..3]
        .iter()
        .flat_map(|p| p["dependencies"].as_array().unwrap().clone())
        .map(|r| r["dependency"].as_str().unwrap().to_owned())
        .collect();
    let counts: Vec<usize> = pages
        .iter()
        .map(|p| p["dependencies"].as_array().unwrap().len())
        .collect();
    assert_eq!(counts, [200, 200, 52, 52]);
    assert_eq!(
        (pages[3]["page"].clone(), pages[3]["pages"].clone()),
        (json!(3), json!(3))
    );
    assert_eq!(pages[0]["unusable_listed"], 1);
    shown.sort();
    let mut expected: Vec<String> = (1..=450).map(|i| format!("extra{i}")).collect();
    expected.extend(["mail".to_owned(), "search".to_owned()]);
    expected.sort();
    assert_eq!(shown, expected, "every row on exactly one page");

    worker
        .finish(call, fleet_budget::CallOutcome::Succeeded)
        .await;
    worker.shutdown().await.unwrap();
    console.stop().await;
}
