//! The circuit breaker in the worker, end to end (real RabbitMQ, private Redis): once failures
//! open it, jobs are held in the delay tiers without running or spending an attempt; a probe
//! finds recovery, the breaker closes and the backlog drains; a job held past `max_wait_secs`
//! is dead-lettered `circuit_open`.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use fleet_budget::Failure;
use fleet_budget_amqp::headers;

use super::{LONG, start, stop};
use crate::common::{Env, header_str, header_u64, wait_until};

const DOWN: &str = "[dependencies.down]\ntasks = [\"t\"]\n[tasks.t]\nmax_attempts = 20\n";

#[tokio::test]
async fn jobs_wait_while_the_breaker_is_open_and_drain_once_a_probe_finds_recovery() {
    let env = Env::new(
        "breaker-drain",
        "",
        "",
        &format!(
            "{DOWN}[dependencies.down.breaker]\nmin_volume = 3\nfailure_ratio = 0.5\nopen_secs = 2\nhalf_open_probes = 1\nclose_after = 1\nmax_wait_secs = 600\n"
        ),
    )
    .await;
    let down = Arc::new(AtomicBool::new(true));
    let failed = Arc::new(AtomicU32::new(0));
    let succeeded_at = Arc::new(Mutex::new(Vec::new()));
    let budget = env.budget().await;
    let runner = {
        let (down, failed, succeeded_at) = (
            Arc::clone(&down),
            Arc::clone(&failed),
            Arc::clone(&succeeded_at),
        );
        start(budget.clone(), &env, move |job| {
            let result = if down.load(Ordering::SeqCst) {
                failed.fetch_add(1, Ordering::SeqCst);
                Err(Failure::retryable("503").with_class("http_503"))
            } else {
                succeeded_at.lock().unwrap().push(job.attempt);
                Ok(())
            };
            async move { result }
        })
    };
    for _ in 0..3 {
        env.publish_one(b"x").await;
    }
    // Three failures open it; the retries come back and are held instead of running.
    let handle = runner.0.clone();
    wait_until(LONG, "a retry held by the open breaker", || async {
        handle.counts().held >= 1
    })
    .await;
    assert_eq!(budget.metrics().breaker_transitions("down", "open"), 1);
    down.store(false, Ordering::SeqCst);
    wait_until(LONG, "the backlog drained", || async {
        succeeded_at.lock().unwrap().len() == 3
    })
    .await;
    let counts = stop(runner).await;
    let m = budget.metrics();
    assert!(m.breaker_transitions("down", "open") >= 1);
    assert_eq!(m.breaker_transitions("down", "closed"), 1);
    assert!(failed.load(Ordering::SeqCst) >= 3, "the minimum volume");
    // Holding spent no attempt: each job's successful attempt is one past its own failures.
    let attempts: u32 = succeeded_at.lock().unwrap().iter().map(|a| a - 1).sum();
    assert_eq!(attempts, failed.load(Ordering::SeqCst));
    assert_eq!((counts.succeeded, counts.dead_lettered), (3, 0));
    assert!(counts.held >= 1, "{counts:?}");
    assert_eq!(env.depth(&env.topology.dead_queue).await, 0);
}

#[tokio::test]
async fn a_job_held_past_its_limit_is_dead_lettered_circuit_open() {
    let env = Env::new(
        "breaker-limit",
        "",
        "",
        &format!(
            "{DOWN}[dependencies.down.breaker]\nmin_volume = 3\nfailure_ratio = 0.5\nopen_secs = 600\nmax_wait_secs = 1\n"
        ),
    )
    .await;
    let ran = Arc::new(AtomicU32::new(0));
    let runner = {
        let ran = Arc::clone(&ran);
        start(env.budget().await, &env, move |_job| {
            ran.fetch_add(1, Ordering::SeqCst);
            async { Err(Failure::retryable("503")) }
        })
    };
    for _ in 0..3 {
        env.publish_one(b"x").await;
    }
    wait_until(LONG, "three dead letters", || async {
        env.depth(&env.topology.dead_queue).await == 3
    })
    .await;
    let counts = stop(runner).await;
    let ran = u64::from(ran.load(Ordering::SeqCst));
    assert!(ran >= 3, "the minimum volume");
    // Each job ran once per attempt before the one that was held and dead-lettered: no
    // execution and no attempt while it waited.
    let mut executions = 0;
    for (props, _) in env.drain(&env.topology.dead_queue).await {
        assert_eq!(
            header_str(&props, headers::REASON).as_deref(),
            Some("circuit_open")
        );
        assert_eq!(header_str(&props, headers::TASK).as_deref(), Some("t"));
        executions += header_u64(&props, headers::ATTEMPTS).unwrap() - 1;
    }
    assert_eq!(executions, ran);
    assert!(counts.held >= 3, "{counts:?}");
}
