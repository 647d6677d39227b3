//! ARCHITECTURE.md against the code: every file and folder it names in code exists, every function
//! it names (`Type::function` or `function()`) is defined, every top-level module of every crate
//! is in its crate's table, and every script of `lua/` is named. A module moved, a file renamed or
//! a function removed fails here, so the walks the file describes cannot go stale unnoticed.
//!
//! How a path is read: one that starts with a top-level folder of the repository (`lua/`,
//! `crates/`, ...) from the root; any other from the `src/` of the current crate, which a heading
//! naming a crate (`### `fleet-budget``) or a path of the form `crates/<crate>/...` sets.
#![allow(
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    clippy::unwrap_used,
    missing_docs
)]

mod common;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Path, PathBuf};

/// The crates of the workspace: their names are folders of `crates/`.
fn crate_names() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(common::repo_root().join("crates"))
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.path().join("src").is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// The inline code spans of `line`, of any number of backticks (`` `a` `` holds "`a`").
fn code_spans(line: &str) -> Vec<String> {
    let chars: Vec<char> = line.chars().collect();
    let mut spans = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '`' {
            i += 1;
            continue;
        }
        let open = chars[i..].iter().take_while(|c| **c == '`').count();
        let start = i + open;
        let mut j = start;
        let mut closed = None;
        while j < chars.len() {
            if chars[j] == '`' {
                let run = chars[j..].iter().take_while(|c| **c == '`').count();
                if run == open {
                    closed = Some(j);
                    break;
                }
                j += run;
            } else {
                j += 1;
            }
        }
        match closed {
            Some(end) => {
                let text: String = chars[start..end].iter().collect();
                spans.push(text.trim().to_owned());
                i = end + open;
            }
            None => break,
        }
    }
    spans
}

/// What a code span names, if anything this test checks.
#[derive(Debug, PartialEq, Eq)]
enum Named {
    /// A file or folder (`store/redis/spend.rs`, `lua/`).
    Path(String),
    /// A function: `Type::function` (the type and the function) or `function()`.
    Function(Option<String>, String),
    /// An associated item that is not a function (`Decision::DeadLetter`): the type and the name.
    Item(String, String),
}

fn is_ident(s: &str) -> bool {
    !s.is_empty()
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !s.starts_with(|c: char| c.is_ascii_digit())
}

fn is_type_name(s: &str) -> bool {
    is_ident(s) && s.starts_with(|c: char| c.is_ascii_uppercase()) && s.contains(char::is_lowercase)
}

fn classify(span: &str) -> Option<Named> {
    let path_like = span
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "_./-".contains(c))
        && (span.contains('/')
            || [".rs", ".lua", ".toml", ".md"]
                .iter()
                .any(|ext| span.ends_with(ext)));
    if path_like && !span.starts_with('.') && !span.starts_with('/') {
        return Some(Named::Path(span.to_owned()));
    }
    if let Some(name) = span.strip_suffix("()")
        && is_ident(name)
    {
        return Some(Named::Function(None, name.to_owned()));
    }
    let (ty, name) = span.split_once("::")?;
    if !is_type_name(ty) || !is_ident(name) {
        return None;
    }
    if name.starts_with(|c: char| c.is_ascii_lowercase() || c == '_') {
        Some(Named::Function(Some(ty.to_owned()), name.to_owned()))
    } else {
        Some(Named::Item(ty.to_owned(), name.to_owned()))
    }
}

/// The text of every Rust source file of the crates.
fn sources() -> String {
    fn walk(dir: &Path, out: &mut String) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push_str(&std::fs::read_to_string(&path).unwrap());
                out.push('\n');
            }
        }
    }
    let mut out = String::new();
    for name in crate_names() {
        walk(
            &common::repo_root().join("crates").join(name).join("src"),
            &mut out,
        );
    }
    out
}

/// Whether `text` holds the word `word` right after one of `before` (`fn `, `struct `, ...).
fn defines(text: &str, before: &[&str], word: &str) -> bool {
    before.iter().any(|b| {
        let needle = format!("{b}{word}");
        text.match_indices(&needle).any(|(at, _)| {
            let next = text[at + needle.len()..].chars().next();
            !next.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        })
    })
}

/// Each problem of `doc` (a path that does not exist, a function not defined), given the
/// repository at `root`, the crates' names and their sources.
fn problems(doc: &str, root: &Path, crates: &[String], code: &str) -> Vec<String> {
    let top: HashSet<String> = std::fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let mut current: Option<String> = None;
    let mut found = Vec::new();
    let mut in_fence = false;
    for (n, line) in doc.lines().enumerate() {
        let at = n + 1;
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        if in_fence {
            continue;
        }
        if line.starts_with('#') {
            current = crates
                .iter()
                .find(|c| line.contains(&format!("`{c}`")))
                .cloned();
        }
        for span in code_spans(line) {
            match classify(&span) {
                Some(Named::Path(path)) => {
                    let first = path.split('/').next().unwrap_or_default();
                    let resolved: Option<PathBuf> = if top.contains(first) {
                        if let Some(rest) = path.strip_prefix("crates/") {
                            let name = rest.split('/').next().unwrap_or_default();
                            if crates.iter().any(|c| c == name) {
                                current = Some(name.to_owned());
                            }
                        }
                        Some(root.join(&path))
                    } else {
                        current
                            .as_ref()
                            .map(|c| root.join("crates").join(c).join("src").join(&path))
                    };
                    match resolved {
                        Some(p) if p.exists() => {}
                        Some(p) => found.push(format!("line {at}: `{path}`: no {}", p.display())),
                        None => found.push(format!(
                            "line {at}: `{path}`: not under a top-level folder, and no crate named before it"
                        )),
                    }
                }
                Some(Named::Function(ty, name)) => {
                    if !defines(code, &["fn "], &name) {
                        found.push(format!(
                            "line {at}: `{span}`: no `fn {name}` in crates/*/src"
                        ));
                    }
                    if let Some(ty) = ty
                        && !defines(code, &["struct ", "enum ", "trait ", "type "], &ty)
                    {
                        found.push(format!(
                            "line {at}: `{span}`: no type `{ty}` in crates/*/src"
                        ));
                    }
                }
                Some(Named::Item(ty, name))
                    if !defines(code, &["struct ", "enum ", "trait ", "type "], &ty)
                        || !defines(code, &["    ", "const ", "static ", "type "], &name) =>
                {
                    found.push(format!("line {at}: `{span}`: not defined in crates/*/src"));
                }
                Some(Named::Item(..)) | None => {}
            }
        }
    }
    found
}

