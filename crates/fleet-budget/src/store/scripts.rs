//! The scripts of `lua/` as Rust calls them: the script texts, the policy arguments every script
//! takes, and the reply they all give. The contract for other languages is `lua/README.md`.

use std::sync::LazyLock;

use redis::Script;

use crate::allowance::{BudgetSnapshot, WindowCounters};
use crate::error::StoreError;
use crate::policy::BudgetPolicy;

/// `lua/spend.lua`: try to spend one retry.
pub static SPEND_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../../lua/spend.lua")));
/// `lua/deposit.lua`: record deposits.
pub static DEPOSIT_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../../lua/deposit.lua")));
/// `lua/status.lua`: read a budget.
pub static STATUS_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../../lua/status.lua")));

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

/// Decodes the 14-integer reply shared by the scripts: `granted` (1, 0, or -1 when not a
/// withdrawal) and the snapshot.
pub fn parse_reply(
    script: &'static str,
    reply: &[i64],
) -> Result<(i64, BudgetSnapshot), StoreError> {
    let bad = |detail: String| StoreError::BadReply { script, detail };
    if reply.len() < 14 {
        return Err(bad(format!(
            "expected at least 14 integers, got {}",
            reply.len()
        )));
    }
    let mut fields = [0u64; 13];
    for (i, (slot, value)) in fields.iter_mut().zip(reply.iter().skip(1)).enumerate() {
        *slot = u64::try_from(*value)
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
    ] = fields;
    if window_ms == 0 {
        return Err(bad("window_ms is 0".to_owned()));
    }
    let granted = reply.first().copied().unwrap_or(-1);
    Ok((
        granted,
        BudgetSnapshot {
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
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_replies_are_errors_not_panics() {
        assert!(parse_reply("spend", &[]).is_err());
        assert!(parse_reply("spend", &[1; 13]).is_err());
        assert!(parse_reply("spend", &[1, -5, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]).is_err());
        assert!(parse_reply("spend", &[1, 5, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]).is_err());
        let (g, s) =
            parse_reply("spend", &[1, 10, 7, 1000, 5, 995, 1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
        assert_eq!(g, 1);
        assert_eq!(s.allowance, 10);
        assert_eq!(s.previous.denied, 8);
    }
}
