//! The scripts' replies as Rust reads them (`lua/README.md`, "Reply"): the budget scripts'
//! shared reply, `status.lua`'s longer one, the fields of the others, and a script's refusal of
//! a key. Pure decoding: nothing here calls Redis.

use std::time::Duration;

use redis::Value;

use crate::allowance::{BudgetSnapshot, Control, WindowCounters};
use crate::error::StoreError;
use crate::policy::{BudgetPolicy, DepositBasis, WindowMode};
use crate::store::BudgetStatus;

/// A script's reply: `granted` (1, 0, or -1 when not a withdrawal), the budget under the policy
/// in force (with [`crate::Control`]: conflict, freeze, set override), and that policy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScriptReply {
    /// 1 granted, 0 denied (spend); -1 for deposit and status.
    pub granted: i64,
    /// The budget after the call.
    pub snapshot: BudgetSnapshot,
    /// The policy in force (which served the call; may differ from the caller's).
    pub policy: BudgetPolicy,
    /// Spend scripts: ms until one more retry could be granted (the last field, `next_grant_ms`;
    /// `None`: never without a change). `Some(0)` for the other scripts, and for a reply
    /// without the field (a script older than it): ask again.
    pub next_grant_ms: Option<u64>,
}

/// The integer at 0-based `index` of a reply.
pub(crate) fn int_at(reply: &[Value], index: usize) -> Result<i64, String> {
    match reply.get(index) {
        Some(Value::Int(v)) => Ok(*v),
        Some(other) => Err(format!("field {} is not an integer: {other:?}", index + 1)),
        None => Err(format!("field {} is missing", index + 1)),
    }
}

/// The text at 0-based `index` of a reply (at most 1 KiB kept).
pub(crate) fn text_at(reply: &[Value], index: usize) -> Result<String, String> {
    match reply.get(index) {
        Some(Value::BulkString(bytes)) => {
            let bytes = bytes.get(..bytes.len().min(1024)).unwrap_or_default();
            Ok(String::from_utf8_lossy(bytes).into_owned())
        }
        Some(Value::SimpleString(text)) => Ok(text.chars().take(1024).collect()),
        Some(other) => Err(format!("field {} is not text: {other:?}", index + 1)),
        None => Err(format!("field {} is missing", index + 1)),
    }
}

/// The value at `index` of an `HMGET` as text (at most 1 KiB kept; an integer as its digits);
/// `None` when it is nil or of another kind, so that a field written by hand reads as absent.
pub(crate) fn field_text(values: &[Value], index: usize) -> Option<String> {
    match values.get(index) {
        Some(Value::BulkString(bytes)) => {
            let bytes = bytes.get(..bytes.len().min(1024)).unwrap_or_default();
            Some(String::from_utf8_lossy(bytes).into_owned())
        }
        Some(Value::SimpleString(text)) => Some(text.chars().take(1024).collect()),
        Some(Value::Int(n)) => Some(n.to_string()),
        _ => None,
    }
}

/// The value at `index` of an `HMGET` as a number ([`field_text`] that parses as one).
pub(crate) fn field_u64(values: &[Value], index: usize) -> Option<u64> {
    field_text(values, index).and_then(|t| t.parse::<u64>().ok())
}

