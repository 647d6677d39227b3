//! Shadow mode (issue 34, item 1), on a real, private `redis-server`: a dependency in shadow
//! is decided exactly as in enforcement (the same scripts, the same counters in Redis), but a
//! retry its budget refuses is retried anyway, marked, and counted in
//! `fleet_budget_retries_would_deny_total`; an operator's switch reaches every worker within the
//! deny cache's staleness; a freeze still holds in shadow.
//!
//! The storm: four processes' budgets (each its own connection and cache) with 32 tasks each
//! decide a storm against a dependency in shadow beside the same storm against one enforced, in
//! the same run. Small here; `storm_of_200000_decisions_in_shadow_beside_enforcement` (ignored)
//! is the full size of `docs/BENCHMARKS.md`. Figures are printed, not asserted on time. The same
//! storms in OS processes, and with the allowance growing during them, are
//! `crates/fleet-budget/tests/shadow_processes.rs`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::cast_precision_loss,
    missing_docs
)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use fleet_budget::control::{AuditLog, OverrideAction, enforcement, fleet_status, overrides};
use fleet_budget::store::{RedisStore, RedisTarget};
use fleet_budget::testing::RedisServer;
use fleet_budget::{
    Config, DeadLetterReason, Decision, Dependency, Enforcement, Failure, FleetBudget,
};

const STALENESS_MS: u64 = 100;

fn config(server: &RedisServer, defaults: &str) -> Config {
    // A window of a day: nothing rolls under the test, so both storms face the same budget.
    let text = format!(
        "[redis]\nurl = \"{}\"\ntimeout_ms = 5000\nkey_prefix = \"fbs\"\ndeny_cache_ms = {STALENESS_MS}\n\
         [defaults]\n{defaults}\nwindow_secs = 86400\nmin_allowance = 10\n\
         [dependencies.shadowed]\ntasks = [\"shadowed\"]\nenforcement = \"shadow\"\n\
         [dependencies.enforced]\ntasks = [\"enforced\"]\n",
        server.url()
    );
    Config::from_toml(&text, "test").unwrap()
}

fn dep(name: &str) -> Dependency {
    Dependency::new(name).unwrap()
}

async fn fail(budget: &FleetBudget, task: &str) -> Decision {
    budget
        .on_failure(task, 1, &Failure::retryable("503"))
        .await
        .unwrap()
}

/// What one storm of `task` saw over its processes.
#[derive(Debug, Default)]
struct Seen {
    retried: u64,
    retried_in_shadow: u64,
    dead_lettered: u64,
    other: u64,
}

/// `total` decisions of `task` over 32 tasks per budget.
async fn storm(budgets: &[Arc<FleetBudget>], task: &'static str, total: u64) -> Seen {
    let tasks = budgets.len() as u64 * 32;
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let budget = Arc::clone(&budgets[usize::try_from(t).unwrap() % budgets.len()]);
            let share = total / tasks + u64::from(t < total % tasks);
            tokio::spawn(async move {
                let mut seen = Seen::default();
                for _ in 0..share {
                    match fail(&budget, task).await {
                        Decision::Retry {
                            shadow_denied: None,
                            ..
                        } => seen.retried += 1,
                        Decision::Retry {
                            shadow_denied: Some(DeadLetterReason::BudgetExhausted),
                            ..
                        } => seen.retried_in_shadow += 1,
                        Decision::DeadLetter {
                            reason: DeadLetterReason::BudgetExhausted,
                            ..
                        } => seen.dead_lettered += 1,
                        _ => seen.other += 1,
                    }
                }
                seen
            })
        })
        .collect();
    let mut all = Seen::default();
    for h in handles {
        let s = h.await.unwrap();
        all.retried += s.retried;
        all.retried_in_shadow += s.retried_in_shadow;
        all.dead_lettered += s.dead_lettered;
        all.other += s.other;
    }
    all
}

