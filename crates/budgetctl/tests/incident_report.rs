//! `budgetctl incident report` on a private `redis-server`: an operator's freeze recorded by
//! `budgetctl budget freeze` (the audit trail), dead letters counted in the dead-letter index as
//! the worker's tally counts them (this dependency's in the range, another dependency's, and this
//! one's from before the range), then the report in Markdown and in HTML, the HTML rendered by
//! headless Chromium: the override with who and why, the dead letters by reason and error class,
//! the others left out, and hostile text shown as text. A replay audited as replays were before
//! they recorded a breakdown by reason and error class shows "breakdown not recorded" (in the
//! report and on the console's page), its count in the total, not zeros.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

#[path = "support/console.rs"]
mod console;

use std::process::{Command, Output, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

use console::Console;
use fleet_budget::FleetBudget;
use fleet_budget::control::AuditEntry;
use fleet_budget::store::RedisStore;
use fleet_budget::testing::{RedisServer, free_port};
use fleet_budget_amqp::WorkerConfig;
use fleet_budget_amqp::dead_letters::{Row, ledger_queue};
use fleet_budget_amqp::topology::Topology;

fn budgetctl(config: &std::path::Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_budgetctl"))
        .env_remove("FLEET_BUDGET_REDIS_URL")
        .env_remove("FLEET_BUDGET_AMQP_URL")
        .env_remove("FLEET_BUDGET_PROMETHEUS_URL")
        .arg("--config")
        .arg(config)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn row(dependency: &str, reason: &str, class: &str, minute: u64) -> String {
    Row {
        dependency: dependency.to_owned(),
        reason: reason.to_owned(),
        error_class: class.to_owned(),
        task: "charge".to_owned(),
        original_exchange: "fbinc.work".to_owned(),
        replays: 0,
        minute,
    }
    .encode()
}

#[test]
fn the_report_shows_who_froze_why_and_the_dead_letters_by_reason_and_renders_in_chromium() {
    let redis = RedisServer::start();
    let dir = std::env::temp_dir().join(format!(
        "fb-incident-{}-{}",
        std::process::id(),
        free_port()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let config_path = dir.join("fleet.toml");
    std::fs::write(
        &config_path,
        format!(
            "[redis]\nurl = \"{}\"\nkey_prefix = \"fb-incident\"\n\n[amqp]\nprefix = \"fbinc\"\n\n\
             [dependencies.payments]\ntasks = [\"charge\"]\nratio = 0.3\n",
            redis.url()
        ),
    )
    .unwrap();

    let freeze = budgetctl(
        &config_path,
        &[
            "budget",
            "freeze",
            "payments",
            "--for",
            "10m",
            "--reason",
            "INC-7: <b>payments</b> down",
            "--actor",
            "alice",
        ],
    );
    assert!(
        freeze.status.success(),
        "{}",
        String::from_utf8_lossy(&freeze.stderr)
    );

    let config = WorkerConfig::from_path(&config_path).unwrap();
    let topology = Topology::new(&config.amqp);
    let now_minute = u64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
        / 60_000;
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let budget = FleetBudget::from_config(&config.budget).await.unwrap();
            let index = budget
                .dead_letter_index()
                .expect("an index on a Redis store");
            index
                .change(
                    &topology.dead_queue,
                    &[
                        (
                            row("payments", "budget_exhausted", "http_503", now_minute),
                            7,
                        ),
                        (row("payments", "budget_frozen", "http_503", now_minute), 3),
                        (row("search", "budget_exhausted", "timeout", now_minute), 5),
                        (
                            row("payments", "non_retryable", "decode", now_minute - 120),
                            11,
                        ),
                    ],
                )
                .await
                .unwrap();
            // A replay of 3 of them, audited as replays were before they recorded `by_group`
            // (0.1's shape: the depths, the selection, the counts).
            let mut old = AuditEntry::new("bob", "replay", Some("payments"), "INC-7 replay");
            old.after = Some(serde_json::json!({
                "work_queue": 0, "dead_letter_queue": 7, "parked_queue": 2,
                "selected": "dependency=payments", "moved": 3, "parked": 0,
                "skipped": 0, "failed": 0
            }));
            config
                .budget
                .audit
                .log()
                .record(
                    &RedisStore::from_settings(&config.budget.redis).unwrap(),
                    &old,
                )
                .await
                .unwrap();
            // What the workers' tally counts in the ledger as the dead letters entered: this
            // dependency's 12 + 3 of the range (2 of the 12 since parked, 3 replayed), the
            // others'.
            index
                .change(
                    &ledger_queue(&topology.dead_queue, now_minute / 60),
                    &[
                        (
                            row("payments", "budget_exhausted", "http_503", now_minute),
                            12,
                        ),
                        (row("payments", "budget_frozen", "http_503", now_minute), 3),
                        (row("search", "budget_exhausted", "timeout", now_minute), 5),
                    ],
                )
                .await
                .unwrap();
            index
                .change(
                    &topology.parked_queue,
                    &[(
                        row("payments", "budget_exhausted", "http_503", now_minute),
                        2,
                    )],
                )
                .await
                .unwrap();
        });

    let md = budgetctl(
        &config_path,
        &[
            "incident",
            "report",
            "--dependency",
            "payments",
            "--since",
            "10m",
        ],
    );
    assert!(
        md.status.success(),
        "{}",
        String::from_utf8_lossy(&md.stderr)
    );
    let md = String::from_utf8(md.stdout).unwrap();
    println!("{md}");
    assert!(
        md.contains("| freeze | alice | INC-7: &lt;b&gt;payments&lt;/b&gt; down |"),
        "{md}"
    );
    assert!(
        md.contains("| dead-letter | budget_exhausted | http_503 | 7 |"),
        "{md}"
    );
    assert!(
        md.contains("| dead-letter | budget_frozen | http_503 | 3 |"),
        "{md}"
    );
    assert!(
        md.contains("| parked | budget_exhausted | http_503 | 2 |"),
        "{md}"
    );
    assert!(
        !md.contains("timeout") && !md.contains("decode"),
        "another dependency's or an older dead letter: {md}"
    );
    // Every dead letter of the range accounted for: the group cannot say where the replayed 3
    // went (the old entry recorded no breakdown), the row of what was not recorded says it,
    // and the total nets them.
    assert!(
        md.contains("| budget_exhausted | http_503 | 12 | 0 | 0 | 7 | 2 | 3 |"),
        "{md}"
    );
    assert!(
        md.contains("| breakdown not recorded |  | 0 | 3 | 0 | 0 | 0 | -3 |"),
        "{md}"
    );
    assert!(
        md.contains("| total |  | 15 | 3 | 0 | 10 | 2 | 0 |"),
        "{md}"
    );
    assert!(
        md.contains("| replay | bob | INC-7 replay | 3 | 0 | 0 | 0 | 0 | breakdown not recorded |"),
        "{md}"
    );
    assert!(md.contains("Every dead letter is accounted for"), "{md}");
    assert!(md.contains("no Prometheus"), "{md}");

    // A Prometheus that does not answer is said in the report, not fatal.
    let unanswered = budgetctl(
        &config_path,
        &[
            "incident",
            "report",
            "--dependency",
            "payments",
            "--since",
            "10m",
            "--prometheus",
            &format!("http://127.0.0.1:{}", free_port()),
            "--timeout",
            "5s",
        ],
    );
    let without = String::from_utf8(unanswered.stdout).unwrap();
    assert!(
        unanswered.status.success(),
        "{}",
        String::from_utf8_lossy(&unanswered.stderr)
    );
    assert!(
        without.contains("Source: Prometheus could not be read:")
            && without.contains("| total |  | 15 | 3 | 0 | 10 | 2 | 0 |"),
        "{without}"
    );

    let html_path = dir.join("report.html");
    let html = budgetctl(
        &config_path,
        &[
            "incident",
            "report",
            "--dependency",
            "payments",
            "--since",
            "10m",
            "--format",
            "html",
            "--output",
            html_path.to_str().unwrap(),
        ],
    );
    assert!(
        html.status.success(),
        "{}",
        String::from_utf8_lossy(&html.stderr)
    );
    let dom = Command::new("chromium")
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--dump-dom"])
        .arg(format!("file://{}", html_path.display()))
        .stdin(Stdio::null())
        .output()
        .expect("Debian's chromium on the PATH");
    let dom = String::from_utf8_lossy(&dom.stdout);
    assert!(dom.contains("<h1>Incident report: payments</h1>"), "{dom}");
    assert!(dom.contains("<td>alice</td>"), "{dom}");
    assert!(
        dom.contains("&lt;b&gt;payments&lt;/b&gt;") && !dom.contains("<b>payments</b>"),
        "the reason is text, not markup: {dom}"
    );
    assert!(
        dom.contains("<td>budget_frozen</td><td>http_503</td><td>3</td>"),
        "{dom}"
    );

    // The console's page says the same.
    let console = Console::start(&config_path, &[]);
    let page = console.get("/incident?dependency=payments&since=10m");
    assert!(
        page.contains("<td>replay</td><td>bob</td><td>INC-7 replay</td><td>3</td><td>0</td><td>0</td><td>0</td><td>0</td><td>breakdown not recorded</td>"),
        "{page}"
    );
    assert!(
        page.contains("<td>breakdown not recorded</td><td></td><td>0</td><td>3</td>"),
        "{page}"
    );
    assert!(
        page.contains("Every dead letter is accounted for"),
        "{page}"
    );
    drop(console);
    let _ = std::fs::remove_dir_all(&dir);
    drop(redis);
}
