//! What both game days (`tests/game_day.rs`, `tests/broker_game_day.rs`) do around their faults:
//! the fleet's folder and worker processes, publishing until confirmed, waiting for the fleet
//! to settle, the operator's replay rounds and the sweep of what the queues still hold.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use fleet_budget::FleetBudget;
use fleet_budget_amqp::testing::TestBroker;
use fleet_budget_amqp::{
    ConnectionConfig, Publisher, ReplayOptions, ReplayReport, Replayer, Topology, WorkerConfig,
    headers, queue_depths,
};
use lapin::BasicProperties;
use lapin::types::ShortString;
use tokio::task::JoinHandle;

use super::fleet::{Launch, WorkerProcess};
use super::upstream::now_ms;

/// The task of the jobs that call the browning-out dependency `search`.
pub(crate) const SEARCH_TASK: &str = "index_document";
/// Unacknowledged deliveries per worker.
pub(crate) const PREFETCH: u64 = 8;
/// The budget: 2-second windows, 10% of successes, a floor of 2.
pub(crate) const WINDOW_MS: u64 = 2000;
pub(crate) const RATIO: f64 = 0.1;
pub(crate) const MIN_ALLOWANCE: u64 = 2;
/// Replays before a dead letter is parked.
pub(crate) const MAX_REPLAYS: u32 = 1;

/// The fleet's configuration: its Redis keys under `key_prefix`, its broker names under
/// `amqp_prefix`, the dependency `search` on the budget above. `amqp_urls` is a cluster's node
/// list (`[amqp] urls`); empty, the workers get their broker's URL on their command line.
pub(crate) fn config_toml(key_prefix: &str, amqp_prefix: &str, amqp_urls: &[String]) -> String {
    let urls = if amqp_urls.is_empty() {
        String::new()
    } else {
        let quoted: Vec<String> = amqp_urls.iter().map(|u| format!("{u:?}")).collect();
        format!("urls = [{}]\n", quoted.join(", "))
    };
    format!(
        r#"
[redis]
key_prefix = "{key_prefix}"
timeout_ms = 100
fallback = "local"

[amqp]
{urls}prefix = "{amqp_prefix}"
prefetch = {PREFETCH}
retry_tiers_secs = [0.1, 0.25, 0.5, 1.0]
max_replays = {MAX_REPLAYS}
connect_timeout_ms = 5000
operation_timeout_ms = 10000

[defaults]
window_secs = {window_secs}
ratio = {RATIO}
min_allowance = {MIN_ALLOWANCE}
max_attempts = 3
backoff_base_ms = 200
backoff_cap_ms = 1000

[dependencies.search]
tasks = ["{SEARCH_TASK}"]
"#,
        window_secs = WINDOW_MS / 1000,
    )
}

/// A search job's properties: persistent, its id and task set.
pub(crate) fn search_properties(id: &str) -> BasicProperties {
    let mut t = lapin::types::FieldTable::default();
    headers::set_str(&mut t, headers::TASK, SEARCH_TASK);
    BasicProperties::default()
        .with_message_id(ShortString::from(id))
        .with_type(ShortString::from(SEARCH_TASK))
        .with_delivery_mode(2)
        .with_headers(t)
}

/// The run's folder (`fleet-budget-<run_id>` in the temporary directory) with the fleet's
/// configuration written into it: its path, and the configuration's.
pub(crate) fn fleet_folder(run_id: &str, toml: &str) -> (PathBuf, PathBuf) {
    let logs = std::env::temp_dir().join(format!("fleet-budget-{run_id}"));
    std::fs::create_dir_all(&logs).expect("a folder for the workers' logs");
    let config_path = logs.join("fleet.toml");
    std::fs::write(&config_path, toml).expect("write the configuration");
    (logs, config_path)
}

