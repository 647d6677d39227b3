//! What the console's test binaries share: a plain `GET` over a new connection, the cookie,
//! CSRF token and `Location` read from an answer, and the suite's JSON Schema validator (`crates/budgetctl/tests/cli/validate_json.py`, Python
//! `jsonschema`: `FLEET_BUDGET_PYTHON`, else the repository's `.venv`, else `python3`).
//!
//! Each test binary compiles this module on its own and uses part of it.
#![allow(
    dead_code,
    clippy::unwrap_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::path::{Path, PathBuf};
use std::process::Stdio;

use fleet_budget::store::{RedisStore, RedisTarget};
use fleet_budget::testing::RedisServer;
use fleet_budget_amqp::WorkerConfig;
use fleet_budget_amqp::testing::{TestBroker, unique_prefix};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The `budgetctl` binary of this build, beside this test's executable (build it first:
/// `cargo build -p budgetctl`; `scripts/test` builds every target).
pub(crate) fn budgetctl() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .map(|dir| dir.join(format!("budgetctl{}", std::env::consts::EXE_SUFFIX)))
        .unwrap();
    assert!(
        bin.is_file(),
        "{} is not built: `cargo build -p budgetctl` first",
        bin.display()
    );
    bin
}

/// `GET path` over a new connection: status and body.
pub(crate) async fn get(addr: &str, path: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let split = out.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&out[..split]).into_owned();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (
        status,
        String::from_utf8_lossy(&out[split + 4..]).into_owned(),
    )
}

/// The validator's verdict on `documents`, each held to `docs/schemas/console/<schema>.schema.json`,
/// and on that schema itself: `{"documents": [[errors of each]], "schemas": {schema: [errors]}}`.
pub(crate) fn validate(schema: &str, documents: &[&Value]) -> Value {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let request = json!({
        "schemas": root.join("docs/schemas/console"),
        "documents": documents.iter().map(|d| json!([schema, d])).collect::<Vec<_>>(),
        "check_schemas": [schema],
    });
    let python = std::env::var_os("FLEET_BUDGET_PYTHON").map_or_else(
        || {
            let venv = root.join(".venv/bin/python");
            if venv.exists() {
                venv
            } else {
                PathBuf::from("python3")
            }
        },
        PathBuf::from,
    );
    let mut child = std::process::Command::new(&python)
        .args([
            "-c",
            include_str!("../../../budgetctl/tests/cli/validate_json.py"),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{} with jsonschema: {e}", python.display()));
    std::io::Write::write_all(
        &mut child.stdin.take().unwrap(),
        request.to_string().as_bytes(),
    )
    .unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// The value of cookie `name` the response head `head` sets.
pub(crate) fn set_cookie(head: &str, name: &str) -> String {
    head.lines()
        .filter(|l| l.to_ascii_lowercase().starts_with("set-cookie:"))
        .find_map(|l| {
            let v = l.split_once(':').unwrap().1.trim();
            v.strip_prefix(&format!("{name}="))
                .map(|rest| rest.split(';').next().unwrap().to_owned())
        })
        .unwrap_or_else(|| panic!("no cookie {name} in {head}"))
}

/// The CSRF token of an operator's form in `page`.
pub(crate) fn csrf_of(page: &str) -> String {
    let at = page
        .find("name=\"csrf\" value=\"")
        .unwrap_or_else(|| panic!("no CSRF token in the page"));
    let rest = &page[at + "name=\"csrf\" value=\"".len()..];
    rest[..rest.find('"').unwrap()].to_owned()
}

/// The `Location` of a response head (empty without one).
pub(crate) fn location(head: &str) -> String {
    head.lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .starts_with("location:")
                .then(|| l.split_once(':').unwrap().1.trim().to_owned())
        })
        .unwrap_or_default()
}

/// A configuration of two dependencies (`search`: task `index`, `mail`: task `send`) on
/// `redis` under a new key prefix starting `key_prefix`, and `broker`'s topology; and a store on
/// it with a 10 s deadline (what a test writes with, not what it measures).
pub(crate) fn search_and_mail(
    redis: &RedisServer,
    broker: &TestBroker,
    key_prefix: &str,
) -> (WorkerConfig, RedisStore) {
    let toml = format!(
        "[redis]\nurl = \"{}\"\nkey_prefix = \"{}\"\ntimeout_ms = 10000\n\
         [dependencies.search]\ntasks = [\"index\"]\n\
         [dependencies.mail]\ntasks = [\"send\"]\n\
         [amqp]\nurl = \"{}\"\nprefix = \"{}\"\n",
        redis.url(),
        unique_prefix(key_prefix),
        broker.url,
        broker.settings.prefix
    );
    let config = WorkerConfig::from_toml(&toml, "the test's configuration").unwrap();
    let r = &config.budget.redis;
    let store = RedisStore::new_with_tls(
        RedisTarget::from_settings(r),
        &r.key_prefix,
        std::time::Duration::from_secs(10),
        &r.tls,
    )
    .unwrap();
    (config, store)
}
