//! Group commit for withdrawals: while one decision for a dependency is in flight, the decisions
//! that arrive for it wait, then go to Redis together as one `spend_many.lua` call.
//!
//! Nothing waits when nothing is in flight: a lone decision is sent at once, as one `spend.lua`
//! call. Under load the Redis work per decision falls by the batch size. Per lane (a budget key
//! with its policy) there is at most one call in flight; its sender is the *leader*, a caller
//! whose own decision is in the batch. When the leader's call is over (answered, failed, or the
//! leader's future dropped), a guard hands the lane to the next waiting caller with up to
//! `max_batch − 1` others: that caller leads the next batch. So:
//!
//! - every caller waits at most the store's deadline from its arrival, whether it leads or not
//!   (the batch is bounded by its leader's deadline, the wait of the others by their own);
//! - a decision is sent at most once and never resent: a batch cut by a deadline or a dropped
//!   leader reached Redis or not, and its callers get an error (the fallback answers them), as
//!   a single call that timed out does;
//! - a caller that gives up while queued is skipped, never sent.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use tokio::sync::oneshot;

use super::scripts::policy_args;
use super::{RedisStore, Withdrawal};
use crate::allowance::BudgetSnapshot;
use crate::dependency::Dependency;
use crate::error::StoreError;
use crate::policy::BudgetPolicy;

/// The largest batch by default.
pub const DEFAULT_MAX_BATCH: usize = 64;

/// The most a batch may hold (`spend_many.lua` refuses more than 10,000).
pub const MAX_BATCH_LIMIT: usize = 10_000;

/// What a queued caller is woken with.
pub(super) enum Wake {
    /// Its decision, decided in someone else's batch.
    Answer(Result<Withdrawal, StoreError>),
    /// It leads the next batch, carrying these callers' decisions with its own.
    Lead(Vec<Waiter>),
}

/// A queued caller.
pub(super) type Waiter = oneshot::Sender<Wake>;

#[derive(Default)]
struct Lane {
    waiting: VecDeque<Waiter>,
}

/// The lanes of one store: a lane is in the map while a call of it is in flight.
pub(super) struct GroupCommit {
    lanes: Mutex<HashMap<String, Lane>>,
    max_batch: usize,
    calls: AtomicU64,
    decisions: AtomicU64,
}

/// How many withdrawal calls the store sent and how many decisions they carried.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroupCommitStats {
    /// `spend.lua` and `spend_many.lua` calls sent.
    pub calls: u64,
    /// Decisions those calls carried (each sent once).
    pub decisions: u64,
}

/// The caller's place: lead now (nothing was in flight), or wait.
pub(super) enum Turn {
    Lead,
    Wait(oneshot::Receiver<Wake>),
}

impl GroupCommit {
    pub(super) fn new(max_batch: usize) -> Self {
        Self {
            lanes: Mutex::new(HashMap::new()),
            max_batch: max_batch.clamp(1, MAX_BATCH_LIMIT),
            calls: AtomicU64::new(0),
            decisions: AtomicU64::new(0),
        }
    }

    pub(super) fn max_batch(&self) -> usize {
        self.max_batch
    }

    /// Joins `lane`: leads when nothing is in flight on it, else queues.
    pub(super) fn join(&self, lane: &str) -> Turn {
        let mut lanes = self.lanes.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(busy) = lanes.get_mut(lane) {
            let (tx, rx) = oneshot::channel();
            busy.waiting.push_back(tx);
            Turn::Wait(rx)
        } else {
            lanes.insert(lane.to_owned(), Lane::default());
            Turn::Lead
        }
    }

    /// Counts a call about to be sent with `decisions` decisions.
    pub(super) fn sent(&self, decisions: usize) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.decisions.fetch_add(
            u64::try_from(decisions).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    pub(super) fn stats(&self) -> GroupCommitStats {
        GroupCommitStats {
            calls: self.calls.load(Ordering::Relaxed),
            decisions: self.decisions.load(Ordering::Relaxed),
        }
    }

    /// The leader of `lane` is done: hands the lane to the first live waiter with up to
    /// `max_batch − 1` more, or frees it when none wait.
    fn hand_off(&self, lane: &str) {
        self.hand_off_with(lane, Vec::new());
    }

    /// As [`Self::hand_off`], with `returned` (a batch whose leader never took it) first in line.
    fn hand_off_with(&self, lane: &str, returned: Vec<Waiter>) {
        let mut lanes = self.lanes.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(queue) = lanes.get_mut(lane) else {
            return;
        };
        for waiter in returned.into_iter().rev() {
            queue.waiting.push_front(waiter);
        }
        loop {
            let Some(next) = queue.waiting.pop_front() else {
                lanes.remove(lane);
                return;
            };
            if next.is_closed() {
                continue;
            }
            let mut batch = Vec::new();
            while batch.len() + 1 < self.max_batch {
                match queue.waiting.pop_front() {
                    Some(waiter) if waiter.is_closed() => {}
                    Some(waiter) => batch.push(waiter),
                    None => break,
                }
            }
            match next.send(Wake::Lead(batch)) {
                Ok(()) => return,
                Err(Wake::Lead(batch)) => {
                    // It gave up between the check and the send: the others go back, in order.
                    for waiter in batch.into_iter().rev() {
                        queue.waiting.push_front(waiter);
                    }
                }
                Err(Wake::Answer(_)) => {}
            }
        }
    }
}

/// Held by a leader while its batch is in flight: on drop (done or cancelled) the lane goes on.
pub(super) struct Leading<'a> {
    pub(super) group: &'a GroupCommit,
    pub(super) lane: &'a str,
}

