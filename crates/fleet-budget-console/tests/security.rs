//! The console's defences as an attacker meets them (issue 32, "Security"): real TCP, raw
//! HTTP/1.1 from several loopback addresses (Linux answers all of 127.0.0.0/8), against the
//! console on a Redis of the test's own and the shared RabbitMQ (a topology prefix of its own),
//! in-process or as the real `budgetctl console` under a 1,024-file limit.
//!
//! No timed assertion: each case asserts what was answered or closed, and prints how long it
//! took.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod support;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::Stdio;
use std::time::{Duration, Instant};

use fleet_budget::testing::{RedisServer, free_port};
use fleet_budget_amqp::WorkerConfig;
use fleet_budget_amqp::testing::{TestBroker, unique_prefix};
use fleet_budget_console::{
    ConsoleSettings, LoginLimits, NetLimits, PublicUrl, RunningConsole, Token, Viewers,
};
use support::budgetctl;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

const OPERATOR: &str = "operator-token-0123456789";
const VIEWER: &str = "viewer-token-0123456789";
const WRONG: &str = "not-a-token-of-this-console";

struct Fleet {
    _redis: RedisServer,
    _broker: TestBroker,
    config: WorkerConfig,
    toml: String,
}

fn fleet(name: &str) -> Fleet {
    let redis = RedisServer::start();
    let broker = TestBroker::new(name);
    let toml = format!(
        "[redis]\nurl = \"{}\"\nkey_prefix = \"{}\"\n\
         [dependencies.search]\ntasks = [\"index\"]\n\
         [amqp]\nurl = \"{}\"\nprefix = \"{}\"\n",
        redis.url(),
        unique_prefix("fbs"),
        broker.url,
        broker.settings.prefix
    );
    let config = WorkerConfig::from_toml(&toml, "security test").unwrap();
    Fleet {
        _redis: redis,
        _broker: broker,
        config,
        toml,
    }
}

async fn console(f: &Fleet, change: impl FnOnce(&mut ConsoleSettings)) -> RunningConsole {
    let operators = Token::parse_list(&format!("ann:{OPERATOR}"), "operator", "test").unwrap();
    let viewers = Token::parse_list(&format!("vic:{VIEWER}"), "viewer", "test").unwrap();
    let mut settings = ConsoleSettings::new(f.config.clone(), operators, Viewers::Tokens(viewers));
    settings.bind = "127.0.0.1:0".parse().unwrap();
    // The allowances refill over an hour, not a minute: what the test counts does not depend
    // on how fast the machine runs it (the default limits are checked below).
    settings.login_limits.window = Duration::from_secs(3_600);
    change(&mut settings);
    fleet_budget_console::start(settings).await.unwrap()
}

fn from(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
}

/// A connection to `to` from the address `source`.
async fn connect(source: IpAddr, to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(source, 0))?;
    tokio::time::timeout(Duration::from_secs(30), socket.connect(to))
        .await
        .map_err(|_| std::io::Error::other("connect timed out"))?
}

#[derive(Debug)]
struct Reply {
    status: u16,
    /// The head, lower case.
    head: String,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Vec<&str> {
        self.head
            .lines()
            .filter_map(|l| l.strip_prefix(&format!("{name}: ")))
            .collect()
    }

    fn cookie(&self, name: &str) -> Option<String> {
        self.header("set-cookie").into_iter().find_map(|c| {
            c.strip_prefix(&format!("{name}="))
                .map(|v| v.split(';').next().unwrap_or_default().to_owned())
        })
    }

    /// The security headers every response carries.
    fn secured(&self) -> bool {
        self.header("content-security-policy")
            .first()
            .is_some_and(|v| v.contains("script-src 'self'") && v.contains("frame-ancestors"))
            && self.header("x-content-type-options") == ["nosniff"]
            && self.header("x-frame-options") == ["deny"]
            && self.header("referrer-policy") == ["same-origin"]
            && self.header("cache-control") == ["no-store"]
    }
}

