//! A long audit trail on a dependency's page and on the audit page filtered to one dependency
//! (issue 32, page times at scale): each view looks through at most the newest 1,000 entries of
//! the whole trail, says so when it stopped short, and its "older" link goes on from where it
//! stopped, so that paging through still shows every entry of the dependency exactly once,
//! newest first. Over HTTP, against a console on a Redis of the test's own and the shared
//! RabbitMQ (a topology prefix of its own).
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

/// The reasons of the audit table's rows, in the page's order.
fn reasons(page: &str) -> Vec<String> {
    page.split("<tr data-action=")
        .skip(1)
        .map(|row| {
            let at = row.find("class=\"cut reason\">").unwrap() + "class=\"cut reason\">".len();
            row[at..at + row[at..].find("</td>").unwrap()].to_owned()
        })
        .collect()
}

/// The address of the page's "older" link, if any.
fn older(page: &str) -> Option<String> {
    let at = page.find("<a class=\"next\" href=\"")? + "<a class=\"next\" href=\"".len();
    Some(page[at..at + page[at..].find('"')?].replace("&amp;", "&"))
}

/// Every entry of the audit page from `first` on, following its "older" links: the reasons,
/// and the pages read.
async fn every_entry(addr: &str, first: &str) -> (Vec<String>, usize) {
    let (mut shown, mut pages) = (Vec::new(), 0);
    let mut next = Some(first.to_owned());
    while let Some(path) = next {
        pages += 1;
        assert!(pages < 200, "the older links never end");
        let (status, page) = get(addr, &path).await;
        assert_eq!(status, 200, "{path}: {page}");
        shown.extend(reasons(&page));
        next = older(&page);
    }
    (shown, pages)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_trail_is_searched_a_bounded_part_at_a_time_and_paged_through_whole() {
    let redis = RedisServer::start();
    let broker = TestBroker::new("console-long-trail");
    let (config, store) = support::search_and_mail(&redis, &broker, "fblt");
    // Oldest first: 60 of search, 300 of mail, 1 of search, 994 of mail, 5 of search: the
    // newest 1,000 end on one of search's, where the page stops looking and the next begins.
    // An entry on that border is shown once.
    let log = AuditLog::default();
    let mut recorded = Vec::new();
    for (dependency, n) in [
        ("search", 60),
        ("mail", 300),
        ("search", 1),
        ("mail", 994),
        ("search", 5),
    ] {
        for _ in 0..n {
            let reason = format!("{dependency} {}", recorded.len());
            let entry = AuditEntry::new("ann", "freeze", Some(dependency), &reason);
            log.record(&store, &entry).await.unwrap();
            recorded.push((dependency, reason));
        }
    }
    let newest_of = |d: &str| -> Vec<String> {
        recorded
            .iter()
            .rev()
            .filter(|(dep, _)| *dep == d)
            .map(|(_, r)| r.clone())
            .collect()
    };

    let operators = Token::parse_list("ann:operator-token-0123456789", "operator", "t").unwrap();
    let mut settings = ConsoleSettings::new(config.clone(), operators, Viewers::Open);
    settings.bind = "127.0.0.1:0".parse().unwrap();
    let console = fleet_budget_console::start(settings).await.unwrap();
    let addr = console.addr().to_string();

    // search's page: its 6 newest entries, found among the newest 1,000 of the trail, which
    // it says, with a link to the older ones.
    let (status, page) = get(&addr, "/dependency/search").await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(reasons(&page), newest_of("search")[..6]);
    let searched: usize = page
        .split("Its entries among the newest ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .map(|n| n.replace(',', "").parse().unwrap())
        .unwrap_or_else(|| panic!("the page does not say how far it searched: {page}"));
    // Exactly the bound, however many entries a round trip brought.
    assert_eq!(searched, 1_000, "searched {searched} of 1,360");
    assert!(page.contains("href=\"/audit?dependency=search\""), "{page}");
    // mail's page: its 20 newest, found at once, nothing to say.
    let (_, page) = get(&addr, "/dependency/mail").await;
    assert_eq!(reasons(&page), newest_of("mail")[..20]);
    assert!(!page.contains("audit-searched"), "{page}");

    // The audit page of search, paged through: every one of its 66 entries once, newest first.
    let (shown, pages) = every_entry(&addr, "/audit?dependency=search").await;
    assert_eq!(shown, newest_of("search"), "{pages} pages");
    println!("search's 66 entries over {pages} pages");
    // Of mail: its 1,294, 50 a page.
    let (shown, pages) = every_entry(&addr, "/audit?dependency=mail").await;
    assert_eq!(shown, newest_of("mail"));
    assert_eq!(pages, 1_294_usize.div_ceil(50));
    // The whole trail, unfiltered, as before.
    let (shown, _) = every_entry(&addr, "/audit").await;
    let all: Vec<String> = recorded.iter().rev().map(|(_, r)| r.clone()).collect();
    assert_eq!(shown, all);

    console.stop().await;
}
