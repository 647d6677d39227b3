//! Time of the console's pages with many dependencies and many dead letters (and 300 with
//! hostile headers: a secret in the error class, 100 KB task names), at the client over
//! loopback and as the server measured it (its `Server-Timing` header), each page's weight,
//! beside the CLI commands that answer the same questions (`budgetctl status --json`,
//! `budgetctl dlq stats --json`), in the same run. Figures are printed, never asserted on time;
//! the secret is asserted absent from every page.
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
//! topology of its own on the shared RabbitMQ (deleted at the end), filled by
//! `crates/fleet-budget-console/tests/support/scale.rs` (the filler the browser test
//! `crates/fleet-budget-console/tests/browser/hundred_thousand.rs` uses too: the dead letters
//! published with confirms, 1,000 in flight, and counted in the dead-letter index as workers
//! count them). Beside the pages' times it prints a Redis `PING`
//! from the same process over the same loopback: the floor any page that reads Redis stands on.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::process::Command;
use std::time::{Duration, Instant};

use fleet_budget_amqp::testing::unique_prefix;
use fleet_budget_console::{ConsoleSettings, Token, Viewers};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[path = "../tests/support/scale.rs"]
mod scale;

use scale::{HOSTILE, HOSTILE_TASK_BYTES, SECRET, ScaleFleet, median, redis_ping, server_ms};

/// One answer as the bench reads it: its status, its weight on the wire (head and body), and
/// the server's own time of it (`Server-Timing: app;dur=...`, ms).
struct Answer {
    status: u16,
    bytes: usize,
    server_ms: Option<f64>,
}

async fn get(addr: &str, path: &str) -> Answer {
    let (status, head, body) = request(addr, "GET", path, "", None).await;
    let server = head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case("server-timing")
            .then(|| server_ms(v))
            .flatten()
    });
    Answer {
        status,
        bytes: head.len() + 4 + body.len(),
        server_ms: server,
    }
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
    let fleet = ScaleFleet::start("console-bench", deps).await;
    let dir = std::env::temp_dir().join(unique_prefix("console-bench"));
    std::fs::create_dir_all(&dir).unwrap();
    let config_path = dir.join("fleet-budget.toml");
    std::fs::write(&config_path, &fleet.toml).unwrap();
    let config_path = config_path.to_string_lossy().into_owned();

    if audit_entries > 0 {
        let took = fleet.record_audit(audit_entries).await;
        eprintln!(
            "recorded {audit_entries} audit entries in {:.1}s",
            took.as_secs_f64()
        );
    }
    if registry > 0 {
        let took = fleet.write_workers(registry).await;
        eprintln!(
            "wrote {registry} worker registry entries in {:.1}s",
            took.as_secs_f64()
        );
    }
    if dead > 0 {
        let filled = fleet.fill_dead_letters(dead).await;
        eprintln!(
            "published {} dead letters ({HOSTILE} hostile ones first) with confirms, 1,000 in \
             flight, and counted them in the index as workers do, in {:.1}s",
            filled.published,
            filled.took.as_secs_f64()
        );
    }

    let operators = Token::parse_list("bench:bench-token-0123456789", "operator", "bench").unwrap();
    let mut settings = ConsoleSettings::new(fleet.config.clone(), operators, Viewers::Open);
    settings.bind = "127.0.0.1:0".parse().unwrap();
    settings.dead_letter_refresh = Duration::from_secs(2);
    // The default: the fleet read every 5 s in the background while the pages are timed.
    let console = fleet_budget_console::start(settings).await.unwrap();
    let addr = console.addr().to_string();
    // The first reading (a page waits for it).
    assert_eq!(get(&addr, "/api/overview").await.status, 200);

    println!(
        "overview, {deps} dependencies (median of 5; the time at the client over loopback, then the server's own (Server-Timing); the console in-process, rendering its last reading; budgetctl a new process each run):"
    );
    let mut status = Vec::new();
    for _ in 0..5 {
        status.push(cli(&bin, &config_path, &["status", "--json"]));
    }
    for path in [
        "/",
        "/api/overview",
        "/fragments/overview",
        "/dependency/d0",
        &format!("/dependency/d{}", deps - 1),
    ] {
        print_timed(&addr, path).await;
    }
    println!(
        "  budgetctl status --json     {:>8.1} ms",
        median(&mut status).as_secs_f64() * 1000.0
    );
    println!(
        "  reference: Redis PING       {:>8.3} ms",
        redis_ping(&fleet.redis).await.as_secs_f64() * 1000.0
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
        median(&mut took).as_secs_f64() * 1000.0
    );
    // The pages that read no dead letter, timed whatever the queue holds.
    if registry > 0 {
        // Written again: fresh, as their workers would keep them (silent after 15 s).
        fleet.write_workers(registry).await;
    }
    println!("workers ({registry} registry entries written), incident and audit (median of 5):");
    for path in [
        "/workers",
        "/api/workers",
        "/incident?dependency=d0&since=24h",
        "/audit",
        "/audit?dependency=d0",
    ] {
        print_timed(&addr, path).await;
    }
    profile_in_redis(&fleet, &addr, "/incident?dependency=d0&since=24h").await;
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
    // A message of the largest group, and one of the hostile group (the sample reads them
    // first: they are at the head of the queue).
    let mut messages: Vec<String> = Vec::new();
    for (i, g) in groups.iter().enumerate() {
        let page = body_of(&addr, g, "").await;
        if i == 0 || page.contains("redis://admin:***@") {
            messages.extend(first_message(&page));
        }
    }
    messages.dedup();
    paths.extend(messages);
    println!(
        "dead letters, {dead} in the queue and {HOSTILE} with {} KB task names (median of 5):",
        HOSTILE_TASK_BYTES / 1024
    );
    println!(
        "  console sample read         {:>8.1} ms (10,000 messages read and put back, asked for once)",
        sample_read.as_secs_f64() * 1000.0
    );
    let mut heaviest = 0;
    for path in &paths {
        heaviest = heaviest.max(print_timed(&addr, path).await);
        assert!(
            !body_of(&addr, path, "").await.contains(SECRET),
            "{path} shows the secret"
        );
    }
    println!("  heaviest page               {heaviest:>9} bytes (the target: at most 1,048,576)");
    println!(
        "  reference: Redis PING       {:>8.3} ms",
        redis_ping(&fleet.redis).await.as_secs_f64() * 1000.0
    );
    // Printed before the CLI's run.
    let stats = cli(&bin, &config_path, &["dlq", "stats", "--json"]);
    println!(
        "  budgetctl dlq stats --json  {:>8.1} ms",
        stats.as_secs_f64() * 1000.0
    );
    console.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Prints the medians of 5 requests of `path`, at the client and at the server, and its
