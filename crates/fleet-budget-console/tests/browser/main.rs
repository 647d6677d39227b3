//! The console in a real headless Chromium (Debian's `chromium` through `chromedriver`), on a
//! Redis of the test's own and the shared RabbitMQ (a topology of the test's own): what an
//! operator sees and does, checked in the browser.
//!
//! Set `FLEET_BUDGET_CONSOLE_SCREENSHOTS=docs` to save the pages as `docs/console-*.png`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod breaker;
mod fleet;
mod security;
mod webdriver;

use std::time::Duration;

use fleet_budget::control::AuditLog;
use fleet_budget::{DeadLetterReason, Failure, FleetBudget};
use fleet_budget_amqp::headers::DeadLetterRecord;
use serde_json::Value;

use crate::breaker::*;
use crate::fleet::*;
use crate::webdriver::{Driver, http};

// The dead-letter pages (issue 32), in a group of their own.
mod pages;
// Operating the console (issue 32): errors, times, the audit table, the risks.
mod operating;
// Shadow mode from the console (issue 34) and human times on the overview.
mod shadow;
// Every page at 100,000 dead letters (issue 32): weight, secret, labels; times printed.
mod hundred_thousand;
// The fleet at scale, filled as `examples/console_bench.rs` fills it.
#[path = "../support/scale.rs"]
mod scale;

const OPERATOR: &str = "operator-token-0123456789";
const VIEWER: &str = "viewer-token-0123456789";

