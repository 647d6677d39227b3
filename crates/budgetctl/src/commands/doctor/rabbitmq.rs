//! The RabbitMQ checks of `doctor`: the broker reachable, the topology against `migrations/`
//! (a dry run of `migrate`, passive declares only), and through the management HTTP API (when
//! given): the version and quorum queues, policies and operator policies in force on our queues,
//! resource alarms, and `consumer_timeout` beside the longest task the configuration allows.

use std::time::Duration;

use fleet_budget::redact::redact_text;
use fleet_budget_amqp::{AmqpError, Migrations, Object, StepState, Topology, WorkerConfig};
use serde_json::Value;

use super::Check;
use super::management::{Management, vhost_of};
use fleet_budget::http::percent_encode as segment;

const SERVICE: &str = "rabbitmq";
/// RabbitMQ's default `consumer_timeout` (30 minutes).
const DEFAULT_CONSUMER_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// Policy keys that drop or refuse messages in any of our queues.
const DROPPING: [&str; 4] = ["max-length", "max-length-bytes", "message-ttl", "expires"];
/// Where a message is the only copy of a failed job and nothing is expected to limit it.
const KEEPING: [&str; 5] = [
    "max-length",
    "max-length-bytes",
    "message-ttl",
    "expires",
    "overflow",
];
/// The longest text kept from a broker answer.
const MAX_TEXT: usize = 300;

/// Every RabbitMQ check.
pub(super) async fn checks(config: &WorkerConfig, management: Option<&Management>) -> Vec<Check> {
    let mut out = Vec::new();
    let topology = Topology::new(&config.amqp);
    match topology_check(config).await {
        Ok(check) => {
            out.push(Check::ok(SERVICE, "reachable", config.amqp.shown_urls()));
            out.push(check);
        }
        Err(check) => {
            out.push(check);
            return out;
        }
    }
    let Some(m) = management else {
        let why = "give --rabbitmq-management-url (the management HTTP API) to check it";
        for check in [
            "version",
            "quorum_queues",
            "policies",
            "alarms",
            "consumer_timeout",
        ] {
            out.push(Check::not_checked(SERVICE, check, why));
        }
        return out;
    };
    let vhost = vhost_of(&config.amqp.url);
    let (checks, version) = version_and_quorum(m).await;
    out.extend(checks);
    out.push(policies(m, &vhost, &topology).await);
    out.push(alarms(m).await);
    out.push(consumer_timeout(m, &vhost, &topology, config, version).await);
    out
}

/// The topology present and at the version of the embedded migrations (`migrate --dry-run`).
/// `Err` when the broker cannot be reached (the `reachable` check).
async fn topology_check(config: &WorkerConfig) -> Result<Check, Check> {
    let migrations = match Migrations::embedded() {
        Ok(m) => m,
        Err(e) => {
            return Ok(Check::not_checked(
                SERVICE,
                "topology",
                short(&e.to_string()),
            ));
        }
    };
    let report = match fleet_budget_amqp::migrate(&config.amqp.url, &config.amqp, &migrations, true)
        .await
    {
        Ok(r) => r,
        Err(e @ AmqpError::ArgumentsDiffer { .. }) => {
            return Ok(Check::risk(
                SERVICE,
                "topology",
                short(&e.to_string()),
                "a queue declared with other arguments than the migrations': workers declaring \
                 it are refused (PRECONDITION_FAILED), and the delivery limit or dead-lettering \
                 the budget relies on may not be what the queue does",
                "see `budgetctl migrate --dry-run`; move the messages off and declare the queue \
                 again, or use another amqp.prefix",
            ));
        }
        Err(e) if e.is_connection_error() => {
            return Err(Check::risk(
                SERVICE,
                "reachable",
                short(&format!("{}: {e}", config.amqp.shown_urls())),
                "workers cannot take jobs, retry them or dead-letter them",
                "start RabbitMQ or point --amqp-url / amqp.url at it",
            ));
        }
        Err(e) => {
            return Err(Check::not_checked(
                SERVICE,
                "reachable",
                short(&format!("{}: {e}", config.amqp.shown_urls())),
            ));
        }
    };
    let expected = report
        .steps
        .iter()
        .map(|(op, _)| op.version)
        .max()
        .unwrap_or(0);
    let behind: Vec<(u32, String, StepState)> = report
        .steps
        .iter()
        .filter(|(op, _)| !matches!(op.object, Object::Binding { .. }))
        .filter(|(_, s)| matches!(s, StepState::WouldCreate | StepState::NeedsPolicy))
        .map(|(op, s)| (op.version, op.object.to_string(), *s))
        .collect();
    let present = behind
        .iter()
        .map(|(v, _, _)| v.saturating_sub(1))
        .min()
        .unwrap_or(expected);
    let prefix = &config.amqp.prefix;
    if behind.is_empty() {
        return Ok(Check::ok(
            SERVICE,
            "topology",
            format!("the topology under {prefix:?} is at version {expected} of {expected}"),
        ));
    }
    let missing = behind
        .iter()
        .filter(|(_, _, s)| matches!(s, StepState::WouldCreate))
        .count();
    let policy = behind.len() - missing;
    let (first_version, first) = behind
        .first()
        .map(|(v, o, _)| (*v, short(o)))
        .unwrap_or_default();
    Ok(Check::risk(
        SERVICE,
        "topology",
        format!(
            "the topology under {prefix:?} is at version {present} of {expected}: {missing} \
             object(s) missing, {policy} queue(s) needing a policy (first: v{} {})",
            first_version, first
        ),
        "a missing queue or exchange: workers publishing a retry or a dead letter there are \
         refused (the job stays unacked and comes back) or the message is routed nowhere; a \
         queue without the later arguments keeps its older behaviour (dead-lettering at most once)",
        "run `budgetctl migrate` (see `budgetctl migrate --dry-run` first)",
    ))
}

