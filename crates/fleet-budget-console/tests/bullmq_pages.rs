//! The BullMQ kept jobs' pages (issue 35: the console lists what Node.js workers without
//! `[amqp]` kept in BullMQ's failed set), over HTTP against a console on a Redis of the test's
//! own and the shared RabbitMQ (a topology prefix of its own). The lists are written as the
//! Node.js client writes them (`clients/node/src/bullmqKept.ts`: one JSON object per job, pushed
//! on the left; a dropped count beside), with what anyone with access to Redis can add: an entry
//! that is no JSON, one carrying a password, a key of another type, a key whose queue name BullMQ
//! refuses.
//!
//! Asserted: every queue listed with its four lengths, the foreign key as "not ours", the bad
//! name left out; a queue's jobs newest first, 50 a page, every entry on exactly one page; the
//! password on no page; a bad queue name a 400; nothing written (the lists as before).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod support;

use fleet_budget::testing::RedisServer;
use fleet_budget_amqp::testing::TestBroker;
use fleet_budget_console::{ConsoleSettings, Token, Viewers};
use support::get;

/// Kept jobs of `mail-jobs`, one of them unreadable and one with a password in its error.
const MAIL_JOBS: usize = 120;

/// The job ids of the page's rows (`td.cut` first cell after the row number), in its order.
fn job_ids(page: &str) -> Vec<String> {
    let Some(table) = page.split("<table id=\"bullmq-jobs\">").nth(1) else {
        return Vec::new();
    };
    table[..table.find("</table>").unwrap_or(table.len())]
        .split("<tr")
        .skip(2)
        .map(|row| {
            if row.contains("not a kept job") {
                return "(unreadable)".to_owned();
            }
            let cell = row.split("<td class=\"cut\">").nth(1).unwrap();
            cell[..cell.find("</td>").unwrap()].to_owned()
        })
        .collect()
}

