//! The worker against the real RabbitMQ and a private Redis: end to end, budget exhaustion
//! across workers, no loss when a copy cannot be confirmed, redelivery after a killed process,
//! graceful shutdown, reconnection.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Env, header_str, header_u64, ids, message_id, wait_until};
use fleet_budget::{Dependency, Failure, FleetBudget};
use fleet_budget_amqp::headers;
use fleet_budget_amqp::{
    Migrations, ReplayOptions, Replayer, Worker, WorkerConfig, WorkerHandle, WorkerOptions, migrate,
};
use lapin::BasicProperties;
use lapin::options::{ExchangeDeleteOptions, QueueDeleteOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use tokio::task::JoinHandle;

const LONG: Duration = Duration::from_secs(60);

fn options(env: &Env) -> WorkerOptions {
    WorkerOptions::new(&env.config, &env.topology)
}

type Runner = (WorkerHandle, JoinHandle<fleet_budget_amqp::WorkerCounts>);

/// Starts a worker whose handler is `handler`.
fn start<H, F>(budget: FleetBudget, env: &Env, handler: H) -> Runner
where
    H: Fn(fleet_budget_amqp::Job) -> F + Send + Sync + 'static,
    F: std::future::Future<Output = Result<(), Failure>> + Send + 'static,
{
    let worker = Worker::new(budget, env.topology.clone(), options(env));
    let handle = worker.handle();
    let join = tokio::spawn(async move { worker.run(handler).await.unwrap() });
    (handle, join)
}

async fn stop((handle, join): Runner) -> fleet_budget_amqp::WorkerCounts {
    handle.shutdown();
    tokio::time::timeout(LONG, join)
        .await
        .expect("worker stops")
        .unwrap()
}

/// (attempt, started, failed at, retry delay of this delivery)
type Execution = (u32, Instant, Option<Instant>, Option<Duration>);

#[derive(Default)]
struct Log {
    succeeded: Vec<String>,
    /// message id → executions
    executions: HashMap<String, Vec<Execution>>,
}

/// End to end: a dependency failing for a while. Every job ends acked as a success or in the
/// dead-letter queue with the right reason and headers; retries never arrive before their delay;
/// submitted = succeeded + dead-lettered + parked (duplicates counted apart); then a replay after
/// recovery moves the dead-lettered work back and the books still balance.
#[tokio::test]
#[allow(clippy::too_many_lines)]
async fn end_to_end_jobs_succeed_or_dead_letter_with_reason_and_headers() {
    let env = Env::new(
        "e2e",
        "",
        "max_attempts = 4",
        "[dependencies.search]\ntasks = [\"index\"]\n",
    )
    .await;
    let publisher = env.publisher().await;
    let failures_left = Arc::new(AtomicI64::new(30));
    let log = Arc::new(Mutex::new(Log::default()));
    let runner = {
        let (failures_left, log) = (Arc::clone(&failures_left), Arc::clone(&log));
        start(env.budget().await, &env, move |job| {
            let (failures_left, log) = (Arc::clone(&failures_left), Arc::clone(&log));
            async move {
                let id = job.message_id.clone().unwrap();
                let started = Instant::now();
                let result = match std::str::from_utf8(&job.payload) {
                    Err(e) => Err(Failure::poison(e)),
                    Ok("bad") => {
                        Err(Failure::non_retryable("400 bad request").with_class("http_400"))
                    }
                    Ok(_) if failures_left.fetch_sub(1, Ordering::SeqCst) > 0 => {
                        Err(Failure::retryable(
                            "search https://svc:hunter2@search/x returned 503, token=abc123",
                        )
                        .with_class("http_503"))
                    }
                    Ok(_) => Ok(()),
                };
                let mut log = log.lock().unwrap();
                let failed_at = result.is_err().then(Instant::now);
                log.executions.entry(id.clone()).or_default().push((
                    job.attempt,
                    started,
                    failed_at,
                    job.retry_delay(),
                ));
                if result.is_ok() {
                    log.succeeded.push(id);
                }
                result
            }
        })
    };

    let mut submitted = BTreeSet::new();
    for i in 0..24 {
        submitted.insert(
            publisher
                .publish_job(
                    &env.topology.work_exchange,
                    "index",
                    "index",
                    format!("doc {i}").as_bytes(),
                )
                .await
                .unwrap(),
        );
    }
    for _ in 0..2 {
        submitted.insert(
            publisher
                .publish_job(&env.topology.work_exchange, "index", "index", b"bad")
                .await
                .unwrap(),
        );
    }
    submitted.insert(
        publisher
            .publish_job(
                &env.topology.work_exchange,
                "index",
                "index",
                &[0xff, 0xfe, 0x00],
            )
            .await
            .unwrap(),
    );
    // A delivery whose attempt header is garbage: dead-lettered without running the handler.
    let mut t = FieldTable::default();
    t.insert(
        ShortString::from(headers::ATTEMPT),
        AMQPValue::LongString(LongString::from("third")),
    );
    let garbage_id = headers::new_message_id();
    let props = BasicProperties::default()
        .with_message_id(ShortString::from(garbage_id.clone()))
        .with_type(ShortString::from("index"))
        .with_headers(t);
    publisher
        .publish(&env.topology.work_exchange, "index", b"doc x", props)
        .await
        .unwrap();
    submitted.insert(garbage_id.clone());

    let total = submitted.len();
    wait_until(LONG, "every job acked or dead-lettered", || async {
        let ok: BTreeSet<String> = log.lock().unwrap().succeeded.iter().cloned().collect();
        ok.len() + env.depth(&env.topology.dead_queue).await as usize == total
    })
    .await;
    let counts = stop(runner).await;
    assert_eq!(env.depth(&env.topology.work_queue).await, 0);
    let dead = env.drain(&env.topology.dead_queue).await;

    // Reasons and headers.
    let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
    for (props, body) in &dead {
        let id = message_id(props);
        assert!(submitted.contains(&id), "message id changed: {id}");
        let reason = header_str(props, headers::REASON).unwrap();
        *reasons.entry(reason.clone()).or_default() += 1;
        if body == b"bad" || body == &[0xff, 0xfe, 0x00] || id == garbage_id {
            assert_eq!(reason, "non_retryable");
        } else {
            assert!(
                reason == "budget_exhausted" || reason == "attempts_exhausted",
                "{reason}"
            );
        }
        if id == garbage_id {
            assert_eq!(
                header_str(props, headers::ERROR_CLASS).as_deref(),
                Some("malformed_header")
            );
        }
        assert_eq!(header_str(props, headers::TASK).as_deref(), Some("index"));
        assert_eq!(
            header_str(props, headers::DEPENDENCY).as_deref(),
            Some("search")
        );
        assert_eq!(
            header_str(props, headers::ORIGINAL_EXCHANGE).unwrap(),
            env.topology.work_exchange
        );
        assert_eq!(
            header_str(props, headers::ORIGINAL_ROUTING_KEY).as_deref(),
            Some("index")
        );
        assert_eq!(
            header_str(props, headers::ORIGINAL_QUEUE).unwrap(),
            env.topology.work_queue
        );
        let first = header_u64(props, headers::FIRST_FAILURE_MS).unwrap();
        let at = header_u64(props, headers::DEAD_LETTERED_MS).unwrap();
        assert!(first <= at && at > 0);
        assert!(header_u64(props, headers::ATTEMPTS).unwrap() >= 1);
        assert!(header_str(props, headers::ERROR_CLASS).is_some());
        let error = header_str(props, headers::ERROR).unwrap();
        assert!(
            !error.contains("hunter2") && !error.contains("abc123"),
            "secret leaked: {error}"
        );
        assert!(error.len() <= headers::ERROR_TEXT_MAX_BYTES);
        if reason == "budget_exhausted" {
            assert!(header_u64(props, headers::BUDGET_ALLOWANCE).unwrap() >= 10);
            assert!(header_u64(props, headers::BUDGET_WINDOW_MS).is_some());
            assert_eq!(
                header_str(props, headers::BUDGET_SOURCE).as_deref(),
                Some("fleet")
            );
        } else {
            assert_eq!(
                header_str(props, headers::BUDGET_SOURCE).as_deref(),
                Some("not_consulted"),
                "{reason}: no budget was asked"
            );
        }
        for (key, value) in props.headers().as_ref().unwrap().inner() {
            // The broker may stamp its own delivery headers on the way to us; ours are all fb-.
            let broker = headers::BROKER_DELIVERY_HEADERS.contains(&key.as_str());
            assert!(
                broker || headers::is_application_header(key.as_str()),
                "header {key} = {value:?} is not an application header"
            );
        }
    }
    assert_eq!(reasons.get("non_retryable"), Some(&4), "{reasons:?}");

    // Retries arrive no sooner than their delay.
    let log_now = std::mem::take(&mut *log.lock().unwrap());
    let mut retries_seen = 0;
    for runs in log_now.executions.values() {
        for pair in runs.windows(2) {
            let (prev, next) = (&pair[0], &pair[1]);
            if next.0 == prev.0 + 1 {
                let delay = next.3.expect("a retry carries its delay");
                let waited = next.1 - prev.2.expect("the previous attempt failed");
                assert!(
                    waited >= delay,
                    "retry came after {waited:?}, before its delay {delay:?}"
                );
                retries_seen += 1;
            }
        }
    }
    assert!(retries_seen > 0, "the scenario must exercise retries");
    assert_eq!(
        u64::try_from(retries_seen).unwrap(),
        counts.retried,
        "{counts:?}"
    );

    // Accounting: submitted = succeeded + dead-lettered + parked, duplicates apart.
    let succeeded: BTreeSet<String> = log_now.succeeded.iter().cloned().collect();
    let dead_ids = ids(&dead);
    let duplicates = (log_now.succeeded.len() - succeeded.len()) + (dead.len() - dead_ids.len());
    assert!(succeeded.is_disjoint(&dead_ids));
    assert_eq!(
        succeeded.len() + dead_ids.len(),
        submitted.len(),
        "duplicates: {duplicates}"
    );
    assert_eq!(
        succeeded.union(&dead_ids).cloned().collect::<BTreeSet<_>>(),
        submitted
    );

    // Phase 2: the dependency recovered. Put the dead-letters back and replay them.
    let republisher = env.publisher().await;
    for (props, body) in &dead {
        republisher
            .publish(&env.topology.dead_exchange, "index", body, props.clone())
            .await
            .unwrap();
    }
    let log2 = Arc::new(Mutex::new(Vec::<String>::new()));
    let replayed = Arc::new(Mutex::new(Vec::<(u32, u32)>::new()));
    let runner = {
        let (log2, replayed) = (Arc::clone(&log2), Arc::clone(&replayed));
        start(env.budget().await, &env, move |job| {
            let (log2, replayed) = (Arc::clone(&log2), Arc::clone(&replayed));
            async move {
                replayed.lock().unwrap().push((job.attempt, job.replays));
                if job.payload == b"bad" || std::str::from_utf8(&job.payload).is_err() {
                    return Err(Failure::non_retryable("still bad"));
                }
                log2.lock().unwrap().push(job.message_id.unwrap());
                Ok(())
            }
        })
    };
    // Without a budget: the search budget is still spent from phase 1 and would pause the
    // replay for most of a window (that behaviour has its own test in replay.rs).
    let replayer = Replayer::new(env.url.clone(), env.topology.clone(), None);
    let report = replayer
        .run(&ReplayOptions::new(&env.config), |_| {})
        .await
        .unwrap();
    assert_eq!(usize::try_from(report.total).unwrap(), dead.len());
    assert_eq!(report.moved + report.parked, report.total, "{report:?}");
    wait_until(LONG, "replayed jobs settled", || async {
        let ok: BTreeSet<String> = log2.lock().unwrap().iter().cloned().collect();
        ok.len()
            + env.depth(&env.topology.dead_queue).await as usize
            + env.depth(&env.topology.parked_queue).await as usize
            == dead_ids.len()
    })
    .await;
    stop(runner).await;
    // Replay resets the attempt counter and counts itself.
    assert!(
        replayed.lock().unwrap().iter().all(|r| *r == (1, 1)),
        "{:?}",
        replayed.lock().unwrap()
    );
    let ok2: BTreeSet<String> = log2.lock().unwrap().iter().cloned().collect();
    let dead2: BTreeSet<String> = env.drain_ids(&env.topology.dead_queue).await;
    let parked: BTreeSet<String> = env.drain_ids(&env.topology.parked_queue).await;
    let all_ok: BTreeSet<String> = succeeded.union(&ok2).cloned().collect();
    assert_eq!(
        all_ok.len() + dead2.len() + parked.len(),
        submitted.len(),
        "ok {all_ok:?} dead {dead2:?} parked {parked:?}"
    );
    // The garbage-header job is parked? No: it was dead-lettered with full headers, so it is
    // replayed and succeeds now; the four undecodable or bad jobs are dead-lettered again.
    assert_eq!(dead2.len(), 3, "{dead2:?}");
}

/// Budget exhaustion dead-letters at once, and retries granted fleet-wide never exceed the
/// allowance with several workers, each with its own budget client.
#[tokio::test]
async fn budget_exhaustion_dead_letters_at_once_and_the_allowance_holds_across_workers() {
    let env = Env::new(
        "exhaust",
        "fallback = \"deny\"",
        "max_attempts = 10",
        "[dependencies.search]\ntasks = [\"index\"]\nmin_allowance = 5\nratio = 0.0\nwindow_secs = 86400\n",
    )
    .await;
    let publisher = env.publisher().await;
    let mut runners = Vec::new();
    for _ in 0..3 {
        runners.push(start(env.budget().await, &env, |_job| async {
            Err(Failure::retryable("503").with_class("http_503"))
        }));
    }
    for i in 0..30 {
        publisher
            .publish_job(
                &env.topology.work_exchange,
                "index",
                "index",
                format!("{i}").as_bytes(),
            )
            .await
            .unwrap();
    }
    wait_until(LONG, "30 dead-letters", || async {
        env.depth(&env.topology.dead_queue).await == 30
    })
    .await;
    let mut retried = 0;
    for r in runners {
        retried += stop(r).await.retried;
    }
    assert_eq!(
        retried, 5,
        "retries granted fleet-wide must equal the allowance of 5"
    );
    let budget = env.budget().await;
    let (snapshot, _) = budget.status(&Dependency::new("search").unwrap()).await;
    assert_eq!(
        snapshot.current.retries + snapshot.previous.retries,
        5,
        "{snapshot:?}"
    );
    assert!(snapshot.current.denied >= 25, "{snapshot:?}");
    let dead = env.drain(&env.topology.dead_queue).await;
    let mut at_once = 0;
    let mut extra_attempts = 0;
    for (props, _) in &dead {
        assert_eq!(
            header_str(props, headers::REASON).as_deref(),
            Some("budget_exhausted")
        );
        let attempts = header_u64(props, headers::ATTEMPTS).unwrap();
        extra_attempts += attempts - 1;
        if attempts == 1 {
            at_once += 1;
            assert!(
                header_u64(props, headers::RETRY_DELAY_MS).is_none(),
                "dead-lettered at once, no retry scheduled"
            );
        }
    }
    assert_eq!(
        extra_attempts, 5,
        "executions beyond the first are exactly the granted retries"
    );
    assert!(at_once >= 25);
}

async fn delete_exchange(env: &Env, name: &str) {
    let conn = env.connection().await;
    let ch = conn.create_channel().await.unwrap();
    ch.exchange_delete(ShortString::from(name), ExchangeDeleteOptions::default())
        .await
        .unwrap();
    let _ = conn.close(200, ShortString::from("bye")).await;
}

async fn remigrate(env: &Env) {
    migrate(
        &env.url,
        &env.config.amqp,
        &Migrations::embedded().unwrap(),
        false,
    )
    .await
    .unwrap();
}

/// No loss: the dead-letter exchange is missing (the broker closes the publishing channel), so
/// the original is not acked and comes back; once the exchange exists again it is dead-lettered.
#[tokio::test]
async fn no_loss_when_the_dead_letter_exchange_is_missing() {
    let env = Env::new("noloss-dlx", "", "", "").await;
    delete_exchange(&env, &env.topology.dead_exchange).await;
    let calls = Arc::new(AtomicU32::new(0));
    let redelivered = Arc::new(AtomicBool::new(false));
    let runner = {
        let (calls, redelivered) = (Arc::clone(&calls), Arc::clone(&redelivered));
        start(env.budget().await, &env, move |job| {
            calls.fetch_add(1, Ordering::SeqCst);
            if job.redelivered {
                redelivered.store(true, Ordering::SeqCst);
            }
            async { Err(Failure::non_retryable("bad input")) }
        })
    };
    let id = env.publish_one(b"x").await;
    wait_until(LONG, "the job to come back", || async {
        calls.load(Ordering::SeqCst) >= 3
    })
    .await;
    assert!(
        redelivered.load(Ordering::SeqCst),
        "the original came back as a redelivery"
    );
    assert_eq!(runner.0.counts().dead_lettered, 0);
    assert!(runner.0.counts().requeued >= 2);
    remigrate(&env).await;
    wait_until(LONG, "the dead-letter", || async {
        env.depth(&env.topology.dead_queue).await == 1
    })
    .await;
    let counts = stop(runner).await;
    assert_eq!(counts.dead_lettered, 1);
    let dead = env.drain(&env.topology.dead_queue).await;
    assert_eq!(message_id(&dead[0].0), id);
    assert_eq!(env.depth(&env.topology.work_queue).await, 0);
}

/// No loss: the retry tier exchanges are missing, so the retry is not confirmed, the original is
/// requeued, and once the tiers exist the job is retried and succeeds.
#[tokio::test]
async fn no_loss_when_the_retry_publish_cannot_be_confirmed() {
    let env = Env::new("noloss-retry", "", "", "").await;
    for tier in &env.topology.retry_tiers {
        delete_exchange(&env, &tier.exchange).await;
    }
    let calls = Arc::new(AtomicU32::new(0));
    let tiers_back = Arc::new(AtomicBool::new(false));
    let runner = {
        let (calls, tiers_back) = (Arc::clone(&calls), Arc::clone(&tiers_back));
        start(env.budget().await, &env, move |job| {
            calls.fetch_add(1, Ordering::SeqCst);
            let ok = job.attempt > 1 && tiers_back.load(Ordering::SeqCst);
            async move {
                if ok {
                    Ok(())
                } else {
                    Err(Failure::retryable("timeout").with_class("timeout"))
                }
            }
        })
    };
    env.publish_one(b"x").await;
    wait_until(LONG, "the job to come back", || async {
        calls.load(Ordering::SeqCst) >= 3
    })
    .await;
    assert_eq!(runner.0.counts().retried, 0);
    assert!(runner.0.counts().requeued >= 2);
    remigrate(&env).await;
    tiers_back.store(true, Ordering::SeqCst);
    wait_until(LONG, "the retried job to succeed", || async {
        runner.0.counts().succeeded == 1
    })
    .await;
    let counts = stop(runner).await;
    assert!(counts.retried >= 1, "{counts:?}");
    assert_eq!(
        env.depth(&env.topology.work_queue).await + env.depth(&env.topology.dead_queue).await,
        0
    );
}

/// No loss: the dead-letter queue is gone, so the dead-letter is returned unroutable (`Ack`
/// with a returned message is not a delivery); the original is requeued until it can go.
#[tokio::test]
async fn no_loss_when_the_dead_letter_is_returned_unroutable() {
    let env = Env::new("noloss-return", "", "", "").await;
    let conn = env.connection().await;
    let ch = conn.create_channel().await.unwrap();
    ch.queue_delete(
        ShortString::from(env.topology.dead_queue.as_str()),
        QueueDeleteOptions::default(),
    )
    .await
    .unwrap();
    let _ = conn.close(200, ShortString::from("bye")).await;
    let calls = Arc::new(AtomicU32::new(0));
    let runner = {
        let calls = Arc::clone(&calls);
        start(env.budget().await, &env, move |_job| {
            calls.fetch_add(1, Ordering::SeqCst);
            async { Err(Failure::poison("not json")) }
        })
    };
    let id = env.publish_one(b"{").await;
    wait_until(LONG, "the job to come back", || async {
        calls.load(Ordering::SeqCst) >= 3
    })
    .await;
    assert_eq!(runner.0.counts().dead_lettered, 0);
    remigrate(&env).await;
    wait_until(LONG, "the dead-letter", || async {
        env.depth(&env.topology.dead_queue).await == 1
    })
    .await;
    stop(runner).await;
    assert_eq!(
        message_id(&env.drain(&env.topology.dead_queue).await[0].0),
        id
    );
}

const CHILD_ENV: &str = "FLEET_BUDGET_AMQP_TEST_CHILD_CONFIG";

/// Not a test on its own: the body of the child process of
/// `a_killed_worker_process_has_its_job_redelivered` (runs only when the variable is set).
#[test]
fn child_worker_process() {
    let Ok(toml) = std::env::var(CHILD_ENV) else {
        return;
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async move {
        let config = WorkerConfig::from_toml(&toml, "child").unwrap();
        let topology = fleet_budget_amqp::Topology::new(&config.amqp);
        let budget = FleetBudget::from_config(&config.budget).await.unwrap();
        let worker = Worker::new(
            budget,
            topology.clone(),
            WorkerOptions::new(&config, &topology),
        );
        worker
            .run(|job| async move {
                println!("STARTED {}", job.message_id.unwrap_or_default());
                tokio::time::sleep(Duration::from_secs(3600)).await;
                Ok(())
            })
            .await
            .unwrap();
    });
}

/// Kills the child process even when the test fails.
struct ChildGuard(std::process::Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A worker process killed (SIGKILL) mid-job: the broker redelivers the job to another worker.
#[tokio::test]
async fn a_killed_worker_process_has_its_job_redelivered() {
    let env = Env::new("killed", "", "", "").await;
    let mut child = ChildGuard(
        Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "child_worker_process",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env(CHILD_ENV, &env.toml)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let id = env.publish_one(b"x").await;
    let stdout = child.0.stdout.take().unwrap();
    let started = tokio::task::spawn_blocking(move || {
        for line in BufReader::new(stdout).lines() {
            let line = line.unwrap();
            // The harness prints "test child_worker_process ... " before the job's line.
            if let Some(at) = line.find("STARTED ") {
                return Some(line[at + "STARTED ".len()..].trim().to_owned());
            }
        }
        None
    });
    let started = tokio::time::timeout(LONG, started)
        .await
        .expect("the child starts the job")
        .unwrap();
    assert_eq!(started.as_deref(), Some(id.as_str()));
    child.0.kill().unwrap(); // SIGKILL: no shutdown, no ack, no nack
    child.0.wait().unwrap();

    let seen = Arc::new(Mutex::new(Vec::new()));
    let runner = {
        let seen = Arc::clone(&seen);
        start(env.budget().await, &env, move |job| {
            seen.lock().unwrap().push((
                job.message_id.clone().unwrap(),
                job.redelivered,
                job.attempt,
            ));
            async { Ok(()) }
        })
    };
    wait_until(LONG, "the redelivery", || async {
        !seen.lock().unwrap().is_empty()
    })
    .await;
    stop(runner).await;
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen, vec![(id, true, 1)]);
    assert_eq!(env.depth(&env.topology.work_queue).await, 0);
}

/// Graceful shutdown lets in-flight jobs finish (acked, not requeued) and flushes the coalesced
/// success counters to Redis.
#[tokio::test]
async fn graceful_shutdown_finishes_in_flight_jobs_and_flushes_counters() {
    let env = Env::new(
        "shutdown",
        "deposit_flush_ms = 10000",
        "",
        "[dependencies.search]\ntasks = [\"index\"]\n",
    )
    .await;
    let started = Arc::new(AtomicU32::new(0));
    let runner = {
        let started = Arc::clone(&started);
        start(env.budget().await, &env, move |_job| {
            started.fetch_add(1, Ordering::SeqCst);
            async {
                tokio::time::sleep(Duration::from_millis(800)).await;
                Ok(())
            }
        })
    };
    let publisher = env.publisher().await;
    for _ in 0..4 {
        publisher
            .publish_job(&env.topology.work_exchange, "index", "index", b"x")
            .await
            .unwrap();
    }
    wait_until(LONG, "four jobs in flight", || async {
        started.load(Ordering::SeqCst) == 4
    })
    .await;
    let counts = stop(runner).await;
    assert_eq!(counts.succeeded, 4, "{counts:?}");
    assert_eq!(env.depth(&env.topology.work_queue).await, 0);
    let (snapshot, _) = env
        .budget()
        .await
        .status(&Dependency::new("search").unwrap())
        .await;
    assert_eq!(
        snapshot.current.successes + snapshot.previous.successes,
        4,
        "counters flushed at shutdown: {snapshot:?}"
    );
}

/// A TCP forwarder to the broker whose connections the test can cut.
struct Proxy {
    port: u16,
    tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Proxy {
    async fn start(target: String) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let tasks: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let t = Arc::clone(&tasks);
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let target = target.clone();
                let task = tokio::spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                t.lock().unwrap().push(task);
            }
        });
        Self { port, tasks }
    }

    fn cut(&self) {
        for t in self.tasks.lock().unwrap().drain(..) {
            t.abort();
        }
    }
}

