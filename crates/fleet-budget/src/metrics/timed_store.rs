//! A [`BudgetStore`] that times every call of the store it wraps, for
//! `fleet_budget_store_call_duration_seconds`. The fleet store of a [`crate::FleetBudget`] is
//! wrapped once, when it is built, so every path (decisions, flushes, status) is measured.

use std::sync::Arc;
use std::time::Instant;

use super::{Metrics, StoreOp};
use crate::allowance::BudgetSnapshot;
use crate::dependency::Dependency;
use crate::policy::BudgetPolicy;
use crate::store::{BudgetStatus, BudgetStore, Deposits, StoreFuture, Withdrawal};

/// The wrapped store and where its timings go.
#[derive(Debug)]
pub(crate) struct TimedStore {
    inner: Arc<dyn BudgetStore>,
    metrics: Metrics,
}

impl TimedStore {
    pub(crate) fn new(inner: Arc<dyn BudgetStore>, metrics: Metrics) -> Self {
        Self { inner, metrics }
    }

    /// Runs `call` of the wrapped store and records its time under `op`.
    fn timed<'a, T: 'a>(&'a self, op: StoreOp, call: StoreFuture<'a, T>) -> StoreFuture<'a, T> {
        Box::pin(async move {
            let started = Instant::now();
            let result = call.await;
            self.metrics.store_call(op, started.elapsed());
            result
        })
    }
}

impl BudgetStore for TimedStore {
    fn deposit<'a>(
        &'a self,
        dependency: &'a Dependency,
        policy: &'a BudgetPolicy,
        deposits: Deposits,
    ) -> StoreFuture<'a, BudgetSnapshot> {
        self.timed(
            StoreOp::Deposit,
            self.inner.deposit(dependency, policy, deposits),
        )
    }

    fn deposit_with_denials<'a>(
        &'a self,
        dependency: &'a Dependency,
        policy: &'a BudgetPolicy,
        deposits: Deposits,
        denied: u64,
    ) -> StoreFuture<'a, BudgetSnapshot> {
        self.timed(
            StoreOp::Deposit,
            self.inner
                .deposit_with_denials(dependency, policy, deposits, denied),
        )
    }

    fn withdraw<'a>(
        &'a self,
        dependency: &'a Dependency,
        policy: &'a BudgetPolicy,
    ) -> StoreFuture<'a, Withdrawal> {
        self.timed(StoreOp::Spend, self.inner.withdraw(dependency, policy))
    }

    fn status<'a>(
        &'a self,
        dependency: &'a Dependency,
        policy: &'a BudgetPolicy,
    ) -> StoreFuture<'a, BudgetSnapshot> {
        self.timed(StoreOp::Status, self.inner.status(dependency, policy))
    }

    fn status_in_force<'a>(
        &'a self,
        dependency: &'a Dependency,
        policy: &'a BudgetPolicy,
    ) -> StoreFuture<'a, BudgetStatus> {
        self.timed(
            StoreOp::Status,
            self.inner.status_in_force(dependency, policy),
        )
    }

    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Arc;

    use super::TimedStore;
    use crate::Dependency;
    use crate::metrics::{Metrics, StoreOp};
    use crate::policy::BudgetPolicy;
    use crate::store::{BudgetStore, Deposits, LocalStore};

    #[tokio::test]
    async fn every_call_is_counted_under_its_operation() {
        let metrics = Metrics::new();
        let store = TimedStore::new(Arc::new(LocalStore::new()), metrics.clone());
        let search = Dependency::new("search").unwrap();
        let policy = BudgetPolicy::default();
        let deposits = Deposits {
            successes: 3,
            first_attempts: 0,
        };
        store.deposit(&search, &policy, deposits).await.unwrap();
        store.withdraw(&search, &policy).await.unwrap();
        store.withdraw(&search, &policy).await.unwrap();
        store.status(&search, &policy).await.unwrap();
        assert_eq!(metrics.store_calls(StoreOp::Deposit), 1);
        assert_eq!(metrics.store_calls(StoreOp::Spend), 2);
        assert_eq!(metrics.store_calls(StoreOp::Status), 1);
        let text = metrics.render();
        assert!(
            text.contains(
                "fleet_budget_store_call_duration_seconds_bucket{op=\"spend\",le=\"0.05\"} 2"
            ),
            "{text}"
        );
        assert_eq!(store.kind(), "local");
    }
}
