//! `tune` and `incident report` refusals and hostile Prometheus answers: no Prometheus (exit 2,
//! saying what fleet-budget keeps), a URL that is not http, nothing listening, a server that
//! never answers (the deadline), one that answers junk or an error; never a hang or a panic.

use std::io::{Read as _, Write as _};
use std::net::TcpListener;
use std::time::{Duration, Instant};

use crate::{assert_exit, run};

/// A server on a free port answering every connection with `reply` (after reading the request),
/// or holding it open without a word when `reply` is `None`.
fn server(reply: Option<&'static str>) -> (u16, std::thread::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let handle = std::thread::spawn(move || {
        listener.set_nonblocking(false).unwrap();
        // At most one connection per query `tune` makes before it gives up.
        if let Ok((mut s, _)) = listener.accept() {
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            match reply {
                Some(r) => {
                    let _ = s.write_all(r.as_bytes());
                }
                None => std::thread::sleep(Duration::from_secs(4)),
            }
        }
    });
    (port, handle)
}

#[test]
fn tune_without_prometheus_says_what_the_project_keeps() {
    let o = run(&["tune"]);
    assert_exit(&o, 2, "--prometheus");
    assert_exit(&o, 2, "keeps no history of its own");
    let o = run(&["tune", "--prometheus", "https://u:hunter2@prom:9090"]);
    assert_exit(&o, 2, "https is not supported");
    assert!(!crate::stderr(&o).contains("hunter2"));
    let o = run(&[
        "tune",
        "--prometheus",
        "http://127.0.0.1:9",
        "--since",
        "1h",
        "--step",
        "1s",
        "--until",
        "2h",
    ]);
    assert_exit(&o, 2, "is not before --until");
}

#[test]
fn tune_gives_up_on_a_silent_or_hostile_prometheus() {
    let port = fleet_budget::testing::free_port();
    let o = run(&[
        "tune",
        "--prometheus",
        &format!("http://127.0.0.1:{port}"),
        "--since",
        "1h",
    ]);
    assert_exit(&o, 1, "connect");

    let (port, h) = server(None);
    let started = Instant::now();
    let o = run(&[
        "tune",
        "--prometheus",
        &format!("http://127.0.0.1:{port}"),
        "--since",
        "1h",
        "--timeout",
        "1s",
    ]);
    assert_exit(&o, 1, "no answer within 1s");
    println!("a silent server: gave up after {:?}", started.elapsed());
    h.join().unwrap();

    for (reply, needle) in [
        (
            "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\n<html>",
            "not JSON",
        ),
        (
            "HTTP/1.1 400 Bad Request\r\nContent-Length: 50\r\n\r\n{\"status\":\"error\",\"error\":\"parse error\\u001b[31m\"}",
            "Prometheus answered an error",
        ),
        (
            "HTTP/1.1 503 Unavailable\r\nContent-Length: 0\r\n\r\n",
            "HTTP 503",
        ),
    ] {
        let (port, h) = server(Some(reply));
        let o = run(&[
            "tune",
            "--prometheus",
            &format!("http://127.0.0.1:{port}"),
            "--since",
            "1h",
        ]);
        assert_exit(&o, 1, needle);
        assert!(
            !crate::stderr(&o).contains('\u{1b}'),
            "{}",
            crate::stderr(&o)
        );
        h.join().unwrap();
    }
}

#[test]
fn incident_report_refuses_a_bad_dependency_and_says_what_it_lacks() {
    let o = run(&[
        "incident",
        "report",
        "--dependency",
        "a{b}",
        "--since",
        "1h",
    ]);
    assert_exit(&o, 2, "--dependency");
    // No Redis listening, no Prometheus: the report still prints and says what it lacks.
    let port = fleet_budget::testing::free_port();
    let o = run(&[
        "--redis-url",
        &format!("redis://127.0.0.1:{port}"),
        "incident",
        "report",
        "--dependency",
        "payments",
        "--since",
        "1h",
    ]);
    assert!(o.status.success(), "{}", crate::stderr(&o));
    let text = crate::stdout(&o);
    assert!(
        text.contains("no Prometheus") && text.contains("Redis could not be reached"),
        "{text}"
    );
}
