//! Names and delays that come from the message are bounded (issue 9, items 5 and 6): unmapped
//! task names by the thousand get at most the cap of budgets and metric label values, a refused
//! unmapped name is dead-lettered without running, and a wait past `max_delay` (a `Retry-After`
//! or a `fb-not-before-ms`) is dead-lettered `delay_exceeded` instead of circling the tiers.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleet_budget::Failure;
use fleet_budget_amqp::headers;
use lapin::BasicProperties;
use lapin::types::{FieldTable, ShortString};
use prometheus::proto::MetricFamily;

use super::{LONG, start, stop};
use crate::common::{Env, header_str, message_id, wait_until};

/// The distinct values of label `label` across `families`.
fn label_values(families: &[MetricFamily], label: &str) -> BTreeSet<String> {
    families
        .iter()
        .flat_map(|f| f.get_metric())
        .flat_map(|m| m.get_label())
        .filter(|l| l.name() == label)
        .map(|l| l.value().to_owned())
        .collect()
}

/// Tasks the handler ran, by message id.
type Ran = Arc<Mutex<Vec<(String, String)>>>;

/// A thousand unmapped task names (a producer bug, a hostile producer): each job runs, but only
/// the first 3 names get a budget of their own; the rest share `unmapped`. Budgets in Redis and
/// `dependency` label values stay within cap + the overflow + the configured dependency.
#[tokio::test]
async fn a_thousand_unmapped_names_make_at_most_the_cap_of_budgets_and_label_values() {
    let env = Env::new(
        "unmapped-cap",
        "",
        "",
        "[dependencies.search]\ntasks = [\"index\"]\n[unmapped_tasks]\nmax_own_budgets = 3\n",
    )
    .await;
    let budget = env.budget().await;
    let ran: Ran = Arc::default();
    let runner = {
        let ran = Arc::clone(&ran);
        start(budget.clone(), &env, move |job| {
            ran.lock()
                .unwrap()
                .push((job.message_id.clone().unwrap(), job.task.clone()));
            // One in ten fails: dead-letters are labelled by dependency too.
            let fail = job.attempt == 1 && job.payload.ends_with(b"3");
            async move {
                if fail {
                    Err(Failure::non_retryable("bad input"))
                } else {
                    Ok(())
                }
            }
        })
    };
    let publisher = env.publisher().await;
    let names = 1000;
    for i in 0..names {
        let task = format!("stranger-{i}");
        publisher
            .publish_job(
                &env.topology.work_exchange,
                &task,
                &task,
                format!("{i}").as_bytes(),
            )
            .await
            .unwrap();
    }
    publisher
        .publish_job(&env.topology.work_exchange, "index", "index", b"0")
        .await
        .unwrap();
    wait_until(LONG, "every job ran", || async {
        ran.lock().unwrap().len() > names
    })
    .await;
    let dead = 100; // i ≡ 3 (mod 10)
    wait_until(LONG, "every failed job dead-lettered", || async {
        env.depth(&env.topology.dead_queue).await == dead
    })
    .await;
    let counts = stop(runner).await;
    assert_eq!(counts.succeeded + counts.dead_lettered, 1001, "{counts:?}");
    budget.flush().await.unwrap();

    // Which 3 names were first is up to the order of processing; there are 3 and no more.
    let own = |names: &BTreeSet<String>| -> BTreeSet<String> {
        names
            .iter()
            .filter(|n| n.starts_with("stranger-"))
            .cloned()
            .collect()
    };
    let labels = label_values(&budget.metrics().registry().gather(), "dependency");
    assert_eq!(own(&labels).len(), 3, "dependency label values {labels:?}");
    assert_eq!(labels.len(), 5, "3 own, unmapped, search: {labels:?}");
    assert!(
        labels.contains("unmapped") && labels.contains("search"),
        "{labels:?}"
    );
    assert_eq!(budget.metrics().counter("first_attempts", "unmapped"), 997);

    // Every key but the worker registry's two, the dead-letter indexes (one per fleet and
    // queue, whatever the tasks; the index's rows are bounded on their own) and the dead-letter
    // ledgers (one per queue and hour, kept 14 days: bounded by time, not by the tasks), and
    // the index's writer keys (one per queue and worker process, gone 10 minutes after its
    // last batch: bounded by the fleet).
    let prefix = &env.config.budget.redis.key_prefix;
    let hour = fleet_budget::clock::now_ms() / 3_600_000;
    let mut registry = vec![
        fleet_budget::keys::workers_key(prefix),
        fleet_budget::keys::workers_seen_key(prefix),
    ];
    for queue in [&env.topology.dead_queue, &env.topology.parked_queue] {
        registry.push(fleet_budget::keys::dead_letters_key(prefix, queue));
        for h in [hour.saturating_sub(1), hour] {
            registry.push(fleet_budget::keys::dead_letters_key(
                prefix,
                &fleet_budget_amqp::dead_letters::ledger_queue(queue, h),
            ));
        }
    }
    let keys: Vec<String> = env.redis.cmd(&["KEYS", &format!("{prefix}:*")]);
    let writers = format!("{prefix}:v1:dead-letters-writer:");
    let keys: Vec<String> = keys
        .into_iter()
        .filter(|k| !registry.contains(k) && !k.starts_with(&writers))
        .collect();
    assert!(keys.len() <= 5, "budget keys {keys:?}");
    assert!(keys.iter().any(|k| k.contains("{unmapped}")), "{keys:?}");
    let mut expected = own(&labels);
    expected.extend(["unmapped".to_owned(), "search".to_owned()]);

    // The dead letters say which budget they spent.
    for (props, _) in env.drain(&env.topology.dead_queue).await {
        let dependency = header_str(&props, headers::DEPENDENCY).unwrap();
        assert!(expected.contains(&dependency), "{dependency}");
    }
}

