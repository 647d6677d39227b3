//! Every job accounted for: what happened to each job of a drill, by id, and the tally
//! `succeeded + dead-lettered-then-replayed + parked + still dead-lettered = submitted`, the rest
//! lost (which must be none).
//!
//! Deliveries are at least once (a worker that dies mid-job, an unconfirmed copy), so successes
//! are recorded by job id and a job counts once, however often it ran. Dead letters are counted
//! by the queue that holds them, and by the budget's metrics.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use serde::Serialize;

/// Which jobs succeeded, recorded by concurrent workers.
#[derive(Debug, Default)]
pub struct JobOutcomes {
    succeeded: Mutex<HashSet<u64>>,
    replay_succeeded: Mutex<HashSet<u64>>,
    successes: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl JobOutcomes {
    /// Job `id` succeeded; `replayed` when it came back from the dead-letter queue.
    pub fn succeeded(&self, id: u64, replayed: bool) {
        self.successes.fetch_add(1, Ordering::Relaxed);
        let set = if replayed {
            &self.replay_succeeded
        } else {
            &self.succeeded
        };
        lock(set).insert(id);
    }

    /// Ids of the jobs that succeeded on the first pass.
    #[must_use]
    pub fn succeeded_ids(&self) -> HashSet<u64> {
        lock(&self.succeeded).clone()
    }

    /// Ids of the replayed jobs that succeeded.
    #[must_use]
    pub fn replay_succeeded_ids(&self) -> HashSet<u64> {
        lock(&self.replay_succeeded).clone()
    }

    /// Successful executions so far (a job run twice counts twice).
    #[must_use]
    pub fn successes(&self) -> u64 {
        self.successes.load(Ordering::Relaxed)
    }
}

/// Every job of a run accounted for after the replay.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Accounting {
    /// Jobs submitted.
    pub submitted: u64,
    /// Jobs that succeeded on the first pass.
    pub succeeded: u64,
    /// Jobs dead-lettered, replayed, then succeeded.
    pub dead_lettered_then_replayed: u64,
    /// Jobs parked (they came back from replay again).
    pub parked: u64,
    /// Jobs still in the dead-letter queue.
    pub still_dead_lettered: u64,
    /// The rest: jobs with no outcome.
    pub lost: u64,
}

impl Accounting {
    /// Jobs that succeeded on the first pass, the replayed ones that succeeded afterwards (and
    /// not before), `parked` and `still_dead_lettered` as counted by the queue; the rest is lost.
    #[must_use]
    pub fn tally(
        submitted: u64,
        outcomes: &JobOutcomes,
        parked: u64,
        still_dead_lettered: u64,
    ) -> Self {
        let succeeded = outcomes.succeeded_ids();
        let replayed = outcomes
            .replay_succeeded_ids()
            .difference(&succeeded)
            .count() as u64;
        let succeeded = succeeded.len() as u64;
        let accounted = succeeded + replayed + parked + still_dead_lettered;
        Self {
            submitted,
            succeeded,
            dead_lettered_then_replayed: replayed,
            parked,
            still_dead_lettered,
            lost: submitted.saturating_sub(accounted),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_counts_once_however_often_it_ran() {
        let o = JobOutcomes::default();
        o.succeeded(1, false);
        o.succeeded(1, false); // redelivered
        o.succeeded(2, true);
        o.succeeded(1, true); // succeeded first, replayed as a duplicate: counted once
        assert_eq!(o.successes(), 4);
        let a = Accounting::tally(5, &o, 1, 0);
        assert_eq!(
            a,
            Accounting {
                submitted: 5,
                succeeded: 1,
                dead_lettered_then_replayed: 1,
                parked: 1,
                still_dead_lettered: 0,
                lost: 2,
            }
        );
    }
}
