//! The Lua scripts other languages load (`lua/<name>.lua`) are generated from their source
//! `lua/src/<name>.lua`, in which a line `-- @include <part>.lua` stands for the shared part
//! `lua/src/shared/<part>.lua` (argument checks, the server's clock, the window roll, the
//! estimates: written once, pasted where used, so a call runs straight-line code with no
//! function to create). This test fails when a shipped script is not exactly its source with the
//! parts pasted in, and rewrites them when run with `FLEET_BUDGET_UPDATE_LUA=1`:
//!
//! ```sh
//! FLEET_BUDGET_UPDATE_LUA=1 cargo test -p fleet-budget-e2e --test lua_scripts
//! ```
#![allow(clippy::expect_used, clippy::panic, clippy::unwrap_used, missing_docs)]

mod common;

use std::collections::BTreeSet;

use fleet_budget::store::{DEPOSIT_SCRIPT, SPEND_MANY_SCRIPT, SPEND_SCRIPT, STATUS_SCRIPT};
use fleet_budget::testing::RedisServer;

/// Set to `1` to write the generated scripts instead of checking them.
const UPDATE: &str = "FLEET_BUDGET_UPDATE_LUA";

/// The text of `lua/<name>.lua`: the source's `#!` line if it has one (script flags must come
/// first), two lines saying where the text comes from, then the source with every
/// `-- @include <part>.lua` line replaced by that shared part, indented as the line was.
fn assemble(name: &str, source: &str) -> String {
    let (flags, body) = match source.strip_prefix("#!") {
        Some(_) => source.split_at(source.find('\n').map_or(source.len(), |at| at + 1)),
        None => ("", source),
    };
    let mut out = format!(
        "{flags}-- GENERATED from lua/src/{name}.lua and the parts it includes from lua/src/shared:\n\
         -- edit those, then run {UPDATE}=1 cargo test -p fleet-budget-e2e --test lua_scripts\n"
    );
    for line in body.lines() {
        let indent = &line[..line.len() - line.trim_start().len()];
        match line.trim_start().strip_prefix("-- @include ") {
            Some(part) => {
                let text = common::read(&format!("lua/src/shared/{}", part.trim()));
                for part_line in text.lines() {
                    if !part_line.is_empty() {
                        out.push_str(indent);
                    }
                    out.push_str(part_line);
                    out.push('\n');
                }
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

/// The `.lua` file names (without the extension) directly in `dir`.
fn scripts_in(dir: &str) -> BTreeSet<String> {
    std::fs::read_dir(common::repo_root().join(dir))
        .unwrap_or_else(|e| panic!("list {dir}: {e}"))
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "lua"))
        .filter_map(|path| Some(path.file_stem()?.to_str()?.to_owned()))
        .collect()
}

#[test]
fn shipped_scripts_are_their_source_with_the_shared_parts_pasted_in() {
    let parts = scripts_in("lua/src");
    assert!(
        parts.contains("spend"),
        "lua/src holds no spend.lua: {parts:?}"
    );
    let update = std::env::var(UPDATE).is_ok_and(|v| v == "1");
    let mut stale = Vec::new();
    for name in &parts {
        let want = assemble(name, &common::read(&format!("lua/src/{name}.lua")));
        let shipped = format!("lua/{name}.lua");
        let path = common::repo_root().join(&shipped);
        if std::fs::read_to_string(&path).ok().as_deref() != Some(want.as_str()) {
            if update {
                std::fs::write(&path, want).unwrap_or_else(|e| panic!("write {shipped}: {e}"));
            } else {
                stale.push(shipped);
            }
        }
    }
    assert!(
        stale.is_empty(),
        "{stale:?} differ from their source in lua/src with its parts pasted in: run\n  \
         {UPDATE}=1 cargo test -p fleet-budget-e2e --test lua_scripts"
    );
    let orphans: Vec<_> = scripts_in("lua").difference(&parts).cloned().collect();
    assert!(
        orphans.is_empty(),
        "lua/{orphans:?}.lua have no part in lua/src: delete them or add their source"
    );
}

/// The Rust library loads the shipped files, so every language sends the same text: same SHA.
#[test]
fn the_library_loads_the_shipped_scripts() {
    let server = RedisServer::start();
    for (name, script) in [
        ("spend", &*SPEND_SCRIPT),
        ("spend_many", &*SPEND_MANY_SCRIPT),
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
    ] {
        let loaded: String =
            server.cmd(&["SCRIPT", "LOAD", &common::read(&format!("lua/{name}.lua"))]);
        assert_eq!(loaded, script.get_hash(), "lua/{name}.lua");
    }
}

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
            "ARGV[2] successes must be a plain integer from 0 to 10^15",
        ),
        (
            "deposit",
            vec!["1000", "1e3", "0"],
            "ARGV[2] successes must be a plain integer from 0 to 10^15",
        ),
        (
            "deposit",
            vec!["1000", "1000000000000000", "0"],
            "ARGV[2] successes must be a plain integer from 0 to 10^15",
        ),
        (
            "deposit",
            vec!["1000", "1", ""],
            "ARGV[3] first_attempts must be a plain integer from 0 to 10^15",
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
