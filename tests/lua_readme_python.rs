//! The Python snippet of `lua/README.md`, run as it stands against a redis-server of the test's
//! own: it records a success and spends a retry through the shipped scripts, and the Rust library
//! then sees that budget, under the same script SHA1s. Another language sharing the budget is the
//! point of `lua/`; this is the check that the documented way to do it works.
//!
//! Needs Python 3.11 with the `redis` package: `FLEET_BUDGET_PYTHON` names the interpreter, else
//! `.venv/bin/python` at the repository's root (scripts/test makes it). Without one the test
//! fails and says so: it is never skipped.
#![allow(clippy::expect_used, clippy::panic, clippy::unwrap_used, missing_docs)]

mod common;

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use fleet_budget::store::{BudgetStore, DEPOSIT_SCRIPT, RedisStore, RedisTarget, SPEND_SCRIPT};
use fleet_budget::testing::RedisServer;
use fleet_budget::{BudgetPolicy, Dependency};

/// Names the Python interpreter to use.
const PYTHON: &str = "FLEET_BUDGET_PYTHON";

/// Runs the snippet read from stdin as `__main__` would run it, then prints what it decided.
const DRIVER: &str = "import json, sys\n\
    namespace = {'__name__': '__main__'}\n\
    exec(compile(sys.stdin.read(), 'lua/README.md', 'exec'), namespace)\n\
    print(json.dumps([namespace['granted'], namespace['allowance']]))\n";

fn python() -> PathBuf {
    let python = std::env::var_os(PYTHON).map_or_else(
        || common::repo_root().join(".venv/bin/python"),
        PathBuf::from,
    );
    let works = Command::new(&python)
        .args([
            "-c",
            "import sys, redis; assert sys.version_info >= (3, 11)",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        works,
        "no Python 3.11 with the `redis` package at {}: run scripts/test (it makes .venv), or set \
         {PYTHON} to such an interpreter",
        python.display()
    );
    python
}

/// The first ```python block of `lua/README.md`.
fn snippet() -> String {
    let readme = common::read("lua/README.md");
    let start = readme
        .find("```python\n")
        .expect("lua/README.md has a ```python block")
        + "```python\n".len();
    let len = readme[start..]
        .find("```")
        .expect("the ```python block is closed");
    readme[start..start + len].to_owned()
}

#[tokio::test]
async fn the_readme_python_snippet_shares_the_budget_with_rust() {
    let python = python();
    let server = RedisServer::start();
    let mut child = Command::new(&python)
        .args(["-c", DRIVER])
        .current_dir(common::repo_root())
        .env("REDIS_URL", server.url())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("run {}: {e}", python.display()));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(snippet().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the snippet failed: {}\n{stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    // One success on an empty budget: allowance max(10, floor(0.2 × 1)) = 10, the retry granted.
    assert_eq!(stdout.trim(), "[1, 10]", "granted and allowance");

    // Python loaded the very scripts the Rust library sends.
    let loaded: Vec<i64> = server.cmd(&[
        "SCRIPT",
        "EXISTS",
        SPEND_SCRIPT.get_hash(),
        DEPOSIT_SCRIPT.get_hash(),
    ]);
    assert_eq!(
        loaded,
        vec![1, 1],
        "the snippet's scripts have the library's SHA1s"
    );

    // The library reads the budget the snippet wrote (default prefix, same policy).
    let store = RedisStore::new(
        RedisTarget::Single(server.url()),
        "fb",
        Duration::from_secs(5),
    )
    .unwrap();
    let policy = BudgetPolicy::default();
    let seen = store
        .status(&Dependency::new("search").unwrap(), &policy)
        .await
        .unwrap();
    // A window boundary may fall between the snippet and this read: count both windows.
    let both = |f: fn(&fleet_budget::WindowCounters) -> u64| f(&seen.current) + f(&seen.previous);
    assert_eq!(both(|w| w.successes), 1, "{seen:?}");
    assert_eq!(both(|w| w.retries), 1, "{seen:?}");
    assert_eq!(both(|w| w.denied), 0, "{seen:?}");
    assert_eq!(seen.allowance, 10, "{seen:?}");
}
