//! What every Lua script does with what it is sent, run on a private redis-server: a bad argument
//! is named (the first, in ARGV order) and nothing is written; no call leaves a key without an
//! expiry; a key of the wrong type or with a tampered field is named; a batch over the limit is
//! refused. The replies are part of the contract other languages match on (`lua/README.md`).
//! That the scripts are their generated source, and that the library loads those, is
//! `tests/lua_scripts.rs`.
#![allow(clippy::expect_used, clippy::panic, clippy::unwrap_used, missing_docs)]

mod common;

use fleet_budget::store::SPEND_BATCH_SCRIPT;
use fleet_budget::testing::RedisServer;

/// Each script names the first bad argument (in ARGV order) and writes nothing. The replies are
/// part of the contract: other languages may match on them.
#[test]
fn every_script_names_its_bad_argument_and_writes_nothing() {
    let server = RedisServer::start();
    let mut c = server.connection().unwrap();
    let good_policy = ["0.2", "10", "s", "sliding"];
    let cases: Vec<(&str, Vec<&str>, &str)> = vec![
        (
            "spend",
            vec!["0", "0.2", "10", "s", "sliding"],
            "ARGV[1] window_ms must be a positive integer",
        ),
        (
            "spend",
            vec!["1.5", "0.2", "10", "s", "sliding"],
            "ARGV[1] window_ms must be a positive integer",
        ),
        (
            "spend",
            vec!["1000", "nan", "10", "s", "sliding"],
            "ARGV[2] ratio must be a number >= 0",
        ),
        (
            "spend",
            vec!["1000", "-0.1", "10", "s", "sliding"],
            "ARGV[2] ratio must be a number >= 0",
        ),
        // Out of range: never stored (a window of inf or 1e300 made a key PEXPIREAT refused,
        // one that never expired; ratio inf granted everything).
        (
            "spend",
            vec!["inf", "0.2", "10", "s", "sliding"],
            "ARGV[1] window_ms must be a positive integer, at most 86400000",
        ),
        (
            "spend",
            vec!["1e300", "0.2", "10", "s", "sliding"],
            "ARGV[1] window_ms must be a positive integer, at most 86400000",
        ),
        (
            "spend",
            vec!["86400001", "0.2", "10", "s", "sliding"],
            "ARGV[1] window_ms must be a positive integer, at most 86400000",
        ),
        (
            "spend",
            vec!["1000", "inf", "10", "s", "sliding"],
            "ARGV[2] ratio must be a number >= 0, at most 10",
        ),
        (
            "spend",
            vec!["1000", "1e300", "10", "s", "sliding"],
            "ARGV[2] ratio must be a number >= 0, at most 10",
        ),
        (
            "spend",
            vec!["1000", "0.2", "inf", "s", "sliding"],
            "ARGV[3] min_allowance must be an integer >= 0, at most 10^9",
        ),
        (
            "status",
            vec!["inf", "0.2", "10", "s", "sliding"],
            "ARGV[1] window_ms must be a positive integer, at most 86400000",
        ),
        (
            "deposit",
            vec!["1e300", "1", "0"],
            "ARGV[1] window_ms must be a positive integer, at most 86400000",
        ),
        (
            "deposit",
            vec!["1000", "1", "0", "inf"],
            "ARGV[4] ratio must be a number >= 0, at most 10",
        ),
        (
            "deposit",
            vec!["1000", "1", "0", "0.2", "1e300"],
            "ARGV[5] min_allowance must be an integer >= 0, at most 10^9",
        ),
        (
            "spend",
            vec!["1000", "0.2", "1.5", "s", "sliding"],
            "ARGV[3] min_allowance must be an integer >= 0",
        ),
        (
            "spend",
            vec!["1000", "0.2", "10", "x", "sliding"],
            "ARGV[4] basis must be \"s\" or \"a\"",
        ),
        (
            "spend",
            vec!["1000", "0.2", "10", "s", "weird"],
            "ARGV[5] mode must be \"sliding\" or \"fixed\"",
        ),
        (
            "spend",
            vec!["1000", "0.2", "10", "s"],
            "ARGV[5] mode must be \"sliding\" or \"fixed\"",
        ),
        // The first bad argument is the one named.
        (
            "spend",
            vec!["x", "nan", "-1", "x", "weird"],
            "ARGV[1] window_ms",
        ),
        (
            "status",
            vec!["1000", "0.2", "-1", "s", "sliding"],
            "ARGV[3] min_allowance must be an integer >= 0",
        ),
        (
            "status",
            vec!["1000", "0.2", "10", "s", "Sliding"],
            "ARGV[5] mode must be \"sliding\" or \"fixed\"",
        ),
        (
            "spend_many",
            vec!["0", "3", "0.2", "10", "s", "sliding"],
            "ARGV[1] window_ms must be a positive integer",
        ),
        (
            "spend_many",
            vec!["1000", "0", "0.2", "10", "s", "sliding"],
            "ARGV[2] n must be an integer from 1 to 10000",
        ),
        (
            "spend_many",
            vec!["1000", "10001", "0.2", "10", "s", "sliding"],
            "ARGV[2] n must be an integer from 1 to 10000",
        ),
        (
            "spend_many",
            vec!["1000", "2.5", "0.2", "10", "s", "sliding"],
            "ARGV[2] n must be an integer from 1 to 10000",
        ),
        (
            "spend_many",
            vec!["1000", "3", "-1", "10", "s", "sliding"],
            "ARGV[3] ratio must be a number >= 0",
        ),
        (
            "spend_many",
            vec!["1000", "3", "0.2", "10", "s", "slow"],
            "ARGV[6] mode must be \"sliding\" or \"fixed\"",
        ),
        (
            "deposit",
            vec!["0", "1", "0"],
            "ARGV[1] window_ms must be a positive integer",
        ),
        (
            "deposit",
            vec!["1000", "-1", "0"],
            "ARGV[2] successes must be a plain integer from 0 to 999999999999999 (at most 15 digits)",
        ),
        (
            "deposit",
            vec!["1000", "1e3", "0"],
            "ARGV[2] successes must be a plain integer from 0 to 999999999999999 (at most 15 digits)",
        ),
        (
            "deposit",
            vec!["1000", "1000000000000000", "0"],
            "ARGV[2] successes must be a plain integer from 0 to 999999999999999 (at most 15 digits)",
        ),
        (
            "deposit",
            vec!["1000", "1", ""],
            "ARGV[3] first_attempts must be a plain integer from 0 to 999999999999999 (at most 15 digits)",
        ),
        (
            "deposit",
            vec!["1000", "1", "x", "nan"],
            "ARGV[3] first_attempts",
        ),
        (
            "deposit",
            vec!["1000", "1", "0", "nan"],
            "ARGV[4] ratio must be a number >= 0",
        ),
        (
            "deposit",
            vec!["1000", "1", "0", "0.2", "x"],
            "ARGV[5] min_allowance must be an integer >= 0",
        ),
        (
            "deposit",
            vec!["1000", "1", "0", "0.2", "10", "b"],
            "ARGV[6] basis must be \"s\" or \"a\"",
        ),
        (
            "deposit",
            vec!["1000", "1", "0", "0.2", "10", "a", "fixd"],
            "ARGV[7] mode must be \"sliding\" or \"fixed\"",
        ),
        // The optional eighth (0.2.0): denials answered in the caller's process.
        (
            "deposit",
            vec!["1000", "1", "0", "0.2", "10", "a", "fixed", "-1"],
            "ARGV[8] denied must be a plain integer from 0 to 999999999999999 (at most 15 digits)",
        ),
        (
            "deposit",
            vec!["1000", "1", "0", "0.2", "10", "a", "fixed", "1e3"],
            "ARGV[8] denied must be a plain integer from 0 to 999999999999999 (at most 15 digits)",
        ),
        (
            "deposit",
            vec![
                "1000",
                "1",
                "0",
                "0.2",
                "10",
                "a",
                "fixed",
                "1000000000000000",
            ],
            "ARGV[8] denied must be a plain integer from 0 to 999999999999999 (at most 15 digits)",
        ),
        (
            "deposit",
            vec!["1000", "1", "0", "0.2", "10", "a", "fixd", "x"],
            "ARGV[7] mode must be \"sliding\" or \"fixed\"",
        ),
        (
            "breaker",
            vec!["open", "1000", "0.5", "10", "1000", "3", "2", "1000"],
            "ARGV[1] op must be admit, record, cancel or status",
        ),
        (
            "breaker",
            vec!["admit", "0", "0.5", "10", "1000", "3", "2", "1000"],
            "ARGV[2] window_ms must be an integer from 1 to 86400000",
        ),
        (
            "breaker",
            vec!["admit", "1000", "nan", "10", "1000", "3", "2", "1000"],
            "ARGV[3] failure_ratio must be a number above 0 and at most 1",
        ),
        (
            "breaker",
            vec!["admit", "1000", "0", "10", "1000", "3", "2", "1000"],
            "ARGV[3] failure_ratio must be a number above 0 and at most 1",
        ),
        (
            "breaker",
            vec!["admit", "1000", "0.5", "10", "inf", "3", "2", "1000"],
            "ARGV[5] open_ms must be an integer from 1 to 86400000",
        ),
        (
            "breaker",
            vec!["admit", "1000", "0.5", "10", "1000", "3", "4", "1000"],
            "ARGV[7] close_after must be an integer from 1 to 3",
        ),
        (
            "breaker",
            vec![
                "record", "1000", "0.5", "10", "1000", "3", "2", "1000", "x", "0",
            ],
            "ARGV[9] outcome must be \"s\" or \"f\"",
        ),
    ];
    for (name, args, needle) in &cases {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(common::read(&format!("lua/{name}.lua")))
            .arg(1)
            .arg("fbt:v1:{bad}");
        // deposit's policy comes after its counts: complete the call with good values.
        let mut args = args.clone();
        if *name == "deposit" && args.len() >= 3 && args.len() < 7 {
            args.extend(good_policy.iter().skip(args.len() - 3));
        }
        for a in &args {
            cmd.arg(*a);
        }
        let err = cmd.query::<redis::Value>(&mut c).unwrap_err();
        // redis-rs reads "fleet-budget:" as the error code, the rest as the detail.
        assert_eq!(err.code(), Some("fleet-budget:"), "{name} {args:?}: {err}");
        assert!(
            err.detail().is_some_and(|d| d.starts_with(needle)),
            "{name} {args:?}: {err}"
        );
    }
    let keys: Vec<String> = server.cmd(&["KEYS", "*"]);
    assert!(keys.is_empty(), "a refused call writes nothing: {keys:?}");
}

