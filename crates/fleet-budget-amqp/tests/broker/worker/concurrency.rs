//! The concurrency budget in the worker, end to end (real RabbitMQ, private Redis): a retry that
//! finds the retry share taken when it is to run is dead-lettered `concurrency_retry_share`
//! without running; every call's lease is given back; a primary at the cap with
//! `primary_waits` is held in a tier without running or spending an attempt, then
//! dead-lettered `concurrency_cap` after `max_wait_secs`.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use fleet_budget::concurrency::{ConcurrencyBudget, LeaseKind};
use fleet_budget::store::RedisStore;
use fleet_budget::{Dependency, Failure};
use fleet_budget_amqp::headers;

use super::{LONG, start, stop};
use crate::common::{Env, header_str, header_u64, wait_until};

fn leases(env: &Env) -> ConcurrencyBudget {
    ConcurrencyBudget::new(Arc::new(
        RedisStore::from_settings(&env.config.budget.redis).unwrap(),
    ))
}

fn in_flight(env: &Env) -> (u64, u64) {
    (
        env.redis.cmd(&["ZCARD", "fb:v1:{paid}:lp"]),
        env.redis.cmd(&["ZCARD", "fb:v1:{paid}:lr"]),
    )
}

/// Executions that were retries (attempt 2) so far.
fn retried(attempts: &Mutex<Vec<u32>>) -> usize {
    attempts.lock().unwrap().iter().filter(|a| **a == 2).count()
}

#[tokio::test]
async fn a_retry_without_a_slot_is_dead_lettered_naming_the_concurrency_budget() {
    let env = Env::new(
        "conc-share",
        "",
        "min_allowance = 100",
        "[dependencies.paid]\ntasks = [\"t\"]\n[dependencies.paid.concurrency]\ncap = 10\nplanned_primary = 8\nmin_retry_slots = 1\nlease_secs = 60\n",
    )
    .await;
    let dependency = Dependency::new("paid").unwrap();
    let policy = env.config.budget.concurrency[&dependency];
    // Another worker's retry holds the only retry slot (max(1, floor(0.25 × 0))).
    let other = leases(&env)
        .acquire(&dependency, &policy, LeaseKind::Retry)
        .await
        .unwrap()
        .lease
        .unwrap();
    let attempts = Arc::new(Mutex::new(Vec::new()));
    let runner = {
        let attempts = Arc::clone(&attempts);
        start(env.budget().await, &env, move |job| {
            attempts.lock().unwrap().push(job.attempt);
            let first = job.attempt == 1;
            async move {
                if first {
                    Err(Failure::retryable("503").with_class("http_503"))
                } else {
                    Ok(())
                }
            }
        })
    };
    for _ in 0..3 {
        env.publish_one(b"x").await;
    }
    wait_until(LONG, "three dead letters", || async {
        env.depth(&env.topology.dead_queue).await == 3
    })
    .await;
    assert_eq!(
        *attempts.lock().unwrap(),
        [1, 1, 1],
        "no retry ran without a slot"
    );
    for (props, _) in env.drain(&env.topology.dead_queue).await {
        assert_eq!(
            header_str(&props, headers::REASON).as_deref(),
            Some("concurrency_retry_share")
        );
        assert_eq!(
            header_str(&props, headers::BUDGET_SOURCE).as_deref(),
            Some("fleet")
        );
        assert_eq!(header_u64(&props, headers::ATTEMPTS), Some(2));
    }
    assert_eq!(in_flight(&env), (0, 1), "only the other worker's lease");
    // Once the slot is free, retries run. One job at a time, each published once the last one's
    // lease is given back: the share is one slot, so two retries in flight at once would rightly
    // refuse the second (dead-lettered `concurrency_retry_share`, never retried). Three jobs
    // published together did that whenever their retries came back close enough to overlap
    // (the machine loaded), and the wait for a third success then never ended.
    leases(&env).release(&other).await.unwrap();
    for done in 1..=3 {
        env.publish_one(b"y").await;
        wait_until(
            LONG,
            "the job retried, succeeded and gave its lease back",
            || async {
                let dead = env.depth(&env.topology.dead_queue).await;
                assert_eq!(dead, 0, "a retry with a free slot was refused");
                retried(&attempts) == done && in_flight(&env) == (0, 0)
            },
        )
        .await;
    }
    let counts = stop(runner).await;
    assert_eq!((counts.succeeded, counts.dead_lettered), (3, 3));
    assert_eq!(in_flight(&env), (0, 0), "every lease given back");
}

#[tokio::test]
async fn a_waiting_primary_is_held_without_running_then_dead_lettered_after_its_limit() {
    let env = Env::new(
        "conc-wait",
        "",
        "",
        "[dependencies.paid]\ntasks = [\"t\"]\n[dependencies.paid.concurrency]\ncap = 1\nplanned_primary = 1\nprimary_waits = true\nmax_wait_secs = 1\n",
    )
    .await;
    let dependency = Dependency::new("paid").unwrap();
    let policy = env.config.budget.concurrency[&dependency];
    let holder = leases(&env)
        .acquire(&dependency, &policy, LeaseKind::Primary)
        .await
        .unwrap()
        .lease
        .unwrap();
    let ran = Arc::new(AtomicU32::new(0));
    let runner = {
        let ran = Arc::clone(&ran);
        start(env.budget().await, &env, move |_job| {
            ran.fetch_add(1, Ordering::SeqCst);
            async { Ok(()) }
        })
    };
    let id = env.publish_one(b"x").await;
    wait_until(LONG, "the held job dead-lettered", || async {
        env.depth(&env.topology.dead_queue).await == 1
    })
    .await;
    assert_eq!(ran.load(Ordering::SeqCst), 0, "a held job never runs");
    let dead = env.drain(&env.topology.dead_queue).await;
    let props = &dead[0].0;
    assert_eq!(headers::message_id(props), Some(id.as_str()));
    assert_eq!(
        header_str(props, headers::REASON).as_deref(),
        Some("concurrency_cap")
    );
    assert_eq!(
        header_u64(props, headers::ATTEMPTS),
        Some(1),
        "no attempt spent"
    );
    assert_eq!(
        header_str(props, headers::ORIGINAL_ROUTING_KEY).as_deref(),
        Some("t")
    );
    leases(&env).release(&holder).await.unwrap();
    env.publish_one(b"y").await;
    wait_until(LONG, "the next job runs", || async {
        ran.load(Ordering::SeqCst) == 1
    })
    .await;
    let counts = stop(runner).await;
    assert!(counts.held >= 1, "{counts:?}");
    assert_eq!((counts.succeeded, counts.dead_lettered), (1, 1));
}
