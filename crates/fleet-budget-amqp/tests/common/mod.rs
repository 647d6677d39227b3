//! Shared test setup: the real RabbitMQ (127.0.0.1:5672 or `FLEET_BUDGET_AMQP_URL`), unique names
//! per test, deleted afterwards; a private Redis per test for budgets.
#![allow(dead_code, unreachable_pub)]

use std::future::Future;
use std::time::{Duration, Instant};

use fleet_budget::testing::RedisServer;
use fleet_budget::{DeadLetterReason, FleetBudget};
use fleet_budget_amqp::headers::{self, DeadLetterRecord};
use fleet_budget_amqp::{Migrations, Publisher, Topology, WorkerConfig, migrate};
use lapin::options::{
    BasicAckOptions, BasicGetOptions, ExchangeDeleteOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::{FieldTable, ShortString};
use lapin::{BasicProperties, Connection};

pub fn amqp_url() -> String {
    std::env::var("FLEET_BUDGET_AMQP_URL")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned())
}

pub struct Env {
    pub redis: Option<RedisServer>,
    pub config: WorkerConfig,
    pub topology: Topology,
    pub url: String,
    pub toml: String,
    pub extra_queues: Vec<String>,
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
        let prefix = format!("fbt.{name}.{}", &headers::new_message_id()[..10]);
        let toml = config_text(&prefix, &server.url(), redis, defaults, rest, amqp);
        let config = WorkerConfig::from_toml(&toml, "test").unwrap();
        let topology = Topology::new(&config.amqp);
        let env = Self {
            redis: Some(server),
            config,
            topology,
            url: amqp_url(),
            toml,
            extra_queues: Vec::new(),
        };
        migrate(
            &env.url,
            &env.config.amqp,
            &Migrations::embedded().unwrap(),
            false,
        )
        .await
        .unwrap();
        env
    }

    pub async fn budget(&self) -> FleetBudget {
        FleetBudget::from_config(&self.config.budget).await.unwrap()
    }

    pub async fn publisher(&self) -> Publisher {
        Publisher::connect(&self.url).await.unwrap()
    }

    pub async fn connection(&self) -> Connection {
        fleet_budget_amqp::connect(&self.url, "test").await.unwrap()
    }

    /// Ready messages in `queue`.
    pub async fn count(&self, queue: &str) -> u32 {
        let conn = self.connection().await;
        let ch = conn.create_channel().await.unwrap();
        let q = ch
            .queue_declare(
                ShortString::from(queue),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap();
        let _ = conn.close(200, ShortString::from("bye")).await;
        q.message_count()
    }

    /// Takes (and acks) every ready message of `queue`.
    pub async fn drain(&self, queue: &str) -> Vec<(BasicProperties, Vec<u8>)> {
        let conn = self.connection().await;
        let ch = conn.create_channel().await.unwrap();
        let mut out = Vec::new();
        while let Some(m) = ch
            .basic_get(ShortString::from(queue), BasicGetOptions::default())
            .await
            .unwrap()
        {
            m.delivery
                .acker
                .ack(BasicAckOptions::default())
                .await
                .unwrap();
            out.push((m.delivery.properties.clone(), m.delivery.data.clone()));
        }
        let _ = conn.close(200, ShortString::from("bye")).await;
        out
    }

    /// Publishes `n` dead-letters straight into the dead-letter exchange.
    pub async fn seed_dead_letters(
        &self,
        publisher: &Publisher,
        n: usize,
        dependency: &str,
        reason: DeadLetterReason,
        replays: u32,
        dead_lettered_ms: u64,
    ) -> Vec<String> {
        let mut ids = Vec::new();
        for i in 0..n {
            let record = DeadLetterRecord {
                task: dependency.to_owned(),
                dependency: dependency.to_owned(),
                reason,
                original_exchange: self.topology.work_exchange.clone(),
                original_routing_key: dependency.to_owned(),
                original_queue: self.topology.work_queue.clone(),
                attempts: 3,
                first_failure_ms: dead_lettered_ms.saturating_sub(1000),
                dead_lettered_ms,
                error_class: "http_503".to_owned(),
                error: "upstream said no".to_owned(),
                budget: None,
                budget_source: None,
                replays,
            };
            let mut t = FieldTable::default();
            record.write(&mut t);
            headers::set_u64(&mut t, headers::ATTEMPT, 3);
            let id = headers::new_message_id();
            let props = BasicProperties::default()
                .with_message_id(ShortString::from(id.clone()))
                .with_type(ShortString::from(dependency))
                .with_headers(t);
            publisher
                .publish(
                    &self.topology.dead_exchange,
                    dependency,
                    format!("job {i}").as_bytes(),
                    props,
                )
                .await
                .unwrap();
            ids.push(id);
        }
        ids
    }

    pub fn redis_url(&self) -> String {
        self.redis
            .as_ref()
            .map(RedisServer::url)
            .unwrap_or_default()
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let url = self.url.clone();
        let mut queues = self.topology.queues();
        queues.extend(self.extra_queues.iter().cloned());
        let exchanges = self.topology.exchanges();
        // Delete the test's names on a runtime of our own (Drop may run inside another).
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async move {
                let Ok(conn) = fleet_budget_amqp::connect(&url, "test cleanup").await else {
                    return;
                };
                for q in queues {
                    if let Ok(ch) = conn.create_channel().await {
                        let _ = ch
                            .queue_delete(ShortString::from(q), QueueDeleteOptions::default())
                            .await;
                    }
                }
                for e in exchanges {
                    if let Ok(ch) = conn.create_channel().await {
                        let _ = ch
                            .exchange_delete(ShortString::from(e), ExchangeDeleteOptions::default())
                            .await;
                    }
                }
                let _ = conn.close(200, ShortString::from("cleaned")).await;
            });
        })
        .join();
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

pub fn message_id(props: &BasicProperties) -> String {
    headers::message_id(props).unwrap().to_owned()
}