/// weight; returns the weight.
async fn print_timed(addr: &str, path: &str) -> usize {
    let mut client = Vec::new();
    let mut server = Vec::new();
    let mut size = 0;
    for _ in 0..5 {
        let t = Instant::now();
        let a = get(addr, path).await;
        assert_eq!(a.status, 200, "{path}");
        client.push(t.elapsed());
        server.extend(a.server_ms);
        size = a.bytes;
    }
    let shown: String = path.chars().take(60).collect();
    server.sort_by(f64::total_cmp);
    let server = server
        .get(server.len() / 2)
        .map_or_else(|| "       -".to_owned(), |ms| format!("{ms:>8.1}"));
    println!(
        "  console GET {shown:60} {:>8.1} ms at the client {server} ms server {size:>9} bytes",
        median(&mut client).as_secs_f64() * 1000.0
    );
    size
}

/// Where a page's server time goes: one request of `path` with Redis's slow log recording
/// every command (`slowlog-log-slower-than 0`), its time beside what Redis spent executing the
/// commands on the audit trail and the others (the console's background readings included,
/// if one ran meanwhile). The slow log is set back to Redis's default after.
async fn profile_in_redis(fleet: &ScaleFleet, addr: &str, path: &str) {
    let client = redis::Client::open(fleet.redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let config = |value: &'static str| {
        let mut c = redis::cmd("CONFIG");
        c.arg("SET").arg("slowlog-log-slower-than").arg(value);
        c.arg("slowlog-max-len").arg("100000");
        c
    };
    let () = config("0").query_async(&mut conn).await.unwrap();
    let () = redis::cmd("SLOWLOG")
        .arg("RESET")
        .query_async(&mut conn)
        .await
        .unwrap();
    let answer = get(addr, path).await;
    assert_eq!(answer.status, 200, "{path}");
    let log: Vec<redis::Value> = redis::cmd("SLOWLOG")
        .arg("GET")
        .arg(100_000)
        .query_async(&mut conn)
        .await
        .unwrap();
    let () = config("10000").query_async(&mut conn).await.unwrap();
    let audit_key = fleet_budget::keys::audit_key(&fleet.config.budget.redis.key_prefix);
    let (mut other, mut other_us) = (0, 0);
    let mut audit_commands = std::collections::BTreeMap::new();
    for entry in &log {
        let redis::Value::Array(fields) = entry else {
            continue;
        };
        let (Some(redis::Value::Int(us)), Some(redis::Value::Array(args))) =
            (fields.get(2), fields.get(3))
        else {
            continue;
        };
        let on_audit = args.iter().any(
            |a| matches!(a, redis::Value::BulkString(b) if b.as_slice() == audit_key.as_bytes()),
        );
        let first = match args.first() {
            Some(redis::Value::BulkString(b)) => String::from_utf8_lossy(b).to_lowercase(),
            _ => String::new(),
        };
        if first == "slowlog" {
            continue;
        }
        if on_audit {
            let (n, t) = audit_commands.entry(first).or_insert((0, 0));
            *n += 1;
            *t += us;
        } else {
            other += 1;
            other_us += us;
        }
    }
    // Commands a script runs are logged beside the script's call, whose time includes theirs.
    let calls: Vec<String> = audit_commands
        .iter()
        .map(|(name, (n, us))| format!("{n} {name} {:.1} ms", *us as f64 / 1000.0))
        .collect();
    println!(
        "  where {path}'s time goes (one request, Redis's slow log): {:.1} ms server; in Redis, \
         on the audit trail {} (a script's time includes the commands it runs), {other} others \
         {:.1} ms",
        answer.server_ms.unwrap_or_default(),
        calls.join(", "),
        other_us as f64 / 1000.0
    );
}

/// The address of the first message listed on a group's page.
fn first_message(page: &str) -> Option<String> {
    page.split("href=\"")
        .skip(1)
        .map(|r| r[..r.find('"').unwrap()].replace("&amp;", "&"))
        .find(|l| l.starts_with("/dead-letters/message?"))
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
