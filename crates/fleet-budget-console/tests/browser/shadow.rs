//! Shadow mode from the console (issue 34, item 1) and human times on the overview and the
//! dependency page (issue 32): an operator switches `search` to shadow with the page's button;
//! the switch is the one `budgetctl budget shadow` writes (the Redis key, audited), a worker
//! started after it retries what its budget refuses (marked shadow-denied); the overview and
//! the dependency page say what enforcement would have dead-lettered, counted over the
//! console's readings (the denials enforcement made before the switch left out); and the
//! button switches it back, which the worker follows.

use fleet_budget::control::enforcement;
use fleet_budget::{DeadLetterReason, Dependency, Enforcement, Failure, FleetBudget};
use serde_json::Value;

use crate::OPERATOR;
use crate::fleet::*;
use crate::webdriver::{Browser, Driver};

/// `/api/overview` as the browser's session reads it.
async fn overview_json(b: &Browser) -> Value {
    let text = b
        .run_async(
            "const done = arguments[arguments.length - 1];\
             fetch('/api/overview', {credentials: 'same-origin'})\
               .then(r => r.text()).then(done).catch(e => done(''));",
        )
        .await;
    serde_json::from_str(text.as_str().unwrap_or_default()).unwrap_or_default()
}

/// `search`'s row of `/api/overview`.
async fn search_row(b: &Browser) -> Value {
    overview_json(b).await["dependencies"]
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["dependency"] == "search").cloned())
        .unwrap_or_default()
}

