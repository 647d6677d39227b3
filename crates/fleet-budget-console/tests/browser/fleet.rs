//! The test's own fleet: a Redis and a topology of its own, the console on them, and what an
//! operator does from outside the browser (logging in, posting from a page, `budgetctl`).

use std::time::Duration;

use fleet_budget::Dependency;
use fleet_budget::control::fleet_status;
use fleet_budget::store::{RedisStore, RedisTarget};
use fleet_budget::testing::RedisServer;
use fleet_budget_amqp::WorkerConfig;
use fleet_budget_amqp::testing::{TestBroker, unique_prefix};
use fleet_budget_console::{ConsoleSettings, RunningConsole, Token, Viewers};
use serde_json::Value;

use crate::webdriver::Browser;

use crate::*;

pub(crate) struct Fleet {
    pub(crate) _redis: RedisServer,
    pub(crate) broker: TestBroker,
    pub(crate) config: WorkerConfig,
    /// The configuration's text, for the `budgetctl` binary.
    pub(crate) toml: String,
}

pub(crate) fn fleet(name: &str) -> Fleet {
    fleet_with(name, "")
}

/// A fleet whose configuration ends with `more` (TOML).
///
/// `timeout_ms` is 10 s, a deadline for a hang: the scenarios need their decisions taken by
/// Redis, and with 2 s a loaded machine (clean-clone run 9 of session 9, four test lanes and a
/// RabbitMQ cluster starting) sent the brownout's decisions to the fallback, so Redis, and the
/// page, never saw them.
pub(crate) fn fleet_with(name: &str, more: &str) -> Fleet {
    let redis = RedisServer::start();
    let broker = TestBroker::new(name);
    let toml = format!(
        "[redis]\nurl = \"{}\"\nkey_prefix = \"{}\"\ntimeout_ms = 10000\n\
         [dependencies.search]\ntasks = [\"index\"]\nratio = 0.1\nmin_allowance = 2\n\
         [dependencies.mail]\ntasks = [\"send\"]\n\
         [amqp]\nurl = \"{}\"\nprefix = \"{}\"\n{more}",
        redis.url(),
        unique_prefix("fbc"),
        broker.url,
        broker.settings.prefix
    );
    let config = WorkerConfig::from_toml(&toml, "browser test")
        .unwrap_or_else(|e| panic!("the test's configuration: {e}"));
    Fleet {
        _redis: redis,
        broker,
        config,
        toml,
    }
}

