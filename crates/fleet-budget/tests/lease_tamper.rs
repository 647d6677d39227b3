// Over ~500 lines on purpose: one hostile-input review of the lease scripts, a case a test, named in
// docs/RELIABILITY.md; submodules would rename them.
//! The concurrency leases (`lua/lease_acquire.lua`, `lua/lease_release.lua`) against lease sets
//! that anyone with access to Redis can write, on a private redis-server: a key of another type,
//! leases that never end (`+inf`, `1e300`) or ended long ago (negative, `-inf`), fractional
//! expiries, a set stuffed with a million members, hostile arguments. Each gives a named error
//! (naming the key or the argument, never a Lua runtime error) or a safe outcome: the cap holds,
//! no lease of a caller is lost or counted twice, and no call does unbounded work.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::sync::Arc;
use std::time::Duration;

use fleet_budget::concurrency::{
    ConcurrencyBudget, ConcurrencyPolicy, LEASE_ACQUIRE_SCRIPT, LEASE_RELEASE_SCRIPT, Lease,
    LeaseKind, MAX_LEASE, Refusal,
};
use fleet_budget::store::{RedisStore, RedisTarget};
use fleet_budget::testing::RedisServer;
use fleet_budget::{Dependency, StoreError};

const LP: &str = "fbt:v1:{paid-api}:lp";
const LR: &str = "fbt:v1:{paid-api}:lr";
const LONGEST_MS: u64 = 86_400_000;
/// Most expired leases a call removes from each set.
const REMOVED_PER_CALL: u64 = 1000;

fn budget(server: &RedisServer) -> ConcurrencyBudget {
    let store = RedisStore::new(
        RedisTarget::Single(server.url()),
        "fbt",
        // Generous: a shared 2-core machine, and a million-member set in some tests.
        Duration::from_secs(20),
    )
    .unwrap();
    ConcurrencyBudget::new(Arc::new(store))
}

fn dep() -> Dependency {
    Dependency::new("paid-api").unwrap()
}

fn policy(cap: u64, primary_waits: bool) -> ConcurrencyPolicy {
    ConcurrencyPolicy {
        cap,
        max_retry_fraction: 0.5,
        min_retry_slots: 1,
        lease: Duration::from_secs(30),
        primary_waits,
        max_wait: Duration::from_secs(60),
    }
    .checked()
    .unwrap()
}

/// The server's clock in ms, as the scripts read it.
fn server_ms(server: &RedisServer) -> u64 {
    let t: Vec<String> = server.cmd(&["TIME"]);
    t[0].parse::<u64>().unwrap() * 1000 + t[1].parse::<u64>().unwrap() / 1000
}

fn score(server: &RedisServer, key: &str, member: &str) -> Option<f64> {
    let s: Option<String> = server.cmd(&["ZSCORE", key, member]);
    s.map(|s| s.parse().unwrap())
}

fn members(server: &RedisServer, key: &str) -> Vec<String> {
    server.cmd(&["ZRANGE", key, "0", "-1"])
}

/// An error text is the scripts' own, not a Lua runtime error of Redis (which names the
/// script's SHA and line: `script: 2f63…, on @user_script:76.`).
fn assert_no_script_error_text(text: &str) {
    assert!(
        !text.contains("@user_script") && !text.contains("script: "),
        "a Lua runtime error: {text}"
    );
}

