//! Operating the console in Chromium (issue 32, "errors in the CLI's words", "human times", "the
//! audit trail as a table", the risks): an invalid override is answered with `budgetctl`'s
//! words and no "Log in" offered to the operator, the audit trail reads as a table with times
//! as "N ago" and the exact UTC time on hover, the risks of Redis and RabbitMQ are on every
//! page, and a reload with Redis down says Redis is unreachable.

use crate::OPERATOR;
use crate::fleet::*;
use crate::webdriver::Driver;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_times_the_audit_table_and_the_risks_read_as_an_operator_needs_them() {
    let mut f = fleet("console-operating");
    // An eviction policy that can drop a freeze: a risk the banner names. The topology is not
    // migrated: a risk of RabbitMQ.
    let _: String = f
        ._redis
        .cmd(&["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"]);
    let c = console(&f.config).await;
    let base = format!("http://{}", c.addr());
    let driver = Driver::start().await;
    let b = driver.browser().await;
    login(&b, &base, OPERATOR).await;

    // The risks, on every page, each with what it costs and what to do.
    b.goto(&format!("{base}/workers")).await;
    let risks = b
        .until_text("#risks", None, |t| {
            t.contains("maxmemory_policy") && t.contains("topology")
        })
        .await;
    println!("risks banner: {risks}");
    assert!(risks.contains("allkeys-lru"), "{risks}");
    b.goto(&format!("{base}/audit")).await;
    // What to do is in a <details> (folded): its text, not what is drawn.
    let folded = b
        .run("return document.querySelector('#risks').textContent")
        .await;
    assert!(
        folded
            .as_str()
            .unwrap_or_default()
            .contains("budgetctl migrate"),
        "{folded}"
    );

    // An override out of range, from the page's own form: 422 in the CLI's words, before Redis.
    b.goto(&format!("{base}/dependency/search")).await;
    b.run(
        "const f = document.querySelector('#set-form');\
         f.querySelector('input[name=ratio]').value = '1500';\
         f.querySelector('input[name=reason]').value = 'too many';\
         f.submit();",
    )
    .await;
    let said = b.until_text("#refusal", None, |t| !t.is_empty()).await;
    println!("invalid ratio: {said}");
    assert!(
        said.contains("the ratio `1500` must be from 0 to 1000"),
        "{said}"
    );
    assert!(!said.contains("ARGV"), "no script text: {said}");
    let source = b.source().await;
    assert!(
        !source.contains("href=\"/login\""),
        "a logged-in operator is not offered Log in"
    );
    let csrf = b
        .run("return (document.querySelector('input[name=csrf]') || {}).value || ''")
        .await;
    assert_eq!(csrf.as_str(), Some(""), "the refusal page carries no form");
    b.goto(&format!("{base}/dependency/search")).await;
    let csrf = b
        .run("return document.querySelector('header input[name=csrf]').value")
        .await;
    let csrf = csrf.as_str().unwrap_or_default().to_owned();
    let path = "/dependency/search/override";
    let status = post_from_page(
        &b,
        path,
        &format!("action=set&ratio=1500&minutes=5&reason=x&csrf={csrf}"),
    )
    .await;
    assert_eq!(status, 422);
    let status = post_from_page(
        &b,
        path,
        &format!("action=freeze&minutes=30&reason=INC-9%20search%20down&csrf={csrf}"),
    )
    .await;
    // Applied: answered with a redirect, which `fetch` with `redirect: 'manual'` shows as 0.
    assert_eq!(status, 0);

    // The audit trail: a table, newest first, the time in words with the exact time on hover.
    b.goto(&format!("{base}/audit")).await;
    b.find("#audit tbody tr").await;
    let row = b
        .run(
            "const r = document.querySelector('#audit tbody tr');\
             return [...r.querySelectorAll('td')].map(td => td.textContent.trim());",
        )
        .await;
    println!("newest audit row: {row}");
    assert_eq!(row[0], "ann");
    assert_eq!(row[2], "freeze");
    assert_eq!(row[3], "search");
    assert_eq!(row[4], "INC-9 search down");
    let when = row[1].as_str().unwrap_or_default();
    assert!(when == "just now" || when.ends_with(" ago"), "{when}");
    assert!(
        !row[5].as_str().unwrap_or_default().contains('{'),
        "details as fields, not raw JSON: {row}"
    );
    let title = b
        .run("return document.querySelector('#audit tbody tr time').title")
        .await;
    assert!(
        title.as_str().unwrap_or_default().ends_with(" UTC"),
        "{title}"
    );
    let headers = b
        .run("return [...document.querySelectorAll('#audit thead th')].map(th => th.textContent)")
        .await;
    assert_eq!(
        headers,
        serde_json::json!(["who", "when", "what", "dependency", "reason", "details"])
    );

    // Redis down: once the console's reading of the fleet fails (it reads every second here),
    // a reload says so, in a page, with no "Log in".
    f._redis.stop();
    let said = b
        .until_text("#refusal", Some(&format!("{base}/")), |t| !t.is_empty())
        .await;
    println!("Redis down: {said}");
    assert!(said.contains("Redis is unreachable"), "{said}");
    assert_eq!(b.text("h1").await, "Redis is unreachable");
    assert!(!b.source().await.contains("href=\"/login\""));
    b.screenshot("redis-down").await;
    b.quit().await;
    c.stop().await;
}
