//! The real `budgetctl console` process as an operator drives it over HTTP: started and waited
//! for, logged in to, read and posted to with the session's cookie, and its replays' answers
//! (`/api/replay/ID`) awaited and held to `docs/schemas/console/replay.schema.json`.
//!
//! For the test binaries that start the console as a process (`restart.rs`, `replay_alarm.rs`);
//! each includes it beside `support` and `browser/webdriver.rs`, whose `http` it uses.
#![allow(dead_code, clippy::unwrap_used, clippy::panic)]

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::process::{Child, Command};

use crate::support::{budgetctl, set_cookie, validate};
use crate::webdriver::http;

/// Starts `budgetctl --config CONFIG console --bind ADDR --no-viewer-token
/// --operator-token-file TOKENS` with `extra` arguments, its log to `stderr`; waits until it
/// answers (a hang check).
pub(crate) async fn start_console(
    config: &Path,
    tokens: &Path,
    addr: &str,
    extra: &[&str],
    stderr: Stdio,
) -> Child {
    let child = Command::new(budgetctl())
        .arg("--config")
        .arg(config)
        .args(["console", "--bind", addr, "--no-viewer-token"])
        .arg("--operator-token-file")
        .arg(tokens)
        .args(extra)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(stderr)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let started = Instant::now();
    loop {
        let answered =
            tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect(addr))
                .await;
        if matches!(answered, Ok(Ok(_))) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the console never listened"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("console up in {:?}", started.elapsed());
    child
}

/// Logs in with `token`; the session cookie (`fbc_session=...`).
pub(crate) async fn login(addr: &str, token: &str) -> String {
    let (_, head, _) = http(addr, "GET", "/login", &[], None).await;
    let nonce = set_cookie(&head, "fbc_login");
    let form = format!("token={token}&login_csrf={nonce}");
    let (status, head, _) = http(
        addr,
        "POST",
        "/login",
        &[("Cookie", &format!("fbc_login={nonce}"))],
        Some(("application/x-www-form-urlencoded", form.as_bytes())),
    )
    .await;
    assert_eq!(status, 303, "{head}");
    format!("fbc_session={}", set_cookie(&head, "fbc_session"))
}

/// `GET path` with the session `cookie`: status, head and body.
pub(crate) async fn get(addr: &str, cookie: &str, path: &str) -> (u16, String, String) {
    let (status, head, body) = http(addr, "GET", path, &[("Cookie", cookie)], None).await;
    (status, head, String::from_utf8_lossy(&body).into_owned())
}

/// `POST path` of the form `form` with the session `cookie`: status, head and body.
pub(crate) async fn post(
    addr: &str,
    cookie: &str,
    path: &str,
    form: &str,
) -> (u16, String, String) {
    let (status, head, body) = http(
        addr,
        "POST",
        path,
        &[("Cookie", cookie)],
        Some(("application/x-www-form-urlencoded", form.as_bytes())),
    )
    .await;
    (status, head, String::from_utf8_lossy(&body).into_owned())
}

/// `job`, an answer of `/api/replay/ID`, held to `docs/schemas/console/replay.schema.json` by
/// the suite's validator (`crates/budgetctl/tests/cli/validate_json.py`, Python `jsonschema`:
/// `FLEET_BUDGET_PYTHON`, else the repository's `.venv`, else `python3`); the schema too.
pub(crate) fn hold_to_schema(job: &Value) {
    let verdict = validate("replay", &[job]);
    assert_eq!(
        verdict["schemas"]["replay"],
        serde_json::json!([]),
        "{verdict}"
    );
    assert_eq!(
        verdict["documents"],
        serde_json::json!([[]]),
        "/api/replay does not match docs/schemas/console/replay.schema.json: {verdict}\n{job}"
    );
}

/// `/api/replay/ID` once: a 200, held to its schema.
pub(crate) async fn job(addr: &str, cookie: &str, id: &str) -> Value {
    let (status, _, body) = get(addr, cookie, &format!("/api/replay/{id}")).await;
    assert_eq!(status, 200, "{body}");
    let job: Value = serde_json::from_str(&body).unwrap();
    hold_to_schema(&job);
    job
}

/// GETs `/api/replay/ID` until `done` holds for its JSON (a hang check; an answer other than
/// 200, as from a console starting again, is waited past); every answer read held to its schema.
pub(crate) async fn job_until(
    addr: &str,
    cookie: &str,
    id: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let started = Instant::now();
    loop {
        let (status, _, body) = get(addr, cookie, &format!("/api/replay/{id}")).await;
        if status == 200 {
            let job: Value = serde_json::from_str(&body).unwrap();
            hold_to_schema(&job);
            if done(&job) {
                return job;
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(180),
            "job {id} never showed what was awaited: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