/// Before: `ZREMRANGEBYSCORE` on a key of another type failed inside the script with Redis's
/// `WRONGTYPE ... script: <sha>, on @user_script:47.`, a plain `StoreError::Redis` that names
/// neither the key nor the script's contract. Now each lease set is checked before any write and
/// refused as `StoreError::BadKey` naming it, for every kind and for the release; the other set
/// is left as it was (its expired lease not even removed).
#[tokio::test]
async fn a_lease_set_of_another_type_is_refused_naming_it_and_nothing_is_written() {
    let server = RedisServer::start();
    let b = budget(&server);
    let p = policy(5, true);
    for (key, other) in [(LP, LR), (LR, LP)] {
        let makers: [&[&str]; 5] = [
            &["SET", key, "x"],
            &["HSET", key, "cr", "lots", "expires", "never"],
            &["RPUSH", key, "a", "b"],
            &["SADD", key, "a"],
            &["XADD", key, "*", "f", "v"],
        ];
        for make in makers {
            let _: () = server.cmd(&["FLUSHALL"]);
            let _: redis::Value = server.cmd(make);
            let kind_before: String = server.cmd(&["TYPE", key]);
            // An expired lease and a live one in the other set: neither may change.
            let _: () = server.cmd(&["ZADD", other, "1", "expired", "99999999999999", "live"]);
            for kind in [LeaseKind::Primary, LeaseKind::Retry, LeaseKind::Hedge] {
                match b.acquire(&dep(), &p, kind).await {
                    Err(StoreError::BadKey { key: named, detail }) => {
                        assert_eq!(named, key, "{make:?}");
                        assert!(
                            detail.starts_with("is not a lease set: WRONGTYPE"),
                            "{make:?}: {detail}"
                        );
                        assert_no_script_error_text(&detail);
                    }
                    other => panic!("{make:?} {kind:?}: {other:?}"),
                }
            }
            let lease = Lease {
                dependency: dep(),
                kind: LeaseKind::Primary,
                id: "live".to_owned(),
                expires_at_ms: 0,
            };
            match b.release(&lease).await {
                Err(e @ StoreError::BadKey { .. }) => {
                    let text = e.to_string();
                    assert!(
                        text.contains(key) && text.contains("is not a lease set"),
                        "{text}"
                    );
                    assert_no_script_error_text(&text);
                }
                other => panic!("{make:?} release: {other:?}"),
            }
            let kind_after: String = server.cmd(&["TYPE", key]);
            assert_eq!(kind_after, kind_before);
            assert_eq!(members(&server, other), ["expired", "live"], "{make:?}");
        }
    }
}

/// Before: a lease set holding a score of `+inf` or `1e300` made the script fail at its
/// `PEXPIREAT` (`ERR value is not an integer or out of range ... @user_script:76`) *after* it had
/// added the caller's lease: the caller saw an error and ran uncounted, and its lease stayed in
/// the set, a slot held by nobody until it expired. A fractional expiry did the same. Now such
/// leases are brought back to the longest lease from now (they still count, and now they
/// expire), the caller's lease is granted and given back, and expired ones (negative, `-inf`,
/// `0`) are gone.
#[tokio::test]
async fn leases_past_the_longest_lease_or_long_over_are_made_safe() {
    let server = RedisServer::start();
    let b = budget(&server);
    let before = server_ms(&server);
    let _: () = server.cmd(&[
        "ZADD", LP, "+inf", "ghost", "1e300", "huge", "-inf", "old", "-5", "negative", "0", "zero",
    ]);
    let fraction = format!("{}.5", before + 60_000);
    let _: () = server.cmd(&["ZADD", LP, &fraction, "fraction"]);
    let _: () = server.cmd(&["ZADD", LR, "1.5", "over", &fraction, "retry-fraction"]);
    let p = policy(10, true);
    let a = b.acquire(&dep(), &p, LeaseKind::Primary).await.unwrap();
    let lease = a
        .lease
        .expect("granted: 3 + 1 primaries and 1 retry under a cap of 10");
    assert_eq!((a.in_flight.primaries, a.in_flight.retries), (4, 1));
    let now = lease.expires_at_ms - 30_000;
    for member in ["ghost", "huge"] {
        assert_eq!(
            score(&server, LP, member),
            Some((now + LONGEST_MS) as f64),
            "{member}"
        );
    }
    assert_eq!(
        score(&server, LP, "fraction"),
        Some(before as f64 + 60_000.5)
    );
    for gone in ["old", "negative", "zero"] {
        assert_eq!(score(&server, LP, gone), None, "{gone}");
    }
    assert_eq!(members(&server, LR), ["retry-fraction"]);
    // The set expires with its last lease, a whole ms after the longest lease at most.
    let ttl: i64 = server.cmd(&["PTTL", LP]);
    assert!(ttl > 0 && ttl <= 86_400_001, "{ttl}");
    // A retry is granted beside them, and both leases are given back: none lost, none doubled.
    let r = b.acquire(&dep(), &p, LeaseKind::Retry).await.unwrap();
    let retry = r
        .lease
        .expect("granted: 4 + 1 under 10, 1 retry of max(1, 2) slots");
    assert_eq!((r.in_flight.primaries, r.in_flight.retries), (4, 2));
    let in_flight = b.release(&lease).await.unwrap();
    assert_eq!((in_flight.primaries, in_flight.retries), (3, 2));
    let in_flight = b.release(&retry).await.unwrap();
    assert_eq!((in_flight.primaries, in_flight.retries), (3, 1));
    assert_eq!(members(&server, LP), ["fraction", "ghost", "huge"]);
    // A second call does not move them forward again: they expire one longest lease after the
    // first call that saw them, not one after the last.
    let _ = b.acquire(&dep(), &p, LeaseKind::Primary).await.unwrap();
    assert_eq!(score(&server, LP, "ghost"), Some((now + LONGEST_MS) as f64));
}

