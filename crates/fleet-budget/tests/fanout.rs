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

use fleet_budget::testing::RedisServer;
use fleet_budget::{Config, DeadLetterReason, Decision, Dependency, Failure, FleetBudget};

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
