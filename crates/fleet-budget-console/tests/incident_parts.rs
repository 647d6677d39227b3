//! The incident page over a long audit trail (issue 32, page times at scale): the report reads
//! only the dependency's entries and the replays of every dependency, filtered in Redis
//! (`AuditLog::read_where`, the same entries as the whole trail read and filtered here), and
//! the page shows a long section 100 rows a part, each labelled with the rows it shows of how
//! many, its links reaching every row once. Over HTTP, against a console on a Redis of the
//! test's own and the shared RabbitMQ (a topology prefix of its own).
//!
//! No timed assertion.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod support;

use fleet_budget::control::{AuditEntry, AuditLog};
use fleet_budget::testing::RedisServer;
use fleet_budget_amqp::testing::TestBroker;
use fleet_budget_console::{ConsoleSettings, Token, Viewers};
use support::get;

/// The "why" cells of the overrides' table (`section-2`) of a page.
fn override_reasons(page: &str) -> Vec<String> {
    let at = page.find("<table id=\"section-2\">").unwrap();
    let table = &page[at..at + page[at..].find("</table>").unwrap()];
    table
        .split("<tr><td>")
        .skip(1)
        .map(|row| row.split("</td><td>").nth(3).unwrap().to_owned())
        .collect()
}

/// The label of the overrides' part, if the section is cut.
fn part_label(page: &str) -> Option<String> {
    let at = page.find("id=\"section-2-part\">")? + "id=\"section-2-part\">".len();
    Some(page[at..at + page[at..].find(" (")?].to_owned())
}

/// The address of the overrides' "next part" link, if any.
fn next_part(page: &str) -> Option<String> {
    let at = page.find("id=\"section-2-part\">")?;
    let label = &page[at..at + page[at..].find("</p>")?];
    let link = label.rfind("href=\"")? + "href=\"".len();
    let href = &label[link..link + label[link..].find('"')?];
    label[link..]
        .contains("the next part")
        .then(|| href.replace("&amp;", "&"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_trail_is_filtered_in_redis_and_a_long_section_shown_a_labelled_part_at_a_time() {
    let redis = RedisServer::start();
    let broker = TestBroker::new("console-incident-parts");
    let (config, store) = support::search_and_mail(&redis, &broker, "fbip");
    // Oldest first: 250 overrides of search, 1,300 of mail (the filter's chunks of 1,000 cross
    // into them), a replay of every dependency, one of mail, the intent of one of search, 5
    // more of search.
    let log = AuditLog::default();
    let mut search = Vec::new();
    for (dependency, action, n) in [
        (Some("search"), "freeze", 250),
        (Some("mail"), "freeze", 1_300),
        (None, "replay", 1),
        (Some("mail"), "replay", 1),
        (Some("search"), "replay_started", 1),
        (Some("search"), "set", 5),
    ] {
        for i in 0..n {
            let reason = format!("{action} {} {i}", dependency.unwrap_or("-"));
            let entry = AuditEntry::new("ann", action, dependency, &reason)
                .with_before_after(&serde_json::json!({}), &serde_json::json!({"moved": 0}));
            log.record(&store, &entry).await.unwrap();
            if dependency == Some("search") && !action.ends_with("_started") {
                search.push(reason);
            }
        }
    }
    let now_ms = fleet_budget::clock::now_ms();
    let since_ms = now_ms - 3_600_000;

    // Filtered in Redis: the same entries, in the same order, as the whole trail read here and
    // filtered the same way.
    let whole = log
        .read(&store, Some(since_ms), Some(now_ms + 60_000), None, 10_000)
        .await
        .unwrap();
    assert_eq!(whole.len(), 1_558);
    let expected: Vec<String> = whole
        .iter()
        .filter(|e| {
            e.dependency.as_deref() == Some("search")
                || (e.dependency.is_none() && e.action == "replay")
        })
        .map(|e| e.id.clone())
        .collect();
    let filtered = log
        .read_where(
            &store,
            since_ms,
            now_ms + 60_000,
            "search",
            &["replay", "parked_replay", "parked_purge"],
            10_000,
        )
        .await
        .unwrap();
    let ids: Vec<String> = filtered.iter().map(|e| e.id.clone()).collect();
    assert_eq!(ids, expected);
    assert_eq!(ids.len(), 257);
    // Its limit keeps the newest.
    let newest = log
        .read_where(&store, since_ms, now_ms + 60_000, "search", &[], 3)
        .await
        .unwrap();
    let ids: Vec<String> = newest.iter().map(|e| e.id.clone()).collect();
    assert_eq!(ids, expected[expected.len() - 3..]);

    let operators = Token::parse_list("ann:operator-token-0123456789", "operator", "t").unwrap();
    let mut settings = ConsoleSettings::new(config.clone(), operators, Viewers::Open);
    settings.bind = "127.0.0.1:0".parse().unwrap();
    let console = fleet_budget_console::start(settings).await.unwrap();
    let addr = console.addr().to_string();

    let first = "/incident?dependency=search&since=1h";
    let (status, page) = get(&addr, first).await;
    assert_eq!(status, 200, "{page}");
    assert!(
        page.contains("255 overrides, 1 replays and purges"),
        "the sources count what was read: {page}"
    );
    assert!(!page.contains("freeze mail"), "{page}");
    // The overrides, 100 a part, each part labelled, the links reaching every one once.
    let mut shown = Vec::new();
    let mut labels = Vec::new();
    let mut next = Some(first.to_owned());
    while let Some(path) = next {
        assert!(labels.len() < 10, "the parts never end");
        let (status, page) = get(&addr, &path).await;
        assert_eq!(status, 200, "{path}: {page}");
        shown.extend(override_reasons(&page));
        labels.push(part_label(&page).unwrap_or_else(|| panic!("unlabelled: {page}")));
        next = next_part(&page);
    }
    assert_eq!(
        labels,
        [
            "Rows 1–100 of 255",
            "Rows 101–200 of 255",
            "Rows 201–255 of 255"
        ]
    );
    assert_eq!(shown, search);
    // A part past the end shows the last; one that is not a number is refused.
    let (_, page) = get(&addr, "/incident?dependency=search&since=1h&part=9").await;
    assert_eq!(part_label(&page).unwrap(), "Rows 201–255 of 255");
    let (status, _) = get(&addr, "/incident?dependency=search&since=1h&part=x").await;
    assert_ne!(status, 200);
    // A short report is shown whole, unlabelled: the hour before the entries.
    let (_, page) = get(&addr, "/incident?dependency=search&since=2h&until=1h").await;
    assert!(page.contains("0 overrides, 0 replays"), "{page}");
    assert!(!page.contains("-part\""), "{page}");

    console.stop().await;
}
