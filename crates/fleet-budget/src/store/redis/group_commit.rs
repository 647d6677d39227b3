//! Group commit for withdrawals: while one call of a group is in flight, the decisions that arrive
//! for it wait, then go to Redis together as one call.
//!
//! A *group* is every decision that may share one script call: on one Redis server, the
//! decisions for any dependency (a `spend_batch.lua` call may hold many keys); on Redis Cluster,
//! those for one budget key (a script's keys must share a slot, and each dependency has a slot of
//! its own through its hash tag). Nothing waits when nothing is in flight: a lone decision is
//! sent at once, as one `spend.lua` call. Under load the Redis work per decision falls by the
//! batch size. Per group there is at most one call in flight; its sender is the *leader*, a
//! caller whose own decision is in the batch. When the leader's call is over (answered, failed,
//! or the leader's future dropped), a guard hands the group on: the next batch is the first
//! `max_batch` callers in line (first come, first in), and it is led by the one of them with the
//! most time left, the latest to arrive; the older ride as followers.
//!
//! Why the latest: the call is driven by the leader's future, so it is bounded by the leader's
//! deadline, and all callers of one store have deadlines of the same length. Led by the oldest
//! (the least time left), a batch sent under sustained load was cut by that one deadline after
//! Redis may have counted it, and every follower got a timeout though it had time left, batch
//! after batch. Led by the latest, the call has all the time any caller of the batch has; an
//! older follower whose own deadline passes gets its timeout, as it would have anyway.
//!
//! - every caller waits at most the store's deadline from its arrival, whether it leads or not
//!   (the batch is bounded by its leader's deadline, the wait of the others by their own);
//! - a decision is sent at most once and never resent: a batch cut by a deadline or a dropped
//!   leader reached Redis or not, and its callers get an error (the fallback answers them), as
//!   a single call that timed out does;
//! - a caller that gives up while queued is skipped, never sent; so is one whose deadline has
//!   passed when its batch is formed or sent (it would be cut at once, after Redis may have
//!   counted it), and a caller woken to lead after its own deadline hands the batch on unsent;
//! - a lead handed to a caller giving up is never lost: the batch goes to the next in line.
//!
//! `batch.rs` leads and sends the batches; `spend.rs` makes the calls.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::error::StoreError;
use crate::policy::BudgetPolicy;
use crate::store::Withdrawal;

/// The largest batch by default.
pub const DEFAULT_MAX_BATCH: usize = 64;

/// The most a batch may hold (`spend_many.lua` and `spend_batch.lua` refuse more than 10,000).
pub const MAX_BATCH_LIMIT: usize = 10_000;

/// One decision asked for: the budget key and the caller's policy.
pub(super) struct Request {
    pub(super) key: String,
    pub(super) policy: BudgetPolicy,
}

/// What a queued caller is woken with.
pub(super) enum Wake {
    /// Its decision, decided in someone else's batch.
    Answer(Result<Withdrawal, StoreError>),
    /// It leads the next batch: its own request back, carried with these older callers'
    /// decisions (in the order they came; its own, the latest, goes after them).
    Lead(Request, Vec<Waiter>),
}

/// A queued caller: its request, its deadline, and where its answer (or the lead) goes.
pub(super) struct Waiter {
    pub(super) request: Request,
    /// When the caller gives up: its arrival plus the store's deadline.
    pub(super) deadline: Instant,
    pub(super) tx: oneshot::Sender<Wake>,
}

impl Waiter {
    /// Still waiting at `now`, with time left: worth sending.
    pub(super) fn is_live(&self, now: Instant) -> bool {
        !self.tx.is_closed() && now < self.deadline
    }
}

/// The groups of one store: a group is in the map while a call of it is in flight.
pub(super) struct GroupCommit {
    groups: Mutex<HashMap<String, VecDeque<Waiter>>>,
    /// One group for every key (one Redis server), or one per key (Redis Cluster).
    across_keys: bool,
    max_batch: usize,
    calls: AtomicU64,
    decisions: AtomicU64,
    budgets: AtomicU64,
}

/// How many withdrawal calls the store sent and how many decisions they carried.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroupCommitStats {
    /// `spend.lua`, `spend_many.lua` and `spend_batch.lua` calls sent.
    pub calls: u64,
    /// Decisions those calls carried (each sent once).
    pub decisions: u64,
    /// Budgets (keys with a policy) those calls decided: one per `spend.lua` or `spend_many.lua`
    /// call, one per entry of a `spend_batch.lua` call.
    pub budgets: u64,
}