/// The broker's version as read from `/api/overview` (major, minor, and the text).
#[derive(Debug, Clone)]
struct BrokerVersion {
    major: u32,
    minor: u32,
    text: String,
}

impl BrokerVersion {
    /// Whether the broker reads a per-queue delivery acknowledgement timeout: the queue argument
    /// `x-consumer-timeout` and the policy key `consumer-timeout`, from RabbitMQ 3.12.
    fn has_per_queue_consumer_timeout(&self) -> bool {
        (self.major, self.minor) >= (3, 12)
    }
}

async fn version_and_quorum(m: &Management) -> (Vec<Check>, Option<BrokerVersion>) {
    let overview = match m.get("/api/overview").await {
        Ok(Some(v)) => v,
        Ok(None) => {
            let why = "GET /api/overview: 404 (is this the management API?)";
            return (
                vec![
                    Check::not_checked(SERVICE, "version", why),
                    Check::not_checked(SERVICE, "quorum_queues", why),
                ],
                None,
            );
        }
        Err(e) => {
            return (
                vec![
                    Check::not_checked(SERVICE, "version", short(&e)),
                    Check::not_checked(SERVICE, "quorum_queues", short(&e)),
                ],
                None,
            );
        }
    };
    let version = overview
        .get("rabbitmq_version")
        .and_then(Value::as_str)
        .map(short)
        .unwrap_or_default();
    let mut parts = version.split('.').map(|p| {
        // "3.10.8", "3.13.0-rc.1", "4.0.2+1": the leading digits of each part.
        let digits: String = p.chars().take_while(char::is_ascii_digit).collect();
        digits.parse::<u32>().unwrap_or(0)
    });
    let (major, minor, patch) = (
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
    );
    let old = (major, minor) < (3, 8);
    let mut out = vec![if old {
        Check::risk(
            SERVICE,
            "version",
            format!("RabbitMQ {version}"),
            "quorum queues (the work queue and its delivery limit) need RabbitMQ 3.8 or later",
            "upgrade RabbitMQ (3.10 or later is what the project is tested on)",
        )
    } else if let Some(gap) = retry_tier_gap(major, minor, patch) {
        match cluster_nodes(m).await {
            Some(1) => Check::ok(
                SERVICE,
                "version",
                format!(
                    "RabbitMQ {version}, one node: no leader change (its retry tiers' gap \
                     after a leader change matters in a cluster: see `doctor` in \
                     docs/guides/operations.md)"
                ),
            ),
            nodes => Check::risk(
                SERVICE,
                "version",
                match nodes {
                    Some(n) => format!("RabbitMQ {version}, a cluster of {n} nodes"),
                    None => format!("RabbitMQ {version} (how many nodes: not listed)"),
                },
                gap,
                "upgrade RabbitMQ (3.10.20, 3.11.12, 3.12.0 or later); until then, see \
                 docs/guides/broker-cluster.md, \"Retry tiers after a leader change\"",
            ),
        }
    } else {
        Check::ok(SERVICE, "version", format!("RabbitMQ {version}"))
    }];
    out.push(match m.get("/api/feature-flags").await {
        Ok(Some(Value::Array(flags))) => {
            let state = flags
                .iter()
                .find(|f| f.get("name").and_then(Value::as_str) == Some("quorum_queue"))
                .and_then(|f| f.get("state").and_then(Value::as_str))
                .map(short);
            match state.as_deref() {
                Some("enabled") => Check::ok(
                    SERVICE,
                    "quorum_queues",
                    "feature flag quorum_queue enabled",
                ),
                other => Check::risk(
                    SERVICE,
                    "quorum_queues",
                    format!("feature flag quorum_queue {}", other.unwrap_or("absent")),
                    "the work queue is a quorum queue: `migrate` cannot declare it, and workers \
                     find no queue to consume",
                    "rabbitmqctl enable_feature_flag quorum_queue (or upgrade RabbitMQ)",
                ),
            }
        }
        Ok(_) if !old => Check::ok(
            SERVICE,
            "quorum_queues",
            format!("RabbitMQ {version} has quorum queues (feature flags not listed)"),
        ),
        Ok(_) => Check::not_checked(
            SERVICE,
            "quorum_queues",
            "GET /api/feature-flags gave no list",
        ),
        Err(e) => Check::not_checked(SERVICE, "quorum_queues", short(&e)),
    });
    let known = (major, minor) != (0, 0);
    (
        out,
        known.then_some(BrokerVersion {
            major,
            minor,
            text: version,
        }),
    )
}