/// Overview shows the brownout as it happens (the page refreshes itself); a freeze made on the
/// page is what the `budgetctl status --json` binary shows, and is in the audit with the
/// token's label; a change without the operator's session or without the CSRF token is refused
/// and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_brownout_shows_live_and_a_freeze_from_the_page_is_enforced_and_audited() {
    let f = fleet("console-freeze");
    let c = console(&f.config).await;
    let base = format!("http://{}", c.addr());
    let driver = Driver::start().await;
    let b = driver.browser().await;

    // Reads need a login.
    b.goto(&format!("{base}/")).await;
    b.find("#login").await;
    login(&b, &base, OPERATOR).await;
    b.goto(&format!("{base}/")).await;

    // search browns out while the page is open: most retries are denied.
    let budget = FleetBudget::from_config(&f.config.budget)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let failure = Failure::retryable("search returned 503").with_class("http_503");
    for _ in 0..30 {
        budget
            .on_attempt("index", 1)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let _ = budget
            .on_failure("index", 1, &failure)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
    assert!(
        !budget.in_fallback(),
        "the brownout's decisions were taken by the fallback, not by Redis"
    );
    budget.shutdown().await.unwrap_or_else(|e| panic!("{e}"));
    let alert = b
        .until_text("#overview tbody tr:first-child", None, |t| {
            t.contains("DENYING")
        })
        .await;
    assert!(alert.starts_with("search"), "{alert}");

    // A worker whose Redis user may not touch search's key decides search from its fallback,
    // and says so in the worker registry: the overview counts it for search, not for mail.
    let worker = cut_off_from_budgets(&f).await;
    let _ = worker
        .on_failure("index", 1, &failure)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(worker.in_fallback());
    // Each row found by its dependency: the order is worst first, and once the brownout's
    // denials leave the rate window both rows are calm and sort by name (clean-clone run 15 of
    // session 10 read mail's row here).
    let cell = b
        .until_text(&fallback_cell("search"), None, |t| t == "1")
        .await;
    assert_eq!(cell, "1");
    let line = b
        .until_text("#workers-line", None, |t| {
            t.starts_with("1 workers reporting, 1 in fallback, 0 silent")
        })
        .await;
    assert!(line.contains("cut off from Redis"), "{line}");
    assert_eq!(
        b.text(&fallback_cell("mail")).await,
        "0",
        "mail is decided by Redis"
    );
    b.screenshot("overview").await;
    b.goto(&format!("{base}/workers")).await;
    let listed = b.text("#workers tbody").await;
    assert!(
        listed.contains(worker.worker_id().unwrap_or_default())
            && listed.contains("in fallback")
            && listed.contains("search ("),
        "{listed}"
    );
    b.screenshot("workers").await;
    b.goto(&format!("{base}/dependency/search")).await;
    let cell = b.text("#workers-in-fallback").await;
    assert!(cell.starts_with("1 (every worker)"), "{cell}");
    worker.shutdown().await.unwrap_or_else(|e| panic!("{e}"));
    b.goto(&format!("{base}/")).await;

    // Freeze from the dependency's page (none before it, as `budgetctl status` shows).
    assert_eq!(status_freeze(&f).await, None);
    b.goto(&format!("{base}/dependency/search")).await;
    b.type_into(
        "#freeze-form input[name=reason]",
        "INC-7 search browning out",
    )
    .await;
    b.click("#freeze-form button").await;
    let shown = b
        .until_text("#overrides", None, |t| t.contains("FROZEN"))
        .await;
    assert!(shown.contains("by ann"), "{shown}");
    assert_eq!(
        freeze_of(&f.config).await.as_deref(),
        Some("ann (INC-7 search browning out)")
    );
    assert_eq!(
        status_freeze(&f).await.as_deref(),
        Some("ann (INC-7 search browning out)"),
        "`budgetctl status --json` shows the freeze made on the page"
    );
    let trail = AuditLog::default()
        .read(&store(&f.config), None, None, Some("search"), 10)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let last = trail.last().unwrap_or_else(|| panic!("no audit entry"));
    assert_eq!(
        (last.action.as_str(), last.actor.as_str()),
        ("freeze", "ann")
    );
    assert!(
        !format!("{trail:?}").contains(OPERATOR),
        "the token is never recorded"
    );
    b.screenshot("dependency").await;

    // The operator's session without the CSRF token, or with a wrong one: refused.
    let path = "/dependency/search/override";
    assert_eq!(
        post_from_page(&b, path, "action=unfreeze&reason=x").await,
        403
    );
    assert_eq!(
        post_from_page(&b, path, "action=unfreeze&reason=x&csrf=0000").await,
        403
    );
    // A viewer's session with its own CSRF token: refused.
    b.click("header form button").await;
    login(&b, &base, VIEWER).await;
    b.goto(&format!("{base}/dependency/search")).await;
    assert!(
        !b.source().await.contains("freeze-form"),
        "a viewer sees no form"
    );
    let csrf = b
        .run("return document.querySelector('header input[name=csrf]').value")
        .await;
    let body = format!(
        "action=unfreeze&reason=x&csrf={}",
        csrf.as_str().unwrap_or_default()
    );
    assert_eq!(post_from_page(&b, path, &body).await, 403);
    // No session at all (a script elsewhere), and a form posted from another site.
    let addr = c.addr().to_string();
    let form = b"action=unfreeze&reason=x";
    let (status, _, _) = http(
        &addr,
        "POST",
        path,
        &[],
        Some(("application/x-www-form-urlencoded", form)),
    )
    .await;
    assert_eq!(status, 401);
    let (status, _, _) = http(
        &addr,
        "POST",
        path,
        &[("Origin", "http://evil.example")],
        Some(("application/x-www-form-urlencoded", form)),
    )
    .await;
    assert_eq!(status, 403);
    // Nothing changed.
    assert_eq!(
        freeze_of(&f.config).await.as_deref(),
        Some("ann (INC-7 search browning out)")
    );
    let after = AuditLog::default()
        .read(&store(&f.config), None, None, Some("search"), 10)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        after.len(),
        trail.len(),
        "a refused change leaves no audit entry"
    );

    // Every response carries the policy that forbids inline scripts.
    let (_, head, _) = http(&addr, "GET", "/login", &[], None).await;
    assert!(
        head.contains("script-src 'self'") && head.contains("frame-ancestors 'none'"),
        "{head}"
    );
    assert!(
        head.to_ascii_lowercase()
            .contains("x-content-type-options: nosniff"),
        "{head}"
    );
    b.quit().await;
    c.stop().await;
}

