//! The Redis store's side of group commit (`group_commit.rs` holds the line): lead a batch or
//! wait in it, and send a batch as the one call that decides it (`spend.rs`): `spend.lua` for a
//! lone decision, `spend_many.lua` for several of one budget, `spend_batch.lua` for several
//! budgets.

use std::collections::HashMap;

use tokio::time::Instant;

use super::RedisStore;
use super::group_commit::{GroupCommit, Leading, Request, Turn, Waiter, Waiting, Wake, copy_error};
use super::spend::{Entry, batch_answer};
use crate::error::StoreError;
use crate::policy::BudgetPolicy;
use crate::store::Withdrawal;

/// What tells two policies apart for the scripts (their arguments), as a map key.
type PolicyId = (u64, u64, u64, &'static str, &'static str);

fn policy_id(policy: &BudgetPolicy) -> PolicyId {
    (
        policy.window_ms(),
        policy.ratio.to_bits(),
        policy.min_allowance,
        policy.deposit.script_code(),
        policy.mode.as_str(),
    )
}

/// Counts `request` in the batch being built: its budget's entry (added at the end the first time
/// that key and policy appear) and its place among that budget's decisions.
fn place<'a>(
    entries: &mut Vec<Entry<'a>>,
    index: &mut HashMap<(&'a str, PolicyId), usize>,
    request: &'a Request,
) -> (usize, u64) {
    let Request { key, policy } = request;
    let at = *index
        .entry((key.as_str(), policy_id(policy)))
        .or_insert_with(|| {
            entries.push(Entry { key, policy, n: 0 });
            entries.len() - 1
        });
    let place = entries.get_mut(at).map_or(0, |entry| {
        entry.n += 1;
        entry.n - 1
    });
    (at, place)
}

impl RedisStore {
    /// A withdrawal of `key`'s budget by group commit (see `group_commit.rs`): lead a batch now, or wait
    /// for an answer or for the lead of the next batch; all within the store's deadline.
    pub(super) async fn withdraw_grouped(
        &self,
        group: &GroupCommit,
        key: String,
        policy: &BudgetPolicy,
    ) -> Result<Withdrawal, StoreError> {
        let request = Request {
            key,
            policy: *policy,
        };
        let deadline = Instant::now() + self.timeout;
        let turn = async {
            let (own, followers) = match group.join(request, deadline) {
                Turn::Lead(own) => (own, Vec::new()),
                Turn::Wait(rx) => {
                    let mut waiting = Waiting { group, rx };
                    match (&mut waiting.rx).await {
                        Ok(Wake::Answer(answer)) => return answer,
                        // Woken to lead after its own deadline (a stalled task): sent now, the
                        // batch would be cut at once, after Redis may have counted it. It goes
                        // to the next in line unsent.
                        Ok(Wake::Lead(own, followers)) if Instant::now() >= deadline => {
                            group.decline_lead(&own, followers);
                            return Err(StoreError::Timeout(self.timeout));
                        }
                        Ok(Wake::Lead(own, followers)) => (own, followers),
                        // Let go unsent (its deadline passed in line), or the leader was dropped
                        // with our decision in flight: then it may have been counted, so it is
                        // not sent again.
                        Err(_) => return Err(StoreError::Timeout(self.timeout)),
                    }
                }
            };
            let _leading = Leading {
                group,
                id: group.group_of(&own.key),
            };
            self.lead(group, &own, followers).await
        };
        tokio::time::timeout_at(deadline, turn)
            .await
            .unwrap_or(Err(StoreError::Timeout(self.timeout)))
    }

    /// Sends the leader's decision with its followers' and answers them. The followers came
    /// first and go first, in order; the leader's decision, the latest, goes last.
    async fn lead(
        &self,
        group: &GroupCommit,
        own: &Request,
        mut followers: Vec<Waiter>,
    ) -> Result<Withdrawal, StoreError> {
        // Those that gave up, or whose deadline passed, since the batch was formed: not sent.
        let now = Instant::now();
        followers.retain(|follower| follower.is_live(now));
        if followers.is_empty() {
            group.sent(1, 1);
            return self.spend_one(&own.key, &own.policy).await;
        }
        // The budgets of the batch in order of first appearance, and for each decision its
        // budget and its place among that budget's decisions.
        let mut entries = Vec::new();
        let mut index = HashMap::new();
        let places: Vec<(usize, u64)> = followers
            .iter()
            .map(|follower| place(&mut entries, &mut index, &follower.request))
            .collect();
        let (own_at, own_place) = place(&mut entries, &mut index, own);
        group.sent(followers.len() + 1, entries.len());
        let replies = match &entries[..] {
            [one] => self
                .spend_many_key(one.key, one.policy, one.n)
                .await
                .map(|reply| vec![Ok(reply)]),
            _ => self.spend_batch(&entries).await,
        };
        let counts: Vec<u64> = entries.iter().map(|entry| entry.n).collect();
        drop((entries, index));
        let replies = match replies {
            Ok(replies) => replies,
            Err(error) => {
                for follower in followers {
                    let _ = follower.tx.send(Wake::Answer(Err(copy_error(&error))));
                }
                return Err(error);
            }
        };
        let answer = |at: usize, place: u64| -> Result<Withdrawal, StoreError> {
            let n = counts.get(at).copied().unwrap_or(0);
            match replies.get(at) {
                Some(Ok((granted, snapshot, next))) => {
                    batch_answer(snapshot, *next, n, *granted, place)
                }
                Some(Err(error)) => Err(copy_error(error)),
                None => Err(StoreError::BadReply {
                    script: "spend_batch",
                    detail: format!("no answer for budget {}", at + 1),
                }),
            }
        };
        for (follower, (at, place)) in followers.into_iter().zip(places) {
            // A follower that gave up is not there to answer; its decision stays counted.
            let _ = follower.tx.send(Wake::Answer(answer(at, place)));
        }
        answer(own_at, own_place)
    }
}
