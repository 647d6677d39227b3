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
    ] {
        let loaded: String =
            server.cmd(&["SCRIPT", "LOAD", &common::read(&format!("lua/{name}.lua"))]);
        assert_eq!(loaded, script.get_hash(), "lua/{name}.lua");
    }
}