/// The largest arguments the scripts accept still make keys that expire: no call, however
/// hostile its numbers, leaves a key without an expiry.
#[test]
fn no_call_leaves_a_key_without_an_expiry() {
    let server = RedisServer::start();
    let mut c = server.connection().unwrap();
    let windows = ["86400000", "86400001", "inf", "1e300", "-inf", "nan", "1"];
    let ratios = ["10", "inf", "1e300", "0"];
    let mins = ["1000000000", "inf", "0"];
    for (n, w) in windows.iter().enumerate() {
        for r in ratios {
            for m in mins {
                let key = format!("fbt:v1:{{d{n}}}");
                for name in ["spend", "deposit", "status"] {
                    let mut cmd = redis::cmd("EVAL");
                    cmd.arg(common::read(&format!("lua/{name}.lua")))
                        .arg(1)
                        .arg(&key)
                        .arg(*w);
                    if name == "deposit" {
                        cmd.arg("1").arg("1");
                    }
                    cmd.arg(r).arg(m).arg("s").arg("sliding");
                    let _ = cmd.query::<redis::Value>(&mut c);
                }
            }
        }
    }
    let keys: Vec<String> = server.cmd(&["KEYS", "*"]);
    assert!(!keys.is_empty(), "the valid calls made keys");
    for key in keys {
        // -1 is "no expiry"; a key of the 1 ms window may be due (0) or gone (-2) by now.
        let ttl: i64 = server.cmd(&["PTTL", &key]);
        assert_ne!(ttl, -1, "{key} has no expiry");
    }
}