/// The caller's place: lead now (nothing was in flight), or wait.
pub(super) enum Turn {
    Lead(Request),
    Wait(oneshot::Receiver<Wake>),
}

impl GroupCommit {
    /// `across_keys`: one group for all keys (one server); else one group per key (cluster).
    pub(super) fn new(max_batch: usize, across_keys: bool) -> Self {
        Self {
            groups: Mutex::new(HashMap::new()),
            across_keys,
            max_batch: max_batch.clamp(1, MAX_BATCH_LIMIT),
            calls: AtomicU64::new(0),
            decisions: AtomicU64::new(0),
            budgets: AtomicU64::new(0),
        }
    }

    pub(super) fn max_batch(&self) -> usize {
        self.max_batch
    }

    /// The group of `key`: `""` for all of them on one server (no allocation), else the key.
    pub(super) fn group_of<'k>(&self, key: &'k str) -> &'k str {
        if self.across_keys { "" } else { key }
    }

    /// Joins the group of `request` (a caller giving up at `deadline`): leads when nothing is
    /// in flight on it, else queues.
    pub(super) fn join(&self, request: Request, deadline: Instant) -> Turn {
        let mut groups = self.groups.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(busy) = groups.get_mut(self.group_of(&request.key)) {
            let (tx, rx) = oneshot::channel();
            busy.push_back(Waiter {
                request,
                deadline,
                tx,
            });
            Turn::Wait(rx)
        } else {
            groups.insert(self.group_of(&request.key).to_owned(), VecDeque::new());
            Turn::Lead(request)
        }
    }

    /// Counts a call about to be sent with `decisions` decisions over `budgets` budgets.
    pub(super) fn sent(&self, decisions: usize, budgets: usize) {
        let count = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.decisions
            .fetch_add(count(decisions), Ordering::Relaxed);
        self.budgets.fetch_add(count(budgets), Ordering::Relaxed);
    }

    pub(super) fn stats(&self) -> GroupCommitStats {
        GroupCommitStats {
            calls: self.calls.load(Ordering::Relaxed),
            decisions: self.decisions.load(Ordering::Relaxed),
            budgets: self.budgets.load(Ordering::Relaxed),
        }
    }

    /// The leader of `group` is done: hands the group to the next batch (see the module doc),
    /// or frees it when no live caller waits.
    fn hand_off(&self, group: &str) {
        self.hand_off_with(group, Vec::new());
    }

    /// A caller woken to lead after its own deadline (`own`, the request it leads with): the
    /// batch is not sent by it; `others` go back first in line and the group is handed on.
    pub(super) fn decline_lead(&self, own: &Request, others: Vec<Waiter>) {
        self.hand_off_with(self.group_of(&own.key), others);
    }

    /// As [`Self::hand_off`], with `returned` (a batch whose leader never took it) first in line.
    fn hand_off_with(&self, group: &str, returned: Vec<Waiter>) {
        let mut groups = self.groups.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(queue) = groups.get_mut(group) else {
            return;
        };
        for waiter in returned.into_iter().rev() {
            queue.push_front(waiter);
        }
        loop {
            // The first `max_batch` live callers in line. One that gave up, or whose deadline
            // has passed, leaves the queue unsent (its receiver sees the sender dropped: a
            // timeout, which its own deadline was about to give it).
            let now = Instant::now();
            let mut batch = Vec::new();
            while batch.len() < self.max_batch {
                match queue.pop_front() {
                    Some(waiter) if waiter.is_live(now) => batch.push(waiter),
                    Some(_) => {}
                    None => break,
                }
            }
            // Led by the one with the latest deadline (ties: the later in line), which bounds
            // the call: the most time any of them has.
            let Some(at) = batch
                .iter()
                .enumerate()
                .max_by_key(|(_, waiter)| waiter.deadline)
                .map(|(at, _)| at)
            else {
                groups.remove(group);
                return;
            };
            let leader = batch.remove(at);
            match leader.tx.send(Wake::Lead(leader.request, batch)) {
                Ok(()) => return,
                Err(Wake::Lead(_, batch)) => {
                    // It gave up between the check and the send: the others go back, in order.
                    for waiter in batch.into_iter().rev() {
                        queue.push_front(waiter);
                    }
                }
                Err(Wake::Answer(_)) => {}
            }
        }
    }
}

