//! Key layout v1 is shared by old and new workers during a rolling deploy: an older `spend.lua`
//! (main 89695b5's, kept as `redis_bench`'s reference) and this one, taking turns on one key,
//! leave the same hash and give the same answers as either alone.
//!
//! Three keys get the same random sequence of spends, group-commit spends, deposits, operator
//! overrides and jumps of the clock, under two policies (so conflicts and a change of the policy
//! in force happen too): on `{old}` every spend is the old script's, on `{new}` this one's, on
//! `{mixed}` either, at random. After every step the three replies agree (the first 17 fields,
//! and the policy in force when this script sends it) and `status.lua` reads the same budget on
//! all three; at the end the hashes and their expiry times are equal. The scripts read the
//! clock from a key the test moves (their `TIME` is replaced by an `HMGET` of it), so that the
//! three keys see the same instants.
//!
//! The same for `deposit.lua`'s optional eighth argument (0.2.0: the denials a caller answered
//! in its process): the 7-argument call of older callers, on the older script (kept as
//! `tests/lua_rolling_deploy/deposit_before.lua`) or on this one, leaves the same hash and gives
//! the same answers; a caller that sends denials changes only the denial counters, by what it
//! sent in each window.
#![allow(clippy::expect_used, clippy::panic, clippy::unwrap_used, missing_docs)]

mod common;

use std::collections::BTreeMap;

use fleet_budget::testing::RedisServer;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use redis::{Script, Value};

const CLOCK: &str = "fbt:clock";

/// `lua/<path>` with its `TIME` read from the test's clock key instead.
fn on_test_clock(path: &str) -> Script {
    let text = common::read(path);
    assert_eq!(text.matches("redis.call('TIME')").count(), 1, "{path}");
    Script::new(&text.replace(
        "redis.call('TIME')",
        &format!("redis.call('HMGET', '{CLOCK}', 's', 'us')"),
    ))
}

struct Scripts {
    old_spend: Script,
    spend: Script,
    spend_many: Script,
    deposit: Script,
    status: Script,
    override_: Script,
}

/// The two policies callers send: `window_ms ratio min_allowance basis mode`.
const POLICIES: [[&str; 5]; 2] = [
    ["1000", "0.5", "2", "s", "sliding"],
    ["2500", "0.2", "1", "a", "fixed"],
];

fn run(c: &mut redis::Connection, script: &Script, key: &str, args: &[String]) -> Vec<Value> {
    let mut invocation = script.key(key);
    for arg in args {
        invocation.arg(arg);
    }
    invocation
        .invoke(c)
        .unwrap_or_else(|e| panic!("{key} {args:?}: {e}"))
}

/// A spend's reply as this script's: 17 fields, and fields 18 to 21 only on a conflict (field
/// 15). The old script always sent 21.
fn as_new_reply(mut reply: Vec<Value>) -> Vec<Value> {
    // This script's reply ends with next_grant_ms (field 18, or 22 after the policy in force),
    // which the old script does not send: the fields both send are compared.
    if reply.len() == 18 || reply.len() == 22 {
        reply.pop();
    }
    if reply.len() >= 21 && reply.get(14) == Some(&Value::Int(0)) {
        reply.truncate(17);
    }
    reply
}

