//! Keys anyone with access to Redis can write (input review, session 5): what operators' reads
//! make of them. Each against a private `redis-server`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::time::Duration;

use fleet_budget::control::{AuditEntry, AuditLog};
use fleet_budget::store::{BudgetStore, RedisStore, RedisTarget};
use fleet_budget::testing::RedisServer;
use fleet_budget::{BudgetPolicy, Dependency};

fn store(server: &RedisServer, prefix: &str) -> RedisStore {
    // Generous deadline: these tests check behaviour, not latency, on a noisy machine.
    RedisStore::new(
        RedisTarget::Single(server.url()),
        prefix,
        Duration::from_secs(5),
    )
    .unwrap()
}

fn dep(name: &str) -> Dependency {
    Dependency::new(name).unwrap()
}

/// Writes `args` as they are (bytes that are not UTF-8 included).
fn raw(server: &RedisServer, args: &[&[u8]]) {
    let mut conn = server.connection().unwrap();
    let mut cmd = redis::cmd(std::str::from_utf8(args[0]).unwrap());
    for a in &args[1..] {
        cmd.arg(*a);
    }
    let _: redis::Value = cmd.query(&mut conn).unwrap();
}

/// A key prefix holding glob characters (allowed: `t[7]`) used to make `SCAN MATCH` look for
/// the keys of `t7` instead, so `budgetctl status` said no budget was found beside live ones.
#[tokio::test]
async fn a_prefix_with_glob_characters_finds_its_own_budgets() {
    let server = RedisServer::start();
    let p = BudgetPolicy::default();
    for prefix in ["t[7]", "t*", r"t\x", "t?"] {
        let s = store(&server, prefix);
        s.withdraw(&dep("search"), &p).await.unwrap();
        assert_eq!(
            s.discover_dependencies().await.unwrap(),
            [dep("search")],
            "prefix {prefix}"
        );
    }
    // A budget of the look-alike prefix `t7` is not one of `t[7]`'s.
    store(&server, "t7")
        .withdraw(&dep("mail"), &p)
        .await
        .unwrap();
    assert_eq!(
        store(&server, "t[7]")
            .discover_dependencies()
            .await
            .unwrap(),
        [dep("search")]
    );
}

/// A key under the prefix whose name is not UTF-8 used to fail the whole listing ("Cannot
/// convert from UTF-8"), which `budgetctl status` reported as a Redis that does not answer.
#[tokio::test]
async fn a_key_that_is_not_utf8_does_not_hide_the_budgets_beside_it() {
    let server = RedisServer::start();
    let s = store(&server, "fbt");
    s.withdraw(&dep("search"), &BudgetPolicy::default())
        .await
        .unwrap();
    raw(&server, &[b"SET", b"fbt:v1:{bad\xff}", b"x"]);
    raw(&server, &[b"SET", b"fbt:v1:{\xc3}", b"x"]);
    assert_eq!(s.discover_dependencies().await.unwrap(), [dep("search")]);
}

/// An audit entry added by hand with a field that is not UTF-8 used to make the whole trail
/// unreadable; it is now read with U+FFFD in place of the bad bytes, beside the others.
#[tokio::test]
async fn an_audit_entry_that_is_not_utf8_does_not_hide_the_trail() {
    let server = RedisServer::start();
    let s = store(&server, "fbt");
    let log = AuditLog::default();
    log.record(
        &s,
        &AuditEntry::new("alice", "freeze", Some("search"), "incident"),
    )
    .await
    .unwrap();
    raw(
        &server,
        &[
            b"XADD",
            b"fbt:v1:audit",
            b"*",
            b"actor",
            b"m\xffallory",
            b"action",
            b"set",
        ],
    );
    log.record(
        &s,
        &AuditEntry::new("bob", "unfreeze", Some("search"), "over"),
    )
    .await
    .unwrap();
    let entries = log.read(&s, None, None, None, 100).await.unwrap();
    let actors: Vec<&str> = entries.iter().map(|e| e.actor.as_str()).collect();
    assert_eq!(actors, ["alice", "m\u{fffd}allory", "bob"]);
    let only = log.read(&s, None, None, Some("search"), 100).await.unwrap();
    assert_eq!(only.len(), 2);
}