/// `amqp://user:pass@host:port/vhost` → (host:port, the same URL through 127.0.0.1:`port`).
fn via_proxy(url: &str, port: u16) -> (String, String) {
    let (scheme, rest) = url.split_once("://").unwrap();
    let (auth, rest) = rest.split_once('@').map_or(("", rest), |(a, r)| (a, r));
    let (hostport, path) = rest.split_once('/').map_or((rest, ""), |(h, p)| (h, p));
    let target = if hostport.contains(':') {
        hostport.to_owned()
    } else {
        format!("{hostport}:5672")
    };
    let at = if auth.is_empty() {
        String::new()
    } else {
        format!("{auth}@")
    };
    (target, format!("{scheme}://{at}127.0.0.1:{port}/{path}"))
}

/// A dropped connection is re-established with backoff and consuming resumes.
#[tokio::test]
async fn a_dropped_connection_is_reestablished_and_consuming_resumes() {
    let env = Env::new("reconnect", "", "", "").await;
    let (target, _) = via_proxy(&env.url, 0);
    let proxy = Proxy::start(target).await;
    let (_, proxied) = via_proxy(&env.url, proxy.port);
    let mut opts = options(&env);
    opts.url = proxied;
    let done = Arc::new(Mutex::new(Vec::new()));
    let worker = Worker::new(env.budget().await, env.topology.clone(), opts);
    let handle = worker.handle();
    let join = {
        let done = Arc::clone(&done);
        tokio::spawn(async move {
            worker
                .run(move |job| {
                    done.lock().unwrap().push(job.message_id.unwrap());
                    async { Ok(()) }
                })
                .await
                .unwrap()
        })
    };
    let publisher = env.publisher().await;
    let first = publisher
        .publish_job(&env.topology.work_exchange, "t", "t", b"1")
        .await
        .unwrap();
    wait_until(LONG, "the first job", || async {
        done.lock().unwrap().len() == 1
    })
    .await;
    proxy.cut();
    let second = publisher
        .publish_job(&env.topology.work_exchange, "t", "t", b"2")
        .await
        .unwrap();
    wait_until(LONG, "the second job after reconnecting", || async {
        done.lock().unwrap().contains(&second)
    })
    .await;
    let counts = stop((handle, join)).await;
    assert!(counts.connections >= 2, "{counts:?}");
    assert!(done.lock().unwrap().contains(&first));
    assert_eq!(env.depth(&env.topology.work_queue).await, 0);
}