/// The code spans of `doc` under each crate's heading (`### `fleet-budget``), by crate.
fn spans_by_crate(doc: &str, crates: &[String]) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in doc.lines() {
        if line.starts_with('#') {
            current = crates
                .iter()
                .find(|c| line.contains(&format!("`{c}`")))
                .cloned();
        }
        if let Some(c) = &current {
            out.entry(c.clone()).or_default().extend(code_spans(line));
        }
    }
    out
}

/// The top-level modules of a crate: the `mod` lines of its `lib.rs` or `main.rs`.
fn top_modules(src: &Path) -> Vec<String> {
    let root = ["lib.rs", "main.rs"]
        .iter()
        .map(|f| src.join(f))
        .find(|p| p.exists())
        .unwrap();
    std::fs::read_to_string(root)
        .unwrap()
        .lines()
        .filter_map(|line| {
            let line = line.trim();
            let rest = line
                .strip_prefix("pub mod ")
                .or_else(|| line.strip_prefix("pub(crate) mod "))
                .or_else(|| line.strip_prefix("mod "))?;
            rest.strip_suffix(';').map(str::to_owned)
        })
        .collect()
}

#[test]
fn every_path_and_function_architecture_md_names_exists() {
    let root = common::repo_root();
    let doc = common::read("ARCHITECTURE.md");
    let found = problems(&doc, &root, &crate_names(), &sources());
    assert!(
        found.is_empty(),
        "ARCHITECTURE.md names what the code no longer has:\n{}",
        found.join("\n")
    );
}

#[test]
fn every_top_level_module_of_every_crate_is_in_its_table() {
    let root = common::repo_root();
    let doc = common::read("ARCHITECTURE.md");
    let crates = crate_names();
    let spans = spans_by_crate(&doc, &crates);
    let mut missing = Vec::new();
    for c in &crates {
        let named = spans.get(c).cloned().unwrap_or_default();
        for module in top_modules(&root.join("crates").join(c).join("src")) {
            let file = format!("{module}.rs");
            let folder = format!("{module}/");
            if !named.iter().any(|s| *s == file || s.starts_with(&folder)) {
                missing.push(format!("{c}: {module}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "top-level modules missing from ARCHITECTURE.md's tables:\n{}",
        missing.join("\n")
    );
}

#[test]
fn every_script_of_lua_is_named() {
    let root = common::repo_root();
    let doc = common::read("ARCHITECTURE.md");
    let mut scripts: Vec<String> = std::fs::read_dir(root.join("lua"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".lua"))
        .collect();
    scripts.sort();
    assert!(scripts.len() >= 9, "{scripts:?}");
    let missing: Vec<&String> = scripts
        .iter()
        .filter(|s| !doc.contains(&format!("`lua/{s}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "scripts ARCHITECTURE.md does not name: {missing:?}"
    );
}

/// The checker itself: it reads spans of any backtick count, resolves paths by crate, and finds
/// what is missing (so the tests above can fail).
#[test]
fn the_checker_finds_what_is_missing() {
    assert_eq!(code_spans("a `b` c `` `d` `` e"), ["b", "`d`"]);
    assert_eq!(
        classify("store/redis/spend.rs"),
        Some(Named::Path("store/redis/spend.rs".into()))
    );
    assert_eq!(classify("budget_exhausted"), None);
    assert_eq!(classify("rediss://"), None);
    assert_eq!(classify("lua/src/<name>.lua"), None);
    assert_eq!(
        classify("RedisStore::invoke"),
        Some(Named::Function(Some("RedisStore".into()), "invoke".into()))
    );
    assert_eq!(
        classify("grants()"),
        Some(Named::Function(None, "grants".into()))
    );
    assert_eq!(
        classify("Decision::DeadLetter"),
        Some(Named::Item("Decision".into(), "DeadLetter".into()))
    );
    let root = common::repo_root();
    let crates = crate_names();
    let code = "pub struct Store;\nimpl Store { fn real() {} }\npub enum Kind {\n    Real,\n}\n";
    let doc = "\
### `fleet-budget`
`store/redis/spend.rs` `store/redis/gone.rs` `Store::real` `Store::gone` `gone()` `Kind::Real` `Kind::Gone`
## elsewhere
`crates/fleet-budget-amqp/src/worker/` then `worker/delivery.rs` and `store/mod.rs`
";
    let found = problems(doc, &root, &crates, code);
    let lines: Vec<&str> = found
        .iter()
        .map(|p| p.split(": ").nth(1).unwrap_or_default())
        .collect();
    assert_eq!(
        lines,
        [
            "`store/redis/gone.rs`",
            "`Store::gone`",
            "`gone()`",
            "`Kind::Gone`",
            "`store/mod.rs`",
        ],
        "{found:#?}"
    );
}
