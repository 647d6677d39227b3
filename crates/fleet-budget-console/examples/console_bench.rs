//! Server time of the console's overview with many dependencies and of its dead-letter pages
//! with many dead letters (and 300 with hostile headers: a secret in the error class, 100 KB
//! task names), each page's weight, beside the CLI commands that answer the same questions
//! (`budgetctl status --json`, `budgetctl dlq stats --json`), in the same run. Figures are
//! printed, never asserted on time; the secret is asserted absent from every page.
//!
//! `cargo run -p fleet-budget-console --example console_bench -- [DEPENDENCIES] [DEAD_LETTERS]
//! [AUDIT_ENTRIES] [WORKERS]` (defaults 1000, 100000, 0 and 0; 0 dead letters measures the
//! overview and the pages that read no dead letter (workers, incident, audit) only;
//! audit entries are recorded before the console starts, a tenth of them of `d0`, each with its
//! before and after states, so that a dependency's page and the audit pages are timed over a
//! long trail; the trail keeps 10,000 at most; workers are entries of the worker registry,
//! written as workers write them, a tenth in fallback, a tenth silent, one in a hundred
//! unreadable, so that the workers' pages are timed over a large registry) with `BUDGETCTL` naming
//! the binary to compare with (default `target/debug/budgetctl`). Uses a Redis of its own and a
//! topology of its own on the shared RabbitMQ (deleted at the end). Beside the overview's times
//! it prints a Redis `PING` from the same process over the same loopback: the floor any page
//! that reads Redis stands on.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::process::Command;
use std::time::{Duration, Instant};

use std::sync::Arc;