/// Leases that never end fill the cap of primaries that wait: every call is refused, so a fix
/// made only when a lease is granted would never come, and the dependency would be shut for
/// good. The refused calls bring them back to the longest lease all the same: the cap frees
/// itself within a day however they were written, and stays shut until then (they count).
#[tokio::test]
async fn a_cap_jammed_by_leases_that_never_end_frees_itself_within_the_longest_lease() {
    let server = RedisServer::start();
    let b = budget(&server);
    for i in 0..6 {
        let _: () = server.cmd(&["ZADD", LR, "+inf", &format!("jam{i}")]);
    }
    let before = server_ms(&server);
    let a = b
        .acquire(&dep(), &policy(5, true), LeaseKind::Primary)
        .await
        .unwrap();
    let after = server_ms(&server);
    assert_eq!(a.lease, Err(Refusal::Cap));
    assert_eq!(a.in_flight.retries, 6);
    for i in 0..6 {
        let s = score(&server, LR, &format!("jam{i}")).unwrap();
        assert!(
            s >= (before + LONGEST_MS) as f64 && s <= (after + LONGEST_MS) as f64,
            "{s}"
        );
    }
    let r = b
        .acquire(&dep(), &policy(5, true), LeaseKind::Retry)
        .await
        .unwrap();
    assert_eq!(r.lease, Err(Refusal::Cap));
}