#[test]
fn old_and_new_spend_scripts_share_one_key() {
    let server = RedisServer::start();
    let mut c = server.connection().unwrap();
    let scripts = Scripts {
        old_spend: on_test_clock("crates/fleet-budget/examples/redis_bench/spend_before.lua"),
        spend: on_test_clock("lua/spend.lua"),
        spend_many: on_test_clock("lua/spend_many.lua"),
        deposit: on_test_clock("lua/deposit.lua"),
        status: on_test_clock("lua/status.lua"),
        override_: on_test_clock("lua/override.lua"),
    };
    let keys = ["fbt:v1:{old}", "fbt:v1:{new}", "fbt:v1:{mixed}"];
    // The clock starts at the server's time and only moves forward, so every expiry the
    // scripts set lies in the real future: no key expires under the test.
    let (secs, _): (u64, u64) = redis::cmd("TIME").query(&mut c).unwrap();
    let mut now_us = secs * 1_000_000;
    let mut rng = SmallRng::seed_from_u64(14);
    let (mut mixed_old, mut mixed_new, mut conflicts, mut grants) = (0, 0, 0, 0);
    for step in 0..3000 {
        let _: () = redis::cmd("HSET")
            .arg(CLOCK)
            .arg("s")
            .arg(now_us / 1_000_000)
            .arg("us")
            .arg(now_us % 1_000_000)
            .query(&mut c)
            .unwrap();
        let policy = POLICIES[usize::from(rng.random_bool(0.1))];
        let with_policy = |own: &[String]| -> Vec<String> {
            let mut args = vec![policy[0].to_owned()];
            args.extend_from_slice(own);
            args.extend(policy[1..].iter().map(|a| (*a).to_owned()));
            args
        };
        let roll = rng.random_range(0..100);
        let replies: Vec<Vec<Value>> = if roll < 40 {
            let old_in_mixed = rng.random_bool(0.5);
            if old_in_mixed {
                mixed_old += 1;
            } else {
                mixed_new += 1;
            }
            keys.iter()
                .enumerate()
                .map(|(k, key)| {
                    let old = k == 0 || (k == 2 && old_in_mixed);
                    let script = if old {
                        &scripts.old_spend
                    } else {
                        &scripts.spend
                    };
                    as_new_reply(run(&mut c, script, key, &with_policy(&[])))
                })
                .collect()
        } else if roll < 50 {
            let n = rng.random_range(1..=5u32).to_string();
            let args = with_policy(std::slice::from_ref(&n));
            keys.iter()
                .map(|key| run(&mut c, &scripts.spend_many, key, &args))
                .collect()
        } else if roll < 75 {
            let s = rng.random_range(0..6u32).to_string();
            let a = rng.random_range(0..6u32).to_string();
            let args = with_policy(&[s, a]);
            keys.iter()
                .map(|key| run(&mut c, &scripts.deposit, key, &args))
                .collect()
        } else if roll < 80 {
            let args: Vec<String> = match rng.random_range(0..4) {
                0 => ["freeze", "700", "ops", "drill"]
                    .map(str::to_owned)
                    .to_vec(),
                1 => ["set", "1500", "ops", "more", "1", ""]
                    .map(str::to_owned)
                    .to_vec(),
                2 => vec!["unfreeze".to_owned()],
                _ => vec!["clear".to_owned()],
            };
            keys.iter()
                .map(|key| run(&mut c, &scripts.override_, key, &args))
                .collect()
        } else {
            // A jump of the clock: within the window, past it, or past two of them.
            now_us += rng.random_range(0..3_000_000u64);
            continue;
        };
        if replies[0].first() == Some(&Value::Int(1)) && roll < 40 {
            grants += 1;
        }
        if replies[0].get(14) == Some(&Value::Int(1)) {
            conflicts += 1;
        }
        assert!(
            replies[0] == replies[1] && replies[1] == replies[2],
            "step {step}: the three keys answered differently: {replies:?}"
        );
        let status: Vec<Vec<Value>> = keys
            .iter()
            .map(|key| {
                let mut reply = run(
                    &mut c,
                    &scripts.status,
                    key,
                    &POLICIES[0].map(str::to_owned),
                );
                reply.remove(21); // the PTTL: real time, read a moment apart
                reply
            })
            .collect();
        assert!(
            status[0] == status[1] && status[1] == status[2],
            "step {step}: status differs: {status:?}"
        );
        now_us += rng.random_range(0..20_000u64);
    }
    // The birth (`e`, 0.2.0) is written by the first script of this version to meet the hash:
    // on `{old}` that is a later call than on the others, by design (lua/README.md, "Lost
    // budgets"); everything else must be equal.
    let hashes: Vec<BTreeMap<String, String>> = keys
        .iter()
        .map(|key| {
            let mut hash: BTreeMap<String, String> = server.cmd(&["HGETALL", key]);
            assert!(hash.remove("e").is_some(), "{key} has a birth");
            hash
        })
        .collect();
    let expiries: Vec<i64> = keys
        .iter()
        .map(|key| server.cmd(&["PEXPIRETIME", key]))
        .collect();
    assert!(
        hashes[0] == hashes[1] && hashes[1] == hashes[2],
        "the hashes differ: {hashes:?}"
    );
    assert!(
        expiries[0] == expiries[1] && expiries[1] == expiries[2],
        "the expiries differ: {expiries:?}"
    );
    // The sequence did what it is meant to: both scripts on the mixed key, grants and denials,
    // conflicts; and it ends with a live key.
    assert!(
        mixed_old > 200 && mixed_new > 200,
        "{mixed_old} {mixed_new}"
    );
    assert!(
        grants > 50 && conflicts > 20,
        "grants {grants} conflicts {conflicts}"
    );
    assert!(
        hashes[0].contains_key("cr") && expiries[0] > 0,
        "{hashes:?}"
    );
}

/// The deposit reply's denial fields (0-based: current window 9, previous window 13).
const CUR_DENIED: usize = 9;
const PREV_DENIED: usize = 13;

fn int(reply: &[Value], at: usize) -> i64 {
    match reply.get(at) {
        Some(Value::Int(n)) => *n,
        other => panic!("field {at} is not an integer: {other:?} in {reply:?}"),
    }
}

