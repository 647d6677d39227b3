//! Every metric the documentation names is in the text exposition (issue 31, item 5:
//! `fleet_budget_retries_denied_in_process_total` was documented and built, and never registered,
//! so `/metrics` did not have it).
//!
//! A worker's budget on a real, private `redis-server` goes through every path that sets a
//! series (deposits, grants, denials from Redis and from the deny cache, a policy conflict, a
//! concurrency lease, a hedge, a breaker that opens, then Redis gone and the fallback deciding),
//! and the fleet exporter reads the same Redis. Then the names of the tables in
//! `src/metrics/mod.rs` (the worker's), `src/metrics/fleet.rs` and `src/metrics/exporter.rs` (the
//! exporter's; its alerts, `src/metrics/alerts.rs`, are the guide's), and every `fleet_budget_*` name in the guides (`docs/`, `README.md`,
//! `ARCHITECTURE.md`, `lua/README.md`), must each have a `# TYPE` line in the exposition of the
//! registry that serves it. A labelled family appears only once a series of it is set, which is
//! why the paths are run and not only the registry built.
//!
//! Not checked here: the metrics of the doc tables of `fleet-budget-amqp` (the worker's
//! `fleet_budget_amqp_*`, the exporter's queue gauges): that crate registers them, and this one
//! does not depend on it. A name of the guides found in neither crate's tables must be in this
//! crate's expositions.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use fleet_budget::metrics::{AlertSource, FleetExporter};
use fleet_budget::risks::RedisRiskSource;
use fleet_budget::store::{BudgetStore, Deposits, RedisStore, RedisTarget};
use fleet_budget::testing::RedisServer;
use fleet_budget::{
    Admission, BudgetPolicy, CallOutcome, Config, Dependency, Failure, FleetBudget,
};

/// Crates and modules spelled like metrics in the guides.
const NOT_METRICS: [&str; 5] = [
    "fleet_budget_amqp",
    "fleet_budget_sim",
    "fleet_budget_drill",
    "fleet_budget_console",
    "fleet_budget_e2e",
];

/// The doc tables of `fleet-budget-amqp`, which registers their metrics (relative to this crate).
const OTHER_CRATE_TABLES: [&str; 2] = [
    "../fleet-budget-amqp/src/metrics/mod.rs",
    "../fleet-budget-amqp/src/metrics/queues.rs",
];

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn repo_root() -> PathBuf {
    crate_dir()
        .parent()
        .and_then(Path::parent)
        .expect("crates/fleet-budget is two levels down")
        .to_path_buf()
}

/// The `fleet_budget_*` words of `text`: maximal runs of `[a-z0-9_]` that start with the prefix
/// (and do not continue a longer word).
fn metric_words(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let bytes = text.as_bytes();
    let word = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_';
    let mut at = 0;
    while let Some(i) = text[at..].find("fleet_budget_") {
        let start = at + i;
        let mut end = start;
        while end < bytes.len() && word(bytes[end]) {
            end += 1;
        }
        let continues = start > 0 && (word(bytes[start - 1]) || bytes[start - 1] == b'-');
        if !continues {
            found.insert(text[start..end].trim_end_matches('_').to_owned());
        }
        at = end.max(start + 1);
    }
    found
}

/// The names in the first column of a module's doc table (`//! | \`name\` | type | ...`).
fn table_names(relative: &str) -> BTreeSet<String> {
    let text = std::fs::read_to_string(crate_dir().join(relative)).unwrap();
    let names: BTreeSet<String> = text
        .lines()
        .filter_map(|line| line.trim_start().strip_prefix("//! | `"))
        .filter_map(|rest| rest.split('`').next())
        .filter(|name| name.starts_with("fleet_budget_"))
        .map(str::to_owned)
        .collect();
    assert!(
        names.len() >= 2,
        "{relative}: a table of metrics: {names:?}"
    );
    names
}