/// (attempt, started, retry delay)
type Run = (u32, Instant, Option<Duration>);

/// A backoff delay longer than the longest tier: the retry comes back early, waits in a tier
/// again without running (or spending budget), and runs no sooner than its delay.
#[tokio::test]
async fn a_delay_longer_than_every_tier_is_waited_out() {
    let env = Env::with_amqp(
        "longdelay",
        "retry_tiers_secs = [0.1, 0.2]",
        "",
        "",
        "[tasks.t]\nbackoff_base_ms = 600\nbackoff_cap_ms = 600\n",
    )
    .await;
    let runs: Arc<Mutex<Vec<Run>>> = Arc::default();
    let runner = {
        let runs = Arc::clone(&runs);
        start(env.budget().await, &env, move |job| {
            runs.lock()
                .unwrap()
                .push((job.attempt, Instant::now(), job.retry_delay()));
            let ok = job.attempt > 1;
            async move {
                if ok {
                    Ok(())
                } else {
                    Err(Failure::retryable("timeout"))
                }
            }
        })
    };
    env.publish_one(b"x").await;
    wait_until(LONG, "the retry to succeed", || async {
        runner.0.counts().succeeded == 1
    })
    .await;
    let counts = stop(runner).await;
    let runs = runs.lock().unwrap().clone();
    assert_eq!(runs.len(), 2, "the handler runs once per attempt: {runs:?}");
    let delay = runs[1].2.unwrap();
    assert!(
        delay > Duration::from_millis(200),
        "jitter keeps the delay in [300, 600] ms: {delay:?}"
    );
    assert!(
        runs[1].1 - runs[0].1 >= delay,
        "ran after {:?}, before its delay {delay:?}",
        runs[1].1 - runs[0].1
    );
    assert!(counts.waited_again >= 1, "{counts:?}");
    assert_eq!(counts.retried, 1, "{counts:?}");
}