#[test]
fn old_and_new_deposit_scripts_share_one_key_and_only_sent_denials_differ() {
    let server = RedisServer::start();
    let mut c = server.connection().unwrap();
    let old_deposit = on_test_clock("tests/lua_rolling_deploy/deposit_before.lua");
    let deposit = on_test_clock("lua/deposit.lua");
    let spend = on_test_clock("lua/spend.lua");
    let status = on_test_clock("lua/status.lua");
    // {old}: the older script; {new}: this one called as older callers do (7 arguments);
    // {mixed}: either, the new one with an explicit 0; {counted}: this one with denials.
    let same = ["fbt:v1:{old}", "fbt:v1:{new}", "fbt:v1:{mixed}"];
    let counted = "fbt:v1:{counted}";
    let policy = POLICIES[0];
    let with_policy = |own: &[String]| -> Vec<String> {
        let mut args = vec![policy[0].to_owned()];
        args.extend_from_slice(own);
        args.extend(policy[1..].iter().map(|a| (*a).to_owned()));
        args
    };
    let (secs, _): (u64, u64) = redis::cmd("TIME").query(&mut c).unwrap();
    let mut now_us = secs * 1_000_000;
    let window_us = policy[0].parse::<u64>().unwrap() * 1000;
    let mut rng = SmallRng::seed_from_u64(31);
    // Denials sent on {counted}, by the window index they were sent in.
    let mut sent: BTreeMap<i64, i64> = BTreeMap::new();
    let (mut mixed_old, mut mixed_new, mut denials_sent) = (0, 0, 0);
    for step in 0..2000 {
        let _: () = redis::cmd("HSET")
            .arg(CLOCK)
            .arg("s")
            .arg(now_us / 1_000_000)
            .arg("us")
            .arg(now_us % 1_000_000)
            .query(&mut c)
            .unwrap();
        let roll = rng.random_range(0..100);
        let replies: Vec<Vec<Value>> = if roll < 45 {
            let args = with_policy(&[]);
            same.iter()
                .chain([&counted])
                .map(|key| as_new_reply(run(&mut c, &spend, key, &args)))
                .collect()
        } else if roll < 90 {
            let s = rng.random_range(0..4u32).to_string();
            let a = rng.random_range(0..4u32).to_string();
            let args = with_policy(&[s, a]);
            let old_in_mixed = rng.random_bool(0.5);
            if old_in_mixed {
                mixed_old += 1;
            } else {
                mixed_new += 1;
            }
            let mut with_zero = args.clone();
            with_zero.push("0".to_owned());
            let denied = rng.random_range(0..6i64);
            let mut with_denied = args.clone();
            with_denied.push(denied.to_string());
            let replies = vec![
                run(&mut c, &old_deposit, same[0], &args),
                run(&mut c, &deposit, same[1], &args),
                if old_in_mixed {
                    run(&mut c, &old_deposit, same[2], &args)
                } else {
                    run(&mut c, &deposit, same[2], &with_zero)
                },
                run(&mut c, &deposit, counted, &with_denied),
            ];
            *sent.entry(int(&replies[3], 2)).or_default() += denied;
            denials_sent += denied;
            replies
        } else {
            // A jump of the clock: within the window, past it, or past two of them.
            now_us += rng.random_range(0..3 * window_us);
            continue;
        };
        assert!(
            replies[0] == replies[1] && replies[1] == replies[2],
            "step {step}: the three keys answered differently: {replies:?}"
        );
        // {counted} differs from {old} only by the denials sent in its two windows.
        let index = int(&replies[0], 2);
        let mut expected = replies[0].clone();
        expected[CUR_DENIED] =
            Value::Int(int(&replies[0], CUR_DENIED) + sent.get(&index).copied().unwrap_or(0));
        expected[PREV_DENIED] = Value::Int(
            int(&replies[0], PREV_DENIED) + sent.get(&(index - 1)).copied().unwrap_or(0),
        );
        assert_eq!(
            replies[3], expected,
            "step {step}: the key with denials sent differs by more than them"
        );
        let reads: Vec<Vec<Value>> = same
            .iter()
            .map(|key| {
                let mut reply = run(&mut c, &status, key, &policy.map(str::to_owned));
                reply.remove(21); // the PTTL: real time, read a moment apart
                reply
            })
            .collect();
        assert!(
            reads[0] == reads[1] && reads[1] == reads[2],
            "step {step}: status differs: {reads:?}"
        );
        now_us += rng.random_range(0..20_000u64);
    }
    let hashes: Vec<BTreeMap<String, String>> = same
        .iter()
        .map(|key| server.cmd(&["HGETALL", key]))
        .collect();
    let expiries: Vec<i64> = same
        .iter()
        .chain([&counted])
        .map(|key| server.cmd(&["PEXPIRETIME", key]))
        .collect();
    assert!(
        hashes[0] == hashes[1] && hashes[1] == hashes[2],
        "the hashes differ: {hashes:?}"
    );
    assert!(
        expiries.iter().all(|e| *e == expiries[0] && *e > 0),
        "the expiries differ: {expiries:?}"
    );
    assert!(
        mixed_old > 100 && mixed_new > 100,
        "{mixed_old} {mixed_new}"
    );
    assert!(denials_sent > 500, "{denials_sent}");
}