/// The "older" (next) link of a pager, if any.
fn next(page: &str) -> Option<String> {
    let at = page.find("<a class=\"next\" href=\"")? + "<a class=\"next\" href=\"".len();
    Some(page[at..at + page[at..].find('"')?].replace("&amp;", "&"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kept_bullmq_jobs_are_listed_by_queue_and_paged_newest_first_read_only() {
    let redis = RedisServer::start();
    let broker = TestBroker::new("console-bullmq");
    let (config, store) = support::search_and_mail(&redis, &broker, "fbbq");
    let prefix = store.prefix().to_owned();
    let key = |list: &str, queue: &str| format!("{prefix}:v1:bullmq-{list}:{{{queue}}}");

    // mail-jobs: 120 kept (oldest pushed first), 3 dropped, 2 on their way back, 1 parked.
    let mut pushed = Vec::new();
    for i in 0..MAIL_JOBS {
        let entry = match i {
            7 => "not json {".to_owned(),
            11 => serde_json::json!({
                "v": 1, "id": format!("job-{i}"), "task": "send", "dependency": "mail",
                "reason": "budget_exhausted", "error_class": "http_503",
                "error": "connect redis://admin:hunter2@cache.internal:6379 refused",
                "at_ms": 1_700_000_000_000_u64 + i as u64,
            })
            .to_string(),
            _ => serde_json::json!({
                "v": 1, "id": format!("job-{i}"), "task": "send", "dependency": "mail",
                "reason": "budget_exhausted", "error_class": "http_503", "error": "503",
                "at_ms": 1_700_000_000_000_u64 + i as u64,
            })
            .to_string(),
        };
        let _: i64 = redis.cmd(&["LPUSH", &key("kept", "mail-jobs"), &entry]);
        pushed.push(if i == 7 {
            "(unreadable)".to_owned()
        } else {
            format!("job-{i}")
        });
    }
    let _: () = redis.cmd(&["SET", &key("kept-dropped", "mail-jobs"), "3"]);
    let _: i64 = redis.cmd(&["RPUSH", &key("replay", "mail-jobs"), "{}", "{}"]);
    let _: i64 = redis.cmd(&["RPUSH", &key("parked", "mail-jobs"), "{}"]);
    // search-jobs: 5 kept, and a dropped count past what Lua holds exactly.
    let _: () = redis.cmd(&["SET", &key("kept-dropped", "search-jobs"), "1e300"]);
    for i in 0..5 {
        let entry = format!(r#"{{"v":1,"id":"s-{i}","task":"index","dependency":"search"}}"#);
        let _: i64 = redis.cmd(&["LPUSH", &key("kept", "search-jobs"), &entry]);
    }
    // mail-jobs' replay receivers: one heard just now, one gone 3 minutes ago with a request in
    // hand; and what others wrote: an id of 300 bytes, a time that is no time.
    let now = fleet_budget::clock::now_ms();
    let receivers = key("receivers", "mail-jobs");
    let (fresh, old) = (now.to_string(), (now - 180_000).to_string());
    let long_id = "r".repeat(300);
    let _: i64 = redis.cmd(&["ZADD", &receivers, &fresh, "host-a", &old, "pod-gone"]);
    let _: i64 = redis.cmd(&["ZADD", &receivers, &fresh, &long_id, "+inf", "odd-time"]);
    let in_hand = format!("{}:pod-gone", key("replaying", "mail-jobs"));
    let _: i64 = redis.cmd(&["RPUSH", &in_hand, "{}"]);
    // Someone else's: a kept "list" that is a string; a queue name BullMQ refuses.
    let _: () = redis.cmd(&["SET", &key("kept", "foreign"), "not a list"]);
    let _: () = redis.cmd(&["SET", &key("receivers", "foreign"), "not a set"]);
    let _: i64 = redis.cmd(&["LPUSH", &key("kept", "a:b"), "{}"]);

    let operators = Token::parse_list("ann:operator-token-0123456789", "operator", "t").unwrap();
    let mut settings = ConsoleSettings::new(config.clone(), operators, Viewers::Open);
    settings.bind = "127.0.0.1:0".parse().unwrap();
    let console = fleet_budget_console::start(settings).await.unwrap();
    let addr = console.addr().to_string();

    // The queues, by name, each with its lengths.
    let (status, page) = get(&addr, "/bullmq").await;
    assert_eq!(status, 200, "{page}");
    let table = page.split("<table id=\"bullmq-queues\">").nth(1).unwrap();
    let rows: Vec<&str> = table.split("<tr>").skip(2).collect();
    assert_eq!(rows.len(), 3, "foreign, mail-jobs, search-jobs: {page}");
    assert!(rows[0].contains(">foreign</a>") && rows[0].contains("not ours"));
    let cells = |row: &str| -> Vec<String> {
        row.split("<td class=\"num\">")
            .skip(1)
            .map(|c| c[..c.find("</td>").unwrap()].to_owned())
            .collect()
    };
    assert!(rows[1].contains("href=\"/bullmq/queue?queue=mail-jobs\""));
    assert_eq!(cells(rows[1]), ["120", "3", "2", "1"]);
    assert!(rows[2].contains(">search-jobs</a>"));
    let search = cells(rows[2]);
    assert_eq!(
        (search[0].as_str(), &search[2..]),
        ("5", &["0".to_owned(), "0".to_owned()][..])
    );
    assert!(search[1].contains("not ours"), "{search:?}");
    assert!(!page.contains("a:b"), "a name BullMQ refuses is left out");

    // mail-jobs, paged through: every entry once, newest first, the password on no page.
    let mut shown = Vec::new();
    let mut path = Some("/bullmq/queue?queue=mail-jobs".to_owned());
    let mut pages = 0;
    while let Some(p) = path {
        pages += 1;
        assert!(pages < 10, "the next links never end");
        let (status, page) = get(&addr, &p).await;
        assert_eq!(status, 200, "{p}: {page}");
        assert!(!page.contains("hunter2"), "{p}: the password is shown");
        if pages == 1 {
            assert!(page.contains("budgetctl replay --bullmq-queue mail-jobs --dry-run"));
            assert!(page.contains("1–50 of 120"), "{page}");
        }
        shown.extend(job_ids(&page));
        path = next(&page);
    }
    assert_eq!(pages, 3);
    let newest_first: Vec<String> = pushed.iter().rev().cloned().collect();
    assert_eq!(shown, newest_first);
    let (_, page) = get(&addr, "/bullmq/queue?queue=mail-jobs&page=3").await;
    assert!(
        page.contains("admin:***@cache.internal"),
        "redacted, not dropped"
    );
    assert!(page.contains("not a kept job"));

    // Its replay receivers: the one alive, the one gone with what it holds; nothing else.
    let (_, page) = get(&addr, "/bullmq/queue?queue=mail-jobs").await;
    let table = page
        .split("<table id=\"bullmq-receivers\">")
        .nth(1)
        .unwrap_or_else(|| panic!("no receivers' table: {page}"));
    let table = &table[..table.find("</table>").unwrap()];
    let rows: Vec<&str> = table.split("<tr>").skip(2).collect();
    assert_eq!(rows.len(), 2, "host-a and pod-gone only: {table}");
    assert!(
        rows[0].contains("host-a") && rows[0].contains("alive"),
        "{}",
        rows[0]
    );
    assert_eq!(cells(rows[0]), ["0"]);
    assert!(
        rows[1].contains("pod-gone") && rows[1].contains("taken for gone"),
        "{}",
        rows[1]
    );
    assert_eq!(cells(rows[1]), ["1"]);
    assert!(
        !table.contains("rrrrrrrrrr") && !table.contains("odd-time"),
        "{table}"
    );
    let (_, page) = get(&addr, "/bullmq/queue?queue=search-jobs").await;
    assert!(page.contains("id=\"bullmq-receivers-none\""), "{page}");

    // The foreign key: said, not an error page.
    let (status, page) = get(&addr, "/bullmq/queue?queue=foreign").await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("not written by fleet-budget"), "{page}");
    assert!(page.contains("id=\"bullmq-receivers-odd\""), "{page}");
    // Bad names: refused with why.
    for bad in [
        "/bullmq/queue?queue=a%3Ab",
        "/bullmq/queue",
        "/bullmq/queue?queue=%7Bx",
    ] {
        let (status, page) = get(&addr, bad).await;
        assert_eq!(status, 400, "{bad}: {page}");
    }

    // Read-only: every list as written.
    let len = |k: String| -> i64 { redis.cmd(&["LLEN", &k]) };
    assert_eq!(len(key("kept", "mail-jobs")), MAIL_JOBS as i64);
    assert_eq!(len(key("replay", "mail-jobs")), 2);
    assert_eq!(len(key("parked", "mail-jobs")), 1);
    assert_eq!(len(key("kept", "search-jobs")), 5);
    assert_eq!(len(in_hand), 1);
    let members: i64 = redis.cmd(&["ZCARD", &receivers]);
    assert_eq!(members, 4);
    let dropped: String = redis.cmd(&["GET", &key("kept-dropped", "mail-jobs")]);
    assert_eq!(dropped, "3");

    console.stop().await;
}