/// `[unmapped_tasks] policy = "reject"`: an unmapped task is dead-lettered `non_retryable`,
/// class `unmapped_task`, without running; a mapped one runs.
#[tokio::test]
async fn rejected_unmapped_tasks_are_dead_lettered_without_running() {
    let env = Env::new(
        "unmapped-reject",
        "",
        "",
        "[dependencies.search]\ntasks = [\"index\"]\n[unmapped_tasks]\npolicy = \"reject\"\n",
    )
    .await;
    let ran: Ran = Arc::default();
    let runner = {
        let ran = Arc::clone(&ran);
        start(env.budget().await, &env, move |job| {
            ran.lock()
                .unwrap()
                .push((job.message_id.unwrap(), job.task));
            async { Ok(()) }
        })
    };
    let publisher = env.publisher().await;
    publisher
        .publish_job(&env.topology.work_exchange, "index", "index", b"ok")
        .await
        .unwrap();
    let stranger = publisher
        .publish_job(&env.topology.work_exchange, "stranger", "stranger", b"x")
        .await
        .unwrap();
    wait_until(LONG, "the stranger dead-lettered", || async {
        env.depth(&env.topology.dead_queue).await == 1
    })
    .await;
    wait_until(LONG, "index ran", || async {
        !ran.lock().unwrap().is_empty()
    })
    .await;
    stop(runner).await;
    let tasks: Vec<String> = ran.lock().unwrap().iter().map(|(_, t)| t.clone()).collect();
    assert_eq!(tasks, ["index"], "the stranger never ran");
    let (props, body) = env.get(&env.topology.dead_queue).await.unwrap();
    assert_eq!(message_id(&props), stranger);
    assert_eq!(body, b"x");
    assert_eq!(
        header_str(&props, headers::REASON).as_deref(),
        Some("non_retryable")
    );
    assert_eq!(
        header_str(&props, headers::ERROR_CLASS).as_deref(),
        Some("unmapped_task")
    );
    assert!(
        header_str(&props, headers::ERROR)
            .unwrap()
            .contains("unmapped tasks are rejected"),
    );
}