/// What RabbitMQ `major.minor.patch` lacks for the retry tiers' dead-lettering across a leader
/// change, if anything: before 3.10 it is at most once (`x-dead-letter-strategy` came with
/// 3.10); before 3.10.20 and 3.11.12 a new leader's dead-letter worker could be left
/// unregistered, or doubled (rabbitmq-server#7677, "Improve rabbit_fifo_dlx_worker
/// resiliency").
fn retry_tier_gap(major: u32, minor: u32, patch: u32) -> Option<&'static str> {
    match (major, minor) {
        (3, 8 | 9) => Some(
            "dead-lettering from a retry tier is at most once before RabbitMQ 3.10: a retry in \
             flight when a leader changes can be lost",
        ),
        (3, 10) if patch < 20 => Some(
            "RabbitMQ before 3.10.20 can leave a retry tier's dead-letter worker unregistered \
             after a leader change (rabbitmq-server#7677): retries then wait in the tier \
             (`messages_dlx`) until someone restarts its leader",
        ),
        (3, 11) if patch < 12 => Some(
            "RabbitMQ before 3.11.12 can leave a retry tier's dead-letter worker unregistered \
             after a leader change (rabbitmq-server#7677): retries then wait in the tier \
             (`messages_dlx`) until someone restarts its leader",
        ),
        _ => None,
    }
}

/// How many nodes the broker's cluster has (`/api/nodes`), when it says.
async fn cluster_nodes(m: &Management) -> Option<usize> {
    match m.get("/api/nodes").await {
        Ok(Some(Value::Array(nodes))) if !nodes.is_empty() => Some(nodes.len()),
        _ => None,
    }
}

