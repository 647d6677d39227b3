//! An in-memory job queue with what a RabbitMQ topology of fleet-budget has: a work queue,
//! delayed retries, a dead-letter queue, and a parking lot for jobs that come back from replay
//! again. The incident drill runs on it when no broker answers.
//!
//! The queue decides nothing: a worker takes a job, runs it, asks the budget, and tells the
//! queue how the job [`Settle`]s (the same three ways a RabbitMQ worker settles a delivery).
//! It reads no clock either: every call that depends on time is handed `now`, the time since the
//! start of the run, and a delayed retry becomes ready once `now` passes its due time.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet, VecDeque};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use fleet_budget::DeadLetterReason;

/// One job as it travels through the queues.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Job {
    /// The job's id (unique per submitted job; a retry or a replay keeps it).
    pub id: u64,
    /// Whether its input is bad (the dependency refuses it whatever the load).
    pub bad_input: bool,
    /// The number of its next execution (1 = first).
    pub attempt: u32,
    /// Times replayed from the dead-letter queue.
    pub replays: u32,
}

/// How a worker settles a job it took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    /// Done (succeeded): the job leaves the queues.
    Ack,
    /// Run again as execution `next_attempt` once `now` reaches `due`.
    Retry {
        /// The number of the next execution.
        next_attempt: u32,
        /// When it becomes ready, since the start of the run.
        due: Duration,
    },
    /// Into the dead-letter queue.
    DeadLetter(DeadLetterReason),
}

/// What one replay pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplayPass {
    /// Jobs moved back to the work queue (paced: each becomes ready at its turn).
    pub moved: u64,
    /// Jobs parked because they had been replayed `max_replays` times already.
    pub parked: u64,
    /// When the last moved job becomes ready, since the start of the run.
    pub last_due: Duration,
}

#[derive(Debug, Default)]
struct State {
    work: VecDeque<Job>,
    /// Retries and paced replays, by due time (then by order of scheduling).
    delayed: BinaryHeap<Reverse<(Duration, u64, Job)>>,
    scheduled: u64,
    dead: Vec<(Job, DeadLetterReason)>,
    parked: Vec<Job>,
    /// Jobs taken and not settled yet.
    busy: u64,
}

impl State {
    fn schedule(&mut self, job: Job, due: Duration) {
        self.scheduled += 1;
        self.delayed.push(Reverse((due, self.scheduled, job)));
    }

    /// Moves the delayed jobs due at `now` to the end of the work queue, earliest first.
    fn release(&mut self, now: Duration) {
        while let Some(Reverse((due, _, _))) = self.delayed.peek() {
            if *due > now {
                break;
            }
            if let Some(Reverse((_, _, job))) = self.delayed.pop() {
                self.work.push_back(job);
            }
        }
    }
}

/// The queues. Shared by concurrent workers.
#[derive(Debug, Default)]
pub struct MemoryQueue {
    state: Mutex<State>,
}

impl MemoryQueue {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Publishes a new job (its first execution).
    pub fn submit(&self, id: u64, bad_input: bool) {
        self.state().work.push_back(Job {
            id,
            bad_input,
            attempt: 1,
            replays: 0,
        });
    }

    /// Takes the next ready job at `now`, if any; the caller must [`MemoryQueue::settle`] it.
    pub fn take(&self, now: Duration) -> Option<Job> {
        let mut state = self.state();
        state.release(now);
        let job = state.work.pop_front()?;
        state.busy += 1;
        Some(job)
    }

    /// Settles a job taken with [`MemoryQueue::take`].
    pub fn settle(&self, job: Job, how: Settle) {
        let mut state = self.state();
        state.busy = state.busy.saturating_sub(1);
        match how {
            Settle::Ack => {}
            Settle::Retry { next_attempt, due } => state.schedule(
                Job {
                    attempt: next_attempt,
                    ..job
                },
                due,
            ),
            Settle::DeadLetter(reason) => state.dead.push((job, reason)),
        }
    }

    /// When the earliest delayed job becomes ready, if any is waiting.
    #[must_use]
    pub fn next_due(&self) -> Option<Duration> {
        self.state().delayed.peek().map(|Reverse((due, _, _))| *due)
    }

    /// Jobs waiting: ready in the work queue, or waiting for their delay.
    #[must_use]
    pub fn waiting(&self) -> u64 {
        let state = self.state();
        (state.work.len() + state.delayed.len()) as u64
    }

    /// Jobs in the dead-letter queue.
    #[must_use]
    pub fn dead_depth(&self) -> u64 {
        self.state().dead.len() as u64
    }

