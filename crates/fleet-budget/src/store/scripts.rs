//! The scripts of `lua/` as Rust calls them: the script texts, the policy arguments every script
//! takes (the caller's policy: which one is in force is the scripts' decision), and the reply
//! they all give. The contract for other languages is `lua/README.md`.

use std::sync::LazyLock;
use std::time::Duration;

use redis::{Script, Value};

use crate::allowance::{BudgetSnapshot, Control, WindowCounters};
use crate::error::StoreError;
use crate::policy::{BudgetPolicy, DepositBasis, WindowMode};

/// `lua/spend.lua`: try to spend one retry.
pub static SPEND_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../../lua/spend.lua")));
/// `lua/spend_many.lua`: decide n retry requests together (group commit).
pub static SPEND_MANY_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../../lua/spend_many.lua")));
/// `lua/deposit.lua`: record deposits.
pub static DEPOSIT_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../../lua/deposit.lua")));
/// `lua/status.lua`: read a budget.
pub static STATUS_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../../lua/status.lua")));

/// `lua/override.lua`: an operator's freeze or set override, or its removal.
pub static OVERRIDE_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../../lua/override.lua")));

/// The arguments every script takes after its own, as `lua/README.md` lists them: the ratio,
/// the floor, the deposit basis (`s` or `a`) and the window mode (`sliding` or `fixed`).
#[must_use]
pub fn policy_args(policy: &BudgetPolicy) -> [String; 4] {
    [
        policy.ratio.to_string(),
        policy.min_allowance.to_string(),
        policy.deposit.script_code().to_owned(),
        policy.mode.as_str().to_owned(),
    ]
}

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

/// Decodes the 21-field reply shared by the scripts (`lua/README.md`, "Reply").
pub fn parse_reply(script: &'static str, reply: &[Value]) -> Result<ScriptReply, StoreError> {
    let bad = |detail: String| StoreError::BadReply { script, detail };
    if reply.len() < 21 {
        return Err(bad(format!(
            "expected at least 21 fields, got {}",
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
    let ratio_text = text_at(reply, 17).map_err(bad)?;
    let ratio = ratio_text
        .parse::<f64>()
        .ok()
        .filter(|r| r.is_finite() && *r >= 0.0)
        .ok_or_else(|| bad(format!("ratio is not a number >= 0: {ratio_text:?}")))?;
    let min_allowance = u64::try_from(int_at(reply, 18).map_err(bad)?)
        .map_err(|_| bad("min_allowance is negative".to_owned()))?;
    let deposit = match text_at(reply, 19).map_err(bad)?.as_str() {
        "s" => DepositBasis::Success,
        "a" => DepositBasis::Request,
        other => return Err(bad(format!("basis is {other:?}"))),
    };
    let mode = match text_at(reply, 20).map_err(bad)?.as_str() {
        "sliding" => WindowMode::Sliding,
        "fixed" => WindowMode::Fixed,
        other => return Err(bad(format!("mode is {other:?}"))),
    };
    let granted = int_at(reply, 0).map_err(bad)?;
    Ok(ScriptReply {
        granted,
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
            },
        },
        policy: BudgetPolicy {
            window: Duration::from_millis(window_ms),
            ratio,
            min_allowance,
            deposit,
            mode,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ints(values: &[i64]) -> Vec<Value> {
        let mut reply: Vec<Value> = values.iter().map(|v| Value::Int(*v)).collect();
        reply.extend([
            Value::Int(0),
            Value::Int(1),
            Value::Int(0),
            Value::BulkString(b"0.2".to_vec()),
            Value::Int(10),
            Value::BulkString(b"s".to_vec()),
            Value::BulkString(b"sliding".to_vec()),
        ]);
        reply
    }

    #[test]
    fn malformed_replies_are_errors_not_panics() {
        assert!(parse_reply("spend", &[]).is_err());
        assert!(parse_reply("spend", &ints(&[1; 13])).is_err());
        assert!(parse_reply("spend", &ints(&[1, -5, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1])).is_err());
        assert!(parse_reply("spend", &ints(&[1, 5, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1])).is_err());
        let mut bad_ratio = ints(&[1, 10, 7, 1000, 5, 995, 1, 2, 3, 4, 5, 6, 7, 8]);
        bad_ratio[17] = Value::BulkString(b"nan".to_vec());
        assert!(parse_reply("spend", &bad_ratio).is_err());
        let reply = parse_reply(
            "spend",
            &ints(&[1, 10, 7, 1000, 5, 995, 1, 2, 3, 4, 5, 6, 7, 8]),
        )
        .unwrap();
        assert_eq!(reply.granted, 1);
        assert_eq!(reply.snapshot.allowance, 10);
        assert_eq!(reply.snapshot.previous.denied, 8);
        assert!(reply.snapshot.control.frozen);
        assert!(!reply.snapshot.control.conflict);
        assert_eq!(reply.policy.window_ms(), 1000);
        assert!((reply.policy.ratio - 0.2).abs() < f64::EPSILON);
    }
}
