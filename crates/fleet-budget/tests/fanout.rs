//! Jobs that fan out to several dependencies, on a real, private `redis-server`: a failure
//! naming its dependency spends that dependency's budget, and a job's retries across its
//! branches stop at its own cap before any budget is asked.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::collections::BTreeSet;

use fleet_budget::testing::RedisServer;
use fleet_budget::{Config, DeadLetterReason, Decision, Dependency, Error, Failure, FleetBudget};
use prometheus::proto::MetricFamily;

fn budget_config(server: &RedisServer) -> Config {
    let text = format!(
        "[redis]\nurl = \"{}\"\ntimeout_ms = 5000\nkey_prefix = \"fbt\"\ndeposit_flush_ms = 0\n\
         [defaults]\nratio = 0\nmin_allowance = 5\n\
         [dependencies.search]\ntasks = [\"index\"]\n\
         [dependencies.mail]\nmin_allowance = 1\n",
        server.url()
    );
    Config::from_toml(&text, "test").unwrap()
}

async fn retries(budget: &FleetBudget, name: &str) -> u64 {
    let (s, _) = budget.status(&Dependency::new(name).unwrap()).await;
    s.current.retries + s.previous.retries
}

#[tokio::test]
async fn a_failure_naming_its_dependency_spends_that_dependency_s_budget() {
    let server = RedisServer::start();
    let budget = FleetBudget::from_config(&budget_config(&server))
        .await
        .unwrap();
    let in_mail = Failure::retryable("smtp 451").in_dependency("mail");
    let first = budget.on_failure("index", 1, &in_mail).await.unwrap();
    let Decision::Retry { dependency, .. } = &first else {
        panic!("{first:?}");
    };
    assert_eq!(dependency.as_str(), "mail");
    // mail's floor is 1: the next one is refused by mail's budget, search's is untouched.
    let second = budget.on_failure("index", 1, &in_mail).await.unwrap();
    let Decision::DeadLetter {
        dependency, reason, ..
    } = &second
    else {
        panic!("{second:?}");
    };
    assert_eq!(
        (dependency.as_str(), *reason),
        ("mail", DeadLetterReason::BudgetExhausted)
    );
    assert_eq!(
        (
            retries(&budget, "mail").await,
            retries(&budget, "search").await
        ),
        (1, 0)
    );
    // Without a name, the task's own dependency pays.
    let own = budget
        .on_failure("index", 1, &Failure::retryable("503"))
        .await
        .unwrap();
    assert!(own.is_retry());
    assert_eq!(retries(&budget, "search").await, 1);
    // A name that cannot be a dependency is an error naming it.
    let err = budget
        .on_failure("index", 1, &Failure::retryable("x").in_dependency("a{b}"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("a{b}"), "{err}");
}

#[tokio::test]
async fn a_job_s_retries_across_its_branches_stop_at_its_cap_before_any_budget() {
    let server = RedisServer::start();
    let budget = FleetBudget::from_config(&budget_config(&server))
        .await
        .unwrap();
    let failure = Failure::retryable("timeout");
    let mut job = budget.fan_out("index", 3);
    for branch in ["search", "mail", "search"] {
        let d = job.on_branch_failure(branch, &failure).await.unwrap();
        let Decision::Retry {
            dependency,
            next_attempt,
            ..
        } = &d
        else {
            panic!("{branch}: {d:?}");
        };
        assert_eq!(dependency.as_str(), branch);
        assert_eq!(*next_attempt, job.retries() + 1);
    }
    assert_eq!(job.retries(), 3);
    // Every budget has room left (search 5, used 2), but the job's cap is reached.
    let d = job.on_branch_failure("search", &failure).await.unwrap();
    assert_eq!(
        d.dead_letter_reason(),
        Some(DeadLetterReason::FanoutExhausted)
    );
    assert_eq!(
        retries(&budget, "search").await,
        2,
        "the cap spends nothing"
    );
    assert_eq!(
        budget
            .metrics()
            .dead_letters("search", DeadLetterReason::FanoutExhausted),
        1
    );
    // Non-retryable comes first, and a branch budget's refusal is its own reason.
    let mut other = budget.fan_out("index", 10);
    let d = other
        .on_branch_failure("mail", &Failure::non_retryable("400"))
        .await
        .unwrap();
    assert_eq!(d.dead_letter_reason(), Some(DeadLetterReason::NonRetryable));
    let d = other.on_branch_failure("mail", &failure).await.unwrap();
    assert_eq!(
        d.dead_letter_reason(),
        Some(DeadLetterReason::BudgetExhausted),
        "mail's one retry went to the first job"
    );
    assert!(other.on_branch_failure("{bad}", &failure).await.is_err());
}

/// The distinct values of `label` across `families`.
fn label_values(families: &[MetricFamily], label: &str) -> BTreeSet<String> {
    families
        .iter()
        .flat_map(|f| f.get_metric())
        .flat_map(|m| m.get_label())
        .filter(|l| l.name() == label)
        .map(|l| l.value().to_owned())
        .collect()
}

fn unmapped_config(server: &RedisServer, unmapped: &str) -> Config {
    let text = format!(
        "[redis]\nurl = \"{}\"\ntimeout_ms = 5000\nkey_prefix = \"fbu\"\ndeposit_flush_ms = 0\n\
         [defaults]\nratio = 0\nmin_allowance = 5\n\
         [dependencies.search]\ntasks = [\"index\"]\n\
         [dependencies.mail]\n\
         [unmapped_tasks]\n{unmapped}\n",
        server.url()
    );
    Config::from_toml(&text, "test").unwrap()
}

/// The dependency a decision spent (or would have).
fn spent(d: &Decision) -> String {
    let (Decision::Retry { dependency, .. } | Decision::DeadLetter { dependency, .. }) = d;
    dependency.to_string()
}

/// A failure may name any dependency (`in_dependency`, a fan-out branch), and the name often
/// comes from the message: 3,000 distinct names no section configures go through
/// `[unmapped_tasks]` like unmapped tasks. With a cap of 3 own budgets, the first 3 names get
/// one, the rest share `unmapped`: at most 3 + `unmapped` + the configured dependencies in
/// Redis and as `dependency` label values. Before, each name was a budget of its own (3,000
/// keys, 3,000 label values, and 3,000 fresh floors of retries).
#[tokio::test]
async fn thousands_of_named_dependencies_make_at_most_the_cap_of_budgets_and_label_values() {
    let server = RedisServer::start();
    let budget = FleetBudget::from_config(&unmapped_config(&server, "max_own_budgets = 3"))
        .await
        .unwrap();
    let failure = Failure::retryable("timeout");
    let mut spent_on = BTreeSet::new();
    let mut granted = 0;
    for i in 0..2000 {
        let d = budget
            .on_failure(
                "index",
                1,
                &failure.clone().in_dependency(format!("dep-{i}")),
            )
            .await
            .unwrap();
        granted += u32::from(d.is_retry());
        spent_on.insert(spent(&d));
    }
    for i in 2000..3000 {
        let mut job = budget.fan_out("index", 5);
        let d = job
            .on_branch_failure(&format!("dep-{i}"), &failure)
            .await
            .unwrap();
        granted += u32::from(d.is_retry());
        spent_on.insert(spent(&d));
    }
    let expected: BTreeSet<String> = ["dep-0", "dep-1", "dep-2", "unmapped"]
        .map(String::from)
        .into();
    assert!(
        spent_on == expected,
        "{} budgets spent, from {:?}",
        spent_on.len(),
        spent_on.iter().take(6).collect::<Vec<_>>()
    );
    // One failure each for the 3 own budgets, and `unmapped`'s floor of 5 for the other
    // 2,997 names (each of them its own floor before: 3,000 granted).
    assert_eq!(granted, 3 + 5, "retries granted across 3,000 names");
    // Known names are never capped, and an admitted name keeps its budget.
    for name in ["search", "mail", "dep-1", "unmapped"] {
        let d = budget
            .on_failure("index", 1, &failure.clone().in_dependency(name))
            .await
            .unwrap();
        assert_eq!(spent(&d), name);
    }
    budget.flush().await.unwrap();
    let labels = label_values(&budget.metrics().registry().gather(), "dependency");
    let mut bounded = expected.clone();
    bounded.extend(["search".to_owned(), "mail".to_owned()]);
    assert!(
        labels.is_subset(&bounded),
        "dependency label values {labels:?}"
    );
    // Every key but the worker registry's two (one per fleet, whatever the tasks).
    let registry = [
        fleet_budget::keys::workers_key("fbu"),
        fleet_budget::keys::workers_seen_key("fbu"),
    ];
    let keys: Vec<String> = server.cmd(&["KEYS", "fbu:*"]);
    let keys: Vec<String> = keys.into_iter().filter(|k| !registry.contains(k)).collect();
    let tags: BTreeSet<&str> = keys
        .iter()
        .filter_map(|k| k.split_once('{')?.1.split_once('}').map(|t| t.0))
        .collect();
    assert!(
        tags.iter().all(|t| bounded.contains(*t)),
        "budget keys {keys:?}"
    );
}

/// `share` and `reject` apply to named dependencies as to unmapped tasks: a name no section
/// configures spends the shared dependency, or is refused with an error naming it (the worker
/// dead-letters it `non_retryable`, class `unmapped_task`); configured names are untouched.
#[tokio::test]
async fn named_dependencies_share_or_are_rejected_like_unmapped_tasks() {
    let server = RedisServer::start();
    let shared = FleetBudget::from_config(&unmapped_config(
        &server,
        "policy = \"share\"\ndependency = \"mail\"",
    ))
    .await
    .unwrap();
    let failure = Failure::retryable("timeout");
    for i in 0..1000 {
        let d = shared
            .on_failure("index", 1, &failure.clone().in_dependency(format!("x-{i}")))
            .await
            .unwrap();
        assert_eq!(spent(&d), "mail", "x-{i}");
    }
    let d = shared
        .fan_out("index", 3)
        .on_branch_failure("y", &failure)
        .await;
    assert_eq!(spent(&d.unwrap()), "mail");
    let labels = label_values(&shared.metrics().registry().gather(), "dependency");
    let configured: BTreeSet<String> = ["mail".to_owned(), "search".to_owned()].into();
    assert!(labels.is_subset(&configured), "{labels:?}");

    let rejecting = FleetBudget::from_config(&unmapped_config(&server, "policy = \"reject\""))
        .await
        .unwrap();
    let err = rejecting
        .on_failure("index", 1, &failure.clone().in_dependency("stranger"))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::UnmappedDependency { dependency } if dependency == "stranger"),
        "{err}"
    );
    let err = rejecting
        .fan_out("index", 3)
        .on_branch_failure("stranger", &failure)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::UnmappedDependency { .. }), "{err}");
    let d = rejecting
        .on_failure("index", 1, &failure.clone().in_dependency("mail"))
        .await
        .unwrap();
    assert_eq!(spent(&d), "mail");
    let d = rejecting
        .fan_out("index", 3)
        .on_branch_failure("search", &failure)
        .await
        .unwrap();
    assert_eq!(spent(&d), "search");
}
