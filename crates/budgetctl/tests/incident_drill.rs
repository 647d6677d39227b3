//! The incident report of a drill: `budgetctl demo` runs on a Redis of the test's own and the
//! shared RabbitMQ (library workers consume its jobs, a dependency browns out, its dead letters
//! are replayed after recovery), then `budgetctl incident report` for each run's trail accounts
//! for every dead letter — per reason and error class, `dead-lettered = replayed + purged + still
//! waiting`, difference 0 — and agrees with the drill's own figures (its workers' dead-letter
//! decisions, what its replays moved, what it left parked). The HTML report is rendered by
//! headless Chromium, and so is the same report as a page of `budgetctl console`, reached from
//! the dependency's page.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant, UNIX_EPOCH};

use fleet_budget::testing::{RedisServer, free_port};
use fleet_budget_amqp::testing::amqp_url;
use serde_json::Value;

fn budgetctl() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_budgetctl"));
    c.env_remove("FLEET_BUDGET_REDIS_URL")
        .env_remove("FLEET_BUDGET_AMQP_URL")
        .env_remove("FLEET_BUDGET_PROMETHEUS_URL")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null());
    c
}

fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn rfc3339(ms: u64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

fn chromium_dom(url: &str) -> String {
    let o = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--virtual-time-budget=5000",
            "--dump-dom",
        ])
        .arg(url)
        .stdin(Stdio::null())
        .output()
        .expect("Debian's chromium on the PATH");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The figures of a run's trail.
struct Trail {
    label: String,
    key_prefix: String,
    amqp_prefix: String,
    since: String,
    until: String,
    decisions: u64,
    replayed: u64,
    parked: u64,
}

fn trails(demo: &Value) -> Vec<Trail> {
    demo["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|run| {
            let t = &run["trail"];
            assert!(
                t.is_object(),
                "a run on Redis and RabbitMQ leaves a trail: {run}"
            );
            Trail {
                label: run["label"].as_str().unwrap().to_owned(),
                key_prefix: t["key_prefix"].as_str().unwrap().to_owned(),
                amqp_prefix: t["amqp_prefix"].as_str().unwrap().to_owned(),
                since: rfc3339(t["since_ms"].as_u64().unwrap()),
                // To the second, rounded up.
                until: rfc3339(t["until_ms"].as_u64().unwrap() + 1000),
                decisions: t["dead_letter_decisions"].as_u64().unwrap(),
                replayed: run["replayed"].as_u64().unwrap(),
                parked: run["accounting"]["parked"].as_u64().unwrap(),
            }
        })
        .collect()
}

fn config_of(dir: &Path, redis: &RedisServer, t: &Trail) -> std::path::PathBuf {
    let path = dir.join(format!("{}.toml", t.key_prefix));
    std::fs::write(
        &path,
        format!(
            "[redis]\nurl = \"{}\"\nkey_prefix = \"{}\"\n\n[amqp]\nurl = \"{}\"\nprefix = \"{}\"\n",
            redis.url(),
            t.key_prefix,
            amqp_url(),
            t.amqp_prefix
        ),
    )
    .unwrap();
    path
}

/// The accounting lines `incident report` prints on stderr, as (group, dead-lettered,
/// replayed, purged, dead-letter queue, parked, difference).
fn accounting(stderr: &str) -> Vec<(String, [i64; 6])> {
    stderr
        .lines()
        .filter_map(|l| l.strip_prefix("accounting: "))
        .map(|l| {
            let (group, rest) = l.split_once(": dead-lettered ").unwrap();
            let numbers: Vec<i64> = rest
                .split(|c: char| !(c.is_ascii_digit() || c == '-'))
                .filter(|w| !w.is_empty() && *w != "-")
                .map(|w| w.parse().unwrap())
                .collect();
            assert_eq!(numbers.len(), 6, "{l}");
            (
                group.to_owned(),
                [
                    numbers[0], numbers[1], numbers[2], numbers[3], numbers[4], numbers[5],
                ],
            )
        })
        .collect()
}

struct Console(Child);

