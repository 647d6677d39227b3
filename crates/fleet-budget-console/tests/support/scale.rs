//! A fleet at the design's scale for the console's measurements, filled the way workers and
//! operators fill one: many dependencies with traffic, a long audit trail, a large worker
//! registry, and 100,000 dead letters with 300 hostile ones among them. One filler for the two
//! that measure the console over it: `examples/console_bench.rs` (each page's time and weight,
//! printed) and the browser test `crates/fleet-budget-console/tests/browser/hundred_thousand.rs`
//! (the same pages in Chromium). Both include this file with `#[path]`; each uses part of it.
//!
//! The dead letters are published with confirms, a thousand in flight at a time, and counted
//! in the dead-letter index (and its ledger) as a worker counts what it dead-letters
//! ([`Tally`]): once the broker confirmed them. So the console's counts are exact from the
//! start, and no read of the queue (`budgetctl migrate`'s rebuild of the index reads and puts
//! back every message: 205 s for 100,000 in a debug build) is paid before the pages are timed.
#![allow(
    dead_code,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use fleet_budget::control::{AuditEntry, AuditLog, DeadLetterIndex};
use fleet_budget::store::{RedisStore, RedisTarget};
use fleet_budget::testing::RedisServer;
use fleet_budget::{DeadLetterReason, Failure, FleetBudget};
use fleet_budget_amqp::WorkerConfig;
use fleet_budget_amqp::dead_letters::{Row, Tally};
use fleet_budget_amqp::headers::{self, DeadLetterRecord};
use fleet_budget_amqp::publish::confirmed;
use fleet_budget_amqp::testing::{TestBroker, unique_prefix};
use lapin::BasicProperties;
use lapin::types::{FieldTable, ShortString};

/// The password in the hostile dead letters' error class: no page may show it.
pub(crate) const SECRET: &str = "hunter2";
/// The hostile dead letters: a secret in the error class, a task name of [`HOSTILE_TASK_BYTES`].
pub(crate) const HOSTILE: usize = 300;
/// The length of a hostile dead letter's task name.
pub(crate) const HOSTILE_TASK_BYTES: usize = 100 * 1024;
/// The dependencies the (ordinary) dead letters are spread over, `d0` to `d9`.
pub(crate) const DEAD_LETTER_DEPENDENCIES: usize = 10;
/// Publishes whose confirms are awaited together.
const IN_FLIGHT: usize = 1000;

/// A Redis of its own with `d0`..`dN` (tasks `t0`..`tN`), a topology of its own on the shared
/// RabbitMQ (migrated; deleted on drop), and the configuration naming both.
pub(crate) struct ScaleFleet {
    pub(crate) redis: RedisServer,
    pub(crate) broker: TestBroker,
    pub(crate) config: WorkerConfig,
    /// The configuration's text (for the `budgetctl` binary).
    pub(crate) toml: String,
}

/// What [`ScaleFleet::fill_dead_letters`] did.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Filled {
    /// Dead letters published and confirmed, the hostile ones included.
    pub(crate) published: usize,
    /// How long publishing and counting them took.
    pub(crate) took: Duration,
}

impl ScaleFleet {
    /// `dependencies` dependencies, each with traffic (an attempt and a failure), a tenth of
    /// them denying (five failures); the topology `name` migrated.
    pub(crate) async fn start(name: &str, dependencies: usize) -> Self {
        let redis = RedisServer::start();
        let broker = TestBroker::new(name);
        broker.migrate().await;
        let mut toml = format!(
            "[redis]\nurl = \"{}\"\nkey_prefix = \"{}\"\ntimeout_ms = 10000\n\
             [amqp]\nurl = \"{}\"\nprefix = \"{}\"\n",
            redis.url(),
            unique_prefix("fbcs"),
            broker.url,
            broker.settings.prefix
        );
        for i in 0..dependencies {
            toml.push_str(&format!("[dependencies.d{i}]\ntasks = [\"t{i}\"]\n"));
        }
        let config = WorkerConfig::from_toml(&toml, "the fleet at scale").unwrap();
        let budget = FleetBudget::from_config(&config.budget).await.unwrap();
        let failure = Failure::retryable("503").with_class("http_503");
        for i in 0..dependencies {
            let task = format!("t{i}");
            budget.on_attempt(&task, 1).await.unwrap();
            for _ in 0..if i % 10 == 0 { 5 } else { 1 } {
                let _ = budget.on_failure(&task, 1, &failure).await.unwrap();
            }
        }
        budget.shutdown().await.unwrap();
        Self {
            redis,
            broker,
            config,
            toml,
        }
    }