/// A key of another type, or a budget field that is not an integer, is refused before any
/// write with an error that names the key; other keys are unaffected.
#[test]
fn a_wrong_type_or_tampered_key_is_named() {
    let server = RedisServer::start();
    let mut c = server.connection().unwrap();
    let _: () = server.cmd(&["SET", "fbt:v1:{str}", "hello"]);
    let _: i64 = server.cmd(&[
        "HSET",
        "fbt:v1:{tampered}",
        "w",
        "1000",
        "i",
        "1",
        "cr",
        "lots",
    ]);
    let _: i64 = server.cmd(&[
        "HSET",
        "fbt:v1:{huge}",
        "w",
        "1000",
        "cs",
        "99999999999999999999",
    ]);
    for (key, needle) in [
        ("fbt:v1:{str}", "is not a budget hash"),
        ("fbt:v1:{tampered}", "field cr is not a valid number"),
        ("fbt:v1:{huge}", "field cs is not a valid number"),
    ] {
        for name in ["spend", "deposit", "status"] {
            let mut cmd = redis::cmd("EVAL");
            cmd.arg(common::read(&format!("lua/{name}.lua")))
                .arg(1)
                .arg(key)
                .arg("1000");
            if name == "deposit" {
                cmd.arg("1").arg("0");
            }
            cmd.arg("0.2").arg("10").arg("s").arg("sliding");
            let err = cmd.query::<redis::Value>(&mut c).unwrap_err();
            assert_eq!(err.code(), Some("fleet-budget:"), "{name} {key}: {err}");
            let detail = err.detail().unwrap_or_default();
            assert!(
                detail.starts_with(&format!("key {key} ")) && detail.contains(needle),
                "{name} {key}: {err}"
            );
        }
    }
    let tampered: Vec<Option<String>> = server.cmd(&["HMGET", "fbt:v1:{tampered}", "cr", "cd"]);
    assert_eq!(
        tampered,
        vec![Some("lots".to_owned()), None],
        "nothing was written"
    );
}

