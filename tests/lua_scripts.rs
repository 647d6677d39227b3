//! The Lua scripts are generated from their one source, `lua/src/<name>.lua` (a line
//! `-- @include <part>.lua` stands for the shared part `lua/src/shared/<part>.lua`), by
//! `scripts/gen-lua`, into every place a script is loaded from: `lua/` (other languages), the
//! Rust crate (`crates/fleet-budget/lua/`, packaged with it) and the Python package
//! (`clients/python/src/fleet_budget/lua/`, in its wheel). This test fails when any copy is
//! stale or has no source: `scripts/gen-lua --check`. What the scripts do with bad arguments and
//! keys is `tests/lua_contract.rs`.
#![allow(clippy::expect_used, clippy::panic, clippy::unwrap_used, missing_docs)]

mod common;

use fleet_budget::store::{
    DEPOSIT_SCRIPT, SPEND_BATCH_SCRIPT, SPEND_MANY_SCRIPT, SPEND_SCRIPT, STATUS_SCRIPT,
};
use fleet_budget::testing::RedisServer;

#[test]
fn every_copy_of_every_script_is_its_source_with_the_shared_parts_pasted_in() {
    let out = std::process::Command::new("python3")
        .arg(common::repo_root().join("scripts/gen-lua"))
        .arg("--check")
        .output()
        .expect("run python3 scripts/gen-lua --check");
    assert!(
        out.status.success(),
        "scripts/gen-lua --check: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The check can fail: in a copy of the tree with one stale copy of one script and one orphan,
/// it names both and exits 1; the generator then mends both.
#[test]
fn the_check_names_a_stale_copy_and_an_orphan() {
    let root = common::repo_root();
    let tmp = std::env::temp_dir().join(format!("fb-gen-lua-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let copy_dir = |rel: &str| {
        let to = tmp.join(rel);
        std::fs::create_dir_all(&to).unwrap();
        for entry in std::fs::read_dir(root.join(rel)).unwrap() {
            let path = entry.unwrap().path();
            if path.is_file() {
                std::fs::copy(&path, to.join(path.file_name().unwrap())).unwrap();
            }
        }
    };
    for rel in [
        "scripts",
        "lua",
        "lua/src",
        "lua/src/shared",
        "crates/fleet-budget/lua",
        "clients/python/src/fleet_budget/lua",
    ] {
        copy_dir(rel);
    }
    let stale = tmp.join("crates/fleet-budget/lua/spend.lua");
    let text = std::fs::read_to_string(&stale).unwrap();
    std::fs::write(&stale, text.replacen("local", "local ", 1)).unwrap();
    // A copy with no source (named in pieces: it exists only in this test's tree).
    let orphan = ["old", "lua"].join(".");
    std::fs::write(
        tmp.join("clients/python/src/fleet_budget/lua")
            .join(&orphan),
        "return 1\n",
    )
    .unwrap();
    let run = |args: &[&str]| {
        std::process::Command::new("python3")
            .arg(tmp.join("scripts/gen-lua"))
            .args(args)
            .output()
            .unwrap()
    };
    let checked = run(&["--check"]);
    let said = String::from_utf8_lossy(&checked.stderr).into_owned();
    assert_eq!(checked.status.code(), Some(1), "{said}");
    assert!(
        said.contains("crates/fleet-budget/lua/spend.lua is stale"),
        "{said}"
    );
    assert!(
        said.contains(&format!("fleet_budget/lua/{orphan} has no source")),
        "{said}"
    );
    assert_eq!(
        std::fs::read_to_string(&stale).unwrap(),
        text.replacen("local", "local ", 1)
    );
    assert!(run(&[]).status.success());
    assert_eq!(std::fs::read_to_string(&stale).unwrap(), text);
    assert!(run(&["--check"]).status.success());
    let _ = std::fs::remove_dir_all(&tmp);
}

/// The Rust library loads the shipped files, so every language sends the same text: same SHA.
#[test]
fn the_library_loads_the_shipped_scripts() {
    let server = RedisServer::start();
    for (name, script) in [
        ("spend", &*SPEND_SCRIPT),
        ("spend_many", &*SPEND_MANY_SCRIPT),
        ("spend_batch", &*SPEND_BATCH_SCRIPT),
        ("deposit", &*DEPOSIT_SCRIPT),
        ("status", &*STATUS_SCRIPT),
        (
            "lease_acquire",
            &*fleet_budget::concurrency::LEASE_ACQUIRE_SCRIPT,
        ),
        (
            "lease_release",
            &*fleet_budget::concurrency::LEASE_RELEASE_SCRIPT,
        ),
        ("breaker", &*fleet_budget::breaker::BREAKER_SCRIPT),
        ("heartbeat", &*fleet_budget::store::HEARTBEAT_SCRIPT),
    ] {
        let loaded: String =
            server.cmd(&["SCRIPT", "LOAD", &common::read(&format!("lua/{name}.lua"))]);
        assert_eq!(loaded, script.get_hash(), "lua/{name}.lua");
    }
}

/// `lua/heartbeat.lua` as `lua/README.md` ("Worker registry") describes it: each bad argument
/// refused by name and nothing written; a key of another type refused by name; a beat replies
/// the server's time and the entries pruned, a leave the entries removed.
#[test]
fn the_heartbeat_script_keeps_its_contract() {
    let server = RedisServer::start();
    let mut c = server.connection().unwrap();
    let text = common::read("lua/heartbeat.lua");
    let (hash, seen) = ("fb:v1:workers:{workers}", "fb:v1:workers:{workers}:seen");
    let run = |c: &mut redis::Connection, keys: [&str; 2], args: &[&str]| {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(&text).arg(2).arg(keys[0]).arg(keys[1]);
        for a in args {
            cmd.arg(*a);
        }
        cmd.query::<Vec<i64>>(c).map_err(|e| e.to_string())
    };
    let long_id = "i".repeat(201);
    let big = "r".repeat(4097);
    for (args, named) in [
        (&["bump", "w", "{}", "60000"][..], "ARGV[1] action"),
        (&[][..], "ARGV[1] action"),
        (&["beat", "", "{}", "60000"][..], "ARGV[2] worker id"),
        (
            &["beat", long_id.as_str(), "{}", "60000"][..],
            "ARGV[2] worker id",
        ),
        (&["leave"][..], "ARGV[2] worker id"),
        (&["beat", "w", "", "60000"][..], "ARGV[3] report"),
        (&["beat", "w", big.as_str(), "60000"][..], "ARGV[3] report"),
        (&["beat", "w", "{}"][..], "ARGV[4] retention_ms"),
        (&["beat", "w", "{}", "999"][..], "ARGV[4] retention_ms"),
        (&["beat", "w", "{}", "1000.5"][..], "ARGV[4] retention_ms"),
        (
            &["beat", "w", "{}", "604800001"][..],
            "ARGV[4] retention_ms",
        ),
        (&["beat", "w", "{}", "nan"][..], "ARGV[4] retention_ms"),
    ] {
        let e = run(&mut c, [hash, seen], args).unwrap_err();
        // The client shows the first word of an error reply apart: `"fleet-budget:": ARGV[1] ...`.
        assert!(
            e.contains("fleet-budget") && e.contains(named),
            "{args:?}: {e}"
        );
    }
    let keys: Vec<String> = server.cmd(&["KEYS", "*"]);
    assert!(keys.is_empty(), "a refused call writes nothing: {keys:?}");

    let before: Vec<String> = server.cmd(&["TIME"]);
    let reply = run(&mut c, [hash, seen], &["beat", "w1", "{\"v\":1}", "60000"]).unwrap();
    assert_eq!(reply.len(), 2);
    assert!(
        reply[0] >= before[0].parse::<i64>().unwrap() * 1000,
        "{reply:?}"
    );
    assert_eq!(reply[1], 0, "nothing to prune");
    let report: String = server.cmd(&["HGET", hash, "w1"]);
    assert_eq!(report, "{\"v\":1}");
    let score: String = server.cmd(&["ZSCORE", seen, "w1"]);
    assert_eq!(
        score,
        reply[0].to_string(),
        "last seen is the server's time"
    );
    for key in [hash, seen] {
        let ttl: i64 = server.cmd(&["PTTL", key]);
        assert!(ttl > 59_000 && ttl <= 60_000, "{key}: {ttl}");
    }
    assert_eq!(run(&mut c, [hash, seen], &["leave", "w1"]).unwrap()[1], 1);
    assert_eq!(run(&mut c, [hash, seen], &["leave", "w1"]).unwrap()[1], 0);

    let _: () = server.cmd(&["SET", "fb:v1:workers:{workers}:other", "x"]);
    let e = run(
        &mut c,
        [hash, "fb:v1:workers:{workers}:other"],
        &["beat", "w", "{}", "60000"],
    )
    .unwrap_err();
    assert!(
        e.contains("key fb:v1:workers:{workers}:other is not the worker registry (string)"),
        "{e}"
    );
}