fn summed(budgets: &[Arc<FleetBudget>], counter: &str, dependency: &str) -> u64 {
    budgets
        .iter()
        .map(|b| b.metrics().counter(counter, dependency))
        .sum()
}

/// The two storms side by side; returns after checking what both promise.
async fn storms_side_by_side(total: u64) {
    let server = RedisServer::start();
    let config = config(&server, "");
    let mut budgets = Vec::new();
    for _ in 0..4 {
        budgets.push(Arc::new(FleetBudget::from_config(&config).await.unwrap()));
    }
    for b in &budgets {
        // Connected (and the scripts loaded) before anything is counted.
        let _ = b.status(&dep("shadowed")).await;
    }
    let started = Instant::now();
    let (shadow, enforced) = tokio::join!(
        storm(&budgets, "shadowed", total),
        storm(&budgets, "enforced", total)
    );
    let secs = started.elapsed().as_secs_f64();
    for b in &budgets {
        b.flush().await.unwrap();
    }
    let store = RedisStore::new(
        RedisTarget::Single(server.url()),
        "fbs",
        Duration::from_secs(5),
    )
    .unwrap();
    let redis_denied = |name: &'static str| {
        let store = &store;
        let policy = config.policy(&dep(name));
        async move {
            fleet_status(store, &dep(name), &policy)
                .await
                .unwrap()
                .snapshot
                .current
                .denied
        }
    };
    let (shadow_in_redis, enforced_in_redis) = (
        redis_denied("shadowed").await,
        redis_denied("enforced").await,
    );
    let would_deny = summed(&budgets, "retries_would_deny", "shadowed");
    let enforced_denied = summed(&budgets, "retries_denied", "enforced");
    println!(
        "storm of {total} decisions per dependency, 4 processes x 32 tasks, floor 10, {secs:.2} s for both\n\
         shadow:      {} retried as granted, {} retried in shadow (would_deny {would_deny}, Redis denied {shadow_in_redis}), {} dead-lettered\n\
         enforcement: {} retried, {} dead-lettered budget_exhausted (denied {enforced_denied}, Redis denied {enforced_in_redis})\n\
         would_deny - enforcement's denials = {}",
        shadow.retried,
        shadow.retried_in_shadow,
        shadow.dead_lettered + shadow.other,
        enforced.retried,
        enforced.dead_lettered,
        i128::from(would_deny) - i128::from(enforced_denied),
    );
    assert_eq!(shadow.other + enforced.other, 0);
    assert_eq!(
        shadow.retried + shadow.retried_in_shadow,
        total,
        "in shadow every retry is retried"
    );
    assert_eq!(shadow.dead_lettered, 0);
    assert_eq!(
        shadow.retried, 10,
        "the budget granted its floor, as enforced"
    );
    assert_eq!(enforced.retried, 10, "the floor, exactly");
    assert_eq!(would_deny, shadow.retried_in_shadow);
    assert_eq!(enforced_denied, enforced.dead_lettered);
    // Both face an exhausted budget of the same floor and no deposits: enforcement's denials and
    // shadow's would-be denials are the same jobs (a staleness only ever delays a grant the
    // budget would make after a change, and nothing changes here).
    assert_eq!(would_deny, enforced_denied);
    assert_eq!(
        shadow_in_redis, would_deny,
        "the same counters: Redis counts shadow's refusals as denials"
    );
    assert_eq!(enforced_in_redis, enforced_denied);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_storm_in_shadow_retries_everything_enforcement_denies_beside_it() {
    storms_side_by_side(12_800).await;
}

/// The full storm of `docs/BENCHMARKS.md` ("Shadow beside enforcement"): `cargo test --release
/// -p fleet-budget --test shadow -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "the full-size storm (200,000 decisions per dependency), a benchmark"]
async fn storm_of_200000_decisions_in_shadow_beside_enforcement() {
    storms_side_by_side(200_000).await;
}