/// `spend_batch.lua` decides at most 10,000 requests in one call, whatever their split over the
/// entries (one call holds the server while it runs: 10,000 keys of 10,000 requests each would
/// loop 10^8 times). Past that the call is refused as a whole and writes nothing; an entry whose
/// own `n` is not a valid count is refused on its own and does not count towards the total.
#[test]
fn a_batch_of_more_than_ten_thousand_requests_is_refused_and_writes_nothing() {
    let server = RedisServer::start();
    let mut c = server.connection().unwrap();
    let entry = |n: &'static str| ["60000", n, "0.2", "10", "s", "sliding"];
    let call = |c: &mut redis::Connection, keys: &[&str], ns: &[&'static str]| {
        let mut invocation = SPEND_BATCH_SCRIPT.prepare_invoke();
        for (key, n) in keys.iter().zip(ns) {
            invocation.key(*key);
            for arg in entry(n) {
                invocation.arg(arg);
            }
        }
        invocation.invoke::<redis::Value>(c)
    };
    let e = call(&mut c, &["t:v1:{a}", "t:v1:{b}"], &["6000", "4001"]).unwrap_err();
    assert!(
        e.to_string()
            .contains("spend_batch decides at most 10000 requests in all"),
        "{e}"
    );
    let keys: usize = server.cmd(&["DBSIZE"]);
    assert_eq!(keys, 0, "a refused batch writes nothing");
    // 10,000 in all is allowed; a bad n is that entry's own error and is not counted.
    let replies = call(
        &mut c,
        &["t:v1:{a}", "t:v1:{b}", "t:v1:{c}"],
        &["6000", "4000", "99999999"],
    )
    .unwrap();
    let redis::Value::Array(replies) = replies else {
        panic!("an array of replies: {replies:?}")
    };
    assert_eq!(replies.len(), 3);
    assert!(matches!(replies[0], redis::Value::Array(_)));
    assert!(matches!(replies[1], redis::Value::Array(_)));
    assert!(
        format!("{:?}", replies[2]).contains("n must be an integer from 1 to 10000"),
        "{:?}",
        replies[2]
    );
}
