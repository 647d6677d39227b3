//! The Redis store's side of group commit (`store/group_commit.rs`): lead a batch or wait in it,
//! and send a batch as the one call that decides it: `spend.lua` for a lone decision,
//! `spend_many.lua` for several of one budget, `spend_batch.lua` for several budgets.

use std::collections::HashMap;

use redis::Value;
use tokio::time::Instant;

use super::group_commit::{
    GroupCommit, Leading, Request, Turn, Waiter, Waiting, Wake, batch_answer, copy_error,
};
use super::redis::key_refusal;
use super::scripts::{SPEND_BATCH_SCRIPT, ScriptReply, parse_reply, policy_args};
use super::{RedisStore, Withdrawal};
use crate::dependency::Dependency;
use crate::error::StoreError;
use crate::policy::BudgetPolicy;

/// One budget of a batch: a key with a policy, and how many decisions it asks for.
struct Entry<'a> {
    key: &'a str,
    policy: &'a BudgetPolicy,
    n: u64,
}

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

/// A budget's answer: granted of its `n`, the snapshot after all `n`, and the wait for the next grant.
type EntryReply = Result<(u64, crate::allowance::BudgetSnapshot, Option<u64>), StoreError>;

impl RedisStore {
    /// A withdrawal by group commit (see `store/group_commit.rs`): lead a batch now, or wait
    /// for an answer or for the lead of the next batch; all within the store's deadline.
    pub(super) async fn withdraw_grouped(
        &self,
        group: &GroupCommit,
        dependency: &Dependency,
        policy: &BudgetPolicy,
    ) -> Result<Withdrawal, StoreError> {
        let request = Request {
            key: self.key(dependency),
            policy: *policy,
        };
        let deadline = Instant::now() + self.timeout();
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
                            return Err(StoreError::Timeout(self.timeout()));
                        }
                        Ok(Wake::Lead(own, followers)) => (own, followers),
                        // Let go unsent (its deadline passed in line), or the leader was dropped
                        // with our decision in flight: then it may have been counted, so it is
                        // not sent again.
                        Err(_) => return Err(StoreError::Timeout(self.timeout())),
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
            .unwrap_or(Err(StoreError::Timeout(self.timeout())))
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

    /// `n` decisions of one budget in one `spend_many.lua` call: how many were granted, the
    /// snapshot after all `n`, and the wait for the next grant after them.
    async fn spend_many_key(&self, key: &str, policy: &BudgetPolicy, n: u64) -> EntryReply {
        let ScriptReply {
            granted,
            snapshot,
            next_grant_ms,
            ..
        } = self.run_many(key, policy, n).await?;
        let granted = u64::try_from(granted).map_err(|_| StoreError::BadReply {
            script: "spend_many",
            detail: format!("granted is {granted}"),
        })?;
        Ok((granted, snapshot, next_grant_ms))
    }

    /// Decides `n` (1 to 10,000) withdrawals of each budget in `requests` in one
    /// `spend_batch.lua` call, as `n` calls of `spend.lua` of each budget, in order, at that
    /// instant would: the answers per budget, or that budget's error (the others are decided).
    /// On Redis Cluster every key must be in one slot.
    ///
    /// # Errors
    /// No budget or more than 10,000, or the call failed or timed out (then none is answered).
    pub async fn withdraw_batch(
        &self,
        requests: &[(&Dependency, &BudgetPolicy, u64)],
    ) -> Result<Vec<Result<Vec<Withdrawal>, StoreError>>, StoreError> {
        let keys: Vec<String> = requests.iter().map(|(d, _, _)| self.key(d)).collect();
        let entries: Vec<Entry<'_>> = requests
            .iter()
            .zip(&keys)
            .map(|((_, policy, n), key)| Entry { key, policy, n: *n })
            .collect();
        let replies = self.spend_batch(&entries).await?;
        Ok(replies
            .into_iter()
            .zip(&entries)
            .map(|(reply, entry)| {
                let (granted, snapshot, next) = reply?;
                (0..entry.n)
                    .map(|k| batch_answer(&snapshot, next, entry.n, granted, k))
                    .collect()
            })
            .collect())
    }

    /// One `spend_batch.lua` call over `entries`: each budget's reply, or its error.
    async fn spend_batch(&self, entries: &[Entry<'_>]) -> Result<Vec<EntryReply>, StoreError> {
        let mut invocation = SPEND_BATCH_SCRIPT.prepare_invoke();
        for entry in entries {
            invocation.key(entry.key);
            invocation.arg(entry.policy.window_ms()).arg(entry.n);
            for arg in policy_args(entry.policy) {
                invocation.arg(arg);
            }
        }
        let reply = self.invoke("spend_batch", invocation).await?;
        if reply.len() != entries.len() {
            return Err(StoreError::BadReply {
                script: "spend_batch",
                detail: format!("{} replies for {} budgets", reply.len(), entries.len()),
            });
        }
        Ok(reply
            .iter()
            .zip(entries)
            .map(|(value, entry)| entry_reply(value, entry.policy))
            .collect())
    }
}

/// One element of a `spend_batch.lua` reply: `spend_many.lua`'s reply to a caller of `policy`,
/// or its error's text.
fn entry_reply(value: &Value, policy: &BudgetPolicy) -> EntryReply {
    let bad = |detail: String| StoreError::BadReply {
        script: "spend_batch",
        detail,
    };
    match value {
        Value::Array(fields) => {
            let ScriptReply {
                granted,
                snapshot,
                next_grant_ms,
                ..
            } = parse_reply("spend_batch", fields, policy)?;
            let granted =
                u64::try_from(granted).map_err(|_| bad(format!("granted is {granted}")))?;
            Ok((granted, snapshot, next_grant_ms))
        }
        Value::BulkString(_) | Value::SimpleString(_) => {
            let text = super::scripts::text_at(std::slice::from_ref(value), 0).map_err(bad)?;
            Err(text
                .strip_prefix("fleet-budget: ")
                .and_then(key_refusal)
                .unwrap_or_else(|| {
                    StoreError::Redis(redis::RedisError::from((
                        redis::ErrorKind::Extension,
                        "spend_batch.lua refused a budget",
                        text,
                    )))
                }))
        }
        other => Err(bad(format!("a budget's reply is {other:?}"))),
    }
}