    /// A store on the fleet's Redis with a 10 s deadline (what the filler writes with).
    pub(crate) fn store(&self) -> RedisStore {
        let r = &self.config.budget.redis;
        RedisStore::new_with_tls(
            RedisTarget::from_settings(r),
            &r.key_prefix,
            Duration::from_secs(10),
            &r.tls,
        )
        .unwrap()
    }

    /// Records `n` audit entries as operators' overrides are recorded (each with its state
    /// before and after), a tenth of them of `d0`, the rest spread over `d1`..`d999`; the trail
    /// keeps the newest 10,000. How long it took.
    pub(crate) async fn record_audit(&self, n: usize) -> Duration {
        let started = Instant::now();
        let store = self.store();
        let log = AuditLog::default();
        let state = serde_json::json!({"ratio": 0.1, "min_allowance": 10, "until_ms": 1_796_650_000_000_u64});
        for i in 0..n {
            let dependency = format!("d{}", if i % 10 == 0 { 0 } else { 1 + i % 999 });
            let entry = AuditEntry::new(
                "bench",
                "set",
                Some(&dependency),
                "an incident's override, recorded with its before and after",
            )
            .with_before_after(&state, &state);
            log.record(&store, &entry).await.unwrap();
        }
        started.elapsed()
    }

    /// Writes `n` entries of the worker registry as `heartbeat.lua` writes them (a report under
    /// the id, the server's time in the sorted set): a tenth deciding three dependencies from
    /// their fallback, a tenth silent (last seen a minute ago), one in a hundred not a worker's
    /// report. Written again, they are fresh again (silent 15 s after). How long it took.
    pub(crate) async fn write_workers(&self, n: usize) -> Duration {
        let started = Instant::now();
        let prefix = &self.config.budget.redis.key_prefix;
        let client = redis::Client::open(self.redis.url()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
        let now_ms = secs * 1000 + micros / 1000;
        let reports = fleet_budget::keys::workers_key(prefix);
        let seen = fleet_budget::keys::workers_seen_key(prefix);
        for chunk in (0..n).collect::<Vec<_>>().chunks(500) {
            let mut pipe = redis::pipe();
            for &i in chunk {
                let id = format!("bench-{i:05}");
                let fallback = if i % 10 == 3 {
                    serde_json::json!([
                        {"dependency": "d0", "for_ms": 12_000},
                        {"dependency": "d1", "for_ms": 9_000},
                        {"dependency": "d2", "for_ms": 4_000}
                    ])
                } else {
                    serde_json::json!([])
                };
                let report = if i % 100 == 7 {
                    "not a report".to_owned()
                } else {
                    serde_json::json!({
                        "v": 1, "id": id, "host": format!("host-{}", i % 200), "pid": 1000 + i,
                        "lang": "rust", "version": "0.2.0", "started_ms": now_ms - 3_600_000,
                        "interval_ms": 5000, "fallback": fallback, "fallback_more": 0
                    })
                    .to_string()
                };
                let at = if i % 10 == 5 {
                    now_ms - 60_000
                } else {
                    now_ms - (i as u64 % 4000)
                };
                pipe.cmd("HSET").arg(&reports).arg(&id).arg(report).ignore();
                pipe.cmd("ZADD").arg(&seen).arg(at).arg(&id).ignore();
            }
            let () = pipe.query_async(&mut conn).await.unwrap();
        }
        started.elapsed()
    }

    /// Publishes [`HOSTILE`] hostile dead letters of `d0` (reason `non_retryable`, the error
    /// class `redis://admin:hunter2@db.internal:6379/0`, a task name of 100 KB), then `n`
    /// dead letters of `budget_exhausted` spread over `d0`..`d9` (bodies `job 0`, `job 1`, ...),
    /// into the dead-letter exchange as workers do, and counts each in the dead-letter index
    /// and its ledger once confirmed, as workers count them. The hostile ones go first: they
    /// are at the head of the queue, where the console's sample of messages reads.
    pub(crate) async fn fill_dead_letters(&self, n: usize) -> Filled {
        let started = Instant::now();
        let broker = &self.broker;
        let publisher = broker.publisher().await;
        let tally = Tally::new(DeadLetterIndex::new(Arc::new(self.store())));
        let now = fleet_budget::clock::now_ms();
        let mut hostile =
            broker.dead_letter_record("d0", DeadLetterReason::NonRetryable, now - 30_000);
        hostile.error_class = format!("redis://admin:{SECRET}@db.internal:6379/0");
        hostile.task = "t".repeat(HOSTILE_TASK_BYTES);
        let mut batches = vec![(hostile, HOSTILE)];
        for d in 0..DEAD_LETTER_DEPENDENCIES {
            let record = broker.dead_letter_record(
                &format!("d{d}"),
                DeadLetterReason::BudgetExhausted,
                now - 60_000,
            );
            let share =
                n / DEAD_LETTER_DEPENDENCIES + usize::from(d < n % DEAD_LETTER_DEPENDENCIES);
            batches.push((record, share));
        }
        let mut published = 0;
        for (record, count) in batches {
            let row = Row::of_record(&record);
            let table = dead_letter_headers(&record);
            let mut sent = 0;
            while sent < count {
                let batch = IN_FLIGHT.min(count - sent);
                let mut pending = Vec::with_capacity(batch);
                for i in sent..sent + batch {
                    let mut props = BasicProperties::default()
                        .with_message_id(ShortString::from(headers::new_message_id()))
                        .with_delivery_mode(2)
                        .with_headers(table.clone());
                    // A task name too long for an AMQP short string goes without a `type`, as
                    // a worker sends it.
                    if record.task.len() <= fleet_budget_amqp::publish::SHORT_STRING_MAX {
                        props = props.with_type(ShortString::from(record.task.as_str()));
                    }
                    let body = format!("job {i}");
                    pending.push(
                        publisher
                            .send(
                                &broker.topology.dead_exchange,
                                &record.original_routing_key,
                                body.as_bytes(),
                                props,
                            )
                            .await
                            .unwrap_or_else(|e| panic!("publish a dead letter: {e}")),
                    );
                }
                for p in pending {
                    confirmed(p)
                        .await
                        .unwrap_or_else(|e| panic!("a dead letter not confirmed: {e}"));
                    tally.entered(&broker.topology.dead_queue, &row);
                }
                tally.flush().await;
                sent += batch;
            }
            published += count;
        }
        tally.flush_last().await;
        assert_eq!(
            tally.unrecorded(),
            0,
            "every dead letter counted in the index"
        );
        publisher.close().await;
        Filled {
            published,
            took: started.elapsed(),
        }
    }
}

/// The headers a worker writes on a dead letter of `record`: the record and the attempt.
fn dead_letter_headers(record: &DeadLetterRecord) -> FieldTable {
    let mut t = FieldTable::default();
    record.write(&mut t);
    headers::set_u64(&mut t, headers::ATTEMPT, u64::from(record.attempts));
    t
}

/// The median of `v` (sorted in place); zero for none.
pub(crate) fn median<T: Ord + Copy + Default>(v: &mut [T]) -> T {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

/// The median of 5 Redis `PING`s to `redis` from this process over loopback: the floor any
/// page that reads Redis stands on.
pub(crate) async fn redis_ping(redis: &RedisServer) -> Duration {
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let mut times = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let _: String = redis::cmd("PING").query_async(&mut conn).await.unwrap();
        times.push(t.elapsed());
    }
    median(&mut times)
}

/// The milliseconds of `app` in a `Server-Timing` value (`app;dur=12.345`), if it has them.
pub(crate) fn server_ms(value: &str) -> Option<f64> {
    value.split(',').find_map(|metric| {
        let mut parts = metric.trim().split(';');
        (parts.next()?.trim() == "app")
            .then(|| parts.find_map(|p| p.trim().strip_prefix("dur=").and_then(|d| d.parse().ok())))
            .flatten()
    })
}