/// Fills `key` with `n` members `m<i>` whose expiry is `offset_ms` from the server's clock, in
/// calls of 100,000.
fn fill(server: &RedisServer, key: &str, n: u64, offset_ms: i64) {
    const FILL: &str = r"
local t = redis.call('TIME')
local at = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[3])
local batch = {}
for i = tonumber(ARGV[1]), tonumber(ARGV[2]) do
  batch[#batch + 1] = at
  batch[#batch + 1] = 'm' .. i
  if #batch >= 2000 then
    redis.call('ZADD', KEYS[1], unpack(batch))
    batch = {}
  end
end
if #batch > 0 then redis.call('ZADD', KEYS[1], unpack(batch)) end
return redis.call('ZCARD', KEYS[1])";
    let mut c = server.connection().unwrap();
    let mut from = 1;
    while from <= n {
        let to = (from + 99_999).min(n);
        let _: u64 = redis::cmd("EVAL")
            .arg(FILL)
            .arg(1)
            .arg(key)
            .arg(from)
            .arg(to)
            .arg(offset_ms)
            .query(&mut c)
            .unwrap();
        from = to + 1;
    }
    let count: u64 = server.cmd(&["ZCARD", key]);
    assert_eq!(count, n);
}

/// The server time of the scripts' calls so far, from `INFO commandstats` (µs in all, calls).
fn script_usec(server: &RedisServer) -> (f64, f64) {
    let info: String = server.cmd(&["INFO", "commandstats"]);
    let line = info
        .lines()
        .find(|l| l.starts_with("cmdstat_evalsha:"))
        .unwrap_or("cmdstat_evalsha:calls=0,usec=0");
    let field = |name: &str| -> f64 {
        line.split([':', ','])
            .find_map(|f| f.strip_prefix(name))
            .map_or(0.0, |v| v.parse().unwrap())
    };
    (field("usec="), field("calls="))
}

/// A million expired leases (a dead fleet, or written by hand): before, the first call removed
/// them all at once with `ZREMRANGEBYSCORE`, holding the server (every client of it) for about
/// a second. Now each call removes at most 1000 per set, so its work is bounded; those not yet
/// removed count towards the cap (it refuses sooner, never later), and after 1000 calls the set
/// is back to the leases in flight. Prints the server time per call beside calls on an empty set
/// in the same run (a figure, not an assertion: the machine is shared).
#[tokio::test]
async fn a_million_expired_leases_are_removed_a_thousand_per_call() {
    const N: u64 = 1_000_000;
    let server = RedisServer::start();
    let b = budget(&server);
    let p = policy(10, true);
    // Reference: calls on empty sets, in the same run.
    let (u0, c0) = script_usec(&server);
    for _ in 0..200 {
        let a = b.acquire(&dep(), &p, LeaseKind::Primary).await.unwrap();
        b.release(&a.lease.unwrap()).await.unwrap();
    }
    let (u1, c1) = script_usec(&server);
    fill(&server, LP, N, -60_000);
    let (u2, c2) = script_usec(&server);
    let mut calls = 0_u64;
    let mut left = N;
    let granted = loop {
        let a = b.acquire(&dep(), &p, LeaseKind::Primary).await.unwrap();
        calls += 1;
        let expected = left.saturating_sub(REMOVED_PER_CALL);
        match a.lease {
            Ok(lease) => {
                assert_eq!(expected, 0, "granted with {left} expired left");
                break lease;
            }
            Err(refusal) => {
                assert_eq!(refusal, Refusal::Cap);
                assert_eq!(a.in_flight.primaries, expected, "call {calls}");
                left = expected;
            }
        }
        assert!(
            calls <= N / REMOVED_PER_CALL,
            "more calls than the expired leases need"
        );
    };
    let (u3, c3) = script_usec(&server);
    assert_eq!(calls, N / REMOVED_PER_CALL);
    assert_eq!(members(&server, LP), std::slice::from_ref(&granted.id));
    b.release(&granted).await.unwrap();
    println!(
        "lease_acquire server time per call: {:.1} µs removing 1000 expired of a million-member set \
         ({} calls), against {:.1} µs per acquire or release on empty sets ({} calls), same run",
        (u3 - u2) / (c3 - c2),
        c3 - c2,
        (u1 - u0) / (c1 - c0),
        c1 - c0,
    );
}

/// A million live leases (written by hand): counted exactly in the reply (`u64`, no overflow),
/// the cap holds for retries and for primaries that wait, a primary that does not wait is
/// granted and given back, and nothing of the caller's is left behind.
#[tokio::test]
async fn a_million_live_leases_are_counted_and_the_cap_holds() {
    const N: u64 = 1_000_000;
    let server = RedisServer::start();
    let b = budget(&server);
    fill(&server, LR, N, 600_000);
    let counted = policy(10, false);
    let a = b
        .acquire(&dep(), &counted, LeaseKind::Primary)
        .await
        .unwrap();
    assert_eq!((a.in_flight.primaries, a.in_flight.retries), (1, N));
    let lease = a
        .lease
        .expect("a primary that does not wait is only counted");
    for (p, kind) in [
        (counted, LeaseKind::Retry),
        (counted, LeaseKind::Hedge),
        (policy(10, true), LeaseKind::Primary),
    ] {
        let refused = b.acquire(&dep(), &p, kind).await.unwrap();
        assert_eq!(refused.lease, Err(Refusal::Cap), "{kind:?}");
    }
    let in_flight = b.release(&lease).await.unwrap();
    assert_eq!((in_flight.primaries, in_flight.retries), (0, N));
    let left: u64 = server.cmd(&["EXISTS", LP]);
    assert_eq!(left, 0, "the primary set went with its last lease");
}

/// With hand-written leases in both sets (some that never end, some long over), callers in
/// parallel never hold more than the cap (counting the hand-written ones), and when they are
/// done the sets hold exactly the hand-written leases that have not ended: no lease of theirs
/// lost (left behind) or doubled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_callers_beside_hand_written_leases_keep_the_cap_and_lose_nothing() {
    const CAP: u64 = 6;
    let server = RedisServer::start();
    let _: () = server.cmd(&["ZADD", LP, "+inf", "p1", "1e300", "p2", "-1", "stale"]);
    let _: () = server.cmd(&["ZADD", LR, "1e20", "r1", "-inf", "gone"]);
    let b = budget(&server);
    let p = policy(CAP, true);
    let tasks: Vec<_> = (0..8)
        .map(|t| {
            let b = b.clone();
            tokio::spawn(async move {
                let mut granted = 0_u64;
                for i in 0..40 {
                    let kind = if (t + i) % 2 == 0 {
                        LeaseKind::Primary
                    } else {
                        LeaseKind::Retry
                    };
                    let a = b.acquire(&dep(), &p, kind).await.unwrap();
                    if let Ok(lease) = a.lease {
                        let held = a.in_flight.primaries + a.in_flight.retries;
                        assert!(held <= CAP, "{held} in flight after a grant");
                        granted += 1;
                        tokio::task::yield_now().await;
                        b.release(&lease).await.unwrap();
                    }
                }
                granted
            })
        })
        .collect();
    let mut granted = 0;
    for t in tasks {
        granted += t.await.unwrap();
    }
    assert!(
        granted > 0,
        "nothing granted beside 3 hand-written leases under a cap of 6"
    );
    assert_eq!(members(&server, LP), ["p1", "p2"]);
    assert_eq!(members(&server, LR), ["r1"]);
}

