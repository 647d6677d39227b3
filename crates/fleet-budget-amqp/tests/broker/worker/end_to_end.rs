//! End to end: jobs succeed or are dead-lettered with reason and headers, then replayed; the
//! allowance holds across workers.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fleet_budget::{Dependency, Failure};
use fleet_budget_amqp::headers;
use fleet_budget_amqp::{ReplayOptions, Replayer};
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};

use super::{LONG, start, stop};
use crate::common::{Env, header_str, header_u64, ids, message_id, wait_until};

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
            // The fleet budget's denial: from Redis, or one it gave that still stands in this
            // process (redis.deny_cache_ms).
            let source = header_str(props, headers::BUDGET_SOURCE);
            assert!(
                matches!(source.as_deref(), Some("fleet" | "fleet_cache")),
                "{source:?}"
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

/// An operator's freeze (`budgetctl budget freeze`): no retry is granted, the floor included;
/// each failed job is dead-lettered at once with the reason `budget_frozen`.
#[tokio::test]
async fn a_frozen_dependency_dead_letters_failed_jobs_as_budget_frozen() {
    use fleet_budget::control::{AuditLog, OverrideAction, overrides};
    use fleet_budget::store::RedisStore;

    let env = Env::new(
        "frozen",
        "fallback = \"deny\"",
        "max_attempts = 10",
        "[dependencies.search]\ntasks = [\"t\"]\nmin_allowance = 50\n",
    )
    .await;
    let store = RedisStore::from_settings(&env.config.budget.redis).unwrap();
    let search = Dependency::new("search").unwrap();
    overrides::apply(
        &store,
        &AuditLog::default(),
        &search,
        OverrideAction::Freeze {
            duration: Duration::from_secs(3600),
        },
        "test",
        "incident drill",
    )
    .await
    .unwrap();
    let runner = start(env.budget().await, &env, |_job| async {
        Err(Failure::retryable("503").with_class("http_503"))
    });
    for _ in 0..4 {
        env.publish_one(b"x").await;
    }
    wait_until(LONG, "4 dead-letters", || async {
        env.depth(&env.topology.dead_queue).await == 4
    })
    .await;
    assert_eq!(stop(runner).await.retried, 0, "a freeze grants nothing");
    for (props, _) in &env.drain(&env.topology.dead_queue).await {
        assert_eq!(
            header_str(props, headers::REASON).as_deref(),
            Some("budget_frozen")
        );
        assert_eq!(header_u64(props, headers::ATTEMPTS), Some(1));
    }
}