/// Decodes the reply shared by the scripts (`lua/README.md`, "Reply"): 17 fields, then the
/// policy in force (fields 18 to 21) when it is not `caller`'s, the policy the call sent. A
/// reply without them while field 15 (conflict) is 1 is refused.
pub fn parse_reply(
    script: &'static str,
    reply: &[Value],
    caller: &BudgetPolicy,
) -> Result<ScriptReply, StoreError> {
    let bad = |detail: String| StoreError::BadReply { script, detail };
    if reply.len() < 17 {
        return Err(bad(format!(
            "expected at least 17 fields, got {}",
            reply.len()
        )));
    }
    let mut fields = [0u64; 16];
    for (i, slot) in fields.iter_mut().enumerate() {
        let value = int_at(reply, i + 1).map_err(bad)?;
        *slot = u64::try_from(value)
            .map_err(|_| bad(format!("field {} is negative: {value}", i + 2)))?;
    }
    let [
        allowance,
        window_index,
        window_ms,
        elapsed_ms,
        previous_weight_ms,
        cs,
        ca,
        cr,
        cd,
        ps,
        pa,
        pr,
        pd,
        conflict,
        frozen,
        overridden,
    ] = fields;
    if window_ms == 0 {
        return Err(bad("window_ms is 0".to_owned()));
    }
    let policy = if reply.len() >= 21 {
        policy_in_force(reply, window_ms).map_err(bad)?
    } else if conflict == 1 {
        return Err(bad(format!(
            "a conflict without the policy in force ({} fields)",
            reply.len()
        )));
    } else if window_ms != caller.window_ms() {
        return Err(bad(format!(
            "window_ms is {window_ms}, not the caller's {}, without a conflict",
            caller.window_ms()
        )));
    } else {
        *caller
    };
    let granted = int_at(reply, 0).map_err(bad)?;
    let next_grant_ms = if script.starts_with("spend") {
        // The field after the policy in force (sent only on a conflict): 18th or 22nd.
        next_grant_at(reply, if reply.len() >= 21 { 21 } else { 17 }).map_err(bad)?
    } else {
        Some(0)
    };
    Ok(ScriptReply {
        granted,
        next_grant_ms,
        snapshot: BudgetSnapshot {
            window_ms,
            window_index,
            elapsed_ms,
            previous_weight_ms,
            current: WindowCounters {
                successes: cs,
                first_attempts: ca,
                retries: cr,
                denied: cd,
            },
            previous: WindowCounters {
                successes: ps,
                first_attempts: pa,
                retries: pr,
                denied: pd,
            },
            allowance,
            control: Control {
                conflict: conflict == 1,
                frozen: frozen == 1,
                overridden: overridden == 1,
                lost: false,
            },
        },
        policy,
    })
}

/// The `next_grant_ms` field at 0-based `index`: ms >= 0, or -1 for never (`None`); a reply
/// without it (a script older than the field) says nothing: `Some(0)`, ask again.
fn next_grant_at(reply: &[Value], index: usize) -> Result<Option<u64>, String> {
    match reply.get(index) {
        None => Ok(Some(0)),
        Some(_) => match int_at(reply, index)? {
            -1 => Ok(None),
            ms => u64::try_from(ms)
                .map(Some)
                .map_err(|_| format!("field {} (next_grant_ms) is {ms}", index + 1)),
        },
    }
}

/// Decodes `status.lua`'s reply (`lua/README.md`, "Reply"): the budget and the policy in force
/// (fields 18 to 21, always sent by status), and the ratio and floor the allowance uses (fields
/// 26 and 27: a set override's in place of the policy's).
pub fn parse_status(reply: &[Value], caller: &BudgetPolicy) -> Result<BudgetStatus, StoreError> {
    let parsed = parse_reply("status", reply, caller)?;
    let bad = |detail: String| StoreError::BadReply {
        script: "status",
        detail,
    };
    if reply.len() < 27 {
        return Err(bad(format!(
            "expected 27 fields from status, got {}",
            reply.len()
        )));
    }
    let ratio = ratio_at(reply, 25).map_err(bad)?;
    let min_allowance = u64::try_from(int_at(reply, 26).map_err(bad)?)
        .map_err(|_| bad("the allowance's floor is negative".to_owned()))?;
    Ok(BudgetStatus {
        snapshot: parsed.snapshot,
        policy: parsed.policy,
        ratio,
        min_allowance,
    })
}

/// A ratio sent as text at 0-based `index`: a finite number >= 0.
fn ratio_at(reply: &[Value], index: usize) -> Result<f64, String> {
    let text = text_at(reply, index)?;
    text.parse::<f64>()
        .ok()
        .filter(|r| r.is_finite() && *r >= 0.0)
        .ok_or_else(|| format!("field {} is not a ratio >= 0: {text:?}", index + 1))
}