/// Decisions of `search` until `worker` has seen `refused` refusals of its budget; each one's
/// `shadow_denied`.
async fn refusals(worker: &FleetBudget, refused: usize) -> Vec<Option<DeadLetterReason>> {
    let failure = Failure::retryable("search returned 503").with_class("http_503");
    let mut seen = Vec::new();
    for _ in 0..200 {
        worker
            .on_attempt("index", 1)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let d = worker
            .on_failure("index", 1, &failure)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let refused_now = match d.shadow_denied() {
            Some(r) => Some(Some(r)),
            None if d.dead_letter_reason() == Some(DeadLetterReason::BudgetExhausted) => Some(None),
            None => None,
        };
        if let Some(r) = refused_now {
            seen.push(r);
            if seen.len() == refused {
                return seen;
            }
        }
    }
    panic!("search's budget refused only {} retries", seen.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_from_the_page_reaches_the_worker_and_says_what_enforcement_would_have_dead_lettered()
 {
    let f = fleet("console-shadow");
    let c = console(&f.config).await;
    let base = format!("http://{}", c.addr());
    let driver = Driver::start().await;
    let b = driver.browser().await;
    login(&b, &base, OPERATOR).await;
    let search = Dependency::new("search").unwrap_or_else(|e| panic!("{e}"));
    let store = store(&f.config);

    // Enforced: search's budget (floor 2) refuses 3 retries, dead-lettered.
    let before = FleetBudget::from_config(&f.config.budget)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let enforced = refusals(&before, 3).await;
    assert_eq!(enforced, [None, None, None], "enforced: dead-lettered");
    before.shutdown().await.unwrap_or_else(|e| panic!("{e}"));
    // The console's reading has them (the count from the switch on leaves them out).
    b.goto(&format!("{base}/")).await;
    let started = std::time::Instant::now();
    loop {
        let row = search_row(&b).await;
        // (Both windows: the window may have rolled since.)
        let denied =
            row["windows"][0][1].as_u64().unwrap_or(0) + row["windows"][1][1].as_u64().unwrap_or(0);
        if denied >= 3 {
            assert_eq!(row["enforcement"], "enforce", "{row}");
            assert_eq!(row["would_deny"], 0, "{row}");
            break;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(45),
            "the reading never showed the denials: {row}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }

    // Without the CSRF token, or without a session: refused, nothing switched.
    b.goto(&format!("{base}/dependency/search")).await;
    let path = "/dependency/search/enforcement";
    let form = "enforcement=shadow&reason=x";
    assert_eq!(post_from_page(&b, path, form).await, 403);
    assert_eq!(
        post_from_page(&b, path, &format!("{form}&csrf=0000")).await,
        403
    );
    let (status, _, _) = crate::webdriver::http(
        &c.addr().to_string(),
        "POST",
        path,
        &[],
        Some(("application/x-www-form-urlencoded", form.as_bytes())),
    )
    .await;
    assert_eq!(status, 401);
    assert_eq!(
        enforcement::read(&store, &search)
            .await
            .unwrap_or_else(|e| panic!("{e}")),
        None,
        "a refused switch switches nothing"
    );

    // The button, on the dependency's page.
    b.goto(&format!("{base}/dependency/search")).await;
    let cell = b.text("#enforcement").await;
    assert!(cell.starts_with("enforce"), "{cell}");
    b.type_into("#enforcement-form input[name=minutes]", "45")
        .await;
    b.type_into(
        "#enforcement-form input[name=reason]",
        "INC-12 watching before enforcing",
    )
    .await;
    b.click("#switch-shadow").await;
    let cell = b
        .until_text("#enforcement", None, |t| t.starts_with("shadow"))
        .await;
    println!("after the switch: {cell}");
    assert!(
        cell.contains("switched by ann (INC-12 watching before enforcing)"),
        "{cell}"
    );
    assert!(
        cell.contains("ends in 44 min") || cell.contains("ends in 45 min"),
        "{cell}"
    );
    // The key `budgetctl budget shadow` writes, with who, why and until when.
    let switch = enforcement::read(&store, &search)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("no switch in Redis"));
    assert_eq!(switch.enforcement, Enforcement::Shadow);
    assert_eq!(switch.actor, "ann");
    assert_eq!(switch.reason, "INC-12 watching before enforcing");
    let lasts = switch.until_ms.unwrap_or_default() - switch.since_ms;
    assert_eq!(lasts, 45 * 60_000, "{switch:?}");
    // Audited like a freeze.
    b.goto(&format!("{base}/audit")).await;
    let row = b.text("#audit tbody tr").await;
    assert!(row.contains("shadow") && row.contains("INC-12"), "{row}");

    // A worker started now retries what the budget refuses, marked shadow-denied.
    let after = FleetBudget::from_config(&f.config.budget)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let shadowed = refusals(&after, 4).await;
    println!("in shadow: {shadowed:?}");
    assert!(
        shadowed
            .iter()
            .all(|r| *r == Some(DeadLetterReason::BudgetExhausted)),
        "every refusal retried in shadow: {shadowed:?}"
    );
    after.shutdown().await.unwrap_or_else(|e| panic!("{e}"));

    // The overview and the dependency page: the 4 refused in shadow, not the 3 before.
    let want = "would have dead-lettered 4 jobs in the last";
    let cell_css = "#overview tbody tr:has(a[href=\"/dependency/search\"]) td.enforcement";
    let cell = b
        .until_text(cell_css, Some(&format!("{base}/")), |t| t.contains(want))
        .await;
    println!("overview: {cell}");
    assert!(
        cell.contains("(counted by the console since it saw the switch)")
            || cell.contains("in the last hour"),
        "{cell}"
    );
    let row = search_row(&b).await;
    assert_eq!(row["enforcement"], "shadow", "{row}");
    assert_eq!(row["enforcement_switch"]["actor"], "ann", "{row}");
    assert!(row["would_deny"].as_u64() >= Some(4), "{row}");
    // How old the reading is, with the exact time on hover.
    let age = b.text("#reading-age").await;
    assert!(
        age.starts_with("Read ") && (age.contains(" ago") || age.contains("just now")),
        "{age}"
    );
    let title = b
        .run("return document.querySelector('#reading-age time').title")
        .await;
    assert!(
        title.as_str().unwrap_or_default().ends_with(" UTC"),
        "{title}"
    );
    b.goto(&format!("{base}/dependency/search")).await;
    let cell = b.text("#enforcement").await;
    assert!(cell.contains(want), "{cell}");
    b.screenshot("shadow").await;

    // And back to enforcement: the worker follows within its deny cache's staleness.
    b.type_into(
        "#enforcement-form input[name=reason]",
        "INC-12 the ratio holds",
    )
    .await;
    b.click("#switch-enforce").await;
    let cell = b
        .until_text("#enforcement", None, |t| t.starts_with("enforce"))
        .await;
    assert!(cell.contains("until switched back"), "{cell}");
    let switch = enforcement::read(&store, &search)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("no switch in Redis"));
    assert_eq!(switch.enforcement, Enforcement::Enforce);
    assert_eq!(switch.until_ms, None);
    let worker = FleetBudget::from_config(&f.config.budget)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let again = refusals(&worker, 1).await;
    assert_eq!(again, [None], "enforced again: dead-lettered");
    worker.shutdown().await.unwrap_or_else(|e| panic!("{e}"));
    b.quit().await;
    c.stop().await;
}
