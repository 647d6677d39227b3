//! The in-process store's decision cost against tower's `TpsBudget`, in one criterion run
//! (issues 3 and 14). Both are asked for one retry (`withdraw`) and told of one deposit
//! (`deposit`); "granted" keeps both budgets far from their limit, "denied" keeps both exhausted.
//! `LocalBudget` is the held per-dependency handle (atomic counters, no lock, no map lookup);
//! `LocalStore::withdraw_now` finds the same counters through the store's map and mutex.
//!
//! `cargo bench -p fleet-budget --bench local_vs_tower`. Under `cargo test --all-targets`
//! criterion runs each function once, as a smoke test; no server is needed.
#![allow(missing_docs, clippy::unwrap_used)]

use std::hint::black_box;
use std::time::{Duration, SystemTime};

use criterion::{Criterion, criterion_group, criterion_main};
use fleet_budget::allowance::BudgetState;
use fleet_budget::store::{Deposits, LocalStore};
use fleet_budget::{BudgetPolicy, Dependency};
use tower::retry::budget::{Budget, TpsBudget};

fn decisions(c: &mut Criterion) {
    let dependency = Dependency::new("search").unwrap();

    let mut group = c.benchmark_group("withdraw_granted");
    let local = LocalStore::new();
    let generous = BudgetPolicy {
        min_allowance: u64::MAX / 4,
        ..BudgetPolicy::default()
    };
    let handle = local.handle(&dependency, &generous);
    group.bench_function("fleet_budget::LocalBudget::withdraw (held handle)", |b| {
        b.iter(|| black_box(handle.withdraw().granted));
    });
    group.bench_function("fleet_budget::LocalStore::withdraw_now", |b| {
        b.iter(|| {
            black_box(
                local
                    .withdraw_now(black_box(&dependency), black_box(&generous))
                    .granted,
            )
        });
    });
    // A minimum of 2^30 retries per second over a 10 s TTL: never exhausted during the run.
    let tower = TpsBudget::new(Duration::from_secs(10), 1 << 30, 0.2);
    group.bench_function("tower::TpsBudget::withdraw", |b| {
        b.iter(|| black_box(tower.withdraw()));
    });
    group.finish();

    let mut group = c.benchmark_group("withdraw_denied");
    let local = LocalStore::new();
    let exhausted = BudgetPolicy {
        min_allowance: 0,
        ratio: 0.0,
        ..BudgetPolicy::default()
    };
    let handle = local.handle(&dependency, &exhausted);
    group.bench_function("fleet_budget::LocalBudget::withdraw (held handle)", |b| {
        b.iter(|| black_box(handle.withdraw().granted));
    });
    group.bench_function("fleet_budget::LocalStore::withdraw_now", |b| {
        b.iter(|| {
            black_box(
                local
                    .withdraw_now(black_box(&dependency), black_box(&exhausted))
                    .granted,
            )
        });
    });
    let tower = TpsBudget::new(Duration::from_secs(10), 0, 0.0);
    group.bench_function("tower::TpsBudget::withdraw", |b| {
        b.iter(|| black_box(tower.withdraw()));
    });
    group.finish();

    // Where the local store's time goes: the same decision as pure arithmetic on one budget
    // (no clock read, no lock, no map lookup), and the system clock read it no longer makes per
    // call (it reads `CoarseClock`, refreshed from memory).
    let mut group = c.benchmark_group("withdraw_parts");
    let now = 1_800_000_000_000u64;
    let mut state = BudgetState::empty(now, generous.window_ms());
    group.bench_function("allowance::BudgetState::try_spend (math only)", |b| {
        b.iter(|| black_box(state.try_spend(black_box(now), black_box(&generous)).0));
    });
    group.bench_function("SystemTime::now (no longer on the store's path)", |b| {
        b.iter(|| black_box(SystemTime::now()));
    });
    group.finish();

    let mut group = c.benchmark_group("deposit");
    let local = LocalStore::new();
    let policy = BudgetPolicy::default();
    let one = Deposits {
        successes: 1,
        first_attempts: 0,
    };
    let handle = local.handle(&dependency, &policy);
    group.bench_function("fleet_budget::LocalBudget::deposit (held handle)", |b| {
        b.iter(|| black_box(handle.deposit(one).allowance));
    });
    group.bench_function("fleet_budget::LocalStore::deposit_now", |b| {
        b.iter(|| {
            black_box(
                local
                    .deposit_now(black_box(&dependency), black_box(&policy), one)
                    .allowance,
            )
        });
    });
    let tower = TpsBudget::new(Duration::from_secs(10), 10, 0.2);
    group.bench_function("tower::TpsBudget::deposit", |b| b.iter(|| tower.deposit()));
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    targets = decisions
}
criterion_main!(benches);
