//! A test harness for code that talks to RabbitMQ (feature `test-harness`).
//!
//! RabbitMQ is not started per test (it takes seconds): tests share the broker at
//! `FLEET_BUDGET_AMQP_URL` (default guest on 127.0.0.1:5672) and stay apart by names. A
//! [`TestBroker`] has a topology under a prefix of its own (`fbt.<test>.<random>`), declares it
//! when asked ([`TestBroker::migrate`]: a test of `budgetctl migrate` declares it itself), and
//! deletes it when dropped, whether the test passed or not.
//!
//! ```no_run
//! use fleet_budget_amqp::testing::TestBroker;
//!
//! # async fn t() {
//! let broker = TestBroker::new("replay");
//! broker.migrate().await;
//! let publisher = broker.publisher().await;
//! let record = broker.dead_letter_record("search", fleet_budget::DeadLetterReason::BudgetExhausted, 0);
//! broker.publish_dead_letter(&publisher, &record, b"{}").await;
//! assert_eq!(broker.depth(&broker.topology.dead_queue).await, 1);
//! # }
//! ```
//!
//! Its methods panic on failure (they are test steps); a synchronous test calls them through
//! [`block_on`].
#![allow(
    clippy::missing_panics_doc,
    clippy::expect_used,
    clippy::panic,
    clippy::unwrap_used
)]

pub mod raw;

use std::future::Future;
use std::time::Duration;

use fleet_budget::DeadLetterReason;
use lapin::options::{BasicAckOptions, BasicGetOptions};
use lapin::types::{FieldTable, ShortString};
use lapin::{BasicProperties, Connection};

use crate::config::AmqpSettings;
use crate::headers::{self, DeadLetterRecord};
use crate::topology::{MigrationReport, Migrations, Topology, delete_topology, migrate};
use crate::{Publisher, connect, queue_depth};

/// The broker tests use: `FLEET_BUDGET_AMQP_URL`, else guest on 127.0.0.1:5672.
#[must_use]
pub fn amqp_url() -> String {
    std::env::var("FLEET_BUDGET_AMQP_URL")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned())
}

/// A name prefix no other test uses: `fbt.<name>.<10 random hex digits>`.
#[must_use]
pub fn unique_prefix(name: &str) -> String {
    format!("fbt.{name}.{}", &headers::new_message_id()[..10])
}

/// Runs `future` to completion on a runtime of its own (for synchronous tests).
pub fn block_on<F: Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(future)
}

/// A topology of the test's own on the shared broker, deleted on drop.
#[derive(Debug)]
pub struct TestBroker {
    /// The broker's URL.
    pub url: String,
    /// The `[amqp]` settings the topology is made of (prefix, retry tiers, ...).
    pub settings: AmqpSettings,
    /// The names.
    pub topology: Topology,
    also_delete: Vec<Topology>,
}

impl TestBroker {
    /// The default settings under a [`unique_prefix`], at [`amqp_url`]. Declares nothing.
    #[must_use]
    pub fn new(name: &str) -> Self {
        Self::with_settings(AmqpSettings {
            url: amqp_url(),
            prefix: unique_prefix(name),
            ..AmqpSettings::default()
        })
    }

    /// A broker for `settings` as they are: make the prefix unique with [`unique_prefix`].
    #[must_use]
    pub fn with_settings(settings: AmqpSettings) -> Self {
        Self {
            url: settings.url.clone(),
            topology: Topology::new(&settings),
            settings,
            also_delete: Vec::new(),
        }
    }

    /// Deletes `topology` on drop too (a second prefix a test declared).
    pub fn also_delete(&mut self, topology: Topology) {
        self.also_delete.push(topology);
    }

    /// Declares the topology with the embedded migrations.
    pub async fn migrate(&self) -> MigrationReport {
        let migrations = Migrations::embedded().expect("the embedded migrations");
        migrate(&self.url, &self.settings, &migrations, false)
            .await
            .unwrap_or_else(|e| panic!("migrate {}: {e}", self.settings.prefix))
    }

    /// A new connection to the broker.
    pub async fn connection(&self) -> Connection {
        connect(&self.url, "fleet-budget test")
            .await
            .unwrap_or_else(|e| panic!("RabbitMQ for the tests (.ci/run starts one): {e}"))
    }

    /// A publisher with confirms, on a connection of its own.
    pub async fn publisher(&self) -> Publisher {
        Publisher::connect(&self.url)
            .await
            .unwrap_or_else(|e| panic!("RabbitMQ for the tests (.ci/run starts one): {e}"))
    }

    /// Ready messages in `queue`.
    pub async fn depth(&self, queue: &str) -> u32 {
        let conn = self.connection().await;
        let ch = conn.create_channel().await.expect("a channel");
        let depth = queue_depth(&ch, queue)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let _ = conn.close(200, ShortString::from("bye")).await;
        depth
    }