/// A worker whose Redis user may write the worker registry and nothing else: every budget it
/// asks fails for it (NOPERM), so it decides from its fallback, and reports so every 200 ms.
pub(crate) async fn cut_off_from_budgets(f: &Fleet) -> FleetBudget {
    let prefix = f.config.budget.redis.key_prefix.clone();
    let _: String = f._redis.cmd(&[
        "ACL",
        "SETUSER",
        "cut-off",
        "on",
        ">pw",
        "resetkeys",
        &format!("~{prefix}:v1:workers:*"),
        "+@all",
    ]);
    let mut config = f.config.budget.clone();
    config.redis.url = config
        .redis
        .url
        .replacen("redis://", "redis://cut-off:pw@", 1);
    config.redis.heartbeat = Duration::from_millis(200);
    FleetBudget::from_config(&config)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

pub(crate) async fn console(config: &WorkerConfig) -> RunningConsole {
    let operators = Token::parse_list(&format!("ann:{OPERATOR}"), "operator", "test")
        .unwrap_or_else(|e| panic!("{e}"));
    let viewers = Token::parse_list(&format!("vic:{VIEWER}"), "viewer", "test")
        .unwrap_or_else(|e| panic!("{e}"));
    let mut settings = ConsoleSettings::new(config.clone(), operators, Viewers::Tokens(viewers));
    settings.bind = "127.0.0.1:0".parse().unwrap_or_else(|e| panic!("{e}"));
    settings.dead_letter_refresh = Duration::from_secs(1);
    settings.history_every = Duration::from_secs(1);
    settings.actions_per_minute = 1_000;
    fleet_budget_console::start(settings)
        .await
        .unwrap_or_else(|e| panic!("the console: {e}"))
}

pub(crate) fn store(config: &WorkerConfig) -> RedisStore {
    let r = &config.budget.redis;
    RedisStore::new_with_tls(
        RedisTarget::from_settings(r),
        &r.key_prefix,
        Duration::from_secs(2),
        &r.tls,
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

pub(crate) async fn login(b: &Browser, base: &str, token: &str) {
    b.goto(&format!("{base}/login")).await;
    b.type_into("#login input[name=token]", token).await;
    b.click("#login button").await;
    b.until_text("header .who", None, |t| {
        t.contains("Log out") || t.contains("(")
    })
    .await;
}

/// POSTs a form from the page with `fetch` (the session cookie goes along, as a forged form's
/// would); returns the HTTP status.
pub(crate) async fn post_from_page(b: &Browser, path: &str, body: &str) -> u64 {
    let script = format!(
        "const done = arguments[arguments.length - 1];\
         fetch({path:?}, {{method: 'POST', credentials: 'same-origin', redirect: 'manual', \
           headers: {{'Content-Type': 'application/x-www-form-urlencoded'}}, body: {body:?}}})\
         .then(r => done(r.status)).catch(e => done(String(e)));"
    );
    b.run_async(&script)
        .await
        .as_u64()
        .unwrap_or_else(|| panic!("fetch {path} failed"))
}

/// The `budgetctl` binary of this build: beside this test's executable (`target/debug/deps/..`
/// → `target/debug/budgetctl`). `scripts/test` builds every target of the workspace before it
/// runs a test; alone, build it first (`cargo build -p budgetctl`).
pub(crate) fn budgetctl() -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("this test's executable: {e}"));
    let bin = exe
        .parent()
        .and_then(std::path::Path::parent)
        .map(|dir| dir.join(format!("budgetctl{}", std::env::consts::EXE_SUFFIX)))
        .unwrap_or_else(|| panic!("no target directory above {}", exe.display()));
    assert!(
        bin.is_file(),
        "{} is not built: this test runs the real `budgetctl status --json`; build it with \
         `cargo build -p budgetctl` (scripts/test builds every target before the tests)",
        bin.display()
    );
    bin
}

/// What the real `budgetctl status --dependency search --json` says of search's freeze:
/// `actor (reason)`, or `None`.
pub(crate) async fn status_freeze(f: &Fleet) -> Option<String> {
    let file = std::env::temp_dir().join(format!("{}.toml", unique_prefix("fbc-status")));
    std::fs::write(&file, &f.toml).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let (bin, path) = (budgetctl(), file.clone());
    let run = tokio::task::spawn_blocking(move || {
        std::process::Command::new(&bin)
            .arg("--config")
            .arg(&path)
            .args(["status", "--dependency", "search", "--json"])
            .output()
    });
    let out = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .unwrap_or_else(|_| panic!("budgetctl status did not end within 60 s"))
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|e| panic!("budgetctl status: {e}"));
    let _ = std::fs::remove_file(&file);
    assert!(
        out.status.success(),
        "budgetctl status: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let json: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("budgetctl status --json: {e}"));
    let row = &json["dependencies"][0];
    assert_eq!(row["dependency"], "search", "{json}");
    let freeze = &row["overrides"]["freeze"];
    (!freeze.is_null()).then(|| {
        format!(
            "{} ({})",
            freeze["actor"].as_str().unwrap_or_default(),
            freeze["reason"].as_str().unwrap_or_default()
        )
    })
}

pub(crate) async fn freeze_of(config: &WorkerConfig) -> Option<String> {
    let search = Dependency::new("search").unwrap_or_else(|e| panic!("{e}"));
    let status = fleet_status(&store(config), &search, &config.budget.policy(&search))
        .await
        .unwrap_or_else(|e| panic!("status: {e}"));
    status
        .overrides
        .freeze
        .map(|f| format!("{} ({})", f.actor, f.reason))
}

/// Indexes the dead letters seeded by hand (as `budgetctl migrate` does for dead letters older
/// than the index), so that the console's counts of them are exact.
pub(crate) async fn reindex(f: &Fleet) {
    let index = fleet_budget::control::DeadLetterIndex::new(std::sync::Arc::new(store(&f.config)));
    fleet_budget_amqp::Replayer::new(f.broker.url.clone(), f.broker.topology.clone(), None)
        .with_index(Some(index))
        .reindex()
        .await
        .unwrap_or_else(|e| panic!("reindex: {e}"));
}