/// Sends `raw` from `source` and reads the answer to its end (the server closes: every request
/// here says `Connection: close`, or is refused with a close).
async fn exchange(source: IpAddr, to: SocketAddr, raw: &[u8]) -> Reply {
    let mut stream = connect(source, to).await.unwrap();
    stream.write_all(raw).await.unwrap();
    let mut reply = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(60), async {
        let mut chunk = [0u8; 16 * 1024];
        loop {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => reply.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await;
    assert!(read.is_ok(), "no end of the answer within 60 s");
    let text = String::from_utf8_lossy(&reply).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Reply {
        status,
        head: head.to_ascii_lowercase(),
        body: body.to_owned(),
    }
}

async fn get(source: IpAddr, to: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Reply {
    let mut raw = format!("GET {path} HTTP/1.1\r\nConnection: close\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        raw.push_str(&format!("Host: {to}\r\n"));
    }
    for (k, v) in headers {
        raw.push_str(&format!("{k}: {v}\r\n"));
    }
    raw.push_str("\r\n");
    exchange(source, to, raw.as_bytes()).await
}

/// The login form's round: its CSRF cookie, then the token, from `source`, for `host`.
async fn login_as(source: IpAddr, to: SocketAddr, host: &str, token: &str) -> Reply {
    let form = get(source, to, "/login", &[("Host", host)]).await;
    assert_eq!(form.status, 200, "{form:?}");
    let nonce = form.cookie("fbc_login").unwrap();
    let body = format!("token={token}&login_csrf={nonce}");
    let raw = format!(
        "POST /login HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\
         Cookie: fbc_login={nonce}\r\nContent-Type: application/x-www-form-urlencoded\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    exchange(source, to, raw.as_bytes()).await
}

async fn login(source: IpAddr, to: SocketAddr, token: &str) -> Reply {
    login_as(source, to, &to.to_string(), token).await
}

/// The value of the series `series` (name and labels) in a text exposition.
fn series(exposition: &str, series: &str) -> u64 {
    exposition
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {series} in\n{exposition}"))
}

async fn metrics(to: SocketAddr) -> String {
    let r = get(
        from(9),
        to,
        "/metrics",
        &[("Authorization", &format!("Bearer {OPERATOR}"))],
    )
    .await;
    assert_eq!(r.status, 200, "{r:?}");
    r.body
}

/// Twenty-five wrong tokens from one address lock out that address only: the operator's
/// correct token from another address logs in at once; a token label's own logins are bounded
/// (31st in a minute refused) without touching another label's. Every refusal is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strangers_wrong_tokens_never_lock_out_an_operator_elsewhere() {
    let f = fleet("sec-lockout");
    let c = console(&f, |_| {}).await;
    let to = c.addr();

    let mut statuses = std::collections::BTreeMap::<u16, u32>::new();
    for _ in 0..25 {
        *statuses
            .entry(login(from(2), to, WRONG).await.status)
            .or_default() += 1;
    }
    println!("25 wrong tokens from 127.0.0.2: {statuses:?}");
    assert_eq!(statuses, [(401, 10), (429, 15)].into_iter().collect());
    // The stranger's own address waits, whatever the token.
    assert_eq!(login(from(2), to, OPERATOR).await.status, 429);
    // The operator, from elsewhere, right away.
    let ok = login(from(3), to, OPERATOR).await;
    assert_eq!(ok.status, 303, "{ok:?}");
    let session = ok.cookie("fbc_session").unwrap();
    let cookie = ok.header("set-cookie").join(" | ");
    assert!(
        cookie.contains("httponly") && !cookie.contains("secure"),
        "no Secure without an https public URL: {cookie}"
    );
    let page = get(
        from(3),
        to,
        "/",
        &[("Cookie", &format!("fbc_session={session}"))],
    )
    .await;
    assert_eq!(page.status, 200);

    // Per label: 30 logins a minute with vic's token, the 31st refused; ann is not touched.
    for i in 0..30 {
        let r = login(from(4), to, VIEWER).await;
        assert_eq!(r.status, 303, "viewer login {i}: {r:?}");
    }
    assert_eq!(login(from(4), to, VIEWER).await.status, 429);
    assert_eq!(login(from(4), to, OPERATOR).await.status, 303);

    // Counted, with fixed reasons; /metrics needs a token or a session.
    assert_eq!(get(from(9), to, "/metrics", &[]).await.status, 401);
    let wrong_bearer = get(
        from(5),
        to,
        "/metrics",
        &[("Authorization", &format!("Bearer {WRONG}"))],
    )
    .await;
    assert_eq!(wrong_bearer.status, 401);
    let m = metrics(to).await;
    println!("{m}");
    let failures = "fleet_budget_console_login_failures_total";
    assert_eq!(
        series(&m, &format!("{failures}{{reason=\"wrong_token\"}}")),
        11
    );
    assert_eq!(
        series(&m, &format!("{failures}{{reason=\"address_limited\"}}")),
        16
    );
    assert_eq!(
        series(&m, &format!("{failures}{{reason=\"label_limited\"}}")),
        1
    );
    assert_eq!(series(&m, "fleet_budget_console_logins_total"), 32);
    assert!(!m.contains(OPERATOR) && !m.contains(WRONG));

    // Every console metric the guide names is served.
    let guide = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/console.md"),
    )
    .unwrap();
    let named: std::collections::BTreeSet<&str> = guide
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("fleet_budget_console_"))
        .collect();
    assert!(named.len() >= 5, "{named:?}");
    for name in named {
        assert!(
            m.contains(&format!("# TYPE {name} ")),
            "{name} is in docs/console.md, not in /metrics"
        );
    }
    c.stop().await;
}

/// DNS rebinding: a Host the console is not (the attacker's name, resolving to us) is refused
/// before any handler, with the security headers; the bind address, `localhost` and the public
/// URL's host are answered; an `https://` public URL makes every cookie `Secure`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_hosts_are_refused_and_an_https_public_url_makes_cookies_secure() {
    let f = fleet("sec-host");
    let c = console(&f, |s| {
        s.viewers = Viewers::Open;
        s.public_url = Some(PublicUrl::parse("https://console.example.com").unwrap());
    })
    .await;
    let to = c.addr();
    for host in [
        "rebind.evil.example".to_owned(),
        format!("rebind.evil.example:{}", to.port()),
        "10.9.8.7".to_owned(),
        "console.example.com.evil.example".to_owned(),
    ] {
        for path in ["/", "/api/overview", "/login"] {
            let r = get(from(2), to, path, &[("Host", &host)]).await;
            assert_eq!(r.status, 421, "{host}{path}: {r:?}");
            assert!(r.secured(), "{r:?}");
            assert!(!r.body.contains("search"), "nothing read: {}", r.body);
        }
    }
    // HTTP/1.0 without a Host.
    let r = exchange(from(2), to, b"GET /api/overview HTTP/1.0\r\n\r\n").await;
    assert_eq!(r.status, 421, "{r:?}");
    for host in [
        to.to_string(),
        format!("localhost:{}", to.port()),
        "console.example.com".to_owned(),
        "Console.Example.COM:443".to_owned(),
    ] {
        let r = get(from(2), to, "/api/overview", &[("Host", &host)]).await;
        assert_eq!(r.status, 200, "{host}: {r:?}");
        assert!(r.secured());
    }
    let form = get(from(2), to, "/login", &[("Host", "console.example.com")]).await;
    assert!(
        form.header("set-cookie").join("").contains("secure"),
        "{form:?}"
    );
    let ok = login_as(from(2), to, "console.example.com", OPERATOR).await;
    assert_eq!(ok.status, 303, "{ok:?}");
    let cookie = ok.header("set-cookie").join("");
    assert!(
        cookie.contains("fbc_session=") && cookie.contains("; secure"),
        "{cookie}"
    );
    // A proxy that does not pass the Host on: a form posted from the public origin is ours,
    // one from elsewhere is not.
    for (origin, from_elsewhere) in [
        ("https://console.example.com", false),
        ("http://console.example.com", true),
        ("https://evil.example", true),
    ] {
        let raw = format!(
            "POST /login HTTP/1.1\r\nHost: {to}\r\nOrigin: {origin}\r\nConnection: close\r\n\
             Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 5\r\n\r\ntoken"
        );
        let r = exchange(from(2), to, raw.as_bytes()).await;
        assert_eq!(r.status, 403, "{origin}: {r:?}");
        assert_eq!(
            r.body.contains("came from another site"),
            from_elsewhere,
            "{origin}: {}",
            r.body
        );
    }
    let m = metrics(to).await;
    assert_eq!(series(&m, "fleet_budget_console_hosts_refused_total"), 13);
    c.stop().await;
}

