//! What a retry tier does with dead letters the work queue did not take (issue 25, item 3).
//!
//! A retry tier is a quorum queue with at-least-once dead-lettering: when a retry's delay is up,
//! the tier's dead-letter worker (on the tier's leader) publishes it to the work queue and keeps
//! it, counted as `messages_dlx`, until the work queue confirms it. RabbitMQ publishes such a
//! dead letter again after `dead_letter_worker_publisher_confirm_timeout` (180 s by default) only
//! to targets that are neither quorum queues nor streams: for those it counts on the queue client
//! to resend what the queue did not apply (`clients_redeliver` in `rabbit_fifo_dlx_worker.erl`),
//! and a publish the queue refused is ignored. Two runs on a private three-node cluster:
//!
//! 1. **Refused** (deterministic): a policy makes the work queue refuse publishes (`max-length` 0
//!    with the project's `reject-publish`; the first one gets in); jobs published to the 250 ms
//!    tier are held by it; the policy is cleared. Whether they arrive within the confirm timeout
//!    and a margin; if not, the remedy of docs/guides/broker-cluster.md (restart the node leading
//!    the tier: its new leader's dead-letter worker takes over what the tier holds) and what
//!    arrives after it.
//! 2. **Leader stopped**: jobs flow through the tier while the node leading the work queue (not
//!    the tier's) is stopped and restarted, as the broker game day does; what the tier held, when
//!    the last job arrived, and the remedy if some never did.
//!
//! Nothing may be lost: every job arrives, by itself or after the remedy. Printed as a table
//! (and kept in `target/tmp/retry-tier-resend.md`).

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use fleet_budget_amqp::RetryTier;
use fleet_budget_amqp::WorkerConfig;
use fleet_budget_amqp::testing::{TestBroker, unique_prefix};

use super::day::{Message, config_toml, publish_surely, search_properties};
use super::rabbit_cluster::RabbitCluster;

/// How long a publish may go unconfirmed before the run fails.
const GIVE_UP: Duration = Duration::from_secs(180);
/// How long past the broker's re-send interval the run waits for held jobs (a bound).
const MARGIN: Duration = Duration::from_secs(60);
/// How long the run waits for held jobs once the tier's leader was restarted (a bound), and how
/// many times it restarts it while jobs are still missing.
const REMEDY_WITHIN: Duration = Duration::from_secs(90);
const REMEDY_TRIES: usize = 3;
/// Jobs in the refused run.
const REFUSED_JOBS: u64 = 50;
/// Jobs in the leader-stopped run, and how many are published each 100 ms.
const FLOW_JOBS: u64 = 2_000;
const FLOW_BURST: u64 = 20;

/// One run's figures.
struct Outcome {
    published: u64,
    held_most: u64,
    /// From the first publish (refused run) or the node's stop (leader run) until every job
    /// was in the work queue; `None` if some never came within the bound.
    all_in_after: Option<Duration>,
    arrived: u64,
    duplicates: u64,
    /// When jobs were still missing past the bound: each restart of the node leading the tier,
    /// how many more arrived within `REMEDY_WITHIN`, and after how long all had.
    remedy: Vec<(String, u64, Option<Duration>)>,
    /// Still held by the tier for dead-lettering at the end (`messages_dlx`).
    still_held: u64,
}

