//! The rate budget: one retry asked of a dependency's budget, and which store answers it.
//!
//! With a fleet store, a denial of it that still stands is answered in the process
//! ([`DenyCache`], counted with the pending deposits since Redis never sees it); otherwise the
//! store is called while [`Health`] says it answers for the dependency, and the fallback decides
//! when it does not. Without a fleet store the local store is the budget.

use std::sync::Arc;
use std::time::Instant;

use super::coalesce::Coalescer;
use super::deny_cache::{DenyCache, Lookup};
use super::health::Health;
use crate::allowance::BudgetSnapshot;
use crate::decision::BudgetSource;
use crate::dependency::Dependency;
use crate::policy::BudgetPolicy;
use crate::store::{BudgetStore, LocalStore, Withdrawal};

/// Where retries are withdrawn: the fleet store, its deny cache, the fallback.
#[derive(Debug)]
pub(super) struct RateBudget {
    pub(super) fleet: Option<Arc<dyn BudgetStore>>,
    pub(super) local: LocalStore,
    pub(super) health: Arc<Health>,
    /// Denials of the fleet store that still stand, answered without a call.
    pub(super) denials: Arc<DenyCache>,
    /// Where a denial answered in the process is counted, to reach Redis with the deposits.
    pub(super) deposits: Arc<Coalescer>,
}

impl RateBudget {
    /// One retry of `dependency`'s budget under `policy`, and which store answered.
    pub(super) async fn withdraw(
        &self,
        dependency: &Dependency,
        policy: &BudgetPolicy,
    ) -> (Withdrawal, BudgetSource) {
        let Some(fleet) = &self.fleet else {
            return (
                self.local.withdraw_now(dependency, policy),
                BudgetSource::Local,
            );
        };
        let epoch = match self.denials.lookup(dependency) {
            Lookup::Denied(withdrawal) => {
                // The store never sees this denial: counted here, sent with the deposits.
                self.deposits.denied_in_process(dependency);
                return (withdrawal, BudgetSource::FleetCache);
            }
            Lookup::Ask(epoch) => epoch,
        };
        if self.health.should_try(dependency) {
            let sent = Instant::now();
            let asked_ms = self.health.now_ms();
            let result = fleet.withdraw(dependency, policy).await;
            self.health.record(dependency, &result);
            if let Ok(withdrawal) = result {
                self.health.saw(dependency, asked_ms, &withdrawal);
                self.denials.remember(dependency, epoch, sent, &withdrawal);
                return (withdrawal, BudgetSource::Fleet);
            }
        }
        self.health.fallback_withdrawal(dependency, policy)
    }

    /// The current budget of `dependency` under `policy`, from the fleet store when it answers.
    pub(super) async fn status(
        &self,
        dependency: &Dependency,
        policy: &BudgetPolicy,
    ) -> (BudgetSnapshot, BudgetSource) {
        let Some(fleet) = &self.fleet else {
            return (
                self.local.status_now(dependency, policy),
                BudgetSource::Local,
            );
        };
        let result = fleet.status(dependency, policy).await;
        self.health.record(dependency, &result);
        match result {
            Ok(snapshot) => {
                self.denials.seen(dependency, snapshot.control);
                (snapshot, BudgetSource::Fleet)
            }
            Err(_) => (
                self.local.status_now(dependency, policy),
                BudgetSource::LocalFallback,
            ),
        }
    }
}