/// The policy and operator policy in force on each of our queues, and the keys of their
/// effective definition that drop or limit messages.
async fn policies(m: &Management, vhost: &str, topology: &Topology) -> Check {
    const CHECK: &str = "policies";
    let v = segment(vhost);
    let mut listed = Vec::new();
    for (kind, path) in [
        ("policies", format!("/api/policies/{v}")),
        ("operator policies", format!("/api/operator-policies/{v}")),
    ] {
        match m.get(&path).await {
            Ok(Some(Value::Array(items))) => listed.push(format!("{} {kind}", items.len())),
            Ok(_) => listed.push(format!("{kind}: none listed")),
            Err(e) => return Check::not_checked(SERVICE, CHECK, short(&e)),
        }
    }
    let keeping = [topology.dead_queue.as_str(), topology.parked_queue.as_str()];
    let mut risky = Vec::new();
    let mut applied = Vec::new();
    for queue in topology.queues() {
        let q = match m.get(&format!("/api/queues/{v}/{}", segment(&queue))).await {
            Ok(Some(q)) => q,
            Ok(None) => continue,
            Err(e) => return Check::not_checked(SERVICE, CHECK, short(&e)),
        };
        let name_of = |field: &str| {
            q.get(field)
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(short)
        };
        let policy = name_of("policy");
        let operator = name_of("operator_policy");
        let empty = serde_json::Map::new();
        let definition = q
            .get("effective_policy_definition")
            .and_then(Value::as_object)
            .unwrap_or(&empty);
        if policy.is_some() || operator.is_some() {
            applied.push(format!(
                "{queue}: policy {}, operator policy {}",
                policy.as_deref().unwrap_or("none"),
                operator.as_deref().unwrap_or("none")
            ));
        }
        let watched: &[&str] = if keeping.contains(&queue.as_str()) {
            &KEEPING
        } else {
            &DROPPING
        };
        for key in watched {
            if let Some(value) = definition.get(*key) {
                let by = match (&policy, &operator) {
                    (Some(p), Some(o)) => format!("policy {p:?} / operator policy {o:?}"),
                    (Some(p), None) => format!("policy {p:?}"),
                    (None, Some(o)) => format!("operator policy {o:?}"),
                    (None, None) => "a policy".to_owned(),
                };
                risky.push(format!(
                    "{queue}: {key}={} ({by})",
                    short(&value.to_string())
                ));
            }
        }
    }
    let listed = listed.join(", ");
    if risky.is_empty() {
        Check::ok(
            SERVICE,
            CHECK,
            if applied.is_empty() {
                format!("no policy applies to our queues ({listed} in vhost {vhost:?})")
            } else {
                format!(
                    "no key that drops messages; {} ({listed} in vhost {vhost:?})",
                    applied.join("; ")
                )
            },
        )
    } else {
        Check::risk(
            SERVICE,
            CHECK,
            risky.join("; "),
            "a length limit drops the oldest dead letters (or refuses new ones with overflow \
             reject-publish), a message-ttl or expires deletes them: a dead letter is the only \
             copy of a failed job, and replay cannot bring back what the broker dropped",
            "exclude our queues from the policy's pattern (or give them a policy of higher \
             priority without these keys); for an operator policy, ask whoever runs the broker",
        )
    }
}

async fn alarms(m: &Management) -> Check {
    const CHECK: &str = "alarms";
    let nodes = match m.get("/api/nodes").await {
        Ok(Some(Value::Array(nodes))) => nodes,
        Ok(_) => return Check::not_checked(SERVICE, CHECK, "GET /api/nodes gave no list"),
        Err(e) => return Check::not_checked(SERVICE, CHECK, short(&e)),
    };
    let mut raised = Vec::new();
    for node in &nodes {
        let name = node
            .get("name")
            .and_then(Value::as_str)
            .map(short)
            .unwrap_or_default();
        for (field, what) in [("mem_alarm", "memory"), ("disk_free_alarm", "disk")] {
            if node.get(field).and_then(Value::as_bool) == Some(true) {
                raised.push(format!("{what} alarm on {name}"));
            }
        }
    }
    if raised.is_empty() {
        Check::ok(
            SERVICE,
            CHECK,
            format!("no resource alarm on {} node(s)", nodes.len()),
        )
    } else {
        Check::risk(
            SERVICE,
            CHECK,
            raised.join(", "),
            "while an alarm is in force the broker blocks every publishing connection: retries, \
             dead letters and replays wait, and jobs stay unacked until it clears",
            "free memory or disk on the node (drain or purge large queues, raise the watermark \
             or the disk limit)",
        )
    }
}