impl Drop for Leading<'_> {
    fn drop(&mut self) {
        self.group.hand_off(self.lane);
    }
}

/// A queued caller's receiver: if it is dropped holding the lead of a batch (its deadline fell
/// between the hand-off and its taking it), the batch and the lane go to the next in line.
pub(super) struct Waiting<'a> {
    pub(super) group: &'a GroupCommit,
    pub(super) lane: &'a str,
    pub(super) rx: oneshot::Receiver<Wake>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if let Ok(Wake::Lead(batch)) = self.rx.try_recv() {
            self.group.hand_off_with(self.lane, batch);
        }
    }
}

/// The same error for another caller of a failed batch.
pub(super) fn copy_error(error: &StoreError) -> StoreError {
    match error {
        StoreError::Timeout(d) => StoreError::Timeout(*d),
        StoreError::Redis(e) => StoreError::Redis(e.clone()),
        StoreError::BadReply { script, detail } => StoreError::BadReply {
            script,
            detail: detail.clone(),
        },
        StoreError::BadKey { key, detail } => StoreError::BadKey {
            key: key.clone(),
            detail: detail.clone(),
        },
    }
}

/// Request `k` (0-based) of a batch of `n` that granted `granted`, from the snapshot after all
/// `n`: what `spend.lua` would have answered it, called `n` times in a row at that instant.
///
/// # Errors
/// A reply whose counters cannot hold the batch it reports.
pub fn batch_answer(
    snapshot: &BudgetSnapshot,
    n: u64,
    granted: u64,
    k: u64,
) -> Result<Withdrawal, StoreError> {
    let bad = |detail: String| StoreError::BadReply {
        script: "spend_many",
        detail,
    };
    let denied = n
        .checked_sub(granted)
        .ok_or_else(|| bad(format!("{granted} granted of {n}")))?;
    let retries_before = snapshot
        .current
        .retries
        .checked_sub(granted)
        .ok_or_else(|| {
            bad(format!(
                "{granted} granted but retries are {}",
                snapshot.current.retries
            ))
        })?;
    let denied_before = snapshot.current.denied.checked_sub(denied).ok_or_else(|| {
        bad(format!(
            "{denied} denied but denials are {}",
            snapshot.current.denied
        ))
    })?;
    let mut answer = *snapshot;
    let seen = k.saturating_add(1);
    answer.current.retries = retries_before + seen.min(granted);
    answer.current.denied = denied_before + seen.saturating_sub(granted).min(denied);
    Ok(Withdrawal {
        granted: k < granted,
        snapshot: answer,
    })
}

/// The group-commit protocol as the Redis store runs it.
impl RedisStore {
    /// A withdrawal by group commit (see `store/group_commit.rs`): lead a batch now, or wait
    /// for an answer or for the lead of the next batch; all within the store's deadline.
    pub(super) async fn withdraw_grouped(
        &self,
        group: &GroupCommit,
        dependency: &Dependency,
        policy: &BudgetPolicy,
    ) -> Result<Withdrawal, StoreError> {
        let mut lane = self.key(dependency);
        lane.push('\0');
        lane.push_str(&policy.window_ms().to_string());
        for arg in policy_args(policy) {
            lane.push('\0');
            lane.push_str(&arg);
        }
        let lane = lane.as_str();
        let turn = async {
            let followers = match group.join(lane) {
                Turn::Lead => Vec::new(),
                Turn::Wait(rx) => {
                    let mut waiting = Waiting { group, lane, rx };
                    match (&mut waiting.rx).await {
                        Ok(Wake::Answer(answer)) => return answer,
                        Ok(Wake::Lead(followers)) => followers,
                        // The leader was dropped with our decision in flight: it may have been
                        // counted, so it is not sent again.
                        Err(_) => return Err(StoreError::Timeout(self.timeout())),
                    }
                }
            };
            let _leading = Leading { group, lane };
            self.lead(group, dependency, policy, followers).await
        };
        tokio::time::timeout(self.timeout(), turn)
            .await
            .unwrap_or(Err(StoreError::Timeout(self.timeout())))
    }

    /// Sends the leader's decision with its followers' (the leader's is first), and answers them.
    async fn lead(
        &self,
        group: &GroupCommit,
        dependency: &Dependency,
        policy: &BudgetPolicy,
        followers: Vec<Waiter>,
    ) -> Result<Withdrawal, StoreError> {
        group.sent(followers.len() + 1);
        if followers.is_empty() {
            return self.withdraw_one(dependency, policy).await;
        }
        let n = u64::try_from(followers.len() + 1).unwrap_or(u64::MAX);
        match self.withdraw_many(dependency, policy, n).await {
            Ok(answers) => {
                let mut answers = answers.into_iter();
                let own = answers.next();
                for (follower, answer) in followers.into_iter().zip(answers) {
                    // A follower that gave up is not there to answer; its decision stays counted.
                    let _ = follower.send(Wake::Answer(Ok(answer)));
                }
                own.ok_or_else(|| StoreError::BadReply {
                    script: "spend_many",
                    detail: "no answers".to_owned(),
                })
            }
            Err(error) => {
                for follower in followers {
                    let _ = follower.send(Wake::Answer(Err(copy_error(&error))));
                }
                Err(error)
            }
        }
    }
}
