//! The dead-letter pages as an operator's browser meets them, over HTTP, against a Redis of the
//! test's own and the shared RabbitMQ (a topology of the test's own): hostile headers (a
//! secret in the error class, 100 KB task names) are redacted and bounded on every page and in
//! every JSON answer, long lists are paged and say what they show, and a replay or purge from a
//! message's page moves exactly that message, in the background, audited.
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

use std::sync::Arc;
use std::time::{Duration, Instant};

use fleet_budget::control::overrides::{self, OverrideAction};
use fleet_budget::control::{AuditLog, DeadLetterIndex};
use fleet_budget::store::{RedisStore, RedisTarget};
use fleet_budget::testing::RedisServer;
use fleet_budget::{DeadLetterReason, Dependency};
use fleet_budget_amqp::headers::{self, DeadLetterRecord};
use fleet_budget_amqp::testing::{TestBroker, unique_prefix};
use fleet_budget_amqp::{Publisher, Replayer, WorkerConfig};
use fleet_budget_console::{ConsoleSettings, RunningConsole, Token, Viewers};
use lapin::BasicProperties;
use lapin::types::{FieldTable, ShortString};
use serde_json::Value;

use support::{csrf_of, set_cookie};
use webdriver::http;

const OPERATOR: &str = "operator-token-0123456789";
const VIEWER: &str = "viewer-token-0123456789";
const SECRET: &str = "hunter2";
/// At 100,000 dead letters (and whatever the headers hold) every page weighs at most this.
const PAGE_MAX: usize = 1024 * 1024;

struct Fleet {
    _redis: RedisServer,
    broker: TestBroker,
    config: WorkerConfig,
}

fn fleet(name: &str) -> Fleet {
    let redis = RedisServer::start();
    let broker = TestBroker::new(name);
    let toml = format!(
        "[redis]\nurl = \"{}\"\nkey_prefix = \"{}\"\ntimeout_ms = 10000\n\
         [dependencies.search]\ntasks = [\"index\"]\n\
         [dependencies.mail]\ntasks = [\"send\"]\n\
         [amqp]\nurl = \"{}\"\nprefix = \"{}\"\n",
        redis.url(),
        unique_prefix("fbcp"),
        broker.url,
        broker.settings.prefix
    );
    let config = WorkerConfig::from_toml(&toml, "pages test").unwrap();
    Fleet {
        _redis: redis,
        broker,
        config,
    }
}

fn store(config: &WorkerConfig) -> RedisStore {
    let r = &config.budget.redis;
    RedisStore::new_with_tls(
        RedisTarget::from_settings(r),
        &r.key_prefix,
        Duration::from_secs(5),
        &r.tls,
    )
    .unwrap()
}

async fn console(config: &WorkerConfig) -> RunningConsole {
    let operators = Token::parse_list(&format!("ann:{OPERATOR}"), "operator", "test").unwrap();
    let viewers = Token::parse_list(&format!("vic:{VIEWER}"), "viewer", "test").unwrap();
    let mut settings = ConsoleSettings::new(config.clone(), operators, Viewers::Tokens(viewers));
    settings.bind = "127.0.0.1:0".parse().unwrap();
    settings.dead_letter_refresh = Duration::from_secs(1);
    settings.history_every = Duration::from_secs(1);
    settings.actions_per_minute = 1_000;
    fleet_budget_console::start(settings).await.unwrap()
}

/// Indexes the dead letters published by hand (as `budgetctl migrate` does for older ones).
async fn reindex(f: &Fleet) {
    let index = DeadLetterIndex::new(Arc::new(store(&f.config)));
    Replayer::new(f.broker.url.clone(), f.broker.topology.clone(), None)
        .with_index(Some(index))
        .reindex()
        .await
        .unwrap();
}

/// A dead letter of `record` with `body`, published as a worker would, but with no AMQP `type`
/// (a task name of 100 KB is no short string).
async fn publish(f: &Fleet, p: &Publisher, record: &DeadLetterRecord, body: &[u8]) -> String {
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
    .unwrap();
    id
}

/// A logged-in session: its cookie and its CSRF token.
struct Session {
    addr: String,
    cookie: String,
    csrf: String,
}