/// Every bad argument of either script is named (`ARGV[n] ...`), and nothing is written or
/// removed, not even an expired lease. A lease id written into both sets by hand is removed
/// from both by one release, which says so (2).
#[test]
fn bad_arguments_are_named_and_nothing_is_written() {
    let server = RedisServer::start();
    let mut c = server.connection().unwrap();
    let long_id = "i".repeat(129);
    let good = ["p", "id", "1000", "5", "0.5", "1", "0"];
    let bad: Vec<(usize, &str, &str)> = vec![
        (0, "x", "ARGV[1] kind"),
        (0, "", "ARGV[1] kind"),
        (1, "", "ARGV[2] lease id"),
        (1, &long_id, "ARGV[2] lease id"),
        (2, "0", "ARGV[3] lease_ms"),
        (2, "86400001", "ARGV[3] lease_ms"),
        (2, "1.5", "ARGV[3] lease_ms"),
        (2, "nan", "ARGV[3] lease_ms"),
        (2, "inf", "ARGV[3] lease_ms"),
        (2, "-1", "ARGV[3] lease_ms"),
        (2, "1e400", "ARGV[3] lease_ms"),
        (3, "0", "ARGV[4] cap"),
        (3, "1000000001", "ARGV[4] cap"),
        (3, "abc", "ARGV[4] cap"),
        (3, "inf", "ARGV[4] cap"),
        (4, "nan", "ARGV[5] max_retry_fraction"),
        (4, "-0.1", "ARGV[5] max_retry_fraction"),
        (4, "1001", "ARGV[5] max_retry_fraction"),
        (4, "inf", "ARGV[5] max_retry_fraction"),
        (5, "-1", "ARGV[6] min_retry_slots"),
        (5, "0.5", "ARGV[6] min_retry_slots"),
        (5, "1e10", "ARGV[6] min_retry_slots"),
        (6, "2", "ARGV[7] primary_waits"),
        (6, "", "ARGV[7] primary_waits"),
    ];
    let _: () = server.cmd(&["ZADD", LP, "1", "expired"]);
    let expect_named = |e: redis::RedisError, needle: &str| {
        assert_eq!(e.code(), Some("fleet-budget:"), "{e}");
        assert!(e.detail().unwrap_or_default().starts_with(needle), "{e}");
        assert_no_script_error_text(&e.to_string());
    };
    for (at, value, needle) in bad {
        let mut args = good;
        args[at] = value;
        let mut invocation = LEASE_ACQUIRE_SCRIPT.key(LP);
        invocation.key(LR);
        for arg in args {
            invocation.arg(arg);
        }
        let e = invocation.invoke::<redis::Value>(&mut c).unwrap_err();
        expect_named(e, needle);
    }
    // Arguments missing altogether.
    for n in 0..good.len() {
        let mut invocation = LEASE_ACQUIRE_SCRIPT.key(LP);
        invocation.key(LR);
        for arg in &good[..n] {
            invocation.arg(*arg);
        }
        let e = invocation.invoke::<redis::Value>(&mut c).unwrap_err();
        expect_named(e, &format!("ARGV[{}]", n + 1));
    }
    for id in [None, Some(""), Some(long_id.as_str())] {
        let mut invocation = LEASE_RELEASE_SCRIPT.key(LP);
        invocation.key(LR);
        if let Some(id) = id {
            invocation.arg(id);
        }
        let e = invocation.invoke::<redis::Value>(&mut c).unwrap_err();
        expect_named(e, "ARGV[1] lease id");
    }
    assert_eq!(
        members(&server, LP),
        ["expired"],
        "nothing written or removed"
    );
    let keys: u64 = server.cmd(&["DBSIZE"]);
    assert_eq!(keys, 1);
    // One id in both sets, by hand: one release takes it out of both, and says 2.
    let at = (server_ms(&server) + 60_000).to_string();
    let _: () = server.cmd(&["ZADD", LP, &at, "both"]);
    let _: () = server.cmd(&["ZADD", LR, &at, "both"]);
    let mut invocation = LEASE_RELEASE_SCRIPT.key(LP);
    invocation.key(LR).arg("both");
    let reply: Vec<u64> = invocation.invoke(&mut c).unwrap();
    // The fourth field is the server's time in ms (a lease found gone before its expiry is
    // counted lost: `lease_release.lua`).
    assert_eq!(reply[..3], [2, 0, 0], "{reply:?}");
    assert_eq!(reply.len(), 4, "{reply:?}");
    assert!(reply[3].abs_diff(server_ms(&server)) < 60_000, "{reply:?}");
    assert_eq!(MAX_LEASE.as_millis(), u128::from(LONGEST_MS));
}