/// The delivery acknowledgement timeout of the work queue, beside how long a delivery may stay
/// unacknowledged under the configuration: a concurrency lease, which outlives the call it
/// covers (a job waiting for a slot waits in a delay tier, its delivery settled).
///
/// What the management API shows, by version (RabbitMQ's consumers guide, "Delivery
/// Acknowledgement Timeout"): up to 3.11 the timeout is node-wide only (`consumer_timeout` in
/// `rabbitmq.conf` or `advanced.config`), which no endpoint of the API returns; from 3.12 a queue
/// may carry its own, the queue argument `x-consumer-timeout` or the policy key
/// `consumer-timeout` (the smaller of the two when both are set), and both show on
/// `/api/queues/<vhost>/<queue>`. The node-wide value stays unreadable on every version: doctor
/// says so instead of assuming the default.
async fn consumer_timeout(
    m: &Management,
    vhost: &str,
    topology: &Topology,
    config: &WorkerConfig,
    version: Option<BrokerVersion>,
) -> Check {
    const CHECK: &str = "consumer_timeout";
    let longest = config.budget.concurrency.values().map(|p| p.lease).max();
    let per_queue = match &version {
        Some(v) if v.has_per_queue_consumer_timeout() => {
            match queue_consumer_timeout(m, vhost, &topology.work_queue).await {
                Ok(found) => found,
                Err(e) => return Check::not_checked(SERVICE, CHECK, short(&e)),
            }
        }
        _ => None,
    };
    if let Some((timeout, source)) = per_queue {
        let found = format!(
            "{}: delivery acknowledgement timeout {} ({source})",
            topology.work_queue,
            humantime::format_duration(timeout)
        );
        return match longest {
            Some(longest) if longest > timeout => Check::risk(
                SERVICE,
                CHECK,
                format!(
                    "{found}, below the longest a job may hold its delivery: {} (its concurrency \
                     lease, longer than the call)",
                    humantime::format_duration(longest)
                ),
                CONSUMER_TIMEOUT_COST,
                "raise the queue's consumer-timeout (policy) above the longest job, or the job's \
                 timeout and lease below it \
                 (docs/guides/operations.md#consumer_timeout-and-the-longest-task)",
            ),
            Some(longest) => Check::ok(
                SERVICE,
                CHECK,
                format!(
                    "{found}, above the longest a job may hold its delivery: {}",
                    humantime::format_duration(longest)
                ),
            ),
            None => Check::not_checked(
                SERVICE,
                CHECK,
                format!(
                    "{found}; the configuration bounds no job's length (no concurrency lease), so \
                     it cannot be compared: size it by the longest task (docs/guides/operations.md)"
                ),
            ),
        };
    }
    let not_shown = match &version {
        Some(v) if v.has_per_queue_consumer_timeout() => format!(
            "{} has no x-consumer-timeout argument nor consumer-timeout policy, so RabbitMQ {} \
             applies the node-wide consumer_timeout, which the management API does not show \
             (default 30 min; read it with `rabbitmq-diagnostics environment`, or give the queue \
             a consumer-timeout policy to make it visible here)",
            topology.work_queue, v.text
        ),
        Some(v) => format!(
            "RabbitMQ {} has only the node-wide consumer_timeout (rabbitmq.conf or \
             advanced.config), which the management API does not show (default 30 min; read it \
             with `rabbitmqctl eval 'application:get_env(rabbit, consumer_timeout).'`); a \
             per-queue timeout comes with 3.12",
            v.text
        ),
        None => "the broker's version is unknown and the management API does not show the \
                 node-wide consumer_timeout (default 30 min)"
            .to_owned(),
    };
    match longest {
        Some(longest) if longest > DEFAULT_CONSUMER_TIMEOUT => Check::risk(
            SERVICE,
            CHECK,
            format!(
                "a job may hold its delivery {} (its concurrency lease, longer than the call), \
                 above the default consumer_timeout of 30 min; {not_shown}",
                humantime::format_duration(longest)
            ),
            CONSUMER_TIMEOUT_COST,
            "raise consumer_timeout above the longest job (rabbitmq.conf `consumer_timeout`, in \
             ms; from 3.12 a `consumer-timeout` policy on the work queue), or the job's timeout and \
             lease below it",
        ),
        Some(longest) => Check::not_checked(
            SERVICE,
            CHECK,
            format!(
                "the longest a job may hold its delivery under the configuration: {} (its \
                 concurrency lease, longer than the call), within the default 30 min; {not_shown}",
                humantime::format_duration(longest)
            ),
        ),
        None => Check::not_checked(
            SERVICE,
            CHECK,
            format!("the configuration bounds no job's length (no concurrency lease); {not_shown}"),
        ),
    }
}

/// What a delivery held past the timeout costs.
const CONSUMER_TIMEOUT_COST: &str = "a delivery unacknowledged past the timeout closes the \
     worker's channel: every job in flight on it comes back and runs again";