/// The answers the server gives on its own (404, 405, 408, 413, 414, 431, 421) carry the
/// security headers; a body that does not arrive is answered 408 after the body deadline and
/// the connection closed. Past hyper's own bounds (a 65 KiB address, 200 header lines) hyper
/// answers without a body: printed, as docs/console.md says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_servers_own_errors_carry_the_security_headers() {
    let f = fleet("sec-errors");
    let c = console(&f, |s| {
        s.limits.body_timeout = Duration::from_secs(2);
    })
    .await;
    let to = c.addr();
    let host = to.to_string();
    let check = |what: &str, r: &Reply, status: u16| {
        println!("{what}: {} ({} bytes of body)", r.status, r.body.len());
        assert_eq!(r.status, status, "{what}: {r:?}");
        assert!(r.secured(), "{what}: no security headers: {}", r.head);
    };
    check("unknown path", &get(from(2), to, "/nope", &[]).await, 404);
    let r = exchange(
        from(2),
        to,
        format!("DELETE /login HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await;
    check("DELETE /login", &r, 405);
    let big = "a".repeat(20_000);
    let r = exchange(
        from(2),
        to,
        format!(
            "POST /login HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\
             Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{big}",
            big.len()
        )
        .as_bytes(),
    )
    .await;
    check("20 KB body", &r, 413);
    let r = exchange(
        from(2),
        to,
        format!(
            "POST /login HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\
             Content-Type: application/x-www-form-urlencoded\r\nTransfer-Encoding: chunked\r\n\r\n\
             4e20\r\n{big}\r\n0\r\n\r\n"
        )
        .as_bytes(),
    )
    .await;
    check("20 KB chunked body", &r, 413);
    let long = format!("/dead-letters/group?error_class={}", "x".repeat(20_000));
    check("20 KB address", &get(from(2), to, &long, &[]).await, 414);
    let many: Vec<(String, String)> = (0..150)
        .map(|i| (format!("X-Filler-{i}"), "v".to_owned()))
        .collect();
    let refs: Vec<(&str, &str)> = many.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    check(
        "150 header lines",
        &get(from(2), to, "/login", &refs).await,
        431,
    );
    let cookie = "c".repeat(40_000);
    check(
        "40 KB cookie",
        &get(from(2), to, "/login", &[("Cookie", &cookie)]).await,
        431,
    );
    check(
        "another host",
        &get(from(2), to, "/login", &[("Host", "evil.example")]).await,
        421,
    );

    // A body that stops halfway: 408 after the deadline, and the connection closed.
    let started = Instant::now();
    let r = exchange(
        from(2),
        to,
        format!(
            "POST /login HTTP/1.1\r\nHost: {host}\r\n\
             Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 100\r\n\r\ntoken=abc"
        )
        .as_bytes(),
    )
    .await;
    println!("half a body: answered after {:?}", started.elapsed());
    check("half a body", &r, 408);
    assert!(r.header("connection").contains(&"close"), "{r:?}");

    // Past hyper's own bounds: hyper's answer, no body (nothing a browser renders).
    let huge = format!("/{}", "x".repeat(70_000));
    let r = get(from(2), to, &huge, &[]).await;
    println!(
        "70 KB address (hyper's own answer): {} {:?}",
        r.status, r.head
    );
    assert!(r.body.is_empty(), "{r:?}");
    let m = metrics(to).await;
    assert_eq!(
        series(&m, "fleet_budget_console_timeouts_total{phase=\"body\"}"),
        1
    );
    c.stop().await;
}

/// The real `budgetctl console` under a 1,024-file limit: 1,100 half-sent requests from one
/// address, then 1,100 from 100 addresses, never stop `/login` answering another client, and
/// every one of them is closed by the server after the head deadline. The tokens come from a
/// variable named with `--operator-token-var`; `--operator-token-env TOKEN` is refused without
/// printing the token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_sent_requests_never_stop_login_answering_and_are_closed_after_the_deadline() {
    let f = fleet("sec-slow");
    let config = std::env::temp_dir().join(format!("{}.toml", unique_prefix("fbs")));
    std::fs::write(&config, &f.toml).unwrap();
    let bin = budgetctl();

    // The token on the command line: refused, not printed.
    let refused = tokio::process::Command::new(&bin)
        .arg("--config")
        .arg(&config)
        .args(["console", "--operator-token-env", OPERATOR])
        .output()
        .await
        .unwrap();
    let said = String::from_utf8_lossy(&refused.stderr).into_owned()
        + &String::from_utf8_lossy(&refused.stdout);
    println!("--operator-token-env: {:?} {said}", refused.status.code());
    assert!(!refused.status.success());
    assert!(said.contains("--operator-token-env is refused"), "{said}");
    assert!(!said.contains(OPERATOR), "the token was printed: {said}");

    let port = free_port();
    let to = SocketAddr::from(([127, 0, 0, 1], port));
    let mut child = tokio::process::Command::new("sh")
        .arg("-c")
        .arg("ulimit -n 1024 && exec \"$@\"")
        .arg("sh")
        .arg(&bin)
        .arg("--config")
        .arg(&config)
        .args([
            "console",
            "--bind",
            &to.to_string(),
            "--no-viewer-token",
            "--operator-token-var",
            "SEC_TEST_OPS",
            "--header-timeout-secs",
            "5",
        ])
        .env("SEC_TEST_OPS", format!("ann:{OPERATOR}"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut up = false;
    for _ in 0..300 {
        if TcpStream::connect(to).await.is_ok() {
            up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(up, "the console did not start");
    let limit = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "grep 'Max open files' /proc/{}/limits",
            child.id().unwrap()
        ))
        .output()
        .await
        .unwrap();
    println!("console: {}", String::from_utf8_lossy(&limit.stdout).trim());

    for (phase, addresses) in [("one address", 1u8), ("100 addresses", 100)] {
        let started = Instant::now();
        let mut open = Vec::new();
        for i in 0..1_100u32 {
            let source = from(10 + u8::try_from(i % u32::from(addresses)).unwrap());
            let mut s = match connect(source, to).await {
                Ok(s) => s,
                Err(e) => panic!("connection {i} ({phase}): {e} (this test needs ~1,200 files)"),
            };
            // Half a request: the head never ends.
            let _ = s
                .write_all(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
                .await;
            open.push(s);
        }
        println!(
            "{phase}: 1,100 half-sent requests open after {:?}",
            started.elapsed()
        );
        let asked = Instant::now();
        let r = get(from(1), to, "/login", &[]).await;
        println!(
            "{phase}: /login answered {} after {:?}",
            r.status,
            asked.elapsed()
        );
        assert_eq!(r.status, 200, "{phase}: {r:?}");
        assert!(r.secured());

        // Every half-sent request ends closed by the server (read gives end of file or a
        // reset), none answered with a page.
        let closing = Instant::now();
        let mut reads = tokio::task::JoinSet::new();
        for mut s in open {
            reads.spawn(async move {
                let mut buf = [0u8; 512];
                let mut got = Vec::new();
                let r = tokio::time::timeout(Duration::from_secs(120), async {
                    loop {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => got.extend_from_slice(&buf[..n]),
                        }
                    }
                })
                .await;
                (r.is_ok(), got.is_empty())
            });
        }
        let (mut closed, mut silent) = (0, 0);
        while let Some(r) = reads.join_next().await {
            let (was_closed, was_silent) = r.unwrap();
            closed += u32::from(was_closed);
            silent += u32::from(was_silent);
        }
        println!(
            "{phase}: {closed} of 1,100 closed by the server, {silent} without an answer, the last after {:?}",
            closing.elapsed()
        );
        assert_eq!(closed, 1_100, "{phase}");
        assert_eq!(silent, 1_100, "{phase}");
    }
    // A wrong token: logged with the address and the reason, never the token.
    assert_eq!(login(from(3), to, WRONG).await.status, 401);
    let m = get(
        from(1),
        to,
        "/metrics",
        &[("Authorization", &format!("Bearer {OPERATOR}"))],
    )
    .await;
    println!("{}", m.body);
    let refused = series(
        &m.body,
        "fleet_budget_console_connections_refused_total{reason=\"per_address\"}",
    );
    let evicted = series(
        &m.body,
        "fleet_budget_console_connections_refused_total{reason=\"evicted_idle\"}",
    );
    let timed_out = series(
        &m.body,
        "fleet_budget_console_timeouts_total{phase=\"header\"}",
    );
    assert!(refused > 0 && evicted > 0 && timed_out > 0, "{}", m.body);
    assert_eq!(
        refused + evicted + timed_out,
        2_200,
        "every half-sent request is accounted for"
    );
    assert!(
        child.try_wait().unwrap().is_none(),
        "the console is still serving"
    );
    child.start_kill().unwrap();
    let out = child.wait_with_output().await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains(OPERATOR) && !stderr.contains(WRONG),
        "{stderr}"
    );
    assert!(
        stderr.lines().any(|l| l.contains("login refused")
            && l.contains("127.0.0.3")
            && l.contains("wrong_token")),
        "{stderr}"
    );
    println!("console's stderr (last lines):\n{}", tail(&stderr, 10));
    let _ = std::fs::remove_file(&config);
}

/// A client that asks and never reads: once the socket buffers are full the console's write
/// stalls, and after the write deadline the connection is ended (counted as a write timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_is_dropped_after_the_write_deadline() {
    let f = fleet("sec-write");
    let c = console(&f, |s| {
        s.viewers = Viewers::Open;
        s.limits.write_idle_timeout = Duration::from_secs(2);
    })
    .await;
    let to = c.addr();
    let mut s = connect(from(2), to).await.unwrap();
    // 3,000 pipelined requests for the script (5 KB each): 15 MB of answers nobody reads.
    let one = format!("GET /static/console.js HTTP/1.1\r\nHost: {to}\r\n\r\n");
    let started = Instant::now();
    let writer = tokio::spawn(async move {
        for _ in 0..3_000 {
            if s.write_all(one.as_bytes()).await.is_err() {
                break;
            }
        }
        s
    });
    let mut stalled = 0;
    for _ in 0..600 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        stalled = series(
            &metrics(to).await,
            "fleet_budget_console_timeouts_total{phase=\"write\"}",
        );
        if stalled > 0 {
            break;
        }
    }
    println!(
        "a client that never reads: dropped after {:?}",
        started.elapsed()
    );
    assert_eq!(stalled, 1);
    let m = metrics(to).await;
    // Only the /metrics connection of this read is open.
    assert_eq!(
        series(&m, "fleet_budget_console_connections_open"),
        1,
        "{m}"
    );
    drop(writer.await);
    c.stop().await;
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The limits' defaults are what docs/console.md says.
#[test]
fn the_documented_defaults_are_the_defaults() {
    assert_eq!(
        LoginLimits::default(),
        LoginLimits {
            failures_per_address: 10,
            logins_per_label: 30,
            window: Duration::from_secs(60)
        }
    );
    let l = NetLimits::default();
    assert_eq!(
        (
            l.header_timeout,
            l.body_timeout,
            l.write_idle_timeout,
            l.max_connections,
            l.max_connections_per_address
        ),
        (
            Duration::from_secs(10),
            Duration::from_secs(10),
            Duration::from_secs(30),
            512,
            64
        )
    );
}
