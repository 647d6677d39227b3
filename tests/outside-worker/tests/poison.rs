//! The worker built from the packaged crates survives jobs whose headers nest 200 and 18,000
//! levels: the process keeps running, the jobs after them are handled, and both end
//! dead-lettered with why. Run by scripts/test-as-user (RabbitMQ on FLEET_BUDGET_AMQP_URL, Redis
//! on FLEET_BUDGET_REDIS_URL).

use std::process::Stdio;
use std::time::{Duration, Instant};

use fleet_budget_amqp::headers;
use fleet_budget_amqp::testing::TestBroker;
use fleet_budget_amqp::testing::raw::{long, nested_table, publish_raw};
use tokio::io::{AsyncBufReadExt, BufReader};

const LONG: Duration = Duration::from_secs(60);

#[tokio::test]
async fn a_worker_from_the_packages_survives_headers_nested_200_and_18000_deep() {
    let broker = TestBroker::new("outside");
    let redis =
        std::env::var("FLEET_BUDGET_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let config = format!(
        "[redis]\nurl = \"{redis}\"\nkey_prefix = \"{prefix}\"\n\
         [amqp]\nurl = \"{url}\"\nprefix = \"{prefix}\"\n\
         [dependencies.api]\ntasks = [\"t\"]\n",
        url = fleet_budget_amqp::testing::amqp_url(),
        prefix = broker.settings.prefix,
    );
    let path = std::env::temp_dir().join(format!("{}.toml", broker.settings.prefix));
    broker.migrate().await;
    std::fs::write(&path, config).unwrap();
    let mut worker = tokio::process::Command::new(env!("CARGO_BIN_EXE_outside-worker"))
        .arg(&path)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(worker.stdout.take().unwrap()).lines();
    let work = broker.topology.work_queue.clone();
    publish_raw(&broker.url, &work, "nested-200", &nested_table(200)).await;
    publish_raw(&broker.url, &work, "nested-18000", &nested_table(18_000)).await;
    for i in 0..5 {
        publish_raw(&broker.url, &work, &format!("after-{i}"), &long(&[])).await;
    }
    let mut handled = Vec::new();
    while handled.len() < 5 {
        let line = tokio::time::timeout(LONG, lines.next_line())
            .await
            .expect("the worker handles the jobs after the poison")
            .unwrap()
            .expect("the worker is still running");
        if let Some(id) = line.strip_prefix("handled ") {
            handled.push(id.to_owned());
        }
    }
    handled.sort();
    assert_eq!(handled, ["after-0", "after-1", "after-2", "after-3", "after-4"]);
    assert!(worker.try_wait().unwrap().is_none(), "the worker is still running");
    let started = Instant::now();
    while broker.depth(&broker.topology.dead_queue).await < 2 {
        assert!(started.elapsed() < LONG, "the poison jobs were not dead-lettered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let dead = broker.drain(&broker.topology.dead_queue).await;
    assert_eq!(dead.len(), 2, "both poison jobs dead-lettered");
    for (props, body) in &dead {
        let h = headers::table(props);
        let error = headers::get_str(&h, headers::ERROR).unwrap().unwrap_or_default();
        let id = headers::message_id(props).unwrap_or_default().to_owned();
        eprintln!("{id}: {error}");
        assert!(error.contains("nested") && error.contains("levels deep"), "{id}: {error}");
        assert_eq!(body.as_slice(), b"job", "{id}: the body is kept");
    }
    // SIGTERM: a clean stop.
    let pid = worker.id().unwrap();
    std::process::Command::new("kill").arg(pid.to_string()).status().unwrap();
    let status = tokio::time::timeout(LONG, worker.wait()).await.unwrap().unwrap();
    assert!(status.success(), "{status:?}");
    let _ = std::fs::remove_file(&path);
}