async fn login(addr: &str, token: &str) -> Session {
    let (_, head, _) = http(addr, "GET", "/login", &[], None).await;
    let nonce = set_cookie(&head, "fbc_login");
    let form = format!("token={token}&login_csrf={nonce}");
    let cookie = format!("fbc_login={nonce}");
    let (status, head, _) = http(
        addr,
        "POST",
        "/login",
        &[("Cookie", &cookie)],
        Some(("application/x-www-form-urlencoded", form.as_bytes())),
    )
    .await;
    assert_eq!(status, 303, "{head}");
    let session = format!("fbc_session={}", set_cookie(&head, "fbc_session"));
    let (_, _, page) = http(addr, "GET", "/", &[("Cookie", &session)], None).await;
    Session {
        addr: addr.to_owned(),
        cookie: session,
        csrf: csrf_of(&String::from_utf8_lossy(&page)),
    }
}

impl Session {
    async fn get(&self, path: &str) -> (u16, String) {
        let (status, _, body) =
            http(&self.addr, "GET", path, &[("Cookie", &self.cookie)], None).await;
        (status, String::from_utf8(body).unwrap())
    }

    /// POSTs `form` (its CSRF token added); the status and the `Location` answered.
    async fn post(&self, path: &str, form: &[(&str, &str)]) -> (u16, String, String) {
        let mut body = format!("csrf={}", self.csrf);
        for (k, v) in form {
            body.push_str(&format!("&{k}={}", encode(v)));
        }
        let (status, head, page) = http(
            &self.addr,
            "POST",
            path,
            &[("Cookie", &self.cookie)],
            Some(("application/x-www-form-urlencoded", body.as_bytes())),
        )
        .await;
        let location = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .starts_with("location:")
                    .then(|| l.split_once(':').unwrap().1.trim().to_owned())
            })
            .unwrap_or_default();
        (
            status,
            location,
            String::from_utf8_lossy(&page).into_owned(),
        )
    }

    /// GETs `path` until `done` holds for its body (a hang check, not a timing).
    async fn until(&self, path: &str, done: impl Fn(&str) -> bool) -> String {
        let started = Instant::now();
        loop {
            let (status, body) = self.get(path).await;
            if status == 200 && done(&body) {
                return body;
            }
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "{path} never showed what was awaited: {}",
                &body[..body.len().min(3000)]
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Asks for a sample of messages and waits until the queue's page shows one.
    async fn read_messages(&self, queue: &str) {
        let before = self.get(&format!("/dead-letters?queue={queue}")).await.1;
        let (status, _, _) = self.post("/dead-letters/refresh", &[]).await;
        assert_eq!(status, 303);
        let was = sampled_line(&before);
        self.until(&format!("/dead-letters?queue={queue}"), |b| {
            b.contains("Sampled ") && sampled_line(b) != was
        })
        .await;
    }

    /// Waits until job `location` (`/replay/ID`) ends; its JSON.
    async fn job_ended(&self, location: &str) -> Value {
        let api = location.replacen("/replay/", "/api/replay/", 1);
        let body = self
            .until(&api, |b| {
                serde_json::from_str::<Value>(b).is_ok_and(|j| j["done"] == true)
            })
            .await;
        serde_json::from_str(&body).unwrap()
    }
}

fn sampled_line(page: &str) -> String {
    page.find("Sampled ")
        .map(|at| page[at..page.len().min(at + 120)].to_owned())
        .unwrap_or_default()
}

fn encode(v: &str) -> String {
    let mut out = String::new();
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Every `href="…"` of a page.
fn links(page: &str) -> Vec<String> {
    page.split("href=\"")
        .skip(1)
        .map(|rest| rest[..rest.find('"').unwrap_or(0)].replace("&amp;", "&"))
        .collect()
}

/// The address of the first link whose text starts with `text`, following `prefix`.
fn link_to(page: &str, prefix: &str) -> String {
    links(page)
        .into_iter()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no link to {prefix}…"))
}

/// A secret in an error class and an override's reason, and 300 messages with task names of
/// 100 KB: no page and no JSON answer shows the secret, no page weighs more than 1 MB, no link
/// is long, the group page says which of its 300 sampled messages it shows and pages through
/// them, and a message's page shows its body (JSON, pretty-printed), typed headers and the cut
/// it made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_headers_are_redacted_bounded_and_paged() {
    let f = fleet("console-pages-hostile");
    f.broker.migrate().await;
    let now = fleet_budget::clock::now_ms();
    let p = f.broker.publisher().await;
    let secret_class = format!("redis://admin:{SECRET}@db.internal:6379/0");
    let leaky = DeadLetterRecord {
        error_class: secret_class.clone(),
        error: format!("connect redis://admin:{SECRET}@db.internal failed"),
        ..f.broker
            .dead_letter_record("mail", DeadLetterReason::NonRetryable, now - 30_000)
    };
    let leaky_id = publish(&f, &p, &leaky, br#"{"to":"x@example.com","n":[1,2]}"#).await;
    let long_class = DeadLetterRecord {
        error_class: format!("{}:end", "c".repeat(20 * 1024)),
        ..f.broker
            .dead_letter_record("mail", DeadLetterReason::NonRetryable, now - 20_000)
    };
    let long_class_id = publish(&f, &p, &long_class, b"plain text body").await;
    let long_task = "t".repeat(100 * 1024);
    let wide = DeadLetterRecord {
        task: long_task.clone(),
        ..f.broker
            .dead_letter_record("search", DeadLetterReason::BudgetExhausted, now - 60_000)
    };
    let mut wide_ids = Vec::new();
    for i in 0..300 {
        wide_ids.push(publish(&f, &p, &wide, format!("job {i}").as_bytes()).await);
    }
    p.close().await;
    reindex(&f).await;
    // An override whose reason holds the secret.
    let store = store(&f.config);
    overrides::apply(
        &store,
        &AuditLog::default(),
        &Dependency::new("search").unwrap(),
        OverrideAction::Freeze {
            duration: Duration::from_secs(600),
        },
        "ann",
        &format!("INC-1 see redis://admin:{SECRET}@db.internal"),
    )
    .await
    .unwrap();

    let c = console(&f.config).await;
    let addr = c.addr().to_string();
    let ann = login(&addr, OPERATOR).await;
    let vic = login(&addr, VIEWER).await;

    // The counts, from the index: both groups, exact; the overview's counts per dependency.
    let list = ann
        .until("/dead-letters", |b| {
            b.contains("counts-exact") && b.contains("300")
        })
        .await;
    let overview = ann
        .until("/", |b| {
            b.contains("dead-letter-counts") && b.contains("300")
        })
        .await;
    assert!(
        overview.contains("id=\"dead-counts-kind\"") && overview.contains("(exact"),
        "the overview labels its counts"
    );
    assert!(
        links(&overview)
            .iter()
            .any(|l| l == "/dead-letters?queue=dead&dependency=search")
    );
    ann.read_messages("dead").await;

    let group = link_to(&ann.get("/dead-letters").await.1, "/dead-letters/group?");
    let mut pages = vec![
        "/".to_owned(),
        "/api/overview".to_owned(),
        "/dependency/search".to_owned(),
        "/dependency/mail".to_owned(),
        "/dead-letters".to_owned(),
        "/dead-letters?queue=parked".to_owned(),
        "/audit".to_owned(),
        "/workers".to_owned(),
        "/api/workers".to_owned(),
        "/bullmq".to_owned(),
        "/replays".to_owned(),
        format!("/dead-letters/message?id={leaky_id}"),
        format!("/dead-letters/message?id={}", wide_ids[7]),
        group.clone(),
    ];
    let page = ann.get("/dead-letters").await.1;
    for l in links(&page) {
        assert!(l.len() < 512, "a link of {} bytes: {}…", l.len(), &l[..200]);
        if l.starts_with("/dead-letters/group?") {
            pages.push(l);
        }
    }
    assert!(!list.contains(SECRET));
    for who in [&ann, &vic] {
        for path in &pages {
            let (status, body) = who.get(path).await;
            assert_eq!(status, 200, "{path}: {}", &body[..body.len().min(500)]);
            assert!(!body.contains(SECRET), "{path} shows the secret");
            assert!(body.len() <= PAGE_MAX, "{path} weighs {} bytes", body.len());
            println!("{path:70.70} {:>9} bytes", body.len());
        }
    }
    // The secret's group: its title and link redacted, the link by key.
    let page = ann.get("/dead-letters").await.1;
    assert!(
        page.contains("redis://admin:***@db.internal:6379/0"),
        "the class is shown, redacted"
    );

    // Each group's page finds its sampled messages: the secret's, and the one whose class the
    // index keeps cut at 256 bytes.
    let group_links: Vec<String> = links(&page)
        .into_iter()
        .filter(|l| l.starts_with("/dead-letters/group?"))
        .collect();
    assert_eq!(group_links.len(), 3, "{group_links:?}");
    let mut found = Vec::new();
    let mut long_group = String::new();
    for l in &group_links {
        let (_, body) = ann.get(l).await;
        for id in [&leaky_id, &long_class_id] {
            if body.contains(id.as_str()) {
                assert!(
                    body.contains("1–1 of 1 sampled"),
                    "{}",
                    &body[..3000.min(body.len())]
                );
                found.push(id.clone());
                if id == &long_class_id {
                    long_group.clone_from(l);
                }
            }
        }
    }
    assert_eq!(found.len(), 2, "{found:?}");

    // The wide group: 300 sampled, 50 a page, said; the second page is the next 50.
    let wide_group = links(&page)
        .into_iter()
        .filter(|l| l.starts_with("/dead-letters/group?"))
        .find(|l| !l.contains("page="))
        .unwrap();
    let (_, first) = ann.get(&wide_group).await;
    let (_, other) = ann
        .get(
            &links(&page)
                .into_iter()
                .filter(|l| l.starts_with("/dead-letters/group?"))
                .nth(1)
                .unwrap(),
        )
        .await;
    let (wide_page, _) = if first.contains("1–50 of 300") {
        (first, other)
    } else {
        (other, first)
    };
    assert!(
        wide_page.contains("1–50 of 300 sampled messages"),
        "{}",
        &wide_page[..3000.min(wide_page.len())]
    );
    assert_eq!(wide_page.matches("/dead-letters/message?").count(), 50);
    let next = link_to(&wide_page, "/dead-letters/group?");
    let next = links(&wide_page)
        .into_iter()
        .find(|l| l.contains("page=2"))
        .unwrap_or(next);
    let (_, second) = ann.get(&next).await;
    assert!(
        second.contains("51–100 of 300"),
        "{}",
        &second[..3000.min(second.len())]
    );
    assert!(wide_page.len() <= PAGE_MAX);

    // A wide message's page: the task cut and said so, typed numbers, no debug print.
    let (_, m) = ann
        .get(&format!("/dead-letters/message?id={}", wide_ids[7]))
        .await;
    assert!(m.contains("102,400 bytes in all"), "the cut is said");
    assert!(!m.contains("LongLongInt"), "no debug print of a number");
    assert!(m.contains("integer"));
    // The leaky message's page: the body pretty-printed, the error redacted.
    let (_, m) = ann
        .get(&format!("/dead-letters/message?id={leaky_id}"))
        .await;
    assert!(m.contains("JSON (pretty-printed)"), "{m}");
    assert!(
        m.contains("&quot;to&quot;: &quot;x@example.com&quot;"),
        "{m}"
    );
    assert!(
        m.contains("redis://admin:***@db.internal"),
        "redacted, not dropped"
    );
    assert!(m.contains("id=\"purge-message\"") && m.contains("id=\"replay-message\""));
    // A viewer has no forms on it.
    let (_, m) = vic
        .get(&format!("/dead-letters/message?id={leaky_id}"))
        .await;
    assert!(!m.contains("purge-message"));

    // The Purge of the row whose class the index keeps cut removes that row's message, and only
    // it (the form names the row by its key).
    let key = long_group
        .split("g=")
        .nth(1)
        .unwrap()
        .split('&')
        .next()
        .unwrap()
        .to_owned();
    let (status, _, confirm) = ann
        .post("/dead-letters/purge", &[("queue", "dead"), ("g", &key)])
        .await;
    assert_eq!(status, 200);
    assert!(
        confirm.contains("id=\"purge-count\">1<"),
        "{}",
        &confirm[..3000.min(confirm.len())]
    );
    assert!(!confirm.contains(SECRET));
    let (status, location, done) = ann
        .post(
            "/dead-letters/purge",
            &[
                ("queue", "dead"),
                ("g", &key),
                ("confirm", "purge"),
                ("note", "INC-1 noise"),
            ],
        )
        .await;
    let removed = if status == 303 {
        ann.job_ended(&location).await["removed"].as_u64()
    } else {
        assert_eq!(status, 200, "{done}");
        assert!(done.contains("1 messages removed"), "{done}");
        Some(1)
    };
    assert_eq!(removed, Some(1));
    let dead = &f.broker.topology.dead_queue;
    assert_eq!(
        f.broker
            .depth_reaching(dead, 301, Duration::from_secs(30))
            .await,
        301,
        "the others come back from the purge's reads"
    );
    c.stop().await;
}

/// A replay and a purge from a message's page act on that message only: the purge removes it
/// (every other message stays, the index counts one less), the replay moves it alone to the
/// work queue; both run as jobs with a page of their own, and both are in the audit trail with
/// the message's id. Without the CSRF token, or as a viewer, nothing happens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_is_replayed_or_purged_alone_from_its_page() {
    let f = fleet("console-pages-message");
    f.broker.migrate().await;
    let now = fleet_budget::clock::now_ms();
    let p = f.broker.publisher().await;
    let ids = f
        .broker
        .seed_dead_letters(
            &p,
            6,
            "search",
            DeadLetterReason::BudgetExhausted,
            0,
            now - 60_000,
        )
        .await;
    p.close().await;
    reindex(&f).await;
    let c = console(&f.config).await;
    let addr = c.addr().to_string();
    let ann = login(&addr, OPERATOR).await;
    let vic = login(&addr, VIEWER).await;
    ann.until("/dead-letters", |b| b.contains("counts-exact"))
        .await;
    ann.read_messages("dead").await;

    let (purged, replayed) = (&ids[2], &ids[4]);
    // Refused: a viewer, and an operator without the confirmation word.
    let (status, _, _) = vic
        .post(
            "/dead-letters/message/purge",
            &[("id", purged), ("confirm", "purge"), ("note", "x")],
        )
        .await;
    assert_eq!(status, 403);
    let (status, _, _) = ann
        .post(
            "/dead-letters/message/purge",
            &[("id", purged), ("note", "x")],
        )
        .await;
    assert_eq!(
        status, 422,
        "a form without its confirmation is refused as invalid"
    );
    // The sample's reads come back by the broker's own time (a quorum queue: a command of its log).
    let dead = &f.broker.topology.dead_queue;
    assert_eq!(
        f.broker
            .depth_reaching(dead, 6, Duration::from_secs(30))
            .await,
        6
    );

    // The purge of one message.
    let (status, location, _) = ann
        .post(
            "/dead-letters/message/purge",
            &[
                ("id", purged),
                ("confirm", "purge"),
                ("note", "INC-3 poison"),
            ],
        )
        .await;
    assert_eq!(status, 303);
    assert!(location.starts_with("/replay/"), "{location}");
    let (_, page) = ann.get(&location).await;
    assert!(
        page.contains("Purge of message"),
        "the job has a page of its own"
    );
    let job = ann.job_ended(&location).await;
    assert_eq!(job["error"], Value::Null, "{job}");
    assert_eq!(
        (job["kind"].as_str(), job["removed"].as_u64()),
        (Some("message_purge"), Some(1)),
        "{job}"
    );
    assert_eq!(
        f.broker
            .depth_reaching(dead, 5, Duration::from_secs(30))
            .await,
        5,
        "the others come back from the purge's reads"
    );

    // The replay of one message.
    let (status, location, _) = ann
        .post(
            "/dead-letters/message/replay",
            &[
                ("id", replayed),
                ("confirm", "replay"),
                ("note", "INC-3 retry this one"),
            ],
        )
        .await;
    assert_eq!(status, 303);
    let job = ann.job_ended(&location).await;
    assert_eq!(job["error"], Value::Null, "{job}");
    assert_eq!(
        (job["kind"].as_str(), job["moved"].as_u64()),
        (Some("message_replay"), Some(1)),
        "{job}"
    );
    let work = f.broker.drain(&f.broker.topology.work_queue).await;
    let moved: Vec<String> = work
        .iter()
        .filter_map(|(props, _)| props.message_id().as_ref().map(|id| id.to_string()))
        .collect();
    assert_eq!(
        moved,
        vec![replayed.clone()],
        "exactly that message was replayed"
    );
    let left = f
        .broker
        .depth_reaching(&f.broker.topology.dead_queue, 4, Duration::from_secs(30))
        .await;
    assert_eq!(left, 4);
    let mut rest: Vec<String> = f
        .broker
        .drain(&f.broker.topology.dead_queue)
        .await
        .iter()
        .filter_map(|(props, _)| props.message_id().as_ref().map(|id| id.to_string()))
        .collect();
    rest.sort();
    let mut expected: Vec<String> = ids
        .iter()
        .filter(|id| *id != purged && *id != replayed)
        .cloned()
        .collect();
    expected.sort();
    assert_eq!(rest, expected, "every other message stayed, once");

    let trail = AuditLog::default()
        .read(&store(&f.config), None, None, None, 20)
        .await
        .unwrap();
    let actions: Vec<&str> = trail.iter().map(|e| e.action.as_str()).collect();
    assert_eq!(
        actions,
        ["dlq_purge_started", "dlq_purge", "replay_started", "replay"],
        "{trail:?}"
    );
    let text = format!("{trail:?}");
    assert!(
        text.contains(purged.as_str()) && text.contains(replayed.as_str()),
        "{text}"
    );
    c.stop().await;
}
