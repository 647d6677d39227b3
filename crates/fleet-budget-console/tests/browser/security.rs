//! The security matrix in the browser (issue 32): a DNS-rebinding page (Chromium resolving an
//! attacker's name to the console) reads nothing, even from a console open to viewers; a
//! stranger's failed logins from another address leave the operator's browser logging in; the
//! browser's own failures end on the page that says why.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use fleet_budget_console::{ConsoleSettings, RunningConsole, Token, Viewers};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpSocket;

use crate::fleet::{Fleet, fleet, login};
use crate::webdriver::Driver;
use crate::*;

async fn open_console(f: &Fleet) -> RunningConsole {
    let operators = Token::parse_list(&format!("ann:{OPERATOR}"), "operator", "test")
        .unwrap_or_else(|e| panic!("{e}"));
    let mut settings = ConsoleSettings::new(f.config.clone(), operators, Viewers::Open);
    settings.bind = "127.0.0.1:0".parse().unwrap_or_else(|e| panic!("{e}"));
    settings.history_every = Duration::from_secs(1);
    // Refilled over an hour: the counts below do not depend on the machine's speed.
    settings.login_limits.window = Duration::from_secs(3_600);
    fleet_budget_console::start(settings)
        .await
        .unwrap_or_else(|e| panic!("the console: {e}"))
}

/// One raw HTTP/1.1 exchange from `source`: the status and the head.
async fn raw(source: IpAddr, to: SocketAddr, request: String) -> (u16, String) {
    let socket = TcpSocket::new_v4().unwrap_or_else(|e| panic!("{e}"));
    socket
        .bind(SocketAddr::new(source, 0))
        .unwrap_or_else(|e| panic!("{e}"));
    let mut s = socket.connect(to).await.unwrap_or_else(|e| panic!("{e}"));
    s.write_all(request.as_bytes())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut reply = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut reply))
        .await
        .unwrap_or_else(|_| panic!("no answer"))
        .unwrap_or_else(|e| panic!("{e}"));
    let text = String::from_utf8_lossy(&reply).into_owned();
    let head = text.split("\r\n\r\n").next().unwrap_or_default().to_owned();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, head)
}

/// A login with `token` from `source`, through the form's round (its CSRF cookie first).
async fn stranger_login(source: IpAddr, to: SocketAddr, token: &str) -> u16 {
    let (_, head) = raw(
        source,
        to,
        format!("GET /login HTTP/1.1\r\nHost: {to}\r\nConnection: close\r\n\r\n"),
    )
    .await;
    let nonce = head
        .lines()
        .find_map(|l| l.strip_prefix("set-cookie: fbc_login="))
        .and_then(|v| v.split(';').next())
        .unwrap_or_else(|| panic!("no login cookie: {head}"))
        .to_owned();
    let body = format!("token={token}&login_csrf={nonce}");
    raw(
        source,
        to,
        format!(
            "POST /login HTTP/1.1\r\nHost: {to}\r\nConnection: close\r\nCookie: fbc_login={nonce}\r\n\
             Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        ),
    )
    .await
    .0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebinding_page_reads_nothing_and_a_strangers_failures_leave_the_operator_logging_in() {
    let f = fleet("console-security");
    let c = open_console(&f).await;
    let port = c.addr().port();
    let driver = Driver::start().await;
    // The attacker's name resolves to the console (what DNS rebinding achieves).
    let b = driver
        .browser_with(&["--host-resolver-rules=MAP rebind.evil.example 127.0.0.1"])
        .await;

    // By its own address the open console shows the overview to anyone.
    b.goto(&format!("http://127.0.0.1:{port}/")).await;
    b.find("#overview").await;
    // Through the attacker's name: refused, and the page's own script reads nothing either.
    let evil = format!("http://rebind.evil.example:{port}");
    b.goto(&format!("{evil}/")).await;
    let page = b.source().await;
    assert!(
        page.contains("does not answer for that host") && !page.contains("id=\"overview\""),
        "{page}"
    );
    let read = b
        .run_async(
            "const done = arguments[arguments.length - 1];\
             fetch('/api/overview').then(r => r.text().then(t => done(r.status + ' ' + t)))\
             .catch(e => done(String(e)));",
        )
        .await;
    let read = read.as_str().unwrap_or_default();
    assert!(read.starts_with("421 "), "{read}");
    assert!(!read.contains("search"), "{read}");

    // 25 wrong tokens from another address: that address is refused, the operator's browser
    // (127.0.0.1) logs in at once.
    let stranger = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
    let mut statuses = Vec::new();
    for _ in 0..25 {
        statuses.push(stranger_login(stranger, c.addr(), "not-a-token-of-this-console").await);
    }
    assert_eq!(
        statuses.iter().filter(|s| **s == 429).count(),
        15,
        "{statuses:?}"
    );
    let base = format!("http://127.0.0.1:{port}");
    login(&b, &base, OPERATOR).await;
    b.until_text("header .who", Some(&format!("{base}/")), |t| {
        t.contains("ann (operator)")
    })
    .await;

    // The browser's own failures: the 11th says why, on a page with the security headers.
    b.click("header form button").await;
    for _ in 0..10 {
        b.goto(&format!("{base}/login")).await;
        b.type_into("#login input[name=token]", "still-not-a-token-0000")
            .await;
        b.click("#login button").await;
        b.until_text("main", None, |t| t.contains("not one of this console's"))
            .await;
    }
    b.goto(&format!("{base}/login")).await;
    b.type_into("#login input[name=token]", OPERATOR).await;
    b.click("#login button").await;
    let said = b
        .until_text("main", None, |t| t.contains("too many failed logins"))
        .await;
    assert!(said.contains("wait a minute"), "{said}");
    assert_eq!(
        b.run("return document.cookie").await,
        Value::from(""),
        "no session, and the cookies are HttpOnly"
    );
    b.quit().await;
    c.stop().await;
}