/// The work queue's own timeout (RabbitMQ 3.12 and later): the smaller of its `x-consumer-timeout`
/// argument and its effective policy's `consumer-timeout`, and where it came from; `None` when
/// neither is set (a queue not declared yet included).
async fn queue_consumer_timeout(
    m: &Management,
    vhost: &str,
    queue: &str,
) -> Result<Option<(Duration, String)>, String> {
    let path = format!("/api/queues/{}/{}", segment(vhost), segment(queue));
    Ok(m.get(&path).await?.as_ref().and_then(consumer_timeout_of))
}

/// The delivery acknowledgement timeout a queue of `/api/queues` carries, and where it comes
/// from: its `x-consumer-timeout` argument or its effective policy's `consumer-timeout`, the
/// smaller when both are set (RabbitMQ's rule); `None` when neither is a positive number.
fn consumer_timeout_of(q: &Value) -> Option<(Duration, String)> {
    let millis = |v: Option<&Value>| v.and_then(Value::as_u64).filter(|ms| *ms > 0);
    let argument = millis(q.get("arguments").and_then(|a| a.get("x-consumer-timeout")));
    let policy = millis(
        q.get("effective_policy_definition")
            .and_then(|d| d.get("consumer-timeout")),
    );
    let policy_name = q
        .get("policy")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map_or_else(
            || "a policy".to_owned(),
            |p| format!("policy {:?}", short(p)),
        );
    match (argument, policy) {
        (Some(a), Some(p)) if a <= p => Some((
            Duration::from_millis(a),
            format!("queue argument x-consumer-timeout, below {policy_name}'s {p} ms"),
        )),
        (Some(a), Some(p)) => Some((
            Duration::from_millis(p),
            format!("{policy_name}'s consumer-timeout, below the queue argument's {a} ms"),
        )),
        (Some(a), None) => Some((
            Duration::from_millis(a),
            "queue argument x-consumer-timeout".to_owned(),
        )),
        (None, Some(p)) => Some((
            Duration::from_millis(p),
            format!("{policy_name}'s consumer-timeout"),
        )),
        (None, None) => None,
    }
}

fn short(text: &str) -> String {
    let text = redact_text(text);
    if text.chars().count() > MAX_TEXT {
        let mut cut: String = text.chars().take(MAX_TEXT).collect();
        cut.push('…');
        cut
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_without_the_dead_letter_worker_fixes_are_named() {
        for (v, gap) in [
            ((3, 8, 35), true),
            ((3, 9, 29), true),
            ((3, 10, 8), true),
            ((3, 10, 19), true),
            ((3, 10, 20), false),
            ((3, 11, 11), true),
            ((3, 11, 12), false),
            ((3, 12, 0), false),
            ((3, 13, 7), false),
            ((4, 0, 2), false),
        ] {
            assert_eq!(retry_tier_gap(v.0, v.1, v.2).is_some(), gap, "{v:?}");
        }
    }

    #[test]
    fn a_queues_own_consumer_timeout_is_the_smaller_of_argument_and_policy() {
        let q = serde_json::json!({
            "arguments": {"x-consumer-timeout": 600_000},
            "policy": "long-jobs",
            "effective_policy_definition": {"consumer-timeout": 3_600_000}
        });
        let (t, from) = consumer_timeout_of(&q).unwrap();
        assert_eq!(t, Duration::from_secs(600));
        assert!(from.contains("queue argument"), "{from}");
        let q = serde_json::json!({
            "arguments": {},
            "policy": "long-jobs",
            "effective_policy_definition": {"consumer-timeout": 2_400_000}
        });
        let (t, from) = consumer_timeout_of(&q).unwrap();
        assert_eq!(t, Duration::from_secs(2400));
        assert!(from.contains("\"long-jobs\""), "{from}");
        // Neither, or values the broker would refuse: nothing of the queue's own.
        for q in [
            serde_json::json!({"arguments": {}}),
            serde_json::json!({"arguments": {"x-consumer-timeout": "600000"}}),
            serde_json::json!({"effective_policy_definition": {"consumer-timeout": -1}}),
        ] {
            assert_eq!(consumer_timeout_of(&q), None, "{q}");
        }
    }

    #[test]
    fn per_queue_timeouts_start_with_3_12() {
        let v = |major, minor| BrokerVersion {
            major,
            minor,
            text: String::new(),
        };
        assert!(!v(3, 10).has_per_queue_consumer_timeout());
        assert!(!v(3, 11).has_per_queue_consumer_timeout());
        assert!(v(3, 12).has_per_queue_consumer_timeout());
        assert!(v(4, 0).has_per_queue_consumer_timeout());
    }
}