/// `budgetctl budget shadow|enforce`: a switch reaches a worker within the deny cache's
/// staleness, both ways, and is audited; a switch that ends returns the dependency to its
/// configuration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operators_switch_reaches_the_worker_within_the_staleness_and_ends_by_itself() {
    let server = RedisServer::start();
    let config = config(&server, "");
    let budget = FleetBudget::from_config(&config).await.unwrap();
    let store = RedisStore::new(
        RedisTarget::Single(server.url()),
        "fbs",
        Duration::from_secs(5),
    )
    .unwrap();
    let audit = AuditLog::default();
    // Exhaust the enforced dependency's floor.
    for _ in 0..10 {
        assert!(fail(&budget, "enforced").await.is_retry());
    }
    assert!(!fail(&budget, "enforced").await.is_retry(), "enforced");
    let switched = enforcement::switch(
        &store,
        &audit,
        &dep("enforced"),
        Enforcement::Shadow,
        Some(Duration::from_millis(1500)),
        "ops@test",
        "watching before enforcing",
    )
    .await
    .unwrap();
    assert_eq!(switched.before, None);
    assert_eq!(switched.after.enforcement, Enforcement::Shadow);
    tokio::time::sleep(Duration::from_millis(STALENESS_MS + 20)).await;
    let d = fail(&budget, "enforced").await;
    assert_eq!(
        d.shadow_denied(),
        Some(DeadLetterReason::BudgetExhausted),
        "switched to shadow within the staleness: {d:?}"
    );
    // And back, before the switch ends.
    let back = enforcement::switch(
        &store,
        &audit,
        &dep("enforced"),
        Enforcement::Enforce,
        None,
        "ops@test",
        "enough seen",
    )
    .await
    .unwrap();
    assert_eq!(
        back.before.as_ref().map(|s| s.enforcement),
        Some(Enforcement::Shadow)
    );
    tokio::time::sleep(Duration::from_millis(STALENESS_MS + 20)).await;
    assert_eq!(
        fail(&budget, "enforced").await.dead_letter_reason(),
        Some(DeadLetterReason::BudgetExhausted)
    );
    let trail = audit
        .read(&store, None, None, Some("enforced"), 10)
        .await
        .unwrap();
    let actions: Vec<&str> = trail.iter().map(|e| e.action.as_str()).collect();
    assert_eq!(actions, ["shadow", "enforce"], "both switches, in order");
    // A switch with an end: the configuration decides again once it has passed.
    enforcement::switch(
        &store,
        &audit,
        &dep("shadowed"),
        Enforcement::Enforce,
        Some(Duration::from_millis(300)),
        "ops@test",
        "a short enforcement",
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(300 + STALENESS_MS + 50)).await;
    assert_eq!(
        enforcement::read(&store, &dep("shadowed")).await.unwrap(),
        None,
        "the switch's key expired with it"
    );
    for _ in 0..11 {
        let _ = fail(&budget, "shadowed").await;
    }
    assert_eq!(
        fail(&budget, "shadowed").await.shadow_denied(),
        Some(DeadLetterReason::BudgetExhausted),
        "in shadow as configured again"
    );
}

/// A freeze is an operator's order: it holds in shadow (dead-lettered `budget_frozen`), and
/// shadow still never dead-letters what the budget grants.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_freeze_holds_in_shadow() {
    let server = RedisServer::start();
    let config = config(&server, "enforcement = \"shadow\"");
    // `[defaults]`'s, for a section without its own too.
    assert_eq!(config.enforcement.of(&dep("enforced")), Enforcement::Shadow);
    assert_eq!(config.enforcement.of(&dep("other")), Enforcement::Shadow);
    let budget = FleetBudget::from_config(&config).await.unwrap();
    let store = RedisStore::new(
        RedisTarget::Single(server.url()),
        "fbs",
        Duration::from_secs(5),
    )
    .unwrap();
    overrides::apply(
        &store,
        &AuditLog::default(),
        &dep("shadowed"),
        OverrideAction::Freeze {
            duration: Duration::from_secs(60),
        },
        "ops@test",
        "incident",
    )
    .await
    .unwrap();
    assert_eq!(
        fail(&budget, "shadowed").await.dead_letter_reason(),
        Some(DeadLetterReason::BudgetFrozen)
    );
    assert_eq!(
        budget.metrics().counter("retries_would_deny", "shadowed"),
        0
    );
}

