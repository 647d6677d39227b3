//! A plain-loop cross-check of `benches/local_vs_tower.rs`: 5 million decisions each, granted and
//! denied, `LocalStore::withdraw_now` against tower's `TpsBudget::withdraw`, two rounds, one
//! process. Criterion's per-group figures moved with the order of the groups; this loop shows
//! both paths side by side under the same conditions.
//!
//! `cargo run --release -p fleet-budget --example local_vs_tower_loop`

use std::hint::black_box;
use std::time::{Duration, Instant};

use fleet_budget::store::LocalStore;
use fleet_budget::{BudgetPolicy, Dependency};
use tower::retry::budget::{Budget, TpsBudget};

const CALLS: u32 = 5_000_000;

fn per_call(f: impl Fn() -> bool) -> f64 {
    let started = Instant::now();
    for _ in 0..CALLS {
        black_box(f());
    }
    started.elapsed().as_secs_f64() * 1e9 / f64::from(CALLS)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dependency = Dependency::new("search")?;
    let generous = BudgetPolicy {
        min_allowance: u64::MAX / 4,
        ..BudgetPolicy::default()
    };
    let exhausted = BudgetPolicy {
        min_allowance: 0,
        ratio: 0.0,
        ..BudgetPolicy::default()
    };
    for round in 1..=2 {
        let local = LocalStore::new();
        let granted = per_call(|| {
            local
                .withdraw_now(black_box(&dependency), &generous)
                .granted
        });
        let local = LocalStore::new();
        let denied = per_call(|| {
            local
                .withdraw_now(black_box(&dependency), &exhausted)
                .granted
        });
        let tower_ok = TpsBudget::new(Duration::from_secs(10), 1 << 30, 0.2);
        let tower_granted = per_call(|| tower_ok.withdraw());
        let tower_none = TpsBudget::new(Duration::from_secs(10), 0, 0.0);
        let tower_denied = per_call(|| tower_none.withdraw());
        println!(
            "round {round}: granted  LocalStore {granted:5.1} ns   tower TpsBudget {tower_granted:5.1} ns"
        );
        println!(
            "round {round}: denied   LocalStore {denied:5.1} ns   tower TpsBudget {tower_denied:5.1} ns"
        );
    }
    Ok(())
}