/// The policy in force, fields 18 to 21 of a reply (with `window_ms`, field 4).
fn policy_in_force(reply: &[Value], window_ms: u64) -> Result<BudgetPolicy, String> {
    let ratio = ratio_at(reply, 17)?;
    let min_allowance =
        u64::try_from(int_at(reply, 18)?).map_err(|_| "min_allowance is negative".to_owned())?;
    let deposit = match text_at(reply, 19)?.as_str() {
        "s" => DepositBasis::Success,
        "a" => DepositBasis::Request,
        other => return Err(format!("basis is {other:?}")),
    };
    let mode = match text_at(reply, 20)?.as_str() {
        "sliding" => WindowMode::Sliding,
        "fixed" => WindowMode::Fixed,
        other => return Err(format!("mode is {other:?}")),
    };
    Ok(BudgetPolicy {
        window: Duration::from_millis(window_ms),
        ratio,
        min_allowance,
        deposit,
        mode,
    })
}

/// The non-negative integer at 0-based `index` of `script`'s reply (the lease and breaker
/// scripts reply with counts only).
pub(crate) fn count_at(
    script: &'static str,
    reply: &[Value],
    index: usize,
) -> Result<u64, StoreError> {
    let detail = match reply.get(index) {
        Some(Value::Int(v)) => match u64::try_from(*v) {
            Ok(v) => return Ok(v),
            Err(_) => format!("field {} is negative: {v}", index + 1),
        },
        Some(_) => format!("field {} is not an integer", index + 1),
        None => format!("field {} is missing", index + 1),
    };
    Err(StoreError::BadReply { script, detail })
}

/// The scripts' refusal of a key (`fleet-budget: key <key> ...`, lua/README.md) as a
/// [`StoreError::BadKey`].
pub(super) fn bad_key(e: &redis::RedisError) -> Option<StoreError> {
    if e.code() != Some("fleet-budget:") {
        return None;
    }
    key_refusal(e.detail()?)
}