/// A `Retry-After` past the task's `max_delay` is dead-lettered `delay_exceeded` before any
/// budget is asked; one within it is honoured.
#[tokio::test]
async fn a_retry_after_past_max_delay_is_dead_lettered_delay_exceeded() {
    let env = Env::new(
        "max-delay",
        "",
        "max_attempts = 3",
        "[dependencies.api]\ntasks = [\"t\"]\n[tasks.t]\nmax_delay_secs = 60\n",
    )
    .await;
    let budget = env.budget().await;
    let ran: Ran = Arc::default();
    let runner = {
        let ran = Arc::clone(&ran);
        start(budget.clone(), &env, move |job| {
            ran.lock()
                .unwrap()
                .push((job.message_id.clone().unwrap(), job.task.clone()));
            let result = match (&job.payload[..], job.attempt) {
                (b"far", _) => Err(Failure::retry_after(
                    Duration::from_secs(86_400),
                    "429, come back tomorrow",
                )
                .with_class("http_429")),
                (b"near", 1) => Err(Failure::retry_after(Duration::from_millis(300), "429")),
                _ => Ok(()),
            };
            async move { result }
        })
    };
    let far = env.publish_one(b"far").await;
    let near = env.publish_one(b"near").await;
    wait_until(LONG, "far dead-lettered, near retried and done", || async {
        let ran = ran
            .lock()
            .unwrap()
            .iter()
            .filter(|(id, _)| *id == near)
            .count();
        ran == 2 && env.depth(&env.topology.dead_queue).await == 1
    })
    .await;
    stop(runner).await;
    let (props, _) = env.get(&env.topology.dead_queue).await.unwrap();
    assert_eq!(message_id(&props), far);
    assert_eq!(
        header_str(&props, headers::REASON).as_deref(),
        Some("delay_exceeded")
    );
    assert_eq!(
        header_str(&props, headers::BUDGET_SOURCE).as_deref(),
        Some("not_consulted")
    );
    assert_eq!(
        header_str(&props, headers::ERROR_CLASS).as_deref(),
        Some("http_429")
    );
    assert_eq!(
        budget.metrics().counter("retries_granted", "api"),
        1,
        "only near's retry spent budget"
    );
}

/// A delivery whose `fb-not-before-ms` is a day away (the test's longest tier is 2 s, the
/// default `max_delay`) is dead-lettered `delay_exceeded` without running, instead of cycling
/// through the longest tier for a day; one within `max_delay` waits and runs.
#[tokio::test]
async fn a_far_future_not_before_is_dead_lettered_not_held() {
    let env = Env::new(
        "not-before",
        "",
        "",
        "[dependencies.api]\ntasks = [\"t\"]\n",
    )
    .await;
    let ran: Ran = Arc::default();
    let runner = {
        let ran = Arc::clone(&ran);
        start(env.budget().await, &env, move |job| {
            ran.lock()
                .unwrap()
                .push((job.message_id.unwrap(), job.task));
            async { Ok(()) }
        })
    };
    let publisher = env.publisher().await;
    let send = async |body: &[u8], not_before: u64| {
        let id = headers::new_message_id();
        let mut t = FieldTable::default();
        headers::set_u64(&mut t, headers::ATTEMPT, 2);
        headers::set_u64(&mut t, headers::NOT_BEFORE_MS, not_before);
        let props = BasicProperties::default()
            .with_message_id(ShortString::from(id.clone()))
            .with_type(ShortString::from("t"))
            .with_headers(t);
        publisher
            .publish(&env.topology.work_exchange, "t", body, props)
            .await
            .unwrap();
        id
    };
    let now = headers::now_ms();
    let far = send(b"far", now + 86_400_000).await;
    let end_of_time = send(b"max", u64::MAX).await;
    let near = send(b"near", now + 1_500).await;
    wait_until(LONG, "near ran, far and max dead-lettered", || async {
        ran.lock().unwrap().len() == 1 && env.depth(&env.topology.dead_queue).await == 2
    })
    .await;
    let counts = stop(runner).await;
    assert_eq!(ran.lock().unwrap()[0].0, near);
    assert!(
        counts.waited_again >= 1,
        "near waited in a tier: {counts:?}"
    );
    let dead = env.drain(&env.topology.dead_queue).await;
    let ids: BTreeSet<String> = dead.iter().map(|(p, _)| message_id(p)).collect();
    assert_eq!(ids, BTreeSet::from([far, end_of_time]));
    for (props, _) in &dead {
        assert_eq!(
            header_str(props, headers::REASON).as_deref(),
            Some("delay_exceeded")
        );
        assert_eq!(
            header_str(props, headers::ERROR_CLASS).as_deref(),
            Some("not_before")
        );
        assert_eq!(
            header_str(props, headers::DEPENDENCY).as_deref(),
            Some("api")
        );
    }
}