use fleet_budget::control::DeadLetterIndex;
use fleet_budget::testing::RedisServer;
use fleet_budget::{DeadLetterReason, Failure, FleetBudget};
use fleet_budget_amqp::WorkerConfig;
use fleet_budget_amqp::headers;
use fleet_budget_amqp::testing::{TestBroker, unique_prefix};
use fleet_budget_console::{ConsoleSettings, Token, Viewers};
use lapin::BasicProperties;
use lapin::types::{FieldTable, ShortString};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn get(addr: &str, path: &str) -> (u16, usize) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let head = String::from_utf8_lossy(&out[..out.len().min(20)]).into_owned();
    (
        head.split_whitespace()
            .nth(1)
            .unwrap_or("0")
            .parse()
            .unwrap_or(0),
        out.len(),
    )
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn cli(bin: &str, config: &str, args: &[&str]) -> Duration {
    let started = Instant::now();
    let out = Command::new(bin)
        .arg("--config")
        .arg(config)
        .args(args)
        .output()
        .unwrap();
    let took = started.elapsed();
    assert!(
        out.status.success(),
        "{bin} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    took
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let deps: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(1000);
    let dead: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(100_000);
    let audit_entries: usize = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(0);
    let registry: usize = args.get(4).and_then(|a| a.parse().ok()).unwrap_or(0);
    let bin = std::env::var("BUDGETCTL").unwrap_or_else(|_| "target/debug/budgetctl".to_owned());
    let redis = RedisServer::start();
    let broker = TestBroker::new("console-bench");
    broker.migrate().await;
    let mut toml = format!(
        "[redis]\nurl = \"{}\"\nkey_prefix = \"{}\"\ntimeout_ms = 2000\n[amqp]\nurl = \"{}\"\nprefix = \"{}\"\n",
        redis.url(),
        unique_prefix("fbcb"),
        broker.url,
        broker.settings.prefix
    );
    for i in 0..deps {
        toml.push_str(&format!("[dependencies.d{i}]\ntasks = [\"t{i}\"]\n"));
    }
    let dir = std::env::temp_dir().join(unique_prefix("console-bench"));
    std::fs::create_dir_all(&dir).unwrap();
    let config_path = dir.join("fleet-budget.toml");
    std::fs::write(&config_path, &toml).unwrap();
    let config_path = config_path.to_string_lossy().into_owned();
    let config = WorkerConfig::from_toml(&toml, "bench").unwrap();

    // Every dependency with traffic, a tenth of them denying.
    let budget = FleetBudget::from_config(&config.budget).await.unwrap();
    let failure = Failure::retryable("503").with_class("http_503");
    for i in 0..deps {
        let task = format!("t{i}");
        budget.on_attempt(&task, 1).await.unwrap();
        for _ in 0..if i % 10 == 0 { 5 } else { 1 } {
            let _ = budget.on_failure(&task, 1, &failure).await.unwrap();
        }
    }
    budget.shutdown().await.unwrap();

    if audit_entries > 0 {
        let t = Instant::now();
        let r = &config.budget.redis;
        let store = fleet_budget::store::RedisStore::new_with_tls(
            fleet_budget::store::RedisTarget::from_settings(r),
            &r.key_prefix,
            Duration::from_secs(10),
            &r.tls,
        )
        .unwrap();
        let log = fleet_budget::control::AuditLog::default();
        let state = serde_json::json!({"ratio": 0.1, "min_allowance": 10, "until_ms": 1_796_650_000_000_u64});
        for i in 0..audit_entries {
            let dependency = format!("d{}", if i % 10 == 0 { 0 } else { 1 + i % 999 });
            let entry = fleet_budget::control::AuditEntry::new(
                "bench",
                "set",
                Some(&dependency),
                "an incident's override, recorded with its before and after",
            )
            .with_before_after(&state, &state);
            log.record(&store, &entry).await.unwrap();
        }
        eprintln!(
            "recorded {audit_entries} audit entries in {:.1}s",
            t.elapsed().as_secs_f64()
        );
    }

    if registry > 0 {
        let t = Instant::now();
        seed_workers(
            &config.budget.redis.url,
            &config.budget.redis.key_prefix,
            registry,
        )
        .await;
        eprintln!(
            "wrote {registry} worker registry entries in {:.1}s",
            t.elapsed().as_secs_f64()
        );
    }

    let started = Instant::now();
    if dead > 0 {
        let publisher = broker.publisher().await;
        let now = fleet_budget::clock::now_ms();
        for chunk in 0..10 {
            let dep = format!("d{chunk}");
            broker
                .seed_dead_letters(
                    &publisher,
                    dead / 10,
                    &dep,
                    DeadLetterReason::BudgetExhausted,
                    0,
                    now - 60_000,
                )
                .await;
        }
        // Hostile headers beside them: a secret in an error class, 300 task names of 100 KB.
        let mut hostile =
            broker.dead_letter_record("d0", DeadLetterReason::NonRetryable, now - 30_000);
        hostile.error_class = "redis://admin:hunter2@db.internal:6379/0".to_owned();
        hostile.task = "t".repeat(100 * 1024);
        for _ in 0..300 {
            let mut t = FieldTable::default();
            hostile.write(&mut t);
            let props = BasicProperties::default()
                .with_message_id(ShortString::from(headers::new_message_id()))
                .with_delivery_mode(2)
                .with_headers(t);
            publisher
                .publish(&broker.topology.dead_exchange, "d0", b"{}", props)
                .await
                .unwrap();
        }
        publisher.close().await;
        eprintln!(
            "seeded {dead} dead letters and 300 hostile ones in {:.1}s",
            started.elapsed().as_secs_f64()
        );
        // Indexed as `budgetctl migrate` indexes dead letters older than the index.
        let t = Instant::now();
        let r = &config.budget.redis;
        let store = fleet_budget::store::RedisStore::new_with_tls(
            fleet_budget::store::RedisTarget::from_settings(r),
            &r.key_prefix,
            Duration::from_secs(10),
            &r.tls,
        )
        .unwrap();
        fleet_budget_amqp::Replayer::new(broker.url.clone(), broker.topology.clone(), None)
            .with_index(Some(DeadLetterIndex::new(Arc::new(store))))
            .reindex()
            .await
            .unwrap();
        eprintln!("indexed in {:.1}s", t.elapsed().as_secs_f64());
    }

    let operators = Token::parse_list("bench:bench-token-0123456789", "operator", "bench").unwrap();
    let mut settings = ConsoleSettings::new(config.clone(), operators, Viewers::Open);
    settings.bind = "127.0.0.1:0".parse().unwrap();
    settings.dead_letter_refresh = Duration::from_secs(2);
    // The default: the fleet read every 5 s in the background while the pages are timed.
    let console = fleet_budget_console::start(settings).await.unwrap();
    let addr = console.addr().to_string();
    // The first reading (a page waits for it).
    assert_eq!(get(&addr, "/api/overview").await.0, 200);

    println!(
        "overview, {deps} dependencies (median of 5; times at the client over loopback; the console in-process, rendering its last reading; budgetctl a new process each run):"
    );
    let mut page = Vec::new();
    let mut json = Vec::new();
    let mut status = Vec::new();
    let (mut page_bytes, mut json_bytes) = (0, 0);
    for _ in 0..5 {
        let t = Instant::now();
        let (code, bytes) = get(&addr, "/").await;
        assert_eq!(code, 200);
        page.push(t.elapsed());
        let t = Instant::now();
        let (code, jbytes) = get(&addr, "/api/overview").await;
        assert_eq!(code, 200);
        json.push(t.elapsed());
        status.push(cli(&bin, &config_path, &["status", "--json"]));
        (page_bytes, json_bytes) = (bytes, jbytes);
    }
    println!(
        "  console GET /               {:>8.1} ms {page_bytes:>9} bytes",
        median(page).as_secs_f64() * 1000.0
    );
    println!(
        "  console GET /api/overview   {:>8.1} ms {json_bytes:>9} bytes (all {deps} rows, serialized once per reading)",
        median(json).as_secs_f64() * 1000.0
    );
    // A dependency's page: its row of the same reading, its history, its audit trail.
    for path in ["/dependency/d0", &format!("/dependency/d{}", deps - 1)] {
        let mut times = Vec::new();
        let mut size = 0;
        for _ in 0..5 {
            let t = Instant::now();
            let (code, bytes) = get(&addr, path).await;
            assert_eq!(code, 200, "{path}");
            times.push(t.elapsed());
            size = bytes;
        }
        println!(
            "  console GET {path:<16}{:>8.1} ms {size:>9} bytes",
            median(times).as_secs_f64() * 1000.0
        );
    }
    println!(
        "  budgetctl status --json     {:>8.1} ms",
        median(status).as_secs_f64() * 1000.0
    );
    let mut fragment = Vec::new();
    let mut ping = Vec::new();
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let mut weight = 0;
    for _ in 0..5 {
        let t = Instant::now();
        let (code, bytes) = get(&addr, "/fragments/overview").await;
        assert_eq!(code, 200);
        fragment.push(t.elapsed());
        weight = bytes;
        let t = Instant::now();
        let _: String = redis::cmd("PING").query_async(&mut conn).await.unwrap();
        ping.push(t.elapsed());
    }
    println!(
        "  console GET /fragments/overview {:>4.1} ms ({weight} bytes: the live refresh)",
        median(fragment).as_secs_f64() * 1000.0
    );
    println!(
        "  reference: Redis PING       {:>8.3} ms",
        median(ping).as_secs_f64() * 1000.0
    );
    let mut took = Vec::new();
    for _ in 0..5 {
        let j: serde_json::Value =
            serde_json::from_str(&body_of(&addr, "/api/overview", "").await).unwrap();
        took.push(Duration::from_millis(j["read_took_ms"].as_u64().unwrap()));
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    println!(
        "  the console's background reading of the fleet (every 5 s, what the pages show) {:>8.1} ms",
        median(took).as_secs_f64() * 1000.0
    );
    // The pages that read no dead letter, timed whatever the queue holds.
    if registry > 0 {
        // Written again: fresh, as their workers would keep them (silent after 15 s).
        seed_workers(
            &config.budget.redis.url,
            &config.budget.redis.key_prefix,
            registry,
        )
        .await;
    }
    println!("workers ({registry} registry entries written), incident and audit (median of 5):");
    for path in [
        "/workers",
        "/api/workers",
        "/incident?dependency=d0&since=24h",
        "/audit",
        "/audit?dependency=d0",
    ] {
        let (took, size) = timed(&addr, path).await;
        println!("  console GET {path:<60} {took:>8.1} ms {size:>9} bytes");
    }
    if dead == 0 {
        console.stop().await;
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }

    // The counts first (no message read), then a sample asked for by an operator.
    while !body_of(&addr, "/dead-letters", "")
        .await
        .contains("counts-exact")
    {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let cookie = login(&addr, "bench-token-0123456789").await;
    let csrf = {
        let page = body_of(&addr, "/", &cookie).await;
        let at = page.find("name=\"csrf\" value=\"").unwrap() + 19;
        page[at..at + page[at..].find('"').unwrap()].to_owned()
    };
    let t = Instant::now();
    request(
        &addr,
        "POST",
        "/dead-letters/refresh",
        &cookie,
        Some(&format!("csrf={csrf}")),
    )
    .await;
    while !body_of(&addr, "/dead-letters", "")
        .await
        .contains("Sampled ")
    {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let sample_read = t.elapsed();
    let list = body_of(&addr, "/dead-letters", "").await;
    let groups: Vec<String> = list
        .split("href=\"")
        .skip(1)
        .map(|r| r[..r.find('"').unwrap()].replace("&amp;", "&"))
        .filter(|l| l.starts_with("/dead-letters/group?"))
        .collect();
    let mut paths = vec![
        "/".to_owned(),
        "/api/overview".to_owned(),
        "/fragments/overview".to_owned(),
        "/dependency/d0".to_owned(),
        "/workers".to_owned(),
        "/api/workers".to_owned(),
        "/dead-letters".to_owned(),
        "/dead-letters?sort=oldest".to_owned(),
        "/dead-letters?queue=parked".to_owned(),
        "/replays".to_owned(),
        "/incident?dependency=d0&since=24h".to_owned(),
        "/audit".to_owned(),
        "/audit?dependency=d0".to_owned(),
    ];
    for g in &groups {
        paths.push(g.clone());
        paths.push(format!("{g}&page=3"));
    }
    let first_group = body_of(&addr, &groups[0], "").await;
    if let Some(m) = first_group
        .split("href=\"")
        .skip(1)
        .map(|r| r[..r.find('"').unwrap()].replace("&amp;", "&"))
        .find(|l| l.starts_with("/dead-letters/message?"))
    {
        paths.push(m);
    }
    println!("dead letters, {dead} in the queue and 300 with 100 KB task names (median of 5):");
    println!(
        "  console sample read         {:>8.1} ms (10,000 messages read and put back, asked for once)",
        sample_read.as_secs_f64() * 1000.0
    );
    let mut heaviest = 0;
    for path in &paths {
        let mut times = Vec::new();
        let mut size = 0;
        for _ in 0..5 {
            let t = Instant::now();
            let (code, bytes) = get(&addr, path).await;
            assert_eq!(code, 200, "{path}");
            times.push(t.elapsed());
            size = bytes;
        }
        heaviest = heaviest.max(size);
        let shown: String = path.chars().take(60).collect();
        println!(
            "  console GET {shown:60} {:>8.1} ms {:>9} bytes",
            median(times).as_secs_f64() * 1000.0,
            size
        );
        assert!(
            !body_of(&addr, path, "").await.contains("hunter2"),
            "{path} shows the secret"
        );
    }
    println!("  heaviest page               {heaviest:>9} bytes (the target: at most 1,048,576)");
    // Printed before the CLI's run.
    let stats = cli(&bin, &config_path, &["dlq", "stats", "--json"]);
    println!(
        "  budgetctl dlq stats --json  {:>8.1} ms",
        stats.as_secs_f64() * 1000.0
    );
    console.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// The median of 5 requests of `path` (ms) and its weight.
async fn timed(addr: &str, path: &str) -> (f64, usize) {
    let mut times = Vec::new();
    let mut size = 0;
    for _ in 0..5 {
        let t = Instant::now();
        let (code, bytes) = get(addr, path).await;
        assert_eq!(code, 200, "{path}");
        times.push(t.elapsed());
        size = bytes;
    }
    (median(times).as_secs_f64() * 1000.0, size)
}

/// `n` entries of the worker registry, as `heartbeat.lua` writes them (a report under the id,
/// the server's time in the sorted set): a tenth deciding three dependencies from their
/// fallback, a tenth silent (last seen a minute ago), one in a hundred not a worker's report.
async fn seed_workers(url: &str, prefix: &str, n: usize) {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    let now_ms = secs * 1000 + micros / 1000;
    let reports = fleet_budget::keys::workers_key(prefix);
    let seen = fleet_budget::keys::workers_seen_key(prefix);
    for chunk in (0..n).collect::<Vec<_>>().chunks(500) {
        let mut pipe = redis::pipe();
        for &i in chunk {
            let id = format!("bench-{i:05}");
            let fallback = if i % 10 == 3 {
                serde_json::json!([
                    {"dependency": "d0", "for_ms": 12_000},
                    {"dependency": "d1", "for_ms": 9_000},
                    {"dependency": "d2", "for_ms": 4_000}
                ])
            } else {
                serde_json::json!([])
            };
            let report = if i % 100 == 7 {
                "not a report".to_owned()
            } else {
                serde_json::json!({
                    "v": 1, "id": id, "host": format!("host-{}", i % 200), "pid": 1000 + i,
                    "lang": "rust", "version": "0.2.0", "started_ms": now_ms - 3_600_000,
                    "interval_ms": 5000, "fallback": fallback, "fallback_more": 0
                })
                .to_string()
            };
            let at = if i % 10 == 5 {
                now_ms - 60_000
            } else {
                now_ms - (i as u64 % 4000)
            };
            pipe.cmd("HSET").arg(&reports).arg(&id).arg(report).ignore();
            pipe.cmd("ZADD").arg(&seen).arg(at).arg(&id).ignore();
        }
        let () = pipe.query_async(&mut conn).await.unwrap();
    }
}

/// One request (`Connection: close`): status, head, body.
async fn request(
    addr: &str,
    method: &str,
    path: &str,
    cookie: &str,
    form: Option<&str>,
) -> (u16, String, Vec<u8>) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    if !cookie.is_empty() {
        req.push_str(&format!("Cookie: {cookie}\r\n"));
    }
    if let Some(f) = form {
        req.push_str(&format!(
            "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n",
            f.len()
        ));
    }
    req.push_str("\r\n");
    req.push_str(form.unwrap_or_default());
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let split = out.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&out[..split]).into_owned();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, head, out[split + 4..].to_vec())
}

async fn body_of(addr: &str, path: &str, cookie: &str) -> String {
    String::from_utf8(request(addr, "GET", path, cookie, None).await.2).unwrap()
}

fn cookie_of(head: &str, name: &str) -> String {
    head.lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.eq_ignore_ascii_case("set-cookie"))
                .then(|| {
                    v.trim()
                        .strip_prefix(&format!("{name}="))?
                        .split(';')
                        .next()
                        .map(str::to_owned)
                })
                .flatten()
        })
        .unwrap()
}

/// An operator's session cookie.
async fn login(addr: &str, token: &str) -> String {
    let (_, head, _) = request(addr, "GET", "/login", "", None).await;
    let nonce = cookie_of(&head, "fbc_login");
    let (_, head, _) = request(
        addr,
        "POST",
        "/login",
        &format!("fbc_login={nonce}"),
        Some(&format!("token={token}&login_csrf={nonce}")),
    )
    .await;
    format!("fbc_session={}", cookie_of(&head, "fbc_session"))
}
