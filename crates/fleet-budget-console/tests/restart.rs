//! A restart of the real `budgetctl console` process (killed with SIGKILL, started again on the
//! same port, Redis of the test's own, the shared RabbitMQ under a topology of its own):
//! operators stay logged in, a replay that was moving messages when the console died is listed
//! as interrupted with the counts it reached, and running it again moves each message once (or
//! parks its original in doubt, when the killed run had sent a copy it never saw confirmed).
//! A token taken out of the configuration ends its sessions at the next start. The same restart
//! driven from Chromium: the browser's session sees the replay interrupted and runs it again.
//! Every `/api/replay` answer read is held to `docs/schemas/console/replay.schema.json`.
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

#[path = "support/console_process.rs"]
mod console_process;

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fleet_budget::DeadLetterReason;
use fleet_budget::control::DeadLetterIndex;
use fleet_budget::store::{RedisStore, RedisTarget};
use fleet_budget::testing::{RedisServer, free_port};
use fleet_budget_amqp::testing::{TestBroker, unique_prefix};
use fleet_budget_amqp::{Replayer, WorkerConfig, queue_depths};
use serde_json::Value;
use tokio::process::Child;

use console_process::{get, hold_to_schema, job_until, login, post, start_console};
use support::{csrf_of, location};
use webdriver::Driver;

const OPERATOR: &str = "operator-token-0123456789";
const OTHER_OPERATOR: &str = "another-operator-token-9876543210";
/// Dead letters the replay moves.
const MESSAGES: u64 = 12;

struct Setup {
    _redis: RedisServer,
    broker: TestBroker,
    config: WorkerConfig,
    config_path: PathBuf,
    tokens: PathBuf,
    port: u16,
}

impl Setup {
    fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Starts `budgetctl console` with the operator tokens in `self.tokens`; waits until it
    /// answers.
    async fn start(&self) -> Child {
        start_console(
            &self.config_path,
            &self.tokens,
            &self.addr(),
            &["--dlq-refresh-secs", "1"],
            Stdio::null(),
        )
        .await
    }
}

fn setup(name: &str) -> Setup {
    let redis = RedisServer::start();
    let broker = TestBroker::new(name);
    let toml = format!(
        "[redis]\nurl = \"{}\"\nkey_prefix = \"{}\"\ntimeout_ms = 10000\n\
         [dependencies.search]\ntasks = [\"index\"]\n\
         [amqp]\nurl = \"{}\"\nprefix = \"{}\"\n",
        redis.url(),
        unique_prefix("fbcr"),
        broker.url,
        broker.settings.prefix
    );
    let config = WorkerConfig::from_toml(&toml, "restart test").unwrap();
    let dir = std::env::temp_dir();
    let config_path = dir.join(format!("{}.toml", unique_prefix("fbcr")));
    std::fs::write(&config_path, &toml).unwrap();
    let tokens = dir.join(format!("{}.tokens", unique_prefix("fbcr")));
    std::fs::write(&tokens, format!("ann:{OPERATOR}\n")).unwrap();
    Setup {
        _redis: redis,
        broker,
        config,
        config_path,
        tokens,
        port: free_port(),
    }
}

fn store(config: &WorkerConfig) -> Arc<RedisStore> {
    let r = &config.budget.redis;
    Arc::new(
        RedisStore::new_with_tls(
            RedisTarget::from_settings(r),
            &r.key_prefix,
            Duration::from_secs(5),
            &r.tls,
        )
        .unwrap(),
    )
}

/// `MESSAGES` dead letters of `search`, indexed.
async fn dead_letters(s: &Setup) {
    let p = s.broker.publisher().await;
    let now = fleet_budget::clock::now_ms();
    for i in 0..MESSAGES {
        let record =
            s.broker
                .dead_letter_record("search", DeadLetterReason::BudgetExhausted, now - 1000);
        s.broker
            .publish_dead_letter(&p, &record, format!("job {i}").as_bytes())
            .await;
    }
    p.close().await;
    Replayer::new(s.broker.url.clone(), s.broker.topology.clone(), None)
        .with_index(Some(DeadLetterIndex::new(store(&s.config))))
        .reindex()
        .await
        .unwrap();
}

