//! The in-process store's decision cost against tower's `TpsBudget`, in one criterion run
//! (issue 3, item 4). Both are asked for one retry (`withdraw`) and told of one deposit
//! (`deposit`); "granted" keeps both budgets far from their limit, "denied" keeps both exhausted.
//!
//! `cargo bench -p fleet-budget --bench local_vs_tower`. Under `cargo test --all-targets`
//! criterion runs each function once, as a smoke test; no server is needed.
#![allow(missing_docs, clippy::unwrap_used)]

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::hint::black_box;
use std::sync::Mutex;
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
    // (no clock read, no lock, no map lookup), and the wall-clock read it makes per call.
    let mut group = c.benchmark_group("withdraw_parts");
    let now = 1_800_000_000_000u64;
    let mut state = BudgetState::empty(now, generous.window_ms());
    group.bench_function("allowance::BudgetState::try_spend (math only)", |b| {
        b.iter(|| black_box(state.try_spend(black_box(now), black_box(&generous)).0));
    });
    group.bench_function("SystemTime::now (the store's clock read)", |b| {
        b.iter(|| black_box(SystemTime::now()));
    });
    // What a leaner local store could cost: the same clock read, lock and arithmetic, but the
    // map looked up with `get_mut` (no `Arc` clone of the key) and hashed with FNV-1a instead of
    // SipHash. A sketch for `docs/BENCHMARKS.md`, not the store's code.
    let lean: Mutex<HashMap<Dependency, BudgetState, BuildHasherDefault<Fnv>>> =
        Mutex::new(HashMap::default());
    lean.lock().unwrap().insert(
        dependency.clone(),
        BudgetState::empty(now, generous.window_ms()),
    );
    group.bench_function("sketch: get_mut + FNV map, same clock and math", |b| {
        b.iter(|| {
            let now = fleet_budget::clock::now_ms();
            let mut map = lean.lock().unwrap();
            let state = map.get_mut(black_box(&dependency)).unwrap();
            black_box(state.try_spend(now, black_box(&generous)).0)
        });
    });
    group.finish();

    let mut group = c.benchmark_group("deposit");
    let local = LocalStore::new();
    let policy = BudgetPolicy::default();
    let one = Deposits {
        successes: 1,
        first_attempts: 0,
    };
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

/// FNV-1a, for the sketch above.
#[derive(Default)]
struct Fnv(u64);

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        let mut h = if self.0 == 0 {
            0xcbf2_9ce4_8422_2325
        } else {
            self.0
        };
        for b in bytes {
            h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
        self.0 = h;
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    targets = decisions
}
criterion_main!(benches);
