//! What this crate's integration tests share beyond the [`TestBroker`] harness: a private Redis
//! per test for budgets, and the configuration text that ties the two together.
#![allow(dead_code, unreachable_pub)]

use std::collections::BTreeSet;
use std::future::Future;
use std::ops::Deref;
use std::time::{Duration, Instant};

use fleet_budget::FleetBudget;
use fleet_budget::testing::RedisServer;
use fleet_budget_amqp::WorkerConfig;
use fleet_budget_amqp::headers;
use fleet_budget_amqp::testing::{TestBroker, amqp_url, unique_prefix};
use lapin::BasicProperties;

/// A test's broker names (migrated), private Redis and configuration. Derefs to its
/// [`TestBroker`] (`env.topology`, `env.depth(..)`, `env.drain(..)`, ...).
pub struct Env {
    pub broker: TestBroker,
    pub redis: RedisServer,
    pub config: WorkerConfig,
    pub toml: String,
}

impl Deref for Env {
    type Target = TestBroker;

    fn deref(&self) -> &TestBroker {
        &self.broker
    }
}

/// Builds the configuration text of a test: `defaults` lines go under `[defaults]`, `rest` is
/// appended (dependencies, tasks).
pub fn config_text(
    prefix: &str,
    redis_url: &str,
    redis: &str,
    defaults: &str,
    rest: &str,
    amqp: &str,
) -> String {
    let tiers = if amqp.contains("retry_tiers_secs") {
        ""
    } else {
        "retry_tiers_secs = [0.2, 0.5, 1.0, 2.0]\n"
    };
    let flush = if redis.contains("deposit_flush_ms") {
        ""
    } else {
        "deposit_flush_ms = 0\n"
    };
    format!(
        "[redis]\nurl = \"{redis_url}\"\ntimeout_ms = 2000\n{flush}{redis}\n\
         [amqp]\nurl = \"{}\"\nprefix = \"{prefix}\"\nprefetch = 16\n{tiers}{amqp}\n\
         [defaults]\nbackoff_base_ms = 100\nbackoff_cap_ms = 1000\n{defaults}\n{rest}\n",
        amqp_url()
    )
}

impl Env {
    /// A private Redis, a unique prefix, the configuration, and the migrated topology.
    pub async fn new(name: &str, redis: &str, defaults: &str, rest: &str) -> Self {
        Self::with_amqp(name, "", redis, defaults, rest).await
    }

    /// [`Env::new`] with more `[amqp]` lines (`retry_tiers_secs = [0.2, 0.5]`).
    pub async fn with_amqp(
        name: &str,
        amqp: &str,
        redis: &str,
        defaults: &str,
        rest: &str,
    ) -> Self {
        let server = RedisServer::start();
        let toml = config_text(
            &unique_prefix(name),
            &server.url(),
            redis,
            defaults,
            rest,
            amqp,
        );
        let config = WorkerConfig::from_toml(&toml, "test").unwrap();
        let broker = TestBroker::with_settings(config.amqp.clone());
        broker.migrate().await;
        Self {
            broker,
            redis: server,
            config,
            toml,
        }
    }

    pub async fn budget(&self) -> FleetBudget {
        FleetBudget::from_config(&self.config.budget).await.unwrap()
    }

    /// Publishes one job of task `t` to the work exchange; returns its message id.
    pub async fn publish_one(&self, body: &[u8]) -> String {
        let publisher = self.publisher().await;
        let id = publisher
            .publish_job(&self.topology.work_exchange, "t", "t", body)
            .await
            .unwrap();
        publisher.close().await;
        id
    }

    /// Waits until `queue` holds at least `n` ready messages. A guard: a replay run now returns
    /// only once what it left in its queue is counted ready again (`replay/end.rs`; before, its
    /// consumer's copies past the bound came back after the run returned, and a run or a drain
    /// started at once read them missing), or reports `not_ready` after its idle timeout. A
    /// deadline for failing, not a timing assertion.
    pub async fn ready_again(&self, queue: &str, n: u32) {
        wait_until(
            Duration::from_secs(60),
            &format!("{n} messages ready again in {queue}"),
            || async { self.depth(queue).await >= n },
        )
        .await;
    }

    /// Takes every ready message of `queue`; returns their message ids.
    pub async fn drain_ids(&self, queue: &str) -> BTreeSet<String> {
        ids(&self.drain(queue).await)
    }
}

/// Polls `cond` until it holds; panics with `what` after `within` (a deadline for failing, not
/// a timing assertion).
pub async fn wait_until<F, Fut>(within: Duration, what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    loop {
        if cond().await {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {within:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub fn header_str(props: &BasicProperties, name: &str) -> Option<String> {
    headers::get_str(&headers::table(props), name).unwrap()
}

pub fn header_u64(props: &BasicProperties, name: &str) -> Option<u64> {
    headers::get_u64(&headers::table(props), name).unwrap()
}

/// The message ids of `messages`.
pub fn ids(messages: &[(BasicProperties, Vec<u8>)]) -> BTreeSet<String> {
    messages.iter().map(|(p, _)| message_id(p)).collect()
}

pub fn message_id(props: &BasicProperties) -> String {
    headers::message_id(props).unwrap().to_owned()
}

/// How long a `rabbitmqctl` of the tests may take (a hang check).
const RABBITMQCTL_WITHIN: Duration = Duration::from_secs(60);

/// Runs `rabbitmqctl` against the shared broker (60 s at most); its output. Panics on failure.
pub async fn rabbitmqctl(args: &[&str]) -> String {
    let mut command = tokio::process::Command::new("rabbitmqctl");
    command.args(args).kill_on_drop(true);
    let out = tokio::time::timeout(RABBITMQCTL_WITHIN, command.output())
        .await
        .unwrap_or_else(|_| panic!("rabbitmqctl {args:?} within {RABBITMQCTL_WITHIN:?}"))
        .unwrap_or_else(|e| panic!("rabbitmqctl {args:?}: {e}"));
    assert!(
        out.status.success(),
        "rabbitmqctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The broker's connections whose client properties name them `name` (unique to a test): the
/// pid of each, as `rabbitmqctl` lists them.
pub async fn connections_named(name: &str) -> Vec<String> {
    rabbitmqctl(&["-q", "list_connections", "pid", "client_properties"])
        .await
        .lines()
        .filter(|line| line.contains(name))
        .filter_map(|line| line.split('\t').next())
        .map(str::to_owned)
        .collect()
}

/// Has the broker close the one connection named `name` (`rabbitmqctl close_connection`), as an
/// operator or a restart would, with `why` as the reason it gives; the connection's pid.
pub async fn close_the_connection_named(name: &str, why: &str) -> String {
    let pids = connections_named(name).await;
    assert_eq!(pids.len(), 1, "connections named {name}: {pids:?}");
    rabbitmqctl(&["close_connection", &pids[0], why]).await;
    pids.into_iter().next().unwrap_or_default()
}