/// The text after `fleet-budget: ` of a script's refusal of a key, as a [`StoreError::BadKey`].
pub(super) fn key_refusal(text: &str) -> Option<StoreError> {
    let rest = text.strip_prefix("key ")?;
    let at = [" is not a budget hash", " is not a breaker hash", " field "]
        .iter()
        .filter_map(|marker| rest.find(marker))
        .min()?;
    let (key, detail) = rest.split_at(at);
    Some(StoreError::BadKey {
        key: key.to_owned(),
        detail: detail.trim_start().to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The policy the calls below sent: window 1000 ms, ratio 0.5, floor 3, successes, fixed.
    fn caller() -> BudgetPolicy {
        BudgetPolicy {
            window: Duration::from_millis(1000),
            ratio: 0.5,
            min_allowance: 3,
            deposit: DepositBasis::Success,
            mode: WindowMode::Fixed,
        }
    }

    /// Fields 1 to 14 as given, then conflict, frozen 1, overridden 0 and, when `conflict`, the
    /// policy in force (0.2, 10, s, sliding).
    fn reply(values: &[i64], conflict: bool) -> Vec<Value> {
        let mut reply: Vec<Value> = values.iter().map(|v| Value::Int(*v)).collect();
        reply.extend([
            Value::Int(i64::from(conflict)),
            Value::Int(1),
            Value::Int(0),
        ]);
        if conflict {
            reply.extend([
                Value::BulkString(b"0.2".to_vec()),
                Value::Int(10),
                Value::BulkString(b"s".to_vec()),
                Value::BulkString(b"sliding".to_vec()),
            ]);
        }
        reply
    }

    const GOOD: [i64; 14] = [1, 10, 7, 1000, 5, 995, 1, 2, 3, 4, 5, 6, 7, 8];

    #[test]
    fn malformed_replies_are_errors_not_panics() {
        let caller = caller();
        assert!(parse_reply("spend", &[], &caller).is_err());
        assert!(parse_reply("spend", &reply(&[1; 13], true), &caller).is_err());
        assert!(parse_reply("spend", &reply(&[1; 13], false), &caller).is_err());
        let negative = [1, -5, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1];
        assert!(parse_reply("spend", &reply(&negative, true), &caller).is_err());
        let zero_window = [1, 5, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1];
        assert!(parse_reply("spend", &reply(&zero_window, true), &caller).is_err());
        let mut bad_ratio = reply(&GOOD, true);
        bad_ratio[17] = Value::BulkString(b"nan".to_vec());
        assert!(parse_reply("spend", &bad_ratio, &caller).is_err());
        let parsed = parse_reply("spend", &reply(&GOOD, true), &caller).unwrap();
        assert_eq!(parsed.granted, 1);
        assert_eq!(parsed.snapshot.allowance, 10);
        assert_eq!(parsed.snapshot.previous.denied, 8);
        assert!(parsed.snapshot.control.frozen);
        assert!(parsed.snapshot.control.conflict);
        assert_eq!(parsed.policy.window_ms(), 1000);
        assert!((parsed.policy.ratio - 0.2).abs() < f64::EPSILON);
        assert_eq!(parsed.policy.min_allowance, 10);
    }

    /// Without a conflict the scripts leave out the policy in force: it is the caller's.
    #[test]
    fn a_reply_without_the_policy_is_the_callers_only_without_a_conflict() {
        let caller = caller();
        let parsed = parse_reply("spend", &reply(&GOOD, false), &caller).unwrap();
        assert_eq!(parsed.policy, caller);
        assert!(!parsed.snapshot.control.conflict);
        assert_eq!(parsed.snapshot.current.retries, 3);
        let mut conflict = reply(&GOOD, false);
        conflict[14] = Value::Int(1);
        assert!(parse_reply("spend", &conflict, &caller).is_err());
        let mut other_window = reply(&GOOD, false);
        other_window[3] = Value::Int(2000);
        assert!(parse_reply("spend", &other_window, &caller).is_err());
    }

    /// Spend replies end with `next_grant_ms`: after the 17 fields, or after the policy in
    /// force on a conflict; -1 is never; a reply without it (an older script) says ask again.
    #[test]
    fn a_spend_reply_ends_with_the_wait_for_the_next_grant() {
        let caller = caller();
        let with = |conflict: bool, last: Option<i64>| {
            let mut r = reply(&GOOD, conflict);
            r.extend(last.map(Value::Int));
            parse_reply("spend", &r, &caller).map(|p| p.next_grant_ms)
        };
        assert_eq!(with(false, Some(250)).unwrap(), Some(250));
        assert_eq!(with(true, Some(7)).unwrap(), Some(7));
        assert_eq!(with(false, Some(-1)).unwrap(), None);
        assert_eq!(with(false, None).unwrap(), Some(0));
        assert_eq!(with(true, None).unwrap(), Some(0));
        assert!(with(false, Some(-5)).is_err());
        let mut text = reply(&GOOD, false);
        text.push(Value::BulkString(b"soon".to_vec()));
        assert!(parse_reply("spend_many", &text, &caller).is_err());
        let status = parse_reply("deposit", &reply(&GOOD, false), &caller).unwrap();
        assert_eq!(status.next_grant_ms, Some(0), "not a spend: no wait");
    }

    /// Status replies: the ratio and floor the allowance uses (fields 26 and 27) are read, and
    /// one missing or malformed is an error, not a guess.
    #[test]
    fn a_status_reply_carries_what_the_allowance_uses() {
        let caller = caller();
        let mut good = reply(&GOOD, true);
        good.extend([
            Value::Int(5000),
            Value::Int(0),
            Value::BulkString(Vec::new()),
            Value::Int(-1),
            Value::BulkString(b"0.75".to_vec()),
            Value::Int(12),
        ]);
        let status = parse_status(&good, &caller).unwrap();
        assert!((status.policy.ratio - 0.2).abs() < f64::EPSILON);
        assert_eq!(status.policy.min_allowance, 10);
        assert!((status.ratio - 0.75).abs() < f64::EPSILON);
        assert_eq!(status.min_allowance, 12);
        assert!(parse_status(&good[..25], &caller).is_err());
        for (index, bad) in [
            (25, Value::BulkString(b"-1".to_vec())),
            (25, Value::BulkString(b"nan".to_vec())),
            (25, Value::Int(1)),
            (26, Value::Int(-3)),
        ] {
            let mut reply = good.clone();
            reply[index] = bad;
            assert!(parse_status(&reply, &caller).is_err(), "{reply:?}");
        }
    }
}