impl Drop for Console {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_drill_leaves_a_trail_whose_incident_report_accounts_for_every_dead_letter() {
    let redis = RedisServer::start();
    let dir = std::env::temp_dir().join(format!(
        "fb-incident-drill-{}-{}",
        std::process::id(),
        free_port()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let prefix = format!("fbid{}", free_port());
    let demo = budgetctl()
        .args(["--redis-url", &redis.url(), "--amqp-url", &amqp_url()])
        .args(["--key-prefix", &prefix])
        .args(["demo", "--phase-secs", "1.5", "--rate", "120", "--json"])
        .output()
        .unwrap();
    let demo: Value = serde_json::from_str(&ok(&demo)).unwrap();
    assert_eq!(demo["mode"]["budget_store"], "redis", "{}", demo["mode"]);
    assert!(
        demo["mode"]["queue"].to_string().contains("rabbitmq"),
        "the drill ran on RabbitMQ: {}",
        demo["mode"]
    );

    let runs = trails(&demo);
    assert_eq!(runs.len(), 2);
    for t in &runs {
        let config = config_of(&dir, &redis, t);
        let report = |format: &str, output: Option<&Path>| {
            let mut c = budgetctl();
            c.arg("--config").arg(&config).args([
                "incident",
                "report",
                "--dependency",
                "search",
                "--since",
                &t.since,
                "--until",
                &t.until,
                "--format",
                format,
            ]);
            if let Some(o) = output {
                c.arg("--output").arg(o);
            }
            c.output().unwrap()
        };
        let md = report("md", None);
        let text = ok(&md);
        let stderr = String::from_utf8_lossy(&md.stderr).into_owned();
        println!("[{}] {}\n{stderr}", t.label, t.key_prefix);
        let lines = accounting(&stderr);
        let (total_name, total) = lines.last().unwrap();
        assert_eq!(total_name, "total", "{stderr}");
        // Every group, and the whole: dead-lettered = replayed + purged + waiting, 0 apart.
        for (group, n) in &lines {
            assert_eq!(n[0], n[1] + n[2] + n[3] + n[4], "{group}: {stderr}");
            assert_eq!(n[5], 0, "{group} is not accounted for: {stderr}");
        }
        assert!(lines.len() >= 2, "at least one reason: {stderr}");
        // The ledger agrees with what the drill's own workers decided (their counters), and
        // the report's replays and purges with what the drill did.
        assert!(t.decisions > 0, "the brownout dead-lettered jobs");
        assert_eq!(u64::try_from(total[0]).unwrap(), t.decisions, "{stderr}");
        assert_eq!(u64::try_from(total[1]).unwrap(), t.replayed, "{stderr}");
        assert_eq!(u64::try_from(total[2]).unwrap(), t.parked, "{stderr}");
        assert_eq!(
            (total[3], total[4]),
            (0, 0),
            "nothing waits after the drill"
        );
        assert!(
            text.contains("Every dead letter is accounted for"),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "| total |  | {} | {} | {} | 0 | 0 | 0 |",
                total[0], total[1], total[2]
            )),
            "{text}"
        );
        assert!(
            text.contains("| replay | budgetctl demo |"),
            "the drill's replays are in the audit trail: {text}"
        );
        if t.label == "with budget" {
            assert!(
                lines
                    .iter()
                    .any(|(g, n)| g == "budget_exhausted / http_503" && n[0] > 0),
                "{stderr}"
            );
        }

        let html_path = dir.join(format!("{}.html", t.key_prefix));
        ok(&report("html", Some(&html_path)));
        let dom = chromium_dom(&format!("file://{}", html_path.display()));
        assert!(dom.contains("<h1>Incident report: search</h1>"), "{dom}");
        assert!(
            dom.contains(&format!(
                "<td>total</td><td></td><td>{}</td><td>{}</td><td>{}</td><td>0</td><td>0</td><td>0</td>",
                total[0], total[1], total[2]
            )),
            "{dom}"
        );
        assert!(dom.contains("Every dead letter is accounted for"), "{dom}");
    }

    // The same report as a page of the console, reached from the dependency's page.
    let t = &runs[1];
    let config = config_of(&dir, &redis, t);
    let port = free_port();
    let console = Console(
        budgetctl()
            .arg("--config")
            .arg(&config)
            .args([
                "console",
                "--bind",
                &format!("127.0.0.1:{port}"),
                "--no-viewer-token",
            ])
            .env(
                "FLEET_BUDGET_CONSOLE_OPERATOR_TOKEN",
                "op:incident-operator-token-0123",
            )
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    let base = format!("http://127.0.0.1:{port}");
    let started = Instant::now();
    let mut console = console;
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            console.0.try_wait().unwrap().is_none(),
            "the console exited"
        );
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the console did not listen"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let dependency = chromium_dom(&format!("{base}/dependency/search"));
    assert!(
        dependency
            .contains("id=\"incident-report\" href=\"/incident?dependency=search&amp;since=24h\""),
        "{dependency}"
    );
    let url = format!(
        "{base}/incident?dependency=search&since={}&until={}",
        t.since, t.until
    );
    let page = chromium_dom(&url);
    println!("{page}");
    assert!(page.contains("Incident report: search"), "{page}");
    // A console without Prometheus says, in one sentence, what its charts need.
    assert!(
        page.contains(
            "<p id=\"charts-need-prometheus\">The per-minute charts need Prometheus: start the \
             console with <code>--prometheus-url</code>.</p>"
        ) && !page.contains("<figure"),
        "{page}"
    );
    assert!(
        page.contains("Every dead letter is accounted for"),
        "{page}"
    );
    let md = ok(&budgetctl()
        .arg("--config")
        .arg(&config)
        .args([
            "incident",
            "report",
            "--dependency",
            "search",
            "--since",
            &t.since,
            "--until",
            &t.until,
        ])
        .output()
        .unwrap());
    let lines = accounting(&String::from_utf8_lossy(
        &budgetctl()
            .arg("--config")
            .arg(&config)
            .args([
                "incident",
                "report",
                "--dependency",
                "search",
                "--since",
                &t.since,
                "--until",
                &t.until,
            ])
            .output()
            .unwrap()
            .stderr,
    ));
    assert!(md.contains("Every dead letter is accounted for"));
    // The page says what the command says, line by line.
    for (group, n) in &lines {
        let line = format!(
            "{group}: dead-lettered {} = replayed {} + purged {} + dead-letter queue {} + parked {}; difference {}",
            n[0], n[1], n[2], n[3], n[4], n[5]
        );
        assert!(
            page.contains(&format!("<li>{line}</li>")),
            "{line} not in {page}"
        );
    }
    drop(console);
    let _ = std::fs::remove_dir_all(&dir);
    drop(redis);
}