/// Starts `count` worker processes and waits (at most 60 s) until each is consuming.
pub(crate) async fn start_workers(count: usize, launch: &Launch) -> Vec<WorkerProcess> {
    let workers: Vec<WorkerProcess> = (0..count)
        .map(|i| WorkerProcess::start(i, launch))
        .collect();
    let ready = Instant::now() + Duration::from_secs(60);
    while !workers.iter().all(WorkerProcess::connected) {
        assert!(
            Instant::now() < ready,
            "the workers did not connect within 60 s (logs in {})",
            launch.logs.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    workers
}

/// A publish to make: where, and what.
pub(crate) struct Message<'a> {
    pub(crate) exchange: &'a str,
    pub(crate) routing_key: &'a str,
    pub(crate) body: &'a [u8],
    pub(crate) properties: &'a BasicProperties,
}

/// Publishes until confirmed, reconnecting (to whichever node answers) as often as needed: a
/// producer's job while the broker restarts. Fails after `give_up`. Returns the publishes that
/// were not confirmed and so were sent again.
pub(crate) async fn publish_surely(
    to: &ConnectionConfig,
    publisher: &mut Option<Publisher>,
    message: &Message<'_>,
    give_up: Duration,
) -> u64 {
    let mut resent = 0;
    let deadline = Instant::now() + give_up;
    loop {
        if publisher.is_none() {
            *publisher = Publisher::connect(to).await.ok();
        }
        if let Some(p) = publisher.as_ref() {
            match p
                .publish(
                    message.exchange,
                    message.routing_key,
                    message.body,
                    message.properties.clone(),
                )
                .await
            {
                Ok(()) => return resent,
                Err(_) => {
                    resent += 1;
                    *publisher = None;
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "could not publish {} to {} for {give_up:?}",
            headers::message_id(message.properties).unwrap_or("a message"),
            message.exchange
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Publishes search jobs in a task of their own (while the faults happen): the ids `id(n)`
/// gives, `n` from 0 until it gives none, `burst` of them every half second, each published
/// until confirmed. The task returns how many it published, and the publishes sent again.
pub(crate) fn submit_paced(
    to: &ConnectionConfig,
    exchange: &str,
    burst: u64,
    give_up: Duration,
    mut id: impl FnMut(u64) -> Option<String> + Send + 'static,
) -> JoinHandle<(u64, u64)> {
    let (to, exchange) = (to.clone(), exchange.to_owned());
    tokio::spawn(async move {
        let mut producer: Option<Publisher> = None;
        let (mut resent, mut n) = (0, 0u64);
        let began = Instant::now();
        while let Some(id) = id(n) {
            let due = Duration::from_millis(n / burst * 500);
            if let Some(wait) = due.checked_sub(began.elapsed()) {
                tokio::time::sleep(wait).await;
            }
            let message = Message {
                exchange: &exchange,
                routing_key: SEARCH_TASK,
                body: b"{}",
                properties: &search_properties(&id),
            };
            resent += publish_surely(&to, &mut producer, &message, give_up).await;
            n += 1;
        }
        if let Some(p) = producer {
            p.close().await;
        }
        (n, resent)
    })
}

/// Waits until the fleet is quiet: no handler of a live worker ran for `quiet`, and the work
/// queue has nothing ready. (The workers' own counts cannot tell: deliveries of a lost
/// connection are never settled by that worker, the broker gives them to another.)
async fn wait_quiet(
    to: &ConnectionConfig,
    broker: &TestBroker,
    workers: &[WorkerProcess],
    quiet: Duration,
    within: Duration,
) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        let last_run = workers
            .iter()
            .filter(|w| !w.killed)
            .flat_map(|w| {
                w.events()
                    .into_iter()
                    .rev()
                    .find(|e| e["event"] == "run")
                    .and_then(|e| e["ms"].as_u64())
            })
            .max()
            .unwrap_or(0);
        let idle =
            now_ms().saturating_sub(last_run) >= u64::try_from(quiet.as_millis()).unwrap_or(0);
        if idle
            && let Ok(d) = queue_depths(to, &broker.topology).await
            && d.work == 0
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    false
}

/// The fleet after the faults, left to settle and replayed: what it runs on, and each way it
/// did not settle (a sentence each, for the report).
pub(crate) struct Recovery<'a> {
    to: &'a ConnectionConfig,
    broker: &'a TestBroker,
    workers: &'a [WorkerProcess],
    pub(crate) unsettled: Vec<String>,
}

impl<'a> Recovery<'a> {
    pub(crate) fn new(
        to: &'a ConnectionConfig,
        broker: &'a TestBroker,
        workers: &'a [WorkerProcess],
    ) -> Self {
        Self {
            to,
            broker,
            workers,
            unsettled: Vec::new(),
        }
    }

    /// Waits at most `within` for the fleet to settle ([`wait_quiet`], 2.5 s without a
    /// handler run); if it does not, says so, naming what it came `after`.
    pub(crate) async fn settle(&mut self, within: Duration, after: &str) {
        let quiet = Duration::from_millis(2500);
        if !wait_quiet(self.to, self.broker, self.workers, quiet, within).await {
            self.unsettled.push(format!(
                "the fleet did not settle within {} s after {after}",
                within.as_secs()
            ));
        }
    }

    /// Replays, as an operator would after recovery, until the dead-letter queue is empty (at
    /// most `MAX_REPLAYS + 3` rounds), the fleet given 60 s to settle after each round.
    /// `before_round` runs before each round's replay; a problem it returns is noted. Returns
    /// each round's report.
    pub(crate) async fn replay_until_empty(
        &mut self,
        config: &WorkerConfig,
        redis_url: &str,
        mut before_round: impl AsyncFnMut() -> Option<String>,
    ) -> Vec<ReplayReport> {
        let topology = &self.broker.topology;
        let budget = FleetBudget::from_config(&{
            let mut c = config.budget.clone();
            c.set_redis_url(redis_url).expect("the Redis URL");
            c
        })
        .await
        .expect("the replay's budget");
        let replayer = Replayer::new(self.to.clone(), topology.clone(), Some(budget));
        let mut options = ReplayOptions::new(config);
        options.rate = Some(200.0);
        options.idle_timeout = Duration::from_secs(2);
        let mut rounds = Vec::new();
        for _ in 0..=MAX_REPLAYS + 2 {
            if self.broker.depth(&topology.dead_queue).await == 0 {
                break;
            }
            self.unsettled.extend(before_round().await);
            let report = replayer.run(&options, |_| {}).await.expect("replay");
            rounds.push(report);
            let after = format!("replay round {}", rounds.len());
            self.settle(Duration::from_secs(60), &after).await;
        }
        rounds
    }
}

/// What is left, queue by queue, every message taken. A message in a retry tier moves to the
/// work queue when its TTL ends, so the queues are swept until two sweeps in a row find nothing
/// (at most ten).
pub(crate) async fn sweep(
    broker: &TestBroker,
    topology: &Topology,
) -> BTreeMap<String, Vec<(BasicProperties, Vec<u8>)>> {
    let mut left: BTreeMap<String, Vec<(BasicProperties, Vec<u8>)>> = BTreeMap::new();
    let mut empty_sweeps = 0;
    for _ in 0..10 {
        let mut found = 0;
        for q in topology.queues() {
            let got = broker.drain(&q).await;
            found += got.len();
            left.entry(q.clone()).or_default().extend(got);
        }
        empty_sweeps = if found == 0 { empty_sweeps + 1 } else { 0 };
        if empty_sweeps == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    left
}