/// What the rerun (`rerun`, its job's answer) leaves, read message by message (the queues are
/// drained): the dead-letter queue empty; each dead letter in the work queue once, or its original
/// parked in doubt, never copied twice. In doubt (docs/semantics.md, "Interrupted actions"):
/// the killed run had claimed it and sent, or was about to send, a copy whose
/// confirm it never saw; the copy may be in the work queue (then the message is in both) or not
/// (a SIGKILL between the claim and the publish: then only parked). Lost: none.
async fn moved_once_or_in_doubt(s: &Setup, rerun: &Value) {
    let depths = queue_depths(s.broker.url.clone(), &s.broker.topology)
        .await
        .unwrap();
    assert_eq!(depths.dead, 0, "dead letters left after the rerun");
    let bodies = |got: Vec<(lapin::BasicProperties, Vec<u8>)>| -> Vec<String> {
        got.into_iter()
            .map(|(_, b)| String::from_utf8_lossy(&b).into_owned())
            .collect()
    };
    let work = bodies(s.broker.drain(&s.broker.topology.work_queue).await);
    let parked = bodies(s.broker.drain(&s.broker.topology.parked_queue).await);
    let in_doubt = rerun["parked"].as_u64().unwrap();
    let copies_of_parked = parked.iter().filter(|b| work.contains(b)).count();
    println!(
        "after the rerun: work {} (dead 0), parked in doubt {} ({copies_of_parked} of them with \
         their copy in the work queue)",
        work.len(),
        parked.len()
    );
    assert_eq!(
        parked.len() as u64,
        in_doubt,
        "only the originals in doubt are parked"
    );
    for i in 0..MESSAGES {
        let body = format!("job {i}");
        let copies = work.iter().filter(|b| **b == body).count();
        assert!(copies <= 1, "{body} moved {copies} times");
        assert!(
            copies == 1 || parked.contains(&body),
            "{body} neither in the work queue nor parked"
        );
    }
    assert_eq!(
        work.len() + parked.len() - copies_of_parked,
        usize::try_from(MESSAGES).unwrap(),
        "nothing else in the queues"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_and_an_interrupted_replay_outlive_a_restart_and_the_rerun_moves_each_message_once()
 {
    let s = setup("console-restart");
    s.broker.migrate().await;
    dead_letters(&s).await;
    let addr = s.addr();
    let mut console = s.start().await;
    let cookie = login(&addr, OPERATOR).await;
    let (_, _, page) = get(&addr, &cookie, "/replays").await;
    let csrf = csrf_of(&page);

    // A replay slow enough to be killed half-way: 1 message a second.
    let form = format!("csrf={csrf}&dependency=search&rate=1&confirm=replay&note=restart%20test");
    let (status, head, body) = post(&addr, &cookie, "/replay/start", &form).await;
    assert_eq!(status, 303, "{head}{body}");
    let id = location(&head).trim_start_matches("/replay/").to_owned();
    let reached = job_until(&addr, &cookie, &id, |j| j["moved"].as_u64() >= Some(2)).await;
    println!("before the kill: {reached}");
    // The record is written every 2 s: let one carry the moves.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    console.kill().await.unwrap();
    let killed_at = Instant::now();

    // Started again: the same cookie still reads and still changes.
    let mut console = s.start().await;
    let (status, head, page) = get(&addr, &cookie, "/replays").await;
    assert_eq!(
        status, 200,
        "the session did not survive the restart: {head}"
    );
    assert!(page.contains("ann (operator)"), "{page}");
    assert_eq!(csrf_of(&page), csrf, "the session's CSRF token is kept");
    let job = job_until(&addr, &cookie, &id, |j| j["state"] == "interrupted").await;
    println!(
        "interrupted shown {:?} after the kill: {job}",
        killed_at.elapsed()
    );
    let stopped_at = job["moved"].as_u64().unwrap();
    assert!(stopped_at >= 2, "the counts are where it stopped: {job}");
    assert!(stopped_at < MESSAGES, "{job}");
    let (_, _, page) = get(&addr, &cookie, &format!("/replay/{id}")).await;
    assert!(page.contains("id=\"interrupted\""), "{page}");
    assert!(page.contains("Run again"), "{page}");
    let (_, _, list) = get(&addr, &cookie, "/replays").await;
    assert!(
        list.contains(&format!("/replay/{id}")),
        "listed after the restart"
    );

    // Run again: every message moved once, none twice.
    let (status, head, body) = post(
        &addr,
        &cookie,
        &format!("/replay/{id}/rerun"),
        &format!("csrf={csrf}"),
    )
    .await;
    assert_eq!(status, 303, "{head}{body}");
    let again = location(&head).trim_start_matches("/replay/").to_owned();
    assert_ne!(again, id);
    let rerun = job_until(&addr, &cookie, &again, |j| j["done"] == true).await;
    println!("the rerun: {rerun}");
    assert_eq!(rerun["state"], "done", "{rerun}");
    assert_eq!(rerun["rerun_of"], id.as_str());
    moved_once_or_in_doubt(&s, &rerun).await;

    // A token taken out of the configuration ends its sessions at the next start.
    console.kill().await.unwrap();
    std::fs::write(&s.tokens, format!("ann:{OTHER_OPERATOR}\n")).unwrap();
    let mut console = s.start().await;
    // (The console is open to viewers: the old cookie reads as anyone does, and changes nothing.)
    let (status, _, page) = get(&addr, &cookie, "/replays").await;
    assert_eq!(status, 200);
    assert!(!page.contains("ann (operator)"), "{page}");
    assert!(page.contains("anonymous (viewer)"), "{page}");
    let (status, _, _) = post(
        &addr,
        &cookie,
        &format!("/replay/{id}/rerun"),
        &format!("csrf={csrf}"),
    )
    .await;
    assert_eq!(status, 401, "the old session changes nothing");
    let fresh = login(&addr, OTHER_OPERATOR).await;
    let (_, _, page) = get(&addr, &fresh, "/replays").await;
    assert!(page.contains("ann (operator)"));
    console.kill().await.unwrap();
    let _ = std::fs::remove_file(&s.config_path);
    let _ = std::fs::remove_file(&s.tokens);
}

/// The restart as an operator meets it in Chromium: logged in in the browser, a replay started
/// from the dead-letter page, the console killed (SIGKILL) and started again; the same browser
/// session reads the replay's page, which says it was interrupted, and its "Run again" moves
/// what is left, each message once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_chromium_a_replay_killed_with_its_console_reads_interrupted_and_runs_again() {
    let s = setup("console-restart-browser");
    s.broker.migrate().await;
    dead_letters(&s).await;
    let addr = s.addr();
    let base = format!("http://{addr}");
    let mut console = s.start().await;
    let driver = Driver::start().await;
    let b = driver.browser().await;
    b.goto(&format!("{base}/login")).await;
    b.type_into("#login input[name=token]", OPERATOR).await;
    b.click("#login button").await;
    b.until_text("header .who", None, |t| t.contains("ann (operator)"))
        .await;

    // The dry run from the group's row, then the replay at 1 message a second.
    let replay_button = "form.replay button";
    b.until_text(
        "#groups tbody",
        Some(&format!("{base}/dead-letters")),
        |t| t.contains("search"),
    )
    .await;
    b.click(replay_button).await;
    b.type_into("#confirm-replay input[name=rate]", "1").await;
    b.type_into("#confirm-replay input[name=note]", "browser restart test")
        .await;
    b.click("#confirm-replay button").await;
    b.until_text("#j-state", None, |t| !t.is_empty()).await;
    let path = b.run("return location.pathname").await;
    let path = path.as_str().unwrap().to_owned();
    assert!(path.starts_with("/replay/"), "{path}");
    let id = path.trim_start_matches("/replay/").to_owned();
    // The page's live refresh shows the moves.
    let moved = b
        .until_text("#j-moved", None, |t| t.parse::<u64>().unwrap_or(0) >= 2)
        .await;
    println!("moved before the kill (the page): {moved}");
    // The record is written every 2 s: let one carry the moves.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    console.kill().await.unwrap();

    // Started again: the same browser session reads the replay as interrupted.
    let mut console = s.start().await;
    let state = b
        .until_text("#j-state", Some(&format!("{base}{path}")), |t| {
            t == "interrupted"
        })
        .await;
    assert_eq!(state, "interrupted");
    assert!(b.text("header .who").await.contains("ann (operator)"));
    b.find("#interrupted").await;
    let stopped_at: u64 = b.text("#j-moved").await.parse().unwrap();
    assert!((2..MESSAGES).contains(&stopped_at), "{stopped_at}");
    b.screenshot("replay-interrupted").await;

    // Run again, from the page.
    b.click("#rerun button").await;
    let again = b.until_text("#j-state", None, |t| t == "done").await;
    assert_eq!(again, "done");
    let path_again = b.run("return location.pathname").await;
    let again_id = path_again
        .as_str()
        .unwrap()
        .trim_start_matches("/replay/")
        .to_owned();
    assert_ne!(again_id, id, "a new job");
    // Its answer, in the browser's session, held to the schema.
    let job = b
        .run_async(&format!(
            "const done = arguments[arguments.length - 1];\
             fetch('/api/replay/{again_id}', {{credentials: 'same-origin'}})\
               .then(r => r.text()).then(done).catch(e => done(''));"
        ))
        .await;
    let job: Value = serde_json::from_str(job.as_str().unwrap_or_default()).unwrap();
    hold_to_schema(&job);
    assert_eq!(job["rerun_of"], id.as_str(), "{job}");
    moved_once_or_in_doubt(&s, &job).await;
    b.quit().await;
    console.kill().await.unwrap();
    let _ = std::fs::remove_file(&s.config_path);
    let _ = std::fs::remove_file(&s.tokens);
}