/// Every `fleet_budget_*` metric name in the guides, a histogram's series under its family,
/// except those of the other crate's tables.
fn documented_names() -> BTreeSet<String> {
    let other_crate: BTreeSet<String> = OTHER_CRATE_TABLES
        .iter()
        .flat_map(|table| table_names(table))
        .collect();
    let root = repo_root();
    let mut files = vec![
        root.join("README.md"),
        root.join("ARCHITECTURE.md"),
        root.join("lua/README.md"),
    ];
    let mut dirs = vec![root.join("docs")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                files.push(path);
            }
        }
    }
    let mut names = BTreeSet::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for name in metric_words(&text) {
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(&name);
            // The console's own metrics (its `/metrics`) are checked by the console's tests
            // (crates/fleet-budget-console/tests/security.rs), which serve them.
            let console = family.starts_with("fleet_budget_console_");
            if !NOT_METRICS.contains(&family) && !other_crate.contains(family) && !console {
                names.insert(family.to_owned());
            }
        }
    }
    assert!(names.len() > 20, "the guides name metrics: {names:?}");
    names
}

/// The families of a text exposition, by their `# TYPE` lines.
fn families(exposition: &str) -> BTreeSet<String> {
    exposition
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

fn config(url: &str) -> Config {
    let text = format!(
        "[redis]\nurl = \"{url}\"\ntimeout_ms = 2000\nkey_prefix = \"fbt\"\ndeposit_flush_ms = 0\n\
         deny_cache_ms = 5000\nheartbeat_ms = 0\n\
         [dependencies.search]\ntasks = [\"index\"]\nratio = 0.5\nmin_allowance = 1\n\
         [dependencies.search.concurrency]\ncap = 4\nplanned_primary = 2\nmin_retry_slots = 1\n\
         max_retry_fraction = 0.5\n\
         [dependencies.search.breaker]\nmin_volume = 2\nfailure_ratio = 0.5\nopen_secs = 600\n\
         half_open_probes = 1\nclose_after = 1\nmax_wait_secs = 600\n\
         [dependencies.mail]\ntasks = [\"send\"]\n\
         [dependencies.watched]\ntasks = [\"watch\"]\nmin_allowance = 0\nenforcement = \"shadow\"\n"
    );
    Config::from_toml(&text, "test").unwrap()
}

async fn fail(budget: &FleetBudget) {
    let _ = budget
        .on_failure("index", 1, &Failure::retryable("503"))
        .await
        .unwrap();
}

/// The worker's exposition after every path that sets a series, and the exporter's.
async fn expositions() -> (String, String) {
    let server = RedisServer::start();
    let config = config(&server.url());
    let search = Dependency::new("search").unwrap();
    let store: Arc<dyn BudgetStore> = Arc::new(
        RedisStore::new(
            RedisTarget::Single(server.url()),
            "fbt",
            Duration::from_secs(5),
        )
        .unwrap(),
    );
    // Another policy in force first: the worker's calls are conflicts.
    let other = BudgetPolicy {
        ratio: 0.9,
        ..config.policy(&search)
    };
    store
        .deposit(&search, &other, Deposits::default())
        .await
        .unwrap();
    let budget = FleetBudget::from_config(&config).await.unwrap();
    budget.on_attempt("index", 1).await.unwrap();
    budget.on_success("index").await.unwrap();
    let Admission::Run(call) = budget.admit("index", 1, None).await.unwrap() else {
        panic!("a first attempt runs");
    };
    budget.finish(call, CallOutcome::Succeeded).await;
    // The floor's retry, a denial from Redis, one from the deny cache; a hedge refused.
    for _ in 0..3 {
        fail(&budget).await;
    }
    assert!(budget.try_hedge("index").await.unwrap().is_none());
    // A dependency in shadow: its refusal retried anyway (fleet_budget_retries_would_deny_total).
    let shadowed = budget
        .on_failure("watch", 1, &Failure::retryable("503"))
        .await
        .unwrap();
    assert!(shadowed.shadow_denied().is_some(), "{shadowed:?}");
    // Two failed calls open the breaker (min_volume 2, failure_ratio 0.5).
    for _ in 0..2 {
        if let Admission::Run(call) = budget.admit("index", 1, None).await.unwrap() {
            budget.finish(call, CallOutcome::Failed).await;
        }
    }
    budget.flush().await.unwrap();
    let exporter = FleetExporter::new(Arc::clone(&store), &config).unwrap();
    // The Redis risks `budgetctl exporter` adds (`fleet_budget_redis_risk`).
    let risks = RedisRiskSource::register(
        Arc::new(
            RedisStore::new(
                RedisTarget::Single(server.url()),
                "fbt",
                Duration::from_secs(5),
            )
            .unwrap(),
        ),
        exporter.registry(),
    )
    .unwrap();
    let exporter = exporter.source(Box::new(risks));
    // The read model's alerts `budgetctl exporter` adds (`fleet_budget_alert`): index's breaker
    // is open.
    let fbt_store = || {
        Arc::new(
            RedisStore::new(
                RedisTarget::Single(server.url()),
                "fbt",
                Duration::from_secs(5),
            )
            .unwrap(),
        )
    };
    let alerts = AlertSource::register(
        fbt_store(),
        config.clone(),
        Arc::default(),
        100,
        exporter.registry(),
    )
    .unwrap();
    let exporter = exporter.source(Box::new(alerts));
    // The overrides keeper `budgetctl exporter` runs beside (`fleet_budget::control::keeper`).
    let keeper = fleet_budget::control::Keeper::new(fbt_store(), &config, "exporter").unwrap();
    keeper.register(exporter.registry()).unwrap();
    keeper.pass().await.unwrap();
    let exported = exporter.scrape().await;
    // Redis gone: store errors, and the fallback decides (for `mail`: a denial of `search`
    // still stands in the process, without a call).
    drop(server);
    let _ = budget
        .on_failure("send", 1, &Failure::retryable("503"))
        .await
        .unwrap();
    let metrics = budget.metrics();
    assert!(
        metrics.counter("retries_denied_in_process", "search") >= 1,
        "the deny cache answered (the third failure, and the hedge's retry)"
    );
    (metrics.render(), exported)
}

#[tokio::test]
async fn every_documented_metric_is_in_the_exposition() {
    let (worker, exported) = expositions().await;
    let (worker, exported) = (families(&worker), families(&exported));
    let mut missing = Vec::new();
    for name in table_names("src/metrics/mod.rs") {
        if !worker.contains(&name) {
            missing.push(format!(
                "{name} (src/metrics/mod.rs: the worker's /metrics)"
            ));
        }
    }
    for relative in ["src/metrics/fleet.rs", "src/metrics/exporter.rs"] {
        for name in table_names(relative) {
            if !exported.contains(&name) {
                missing.push(format!("{name} ({relative}: the exporter's /metrics)"));
            }
        }
    }
    for name in documented_names() {
        if !worker.contains(&name) && !exported.contains(&name) {
            missing.push(format!("{name} (named in the guides)"));
        }
    }
    assert!(
        missing.is_empty(),
        "documented, not in any exposition:\n  {}\nworker: {worker:?}\nexporter: {exported:?}",
        missing.join("\n  ")
    );
}

#[test]
fn metric_words_are_whole_words_and_histogram_series_are_their_family() {
    let words = metric_words(
        "`fleet_budget_retries_denied_total`, fleet_budget_amqp::x, my_fleet_budget_x, \
         fleet_budget_store_call_duration_seconds_bucket{op=\"spend\"}",
    );
    assert_eq!(
        words.into_iter().collect::<Vec<_>>(),
        [
            "fleet_budget_amqp",
            "fleet_budget_retries_denied_total",
            "fleet_budget_store_call_duration_seconds_bucket"
        ]
    );
}