    /// Parked jobs.
    #[must_use]
    pub fn parked_depth(&self) -> u64 {
        self.state().parked.len() as u64
    }

    /// Whether nothing is queued, delayed or being processed.
    #[must_use]
    pub fn idle(&self) -> bool {
        let state = self.state();
        state.work.is_empty() && state.delayed.is_empty() && state.busy == 0
    }

    /// One pass of replay at `now`, as the library replayer does it: bounded to the dead letters
    /// present now; a job replayed `max_replays` times already is parked; the others go back to
    /// the work queue with the attempt counter reset and the replay count incremented, paced at
    /// `rate` per second (the first at once).
    pub fn replay(&self, now: Duration, rate: u32, max_replays: u32) -> ReplayPass {
        let mut state = self.state();
        let batch = std::mem::take(&mut state.dead);
        let pause = Duration::from_secs(1) / rate.max(1);
        let mut pass = ReplayPass {
            last_due: now,
            ..ReplayPass::default()
        };
        for (job, _reason) in batch {
            if job.replays >= max_replays {
                state.parked.push(job);
                pass.parked += 1;
                continue;
            }
            let due = now.saturating_add(
                pause.saturating_mul(u32::try_from(pass.moved).unwrap_or(u32::MAX)),
            );
            state.schedule(
                Job {
                    attempt: 1,
                    replays: job.replays + 1,
                    ..job
                },
                due,
            );
            pass.moved += 1;
            pass.last_due = due;
        }
        pass
    }

    /// Ids of the parked jobs.
    #[must_use]
    pub fn parked_ids(&self) -> HashSet<u64> {
        self.state().parked.iter().map(|j| j.id).collect()
    }

    /// Ids of the jobs in the dead-letter queue.
    #[must_use]
    pub fn dead_ids(&self) -> HashSet<u64> {
        self.state().dead.iter().map(|(j, _)| j.id).collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_retry_waits_for_its_due_time_and_keeps_its_id() {
        let q = MemoryQueue::default();
        q.submit(7, false);
        let job = q.take(Duration::ZERO).unwrap();
        assert!(
            !q.idle(),
            "a job taken and not settled keeps the queue busy"
        );
        q.settle(
            job,
            Settle::Retry {
                next_attempt: 2,
                due: 100 * MS,
            },
        );
        assert_eq!(q.take(99 * MS), None);
        assert_eq!(q.next_due(), Some(100 * MS));
        assert_eq!(q.waiting(), 1);
        let again = q.take(100 * MS).unwrap();
        assert_eq!((again.id, again.attempt), (7, 2));
        q.settle(again, Settle::Ack);
        assert!(q.idle());
    }

    #[test]
    fn delayed_jobs_come_back_earliest_first() {
        let q = MemoryQueue::default();
        for id in 0..3 {
            q.submit(id, false);
        }
        for (id, due) in [(0, 30), (1, 10), (2, 20)] {
            let job = q.take(Duration::ZERO).unwrap();
            assert_eq!(job.id, id);
            q.settle(
                job,
                Settle::Retry {
                    next_attempt: 2,
                    due: due * MS,
                },
            );
        }
        let order: Vec<u64> = std::iter::from_fn(|| q.take(50 * MS))
            .map(|j| j.id)
            .collect();
        assert_eq!(order, [1, 2, 0]);
    }

    #[test]
    fn replay_paces_moves_back_and_parks_what_comes_back_again() {
        let q = MemoryQueue::default();
        for id in 0..3 {
            q.submit(id, id == 2);
            let job = q.take(Duration::ZERO).unwrap();
            q.settle(job, Settle::DeadLetter(DeadLetterReason::BudgetExhausted));
        }
        assert_eq!((q.dead_depth(), q.dead_ids().len()), (3, 3));
        let pass = q.replay(Duration::from_secs(1), 10, 1);
        assert_eq!((pass.moved, pass.parked), (3, 0));
        assert_eq!(pass.last_due, Duration::from_millis(1200));
        assert_eq!(q.dead_depth(), 0);
        let first = q.take(Duration::from_secs(1)).unwrap();
        assert_eq!((first.attempt, first.replays), (1, 1));
        assert_eq!(q.take(Duration::from_secs(1)), None, "paced");
        q.settle(first, Settle::DeadLetter(DeadLetterReason::NonRetryable));
        let pass = q.replay(Duration::from_secs(2), 10, 1);
        assert_eq!((pass.moved, pass.parked), (0, 1));
        assert_eq!(q.parked_ids(), HashSet::from([first.id]));
        assert_eq!(q.parked_depth(), 1);
    }
}