/// Redis does not answer (a port nobody listens on): a `deny` fallback's refusal is the
/// machinery's and holds in shadow; a `local` fallback's refusal of its exhausted budget is the
/// budget's, and is retried anyway, marked and counted (`docs/semantics.md`, "What shadow does not
/// cover").
#[tokio::test]
async fn in_shadow_a_deny_fallback_holds_and_a_local_fallbacks_refusal_is_shadowed() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("redis://{}", closed.local_addr().unwrap());
    drop(closed);
    for (fallback, shadowed) in [("deny", false), ("local", true)] {
        let text = format!(
            "[redis]\nurl = \"{url}\"\ntimeout_ms = 200\nkey_prefix = \"fbs\"\nfallback = \"{fallback}\"\n\
             [defaults]\nenforcement = \"shadow\"\nmin_allowance = 2\n\
             [dependencies.shadowed]\ntasks = [\"shadowed\"]\n"
        );
        let config = Config::from_toml(&text, "test").unwrap();
        let budget = FleetBudget::from_config(&config).await.unwrap();
        // The local fallback grants its floor's share first; then it refuses.
        let mut seen = Vec::new();
        for _ in 0..20 {
            seen.push(fail(&budget, "shadowed").await);
        }
        let refused_and_retried = seen
            .iter()
            .filter(|d| {
                matches!(
                    d,
                    Decision::Retry {
                        shadow_denied: Some(_),
                        ..
                    }
                )
            })
            .count();
        let dead_lettered = seen
            .iter()
            .filter(|d| d.dead_letter_reason().is_some())
            .count();
        println!(
            "fallback {fallback}: 20 failures, {refused_and_retried} refused and retried anyway, \
             {dead_lettered} dead-lettered"
        );
        if shadowed {
            assert!(refused_and_retried > 0, "{fallback}: {seen:?}");
            assert_eq!(dead_lettered, 0, "{fallback}: {seen:?}");
            assert_eq!(
                budget.metrics().counter("retries_would_deny", "shadowed"),
                u64::try_from(refused_and_retried).unwrap()
            );
        } else {
            assert_eq!(refused_and_retried, 0, "{fallback}: {seen:?}");
            assert_eq!(dead_lettered, 20, "{fallback}: {seen:?}");
            assert!(
                seen.iter()
                    .all(|d| d.dead_letter_reason() == Some(DeadLetterReason::BudgetExhausted))
            );
            assert_eq!(
                budget.metrics().counter("retries_would_deny", "shadowed"),
                0
            );
        }
    }
}

#[test]
fn enforcement_is_checked_with_the_key_named() {
    for (text, key) in [
        (
            "[defaults]\nenforcement = \"dry-run\"\n",
            "defaults.enforcement",
        ),
        (
            "[dependencies.search]\nenforcement = \"off\"\n",
            "dependencies.search.enforcement",
        ),
        ("[defaults]\nenforcement = 1\n", "defaults.enforcement"),
    ] {
        let e = Config::from_toml(text, "t.toml").unwrap_err().to_string();
        assert!(e.contains(key) || e.contains("enforcement"), "{e}");
        assert!(e.contains("t.toml"), "{e}");
    }
    let c = Config::from_toml("[defaults]\nenforcement = \"shadow\"\n", "t").unwrap();
    assert_eq!(c.enforcement.of(&dep("any")), Enforcement::Shadow);
    let c = Config::from_toml("", "t").unwrap();
    assert_eq!(c.enforcement.of(&dep("any")), Enforcement::Enforce);
}