/// The scripts' server time per call, shipped against the scripts at `FB_LEASE_BASE` (a git
/// commit; default 4767262, before the checks above), in one run on one private server: six
/// rounds of 2,000 calls of each, in alternating order, on sets holding a few leases; then the
/// first acquire on a million expired leases, old and new. Prints figures, asserts nothing (the
/// machine is shared). docs/RELIABILITY.md ("Input review, session 6") records a run:
///
/// ```sh
/// cargo test -p fleet-budget --test lease_tamper -- --ignored --nocapture lease_scripts_cost
/// ```
#[test]
#[ignore = "a benchmark: run with --ignored --nocapture"]
fn lease_scripts_cost() {
    let base = std::env::var("FB_LEASE_BASE").unwrap_or_else(|_| "4767262".to_owned());
    let at_base = |name: &str| {
        let out = std::process::Command::new("git")
            .args(["show", &format!("{base}:lua/{name}.lua")])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .expect("run git");
        assert!(out.status.success(), "git show {base}:lua/{name}.lua");
        String::from_utf8(out.stdout).unwrap()
    };
    let server = RedisServer::start();
    let mut c = server.connection().unwrap();
    let mut load = |text: &str| -> String {
        redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(text)
            .query(&mut c)
            .unwrap()
    };
    let shipped = |name: &str| {
        std::fs::read_to_string(format!(
            "{}/../../lua/{name}.lua",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap()
    };
    let acquire = [
        load(&at_base("lease_acquire")),
        load(&shipped("lease_acquire")),
    ];
    let release = [
        load(&at_base("lease_release")),
        load(&shipped("lease_release")),
    ];
    let mut c = server.connection().unwrap();
    let far = (server_ms(&server) + 600_000).to_string();
    let mut per_call = [[Vec::new(), Vec::new()], [Vec::new(), Vec::new()]];
    for round in 0..6 {
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for which in order {
            let _: () = server.cmd(&["DEL", LP, LR]);
            let (u0, c0) = script_usec(&server);
            for i in 0..2000 {
                let kind = if i % 2 == 0 { "p" } else { "r" };
                let _: redis::Value = redis::cmd("EVALSHA")
                    .arg(&acquire[which])
                    .arg(2)
                    .arg(LP)
                    .arg(LR)
                    .arg(kind)
                    .arg(format!("id{i}"))
                    .arg(30_000)
                    .arg(50)
                    .arg(0.5)
                    .arg(1)
                    .arg("1")
                    .query(&mut c)
                    .unwrap();
                if i % 4 == 3 {
                    let _: () =
                        server.cmd(&["ZREM", LP, &format!("id{}", i - 3), &format!("id{}", i - 1)]);
                    let _: () =
                        server.cmd(&["ZREM", LR, &format!("id{}", i - 2), &format!("id{i}")]);
                }
            }
            let (u1, c1) = script_usec(&server);
            per_call[0][which].push((u1 - u0) / (c1 - c0));
            let _: () = server.cmd(&["DEL", LP, LR]);
            let _: () = server.cmd(&["ZADD", LP, &far, "p1", &far, "p2", &far, "p3"]);
            let _: () = server.cmd(&["ZADD", LR, &far, "r1", &far, "r2", &far, "r3"]);
            let (u0, c0) = script_usec(&server);
            for i in 0..2000 {
                let _: () = server.cmd(&[
                    "ZADD",
                    if i % 2 == 0 { LR } else { LP },
                    &far,
                    &format!("id{i}"),
                ]);
                let _: redis::Value = redis::cmd("EVALSHA")
                    .arg(&release[which])
                    .arg(2)
                    .arg(LP)
                    .arg(LR)
                    .arg(format!("id{i}"))
                    .query(&mut c)
                    .unwrap();
            }
            let (u1, c1) = script_usec(&server);
            per_call[1][which].push((u1 - u0) / (c1 - c0));
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0
    };
    for (script, runs) in ["lease_acquire", "lease_release"].iter().zip(&mut per_call) {
        let [old, new] = runs;
        println!(
            "{script}: {:.1} µs per call (median of 6 × 2,000) against {:.1} µs at {base}; runs {new:.1?} against {old:.1?}",
            median(&mut new.clone()),
            median(&mut old.clone()),
        );
    }
    for (which, label) in [(0, base.as_str()), (1, "shipped")] {
        let _: () = server.cmd(&["FLUSHALL"]);
        fill(&server, LP, 1_000_000, -60_000);
        let (u0, c0) = script_usec(&server);
        let _: redis::Value = redis::cmd("EVALSHA")
            .arg(&acquire[which])
            .arg(2)
            .arg(LP)
            .arg(LR)
            .arg("p")
            .arg("one")
            .arg(30_000)
            .arg(10)
            .arg(0.5)
            .arg(1)
            .arg("1")
            .query(&mut c)
            .unwrap();
        let (u1, c1) = script_usec(&server);
        let left: u64 = server.cmd(&["ZCARD", LP]);
        println!(
            "lease_acquire at {label} on 1,000,000 expired leases: the first call took {:.0} µs of server time, {left} left in the set",
            (u1 - u0) / (c1 - c0)
        );
    }
}