/// Dead letters grouped in the browser; hostile header text renders as text and runs no
/// script; a group's dry run predicts exactly what its replay then moves; a purge asks for its
/// own confirmation and is audited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_are_grouped_replayed_as_predicted_and_hostile_text_stays_text() {
    // On the heap: the whole test as one future outgrew the test thread's 2 MiB stack in a
    // debug build (a stack overflow, not a failure of the console).
    Box::pin(grouped_replayed_as_predicted()).await;
}

async fn grouped_replayed_as_predicted() {
    let f = fleet("console-dlq");
    f.broker.migrate().await;
    let now = fleet_budget::clock::now_ms();
    let publisher = f.broker.publisher().await;
    f.broker
        .seed_dead_letters(
            &publisher,
            5,
            "search",
            DeadLetterReason::BudgetExhausted,
            0,
            now - 60_000,
        )
        .await;
    let hostile = DeadLetterRecord {
        task: "<script>window.__pwned=1</script>".to_owned(),
        error_class: "pay\u{202E}lanoitan".to_owned(),
        error: "\"><img src=x onerror=\"window.__pwned=2\">".to_owned(),
        ..f.broker
            .dead_letter_record("mail", DeadLetterReason::NonRetryable, now - 30_000)
    };
    let hostile_id = f
        .broker
        .publish_dead_letter(&publisher, &hostile, b"{}")
        .await;
    publisher.close().await;
    reindex(&f).await;

    let c = console(&f.config).await;
    let base = format!("http://{}", c.addr());
    let driver = Driver::start().await;
    let b = driver.browser().await;
    login(&b, &base, OPERATOR).await;

    let dlq = format!("{base}/dead-letters");
    b.until_text("#groups tbody", Some(&dlq), |t| {
        t.contains("search") && t.contains("mail")
    })
    .await;
    let first = b.text("#groups tbody tr:first-child").await;
    assert!(
        first.starts_with("search budget_exhausted http_503 5"),
        "{first}"
    );
    let pwned = "return window.__pwned === undefined";
    assert_eq!(b.run(pwned).await, Value::Bool(true));
    let text = b.text("#groups").await;
    assert!(
        text.contains("pay\\u{202e}lanoitan"),
        "U+202E shown by code point: {text}"
    );
    assert_eq!(b.text("#counts-exact").await, "Exact.");
    b.screenshot("dead-letters").await;

    // Messages one by one are read only when asked: then the hostile group's messages and the
    // message's headers are text, no script.
    assert!(
        b.text("#sample").await.contains("only when asked"),
        "no look read the queue"
    );
    b.click("form[action=\"/dead-letters/refresh\"] button")
        .await;
    b.until_text("#sample", Some(&dlq), |t| t.starts_with("Sampled"))
        .await;
    b.click("#groups tbody tr:nth-child(2) td:nth-child(3) a")
        .await;
    let messages = b.text("#messages").await;
    assert!(
        messages.contains("<script>window.__pwned=1</script>"),
        "{messages}"
    );
    assert!(messages.contains("onerror="), "{messages}");
    assert_eq!(b.run(pwned).await, Value::Bool(true));
    b.screenshot("group").await;
    b.goto(&format!("{base}/dead-letters/message?id={hostile_id}"))
        .await;
    let headers = b.text("#headers").await;
    assert!(
        headers.contains("<script>window.__pwned=1</script>"),
        "{headers}"
    );
    assert!(headers.contains("\\u{202e}"), "{headers}");
    assert!(!headers.contains('\u{202E}'), "{headers}");
    assert_eq!(b.run(pwned).await, Value::Bool(true));
    assert_eq!(
        b.run("return document.querySelectorAll('main script, main img').length")
            .await,
        Value::from(0)
    );
    b.screenshot("message").await;

    // Replay the search group: the dry run's prediction, then the run.
    b.goto(&dlq).await;
    b.click("#groups tbody tr:first-child form.replay button")
        .await;
    let moved = b.text("#p-moved").await;
    assert_eq!(moved, "5");
    assert_eq!(b.text("#p-skipped").await, "1");
    b.screenshot("dry-run").await;
    b.type_into("#confirm-replay input[name=note]", "INC-7 search is back")
        .await;
    b.click("#confirm-replay button").await;
    b.until_text("#j-state", None, |t| t == "done" || t == "failed")
        .await;
    assert_eq!(
        b.text("#j-moved").await,
        moved,
        "the replay moves what its dry run predicted"
    );
    assert_eq!(b.text("#j-error").await, "-");
    b.screenshot("replay").await;
    assert_eq!(f.broker.depth(&f.broker.topology.work_queue).await, 5);

    // Purge the hostile group: a confirmation first, then the word.
    b.until_text("#groups tbody", Some(&dlq), |t| !t.contains("search"))
        .await;
    b.click("#groups tbody tr:first-child form.purge button")
        .await;
    assert_eq!(b.text("#purge-count").await, "1");
    b.type_into("#confirm-purge input[name=confirm]", "purge")
        .await;
    b.type_into("#confirm-purge input[name=note]", "poison, not a job")
        .await;
    b.click("#confirm-purge button").await;
    let purged = b.text("#purged").await;
    assert!(purged.starts_with("1 messages removed"), "{purged}");
    assert_eq!(f.broker.depth(&f.broker.topology.dead_queue).await, 0);

    let trail = AuditLog::default()
        .read(&store(&f.config), None, None, None, 10)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let actions: Vec<(&str, &str)> = trail
        .iter()
        .map(|e| (e.action.as_str(), e.actor.as_str()))
        .collect();
    assert_eq!(
        actions,
        [
            ("replay_started", "ann"),
            ("replay", "ann"),
            ("dlq_purge_started", "ann"),
            ("dlq_purge", "ann")
        ]
    );
    b.goto(&format!("{base}/audit")).await;
    b.screenshot("audit").await;
    b.quit().await;
    c.stop().await;
}

