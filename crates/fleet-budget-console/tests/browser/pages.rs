//! The dead-letter pages in Chromium: a hostile row keeps its buttons on screen and its secret
//! off the page, a held replay blocks no dry run and says why a sample waits, and a message's
//! page replays that message alone.

use fleet_budget::DeadLetterReason;
use fleet_budget_amqp::headers::{self, DeadLetterRecord};
use lapin::BasicProperties;
use lapin::types::{FieldTable, ShortString};
use serde_json::Value;

use crate::OPERATOR;
use crate::breaker::*;
use crate::fleet::*;
use crate::webdriver::Driver;

/// A dead letter of `record`, published as a worker would (without an AMQP `type`: a long task
/// is no short string); its id.
async fn publish(f: &Fleet, record: &DeadLetterRecord, body: &[u8]) -> String {
    let p = f.broker.publisher().await;
    let mut t = FieldTable::default();
    record.write(&mut t);
    headers::set_u64(&mut t, headers::ATTEMPT, u64::from(record.attempts));
    let id = headers::new_message_id();
    let props = BasicProperties::default()
        .with_message_id(ShortString::from(id.clone()))
        .with_content_type(ShortString::from("application/json"))
        .with_delivery_mode(2)
        .with_headers(t);
    p.publish(
        &f.broker.topology.dead_exchange,
        &record.original_routing_key,
        body,
        props,
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    p.close().await;
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_replay_blocks_no_dry_run_and_a_message_page_replays_that_message() {
    let f = fleet_with("console-pages", BREAKER);
    f.broker.migrate().await;
    let now = fleet_budget::clock::now_ms();
    let p = f.broker.publisher().await;
    f.broker
        .seed_dead_letters(
            &p,
            4,
            "search",
            DeadLetterReason::BudgetExhausted,
            0,
            now - 60_000,
        )
        .await;
    p.close().await;
    let hostile = DeadLetterRecord {
        task: "t".repeat(100 * 1024),
        error_class: format!("redis://admin:hunter2@db.internal/{}", "c".repeat(400)),
        ..f.broker
            .dead_letter_record("mail", DeadLetterReason::NonRetryable, now - 30_000)
    };
    let hostile_id = publish(&f, &hostile, br#"{"to":"x@example.com"}"#).await;
    reindex(&f).await;

    let c = console(&f.config).await;
    let base = format!("http://{}", c.addr());
    let driver = Driver::start().await;
    let b = driver.browser().await;
    login(&b, &base, OPERATOR).await;

    // The hostile row: its secret redacted, its buttons on screen.
    let dlq = format!("{base}/dead-letters");
    b.until_text("#groups tbody", Some(&dlq), |t| {
        t.contains("search") && t.contains("mail")
    })
    .await;
    assert!(!b.source().await.contains("hunter2"));
    assert!(
        b.text("#groups")
            .await
            .contains("redis://admin:***@db.internal")
    );
    let on_screen = b
        .run(
            "const r = document.querySelector('#groups tbody tr:last-child form.purge button')\
             .getBoundingClientRect(); return r.right <= window.innerWidth && r.width > 0;",
        )
        .await;
    assert_eq!(
        on_screen,
        Value::Bool(true),
        "the row's buttons stay on screen"
    );
    assert!(b.text("#groups-shown").await.starts_with("1–2 of 2 groups"));

    // A replay held by search's open breaker.
    prepare_search_replay(&b, &base, 4, "INC-9 search recovering").await;
    open_breaker(&f.config).await;
    b.click("#confirm-replay button").await;
    b.until_text("#j-state", None, |t| t == "held").await;
    let held_page = b.run("return location.href").await;

    // Beside it: another group's dry run answers (no 409), and a read of messages asked for
    // says it waits for the replay.
    b.goto(&dlq).await;
    b.click("#groups tbody tr:last-child form.replay button")
        .await;
    assert_eq!(b.text("#p-moved").await, "1");
    b.goto(&dlq).await;
    b.click("form[action=\"/dead-letters/refresh\"] button")
        .await;
    let waiting = b
        .until_text("#sample", Some(&dlq), |t| {
            t.contains("waits until the replay")
        })
        .await;
    assert!(waiting.contains("waits"), "{waiting}");
    b.goto(held_page.as_str().unwrap_or_default()).await;
    // Still held while the breaker is open. Waited for, not read once: the page loaded between
    // two of the replay's checks of the breaker can show its last progress as "running" for a
    // moment (seen once under load, CI of stop 40).
    b.until_text("#j-state", None, |t| t == "held").await;

    // The breaker closes: the replay ends, then the sample is read.
    close_breaker(&f.config).await;
    b.until_text("#j-state", None, |t| t == "done" || t == "failed")
        .await;
    assert_eq!(progress_now(&b).await.2, "4");
    b.until_text("#sample", Some(&dlq), |t| t.starts_with("Sampled"))
        .await;

    // The hostile message's page: its body, its error redacted; replay that message alone.
    b.goto(&format!("{base}/dead-letters/message?id={hostile_id}"))
        .await;
    assert!(b.text("#body").await.contains("\"to\": \"x@example.com\""));
    assert!(b.text("#errors").await.contains("redis://admin:***@"));
    assert!(b.text("#headers").await.contains("102,400 bytes in all"));
    assert!(!b.source().await.contains("hunter2"));
    b.type_into("#replay-message input[name=note]", "INC-9 this one too")
        .await;
    b.click("#replay-message button").await;
    b.until_text("#j-state", None, |t| t == "done" || t == "failed")
        .await;
    assert_eq!(
        b.text("#j-kind").await,
        "replay of one message (dead queue)"
    );
    assert_eq!(b.text("#j-moved").await, "1");
    assert_eq!(b.text("#j-error").await, "-");
    assert_eq!(f.broker.depth(&f.broker.topology.work_queue).await, 5);
    assert_eq!(f.broker.depth(&f.broker.topology.dead_queue).await, 0);
    b.quit().await;
    c.stop().await;
}