pub(crate) async fn run() {
    let mut cluster = RabbitCluster::start()
        .await
        .unwrap_or_else(|e| panic!("a private three-node RabbitMQ cluster: {e}"));
    let resend = cluster
        .dead_letter_resend_after()
        .unwrap_or_else(|e| panic!("the dead-letter worker's confirm timeout: {e}"));
    let run_id = unique_prefix("resend");
    let key_prefix = run_id.replace('.', "-");
    let toml = config_toml(&key_prefix, &run_id, &cluster.urls());
    let config = WorkerConfig::from_toml(&toml, "retry tier re-send").expect("the configuration");
    let to = config.amqp.connection();
    let broker = TestBroker::with_settings(config.amqp.clone());
    broker.migrate().await;
    let topology = broker.topology.clone();
    let tier = topology
        .retry_tiers
        .iter()
        .find(|t| t.delay == Duration::from_millis(250))
        .cloned()
        .expect("a 250 ms retry tier");
    let work = topology.work_queue.clone();

    // 1. Refused.
    let first = cluster.nodes[0].node.clone();
    let policy = format!("{run_id}-full");
    let pattern = format!("^{}$", regex_escape(&work));
    cluster.nodes[0]
        .ctl(&[
            "set_policy",
            "--apply-to",
            "queues",
            &policy,
            &pattern,
            r#"{"max-length":0}"#,
        ])
        .unwrap_or_else(|e| panic!("set_policy on {first}: {e}"));
    let began = Instant::now();
    let mut producer = None;
    for n in 0..REFUSED_JOBS {
        publish(
            &to,
            &mut producer,
            &tier,
            &work,
            &format!("{run_id}-refused-{n:03}"),
        )
        .await;
    }
    let held = wait_held(&cluster, REFUSED_JOBS, Duration::from_secs(60)).await;
    cluster.nodes[0]
        .ctl(&["clear_policy", &policy])
        .unwrap_or_else(|e| panic!("clear_policy: {e}"));
    let cleared_after = began.elapsed();
    let refused = arrivals(
        &mut cluster,
        &broker,
        (&work, &tier.queue),
        &format!("{run_id}-refused-"),
        REFUSED_JOBS,
        held,
        began,
        resend + MARGIN,
    )
    .await;
    let refused_still_held = cluster.messages_dlx().unwrap_or(0);

    // 2. Leader stopped: the tier's leader must not be the one stopped.
    let mut moves = 0;
    let (work_leader, tier_leader) = loop {
        let w = cluster.leader_of(&work).unwrap_or_else(|e| panic!("{e}"));
        let t = cluster
            .leader_of(&tier.queue)
            .unwrap_or_else(|e| panic!("{e}"));
        if w != t {
            break (w, t);
        }
        assert!(
            moves < 6,
            "the work queue and the tier kept one leader over 6 restarts"
        );
        cluster.nodes[w]
            .restart()
            .await
            .unwrap_or_else(|e| panic!("restart: {e}"));
        moves += 1;
    };
    let flowing = {
        let (to, tier, work, run_id) = (to.clone(), tier.clone(), work.clone(), run_id.clone());
        tokio::spawn(async move {
            let mut producer = None;
            let began = Instant::now();
            for n in 0..FLOW_JOBS {
                let due = Duration::from_millis(n / FLOW_BURST * 100);
                if let Some(wait) = due.checked_sub(began.elapsed()) {
                    tokio::time::sleep(wait).await;
                }
                publish(
                    &to,
                    &mut producer,
                    &tier,
                    &work,
                    &format!("{run_id}-flow-{n:05}"),
                )
                .await;
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(4)).await;
    let stopped_node = cluster.nodes[work_leader].node.clone();
    let stopped = Instant::now();
    cluster.nodes[work_leader].stop();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let down = stopped.elapsed();
    cluster.nodes[work_leader]
        .restart()
        .await
        .unwrap_or_else(|e| panic!("restart {stopped_node}: {e}"));
    flowing.await.expect("the publishing task");
    let held_now = cluster.messages_dlx().unwrap_or(0);
    let mut flow = arrivals(
        &mut cluster,
        &broker,
        (&work, &tier.queue),
        &format!("{run_id}-flow-"),
        FLOW_JOBS,
        held_now,
        stopped,
        resend + MARGIN,
    )
    .await;
    let flow_still_held = cluster
        .messages_dlx()
        .unwrap_or(0)
        .saturating_sub(refused_still_held);
    let mut refused = refused;
    refused.still_held = refused_still_held;
    flow.still_held = flow_still_held;

    let mut table = String::new();
    let _ = writeln!(
        table,
        "## A retry tier's dead letters the work queue did not take (three-node cluster)\n"
    );
    let _ = writeln!(
        table,
        "RabbitMQ's `dead_letter_worker_publisher_confirm_timeout`: {:.0} s\n",
        resend.as_secs_f64()
    );
    let _ = writeln!(
        table,
        "| run | published to the 250 ms tier | held by the tier at most (`messages_dlx`) | all in the work queue after | arrived | then, the tier's leader restarted | still held by the tier | duplicates | lost |\n|---|---|---|---|---|---|---|---|---|"
    );
    for (name, o) in [
        (
            format!(
                "work queue refusing (max-length 0), policy cleared {:.1} s after the first publish",
                cleared_after.as_secs_f64()
            ),
            &refused,
        ),
        (
            format!(
                "work queue's leader {stopped_node} stopped ({:.1} s down; tier led by {}), {moves} restarts to part the leaders",
                down.as_secs_f64(),
                cluster.nodes[tier_leader].node
            ),
            &flow,
        ),
    ] {
        let _ = writeln!(
            table,
            "| {name} | {} | {} | {} | {} | {} | {} | {} | {} |",
            o.published,
            o.held_most,
            o.all_in_after.map_or_else(
                || format!("not within {:.0} s", (resend + MARGIN).as_secs_f64()),
                |d| format!("{:.1} s", d.as_secs_f64())
            ),
            o.arrived - o.remedy.iter().map(|r| r.1).sum::<u64>(),
            if o.remedy.is_empty() {
                "not needed".to_owned()
            } else {
                o.remedy
                    .iter()
                    .map(|(node, more, after)| {
                        format!(
                            "{node}: {more} more arrived{}",
                            after.map_or_else(
                                || format!(", not all within {:.0} s", REMEDY_WITHIN.as_secs_f64()),
                                |d| format!(", all in {:.1} s", d.as_secs_f64())
                            )
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("; ")
            },
            o.still_held,
            o.duplicates,
            o.published.saturating_sub(o.arrived + o.still_held)
        );
    }
    println!("{table}");
    let _ = std::fs::create_dir_all("../target/tmp");
    let _ = std::fs::write("../target/tmp/retry-tier-resend.md", &table);

    // Nothing lost: every job arrived or is still held by the tier (the broker keeps it).
    assert_eq!(
        refused.arrived + refused.still_held,
        REFUSED_JOBS,
        "refused jobs lost\n{table}"
    );
    assert_eq!(
        flow.arrived + flow.still_held,
        FLOW_JOBS,
        "jobs lost across the leader's stop\n{table}"
    );
    assert!(
        refused.held_most > 0,
        "the tier held none of the jobs the work queue refused\n{table}"
    );
}

/// Publishes job `id` to `tier` for queue `work` (the tier dead-letters to the default exchange
/// with the routing key it was published with), until confirmed.
async fn publish(
    to: &fleet_budget_amqp::ConnectionConfig,
    producer: &mut Option<fleet_budget_amqp::Publisher>,
    tier: &RetryTier,
    work: &str,
    id: &str,
) {
    publish_surely(
        to,
        producer,
        &Message {
            exchange: &tier.exchange,
            routing_key: work,
            body: b"{}",
            properties: &search_properties(id),
        },
        GIVE_UP,
    )
    .await;
}

/// Waits until the leaders hold `n` messages for dead-lettering, or hold some and the count
/// has not moved for 3 s (`max-length` 0 lets one message in), or `within`; the most seen.
async fn wait_held(cluster: &RabbitCluster, n: u64, within: Duration) -> u64 {
    let deadline = Instant::now() + within;
    let (mut most, mut since_change) = (0, Instant::now());
    while Instant::now() < deadline {
        let now = cluster.messages_dlx().unwrap_or(0);
        if now > most {
            most = now;
            since_change = Instant::now();
        }
        if most >= n || (most > 0 && since_change.elapsed() >= Duration::from_secs(3)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    most
}

/// Takes the jobs whose ids start with `prefix` out of `work` as they arrive, until all
/// `published` have or `within` of `since` passed; the held count is watched meanwhile. Jobs
/// still missing then: the node leading `tier_queue` is restarted, and the arrivals counted
/// again.
#[allow(clippy::too_many_arguments)]
async fn arrivals(
    cluster: &mut RabbitCluster,
    broker: &TestBroker,
    (work, tier_queue): (&str, &str),
    prefix: &str,
    published: u64,
    held: u64,
    since: Instant,
    within: Duration,
) -> Outcome {
    let mut seen = BTreeSet::new();
    let (mut duplicates, mut held_most) = (0, held);
    let all_in_after = take_arrivals(
        cluster,
        broker,
        (work, prefix, published),
        (&mut seen, &mut duplicates, &mut held_most),
        since,
        within,
    )
    .await;
    let mut remedy: Vec<(String, u64, Option<Duration>)> = Vec::new();
    let mut done = all_in_after.is_some();
    while !done && remedy.len() < REMEDY_TRIES {
        // The remedy of docs/guides/broker-cluster.md: a new leader for the tier starts a new
        // dead-letter worker, which should take over what the tier holds.
        let before = seen.len() as u64;
        let node = cluster
            .restart_leader_of(tier_queue)
            .await
            .unwrap_or_else(|e| panic!("the tier's leader: {e}"));
        let restarted = Instant::now();
        let after = take_arrivals(
            cluster,
            broker,
            (work, prefix, published),
            (&mut seen, &mut duplicates, &mut held_most),
            restarted,
            REMEDY_WITHIN,
        )
        .await;
        done = after.is_some();
        remedy.push((node, seen.len() as u64 - before, after));
    }
    Outcome {
        published,
        held_most,
        all_in_after,
        arrived: seen.len() as u64,
        duplicates,
        remedy,
        still_held: 0,
    }
}

/// Drains `work` of the jobs whose ids start with `prefix` until all `published` are in `seen`
/// (then: how long since `since`) or `within` of `since` passed (`None`).
async fn take_arrivals(
    cluster: &RabbitCluster,
    broker: &TestBroker,
    (work, prefix, published): (&str, &str, u64),
    (seen, duplicates, held_most): (&mut BTreeSet<String>, &mut u64, &mut u64),
    since: Instant,
    within: Duration,
) -> Option<Duration> {
    while since.elapsed() < within {
        for (props, _) in broker.drain(work).await {
            let Some(id) = fleet_budget_amqp::headers::message_id(&props) else {
                continue;
            };
            if id.starts_with(prefix) && !seen.insert(id.to_owned()) {
                *duplicates += 1;
            }
        }
        *held_most = (*held_most).max(cluster.messages_dlx().unwrap_or(0));
        if seen.len() as u64 >= published {
            return Some(since.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Duplicates a later re-send could still bring are not waited for.
    None
}

/// `name` with the regular expression's special characters escaped (a queue name's dots).
fn regex_escape(name: &str) -> String {
    name.chars().fold(String::new(), |mut s, c| {
        if ".^$*+?()[]{}|\\".contains(c) {
            s.push('\\');
        }
        s.push(c);
        s
    })
}