    /// Ready messages in `queue` once they are `expected`, or the last count read when
    /// `within` (a hang check) passed first. For messages the broker gives back on its own time:
    /// a quorum queue returns what a closed channel held by a command of its log, applied after
    /// the close is answered (under load, seconds later), and a replay waits for that only up to
    /// its `idle_timeout` (it then reports them `not_ready`).
    pub async fn depth_reaching(&self, queue: &str, expected: u32, within: Duration) -> u32 {
        let conn = self.connection().await;
        let ch = conn.create_channel().await.expect("a channel");
        let deadline = tokio::time::Instant::now() + within;
        let depth = loop {
            let depth = queue_depth(&ch, queue)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            if depth == expected || tokio::time::Instant::now() >= deadline {
                break depth;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let _ = conn.close(200, ShortString::from("bye")).await;
        depth
    }

    /// Takes (and acks) the next ready message of `queue`.
    pub async fn get(&self, queue: &str) -> Option<(BasicProperties, Vec<u8>)> {
        self.take(queue, Some(1)).await.pop()
    }

    /// Takes (and acks) every ready message of `queue`.
    pub async fn drain(&self, queue: &str) -> Vec<(BasicProperties, Vec<u8>)> {
        self.take(queue, None).await
    }

    async fn take(&self, queue: &str, most: Option<usize>) -> Vec<(BasicProperties, Vec<u8>)> {
        let conn = self.connection().await;
        let ch = conn.create_channel().await.expect("a channel");
        let mut out = Vec::new();
        while most.is_none_or(|n| out.len() < n) {
            let Some(m) = ch
                .basic_get(ShortString::from(queue), BasicGetOptions::default())
                .await
                .unwrap_or_else(|e| panic!("get from {queue}: {e}"))
            else {
                break;
            };
            m.delivery
                .acker
                .ack(BasicAckOptions::default())
                .await
                .expect("ack");
            out.push((m.delivery.properties.clone(), m.delivery.data.clone()));
        }
        let _ = conn.close(200, ShortString::from("bye")).await;
        out
    }

    /// A dead-letter record of a job of task `dependency` from this topology's work queue,
    /// three attempts, dead-lettered at `dead_lettered_ms` (change its fields at will).
    #[must_use]
    pub fn dead_letter_record(
        &self,
        dependency: &str,
        reason: DeadLetterReason,
        dead_lettered_ms: u64,
    ) -> DeadLetterRecord {
        DeadLetterRecord {
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
            replays: 0,
        }
    }

    /// Publishes a dead-letter with `record`'s headers (and its attempts as the attempt
    /// header) into the dead-letter exchange, as a worker would; returns its message id.
    pub async fn publish_dead_letter(
        &self,
        publisher: &Publisher,
        record: &DeadLetterRecord,
        body: &[u8],
    ) -> String {
        let mut t = FieldTable::default();
        record.write(&mut t);
        headers::set_u64(&mut t, headers::ATTEMPT, u64::from(record.attempts));
        let id = headers::new_message_id();
        let props = BasicProperties::default()
            .with_message_id(ShortString::from(id.clone()))
            .with_type(ShortString::from(record.task.as_str()))
            .with_delivery_mode(2)
            .with_headers(t);
        publisher
            .publish(
                &self.topology.dead_exchange,
                &record.original_routing_key,
                body,
                props,
            )
            .await
            .unwrap_or_else(|e| panic!("publish a dead-letter: {e}"));
        id
    }

    /// Publishes `n` dead-letters of `dependency` (bodies `job 0`, `job 1`, ...); returns their
    /// message ids.
    pub async fn seed_dead_letters(
        &self,
        publisher: &Publisher,
        n: usize,
        dependency: &str,
        reason: DeadLetterReason,
        replays: u32,
        dead_lettered_ms: u64,
    ) -> Vec<String> {
        let record = DeadLetterRecord {
            replays,
            ..self.dead_letter_record(dependency, reason, dead_lettered_ms)
        };
        let mut ids = Vec::with_capacity(n);
        for i in 0..n {
            let body = format!("job {i}");
            ids.push(
                self.publish_dead_letter(publisher, &record, body.as_bytes())
                    .await,
            );
        }
        ids
    }
}

impl Drop for TestBroker {
    fn drop(&mut self) {
        let url = self.url.clone();
        let mut topologies = vec![self.topology.clone()];
        topologies.append(&mut self.also_delete);
        // On a thread and runtime of its own: Drop may run inside another runtime.
        let _ = std::thread::spawn(move || {
            block_on(async move {
                let Ok(conn) = connect(&url, "fleet-budget test cleanup").await else {
                    return;
                };
                for t in &topologies {
                    if let Err(e) = delete_topology(&conn, t).await {
                        eprintln!("test cleanup: {e}");
                    }
                }
                let _ = conn.close(200, ShortString::from("cleaned")).await;
            });
        })
        .join();
    }
}