/// Held by a leader while its batch is in flight: on drop (done or cancelled) the group goes on.
pub(super) struct Leading<'a> {
    pub(super) group: &'a GroupCommit,
    pub(super) id: &'a str,
}

impl Drop for Leading<'_> {
    fn drop(&mut self) {
        self.group.hand_off(self.id);
    }
}

/// A queued caller's receiver: if it is dropped holding the lead of a batch (its deadline fell
/// between the hand-off and its taking it), the batch and the group go to the next in line.
pub(super) struct Waiting<'a> {
    pub(super) group: &'a GroupCommit,
    pub(super) rx: oneshot::Receiver<Wake>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        // Closed first: a hand-off then either sent before the close (read below) or fails and
        // passes the lead on itself. Read before closing, a lead sent between the read and the
        // receiver's drop would be dropped with it, and the group left busy with no leader.
        self.rx.close();
        if let Ok(Wake::Lead(own, batch)) = self.rx.try_recv() {
            self.group
                .hand_off_with(self.group.group_of(&own.key), batch);
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;
    use std::time::Duration;

    use super::*;
    use crate::policy::{DepositBasis, WindowMode};

    fn request(key: &str) -> Request {
        Request {
            key: key.to_owned(),
            policy: BudgetPolicy {
                window: Duration::from_millis(1000),
                ratio: 0.1,
                min_allowance: 3,
                deposit: DepositBasis::Success,
                mode: WindowMode::Sliding,
            },
        }
    }

    /// A queued caller that gives up while its leader hands it the lead: whichever comes first,
    /// the group is handed on (here, freed, as nobody else waits), never left busy with no
    /// leader (then every later caller of the group would queue until its deadline, forever).
    /// The two race on two threads many times over, with a shifting head start.
    #[test]
    fn a_lead_handed_to_a_caller_giving_up_is_never_lost() {
        let group = GroupCommit::new(DEFAULT_MAX_BATCH, true);
        let deadline = Instant::now() + Duration::from_secs(3600);
        for round in 0..20_000_u32 {
            let Turn::Lead(_) = group.join(request("a"), deadline) else {
                panic!("nothing was in flight");
            };
            let Turn::Wait(rx) = group.join(request("b"), deadline) else {
                panic!("a call was in flight");
            };
            let waiting = Waiting { group: &group, rx };
            let (ready, go) = (AtomicBool::new(false), AtomicBool::new(false));
            let (spin_waiter, spin_leader) = (round % 97, (round / 97) % 31);
            std::thread::scope(|s| {
                s.spawn(|| {
                    ready.store(true, Ordering::Release);
                    while !go.load(Ordering::Acquire) {
                        std::thread::yield_now();
                    }
                    for _ in 0..spin_waiter {
                        std::hint::spin_loop();
                    }
                    drop(waiting);
                });
                while !ready.load(Ordering::Acquire) {
                    std::thread::yield_now();
                }
                go.store(true, Ordering::Release);
                for _ in 0..spin_leader {
                    std::hint::spin_loop();
                }
                // The leader is done: its guard hands the group on.
                drop(Leading {
                    group: &group,
                    id: "",
                });
            });
            let groups = group.groups.lock().unwrap_or_else(PoisonError::into_inner);
            assert!(
                groups.is_empty(),
                "round {round}: the group is busy with no leader"
            );
        }
    }

    /// Joins a caller for `key` giving up `in_secs` from now (negative: already past) and
    /// expects it to queue.
    fn queue(group: &GroupCommit, key: &str, in_secs: i64) -> oneshot::Receiver<Wake> {
        let now = Instant::now();
        let offset = Duration::from_secs(in_secs.unsigned_abs());
        let deadline = if in_secs < 0 {
            now.checked_sub(offset).unwrap_or(now)
        } else {
            now + offset
        };
        match group.join(request(key), deadline) {
            Turn::Wait(rx) => rx,
            Turn::Lead(_) => panic!("{key}: a call was in flight"),
        }
    }

    /// What a queued caller has been handed so far: `None` (still waiting), the keys of its
    /// batch when it leads (its followers' in order, then its own), or `Some(vec![])` when it
    /// was let go unsent (its sender dropped).
    fn handed(rx: &mut oneshot::Receiver<Wake>) -> Option<Vec<String>> {
        match rx.try_recv() {
            Err(oneshot::error::TryRecvError::Empty) => None,
            Err(oneshot::error::TryRecvError::Closed) => Some(Vec::new()),
            Ok(Wake::Lead(own, followers)) => Some(
                followers
                    .iter()
                    .map(|waiter| waiter.request.key.clone())
                    .chain([own.key])
                    .collect(),
            ),
            Ok(Wake::Answer(_)) => panic!("answered by no call"),
        }
    }

    /// The next batch is the first `max_batch` in line, and its lead goes to the one with the
    /// most time left (the latest to arrive), the older riding as followers: the call is bounded
    /// by its leader's deadline, so led by the oldest it would be cut while the others still
    /// had time. Those further back wait for the batch after.
    #[test]
    fn the_batch_is_led_by_the_caller_with_the_most_time_left() {
        let group = GroupCommit::new(3, true);
        let Turn::Lead(_) = group.join(request("first"), Instant::now() + Duration::from_secs(60))
        else {
            panic!("nothing was in flight");
        };
        let mut line: Vec<_> = [("b", 61), ("c", 62), ("d", 63), ("e", 64)]
            .into_iter()
            .map(|(key, in_secs)| (key, queue(&group, key, in_secs)))
            .collect();
        drop(Leading {
            group: &group,
            id: "",
        });
        let seen: Vec<_> = line.iter_mut().map(|(_, rx)| handed(rx)).collect();
        assert_eq!(
            seen,
            [
                None,
                None,
                Some(vec!["b".to_owned(), "c".to_owned(), "d".to_owned()]),
                None
            ],
            "d leads b and c, in the order they came; e waits"
        );
        // d's call is over: e, alone in line, leads the next; then the group is free.
        drop(Leading {
            group: &group,
            id: "",
        });
        assert_eq!(handed(&mut line[3].1), Some(vec!["e".to_owned()]));
        drop(Leading {
            group: &group,
            id: "",
        });
        let groups = group.groups.lock().unwrap_or_else(PoisonError::into_inner);
        assert!(groups.is_empty(), "nobody waits: the group is free");
    }

    /// A caller whose deadline has passed when its batch is formed is neither sent nor made to
    /// lead (its call would be cut at once, after Redis may have counted it): it is let go with
    /// a timeout, and the batch goes on without it. One that gave up is skipped as before.
    #[test]
    fn a_caller_past_its_deadline_neither_leads_nor_is_sent() {
        let group = GroupCommit::new(DEFAULT_MAX_BATCH, true);
        let Turn::Lead(_) = group.join(request("first"), Instant::now() + Duration::from_secs(60))
        else {
            panic!("nothing was in flight");
        };
        let mut live = queue(&group, "live", 61);
        let mut late = queue(&group, "late", -1);
        let gone = queue(&group, "gone", 3600);
        drop(gone);
        drop(Leading {
            group: &group,
            id: "",
        });
        assert_eq!(handed(&mut late), Some(Vec::new()), "let go unsent");
        assert_eq!(
            handed(&mut live),
            Some(vec!["live".to_owned()]),
            "the one live caller leads alone, though others came later"
        );
        // Only late callers in line: nobody leads, the group is freed.
        let mut later = queue(&group, "later", -1);
        drop(Leading {
            group: &group,
            id: "",
        });
        assert_eq!(handed(&mut later), Some(Vec::new()));
        let groups = group.groups.lock().unwrap_or_else(PoisonError::into_inner);
        assert!(groups.is_empty(), "the group is free");
    }

    /// A caller woken to lead after its own deadline declines: its batch, unsent, goes to the
    /// next in line, first, and is led again by the one with the most time left.
    #[test]
    fn a_declined_lead_goes_to_the_next_in_line() {
        let group = GroupCommit::new(DEFAULT_MAX_BATCH, true);
        let Turn::Lead(_) = group.join(request("first"), Instant::now() + Duration::from_secs(60))
        else {
            panic!("nothing was in flight");
        };
        let mut line: Vec<_> = [("b", 61), ("c", 62)]
            .into_iter()
            .map(|(key, in_secs)| (key, queue(&group, key, in_secs)))
            .collect();
        drop(Leading {
            group: &group,
            id: "",
        });
        let Ok(Wake::Lead(own, others)) = line[1].1.try_recv() else {
            panic!("c leads");
        };
        let mut d = queue(&group, "d", 63);
        group.decline_lead(&own, others);
        assert_eq!(handed(&mut line[0].1), None, "b follows again");
        assert_eq!(handed(&mut d), Some(vec!["b".to_owned(), "d".to_owned()]));
    }
}
