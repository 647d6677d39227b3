//! The spend scripts, the calls that decide withdrawals: `spend.lua` for one decision,
//! `spend_many.lua` for several of one budget, `spend_batch.lua` for several budgets, and how a
//! batched reply answers each decision in it ([`batch_answer`]). Group commit (`batch.rs`)
//! sends its batches through these; `budget.rs` its lone decisions.

use redis::{Script, Value};

use super::RedisStore;
use super::memory;
use super::reply::{ScriptReply, key_refusal, parse_reply, text_at};
use super::scripts::{SPEND_BATCH_SCRIPT, SPEND_MANY_SCRIPT, SPEND_SCRIPT, policy_args};
use crate::allowance::BudgetSnapshot;
use crate::error::StoreError;
use crate::policy::BudgetPolicy;
use crate::store::Withdrawal;

/// One budget of a batch: a key with a policy, and how many decisions it asks for.
pub(super) struct Entry<'a> {
    pub(super) key: &'a str,
    pub(super) policy: &'a BudgetPolicy,
    pub(super) n: u64,
}

/// A budget's answer: granted of its `n`, the snapshot after all `n`, and the wait for the next grant.
pub(super) type EntryReply = Result<(u64, BudgetSnapshot, Option<u64>), StoreError>;

impl RedisStore {
    /// Runs the budget script `script` (called `name` in errors) on `key` with the arguments of
    /// `lua/README.md`: the window, the script's `own`, then the policy's; decodes the reply.
    pub(super) async fn run_key(
        &self,
        script: &Script,
        name: &'static str,
        key: &str,
        policy: &BudgetPolicy,
        own: &[u64],
    ) -> Result<ScriptReply, StoreError> {
        let mut invocation = script.key(key);
        invocation.arg(policy.window_ms());
        for arg in own {
            invocation.arg(*arg);
        }
        for arg in policy_args(policy) {
            invocation.arg(arg);
        }
        for arg in self.memory.args(key) {
            invocation.arg(arg);
        }
        let reply = self.invoke(name, invocation).await?;
        self.remembered(name, key, &reply, policy)
    }

    /// Decodes the reply of a budget script called with this store's memory of `key` (the six
    /// fields after the reply as it was), remembers what it says of the hash, and marks the
    /// snapshot `lost` when the call found the hash it remembered gone.
    pub(super) fn remembered(
        &self,
        name: &'static str,
        key: &str,
        reply: &[Value],
        policy: &BudgetPolicy,
    ) -> Result<ScriptReply, StoreError> {
        let (at, state) = memory::split(name, reply)?;
        let mut parsed = parse_reply(name, reply.get(..at).unwrap_or_default(), policy)?;
        self.memory.learn(key, &state, &parsed.snapshot);
        parsed.snapshot.control.lost = state.lost;
        Ok(parsed)
    }

    /// One `spend.lua` call on `key`.
    pub(super) async fn spend_one(
        &self,
        key: &str,
        policy: &BudgetPolicy,
    ) -> Result<Withdrawal, StoreError> {
        let ScriptReply {
            granted,
            snapshot,
            next_grant_ms,
            ..
        } = self
            .run_key(&SPEND_SCRIPT, "spend", key, policy, &[])
            .await?;
        match granted {
            0 | 1 => Ok(Withdrawal {
                granted: granted == 1,
                snapshot,
                next_grant_ms,
            }),
            other => Err(StoreError::BadReply {
                script: "spend",
                detail: format!("granted is {other}, expected 0 or 1"),
            }),
        }
    }

    /// `n` decisions of one budget in one `spend_many.lua` call: how many were granted, the
    /// snapshot after all `n`, and the wait for the next grant after them.
    pub(super) async fn spend_many_key(
        &self,
        key: &str,
        policy: &BudgetPolicy,
        n: u64,
    ) -> EntryReply {
        let ScriptReply {
            granted,
            snapshot,
            next_grant_ms,
            ..
        } = self
            .run_key(&SPEND_MANY_SCRIPT, "spend_many", key, policy, &[n])
            .await?;
        let granted = u64::try_from(granted).map_err(|_| StoreError::BadReply {
            script: "spend_many",
            detail: format!("granted is {granted}"),
        })?;
        Ok((granted, snapshot, next_grant_ms))
    }

    /// One `spend_batch.lua` call over `entries`: each budget's reply, or its error.
    pub(super) async fn spend_batch(
        &self,
        entries: &[Entry<'_>],
    ) -> Result<Vec<EntryReply>, StoreError> {
        let mut invocation = SPEND_BATCH_SCRIPT.prepare_invoke();
        for entry in entries {
            invocation.key(entry.key);
            invocation.arg(entry.policy.window_ms()).arg(entry.n);
            for arg in policy_args(entry.policy) {
                invocation.arg(arg);
            }
            for arg in self.memory.args(entry.key) {
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
            .map(|(value, entry)| self.entry_reply(value, entry))
            .collect())
    }

    /// One element of a `spend_batch.lua` reply: `spend_many.lua`'s reply to `entry`, or its
    /// error's text.
    fn entry_reply(&self, value: &Value, entry: &Entry<'_>) -> EntryReply {
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
                } = self.remembered("spend_batch", entry.key, fields, entry.policy)?;
                let granted =
                    u64::try_from(granted).map_err(|_| bad(format!("granted is {granted}")))?;
                Ok((granted, snapshot, next_grant_ms))
            }
            other => Err(entry_refusal(other)),
        }
    }
}

/// A `spend_batch.lua` entry that is not an array: the text of its error (a script's refusal of
/// the key, or another error), or a value the script never sends.
fn entry_refusal(value: &Value) -> StoreError {
    let bad = |detail: String| StoreError::BadReply {
        script: "spend_batch",
        detail,
    };
    match value {
        Value::BulkString(_) | Value::SimpleString(_) => {
            match text_at(std::slice::from_ref(value), 0) {
                Err(detail) => bad(detail),
                Ok(text) => text
                    .strip_prefix("fleet-budget: ")
                    .and_then(key_refusal)
                    .unwrap_or_else(|| {
                        StoreError::Redis(redis::RedisError::from((
                            redis::ErrorKind::Extension,
                            "spend_batch.lua refused a budget",
                            text,
                        )))
                    }),
            }
        }
        other => bad(format!("a budget's reply is {other:?}")),
    }
}

/// Request `k` (0-based) of a batch of `n` that granted `granted`, from the snapshot after all
/// `n` and the batch's `next_grant_ms`: what `spend.lua` would have answered it, called `n` times
/// in a row at that instant. A grant before the last left room for the next (`Some(0)`); the
/// last grant and every denial saw the retries as they are after the batch (denials do not move
/// the estimate), so the batch's wait.
///
/// # Errors
/// A reply whose counters cannot hold the batch it reports.
pub fn batch_answer(
    snapshot: &BudgetSnapshot,
    next_grant_ms: Option<u64>,
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
    // A lost hash is the call's news, told once: with the batch's first answer.
    answer.control.lost = snapshot.control.lost && k == 0;
    let seen = k.saturating_add(1);
    answer.current.retries = retries_before + seen.min(granted);
    answer.current.denied = denied_before + seen.saturating_sub(granted).min(denied);
    Ok(Withdrawal {
        granted: k < granted,
        snapshot: answer,
        next_grant_ms: if seen < granted {
            Some(0)
        } else {
            next_grant_ms
        },
    })
}