/// A replay started on the page while the dependency's breaker is open is held (the page says
/// so, and nothing moves); once the breaker closes it resumes and moves every message. A replay
/// held again is cancelled from the page: it moves nothing, leaves its messages in the queue,
/// and who cancelled it is in the audit trail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_held_by_an_open_breaker_resumes_when_it_closes_and_can_be_cancelled() {
    let f = fleet_with("console-held", BREAKER);
    f.broker.migrate().await;
    let now = fleet_budget::clock::now_ms();
    let seed = |n: usize| {
        let broker = &f.broker;
        async move {
            let publisher = broker.publisher().await;
            broker
                .seed_dead_letters(
                    &publisher,
                    n,
                    "search",
                    DeadLetterReason::BudgetExhausted,
                    0,
                    now - 60_000,
                )
                .await;
            publisher.close().await;
        }
    };
    seed(4).await;
    reindex(&f).await;
    let c = console(&f.config).await;
    let base = format!("http://{}", c.addr());
    let driver = Driver::start().await;
    let b = driver.browser().await;
    login(&b, &base, OPERATOR).await;

    // Started while the breaker is open: held, nothing moves.
    prepare_search_replay(&b, &base, 4, "INC-9 search recovering").await;
    open_breaker(&f.config).await;
    b.click("#confirm-replay button").await;
    b.until_text("#j-state", None, |t| t == "held").await;
    let (state, held, moved) = progress_now(&b).await;
    assert_eq!(
        (state.as_str(), held.as_str(), moved.as_str()),
        ("held", "held: the breaker of search is open", "0")
    );
    assert_eq!(f.broker.depth(&f.broker.topology.work_queue).await, 0);
    b.screenshot("replay-held").await;

    // The breaker closes: the replay resumes and moves every message.
    close_breaker(&f.config).await;
    b.until_text("#j-state", None, |t| t == "done" || t == "failed")
        .await;
    let (state, held, moved) = progress_now(&b).await;
    assert_eq!(
        (state.as_str(), held.as_str(), moved.as_str()),
        ("done", "-", "4")
    );
    assert_eq!(b.text("#j-error").await, "-");
    assert_eq!(f.broker.depth(&f.broker.topology.work_queue).await, 4);
    assert_eq!(f.broker.depth(&f.broker.topology.dead_queue).await, 0);
    assert!(
        !b.source().await.contains("cancel-replay"),
        "an ended replay has no Cancel button"
    );

    // Held again, then cancelled from the page: nothing moves, the messages stay.
    seed(3).await;
    reindex(&f).await;
    prepare_search_replay(&b, &base, 3, "INC-9 second try").await;
    open_breaker(&f.config).await;
    b.click("#confirm-replay button").await;
    b.until_text("#j-state", None, |t| t == "held").await;
    // Without the CSRF token the cancel is refused and the run stays held.
    let page = b.run("return location.pathname").await;
    let cancel = format!("{}/cancel", page.as_str().unwrap_or_default());
    assert_eq!(post_from_page(&b, &cancel, "").await, 403);
    assert_eq!(progress_now(&b).await.0, "held");
    b.click("#cancel-replay button").await;
    b.until_text("#j-state", None, |t| t == "cancelled" || t == "failed")
        .await;
    let (state, _, moved) = progress_now(&b).await;
    assert_eq!((state.as_str(), moved.as_str()), ("cancelled", "0"));
    assert_eq!(b.text("#j-cancelled-by").await, "ann");
    // The three are back: the held one's copy confirmed, the two the run's channel held
    // returned by the broker after the close, on its own time (clean-clone run 11 of session 10,
    // at load 14, read 2 the moment the page said cancelled: the replay waits for them only up
    // to its idle timeout, 3 s).
    assert_eq!(
        f.broker
            .depth_reaching(&f.broker.topology.dead_queue, 3, Duration::from_secs(30))
            .await,
        3
    );
    assert_eq!(f.broker.depth(&f.broker.topology.work_queue).await, 4);

    let trail = AuditLog::default()
        .read(&store(&f.config), None, None, Some("search"), 10)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let actions: Vec<(&str, &str)> = trail
        .iter()
        .map(|e| (e.action.as_str(), e.actor.as_str()))
        .collect();
    assert_eq!(
        actions,
        [
            ("replay_started", "ann"),
            ("replay", "ann"),
            ("replay_started", "ann"),
            ("replay_cancel", "ann"),
            ("replay", "ann")
        ]
    );
    let first = trail[1]
        .after
        .as_ref()
        .unwrap_or_else(|| panic!("{trail:?}"));
    assert_eq!(first["moved"], 4);
    assert_eq!(first["cancelled"], false);
    assert!(
        first["held_breaker_secs"].as_f64().unwrap_or(0.0) > 0.0,
        "{first}"
    );
    let last = trail[4]
        .after
        .as_ref()
        .unwrap_or_else(|| panic!("{trail:?}"));
    assert_eq!(
        (last["moved"].clone(), last["cancelled"].clone()),
        (0.into(), true.into())
    );
    assert_eq!(last["cancelled_by"], "ann");
    b.quit().await;
    c.stop().await;
}

/// The overview's "workers in fallback" cell of `dependency`'s row.
fn fallback_cell(dependency: &str) -> String {
    format!("#overview tbody tr:has(a[href=\"/dependency/{dependency}\"]) td.fallback")
}
