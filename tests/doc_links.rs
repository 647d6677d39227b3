//! Every relative link in every Markdown file of the repository resolves (to a file or folder,
//! and to a heading when it names a `#section` of a Markdown file), and every repository path
//! that a doc, a comment or a migration names (`docs/semantics.md`, `lua/README.md`, ...)
//! exists. Files move; this is what notices the docs that still point at the old place.
#![allow(
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    clippy::unwrap_used,
    missing_docs
)]

mod common;

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

/// Folders never searched: build output, tool state, dependencies.
const SKIP_DIRS: [&str; 5] = ["target", ".git", ".venv", "node_modules", "__pycache__"];

/// Top-level folders whose files are not searched, though paths into them named elsewhere are
/// checked: `vendor/` holds crates as published, whose links and paths name files of their own
/// repositories.
const NOT_OURS: [&str; 1] = ["vendor"];

/// Every file below `dir` (relative paths, sorted), outside [`SKIP_DIRS`] and [`NOT_OURS`].
fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("list {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            let not_ours = NOT_OURS.contains(&name.as_str()) && dir == common::repo_root();
            if !SKIP_DIRS.contains(&name.as_str()) && !not_ours {
                files(&path, out);
            }
        } else {
            out.push(path);
        }
    }
}

fn repo_files() -> Vec<PathBuf> {
    let mut out = Vec::new();
    files(&common::repo_root(), &mut out);
    out
}

fn relative(path: &Path) -> String {
    path.strip_prefix(common::repo_root())
        .unwrap_or(path)
        .display()
        .to_string()
}

/// The lines of a Markdown text outside fenced code blocks, with their numbers (1-based).
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fence: Option<&str> = None;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        match fence {
            Some(f) if trimmed.starts_with(f) => fence = None,
            Some(_) => {}
            None if trimmed.starts_with("```") => fence = Some("```"),
            None if trimmed.starts_with("~~~") => fence = Some("~~~"),
            None => out.push((n + 1, line)),
        }
    }
    out
}

/// `line` without its inline code spans (`` `like this` ``).
fn without_code(line: &str) -> String {
    let mut out = String::new();
    let mut in_code = false;
    for ch in line.chars() {
        if ch == '`' {
            in_code = !in_code;
        } else if !in_code {
            out.push(ch);
        }
    }
    out
}

/// The destinations of inline links and images (`[text](dest)`) and of link reference
/// definitions (`[label]: dest`) in one line of prose.
fn link_targets(line: &str) -> Vec<String> {
    let line = without_code(line);
    let mut out = Vec::new();
    let trimmed = line.trim_start();
    if trimmed.starts_with('[')
        && let Some(close) = trimmed.find("]:")
    {
        out.push(trimmed[close + 2..].trim().to_owned());
    }
    let mut rest = line.as_str();
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        // Up to the matching `)`, allowing one level of parentheses inside.
        let mut depth = 0;
        let end = rest
            .char_indices()
            .find(|&(_, ch)| match ch {
                '(' => {
                    depth += 1;
                    false
                }
                ')' if depth == 0 => true,
                ')' => {
                    depth -= 1;
                    false
                }
                _ => false,
            })
            .map_or(rest.len(), |(i, _)| i);
        out.push(rest[..end].trim().to_owned());
        rest = &rest[end..];
    }
    out.into_iter()
        .map(|dest| {
            // `<dest>` and `dest "title"`.
            let dest = dest.trim_start_matches('<');
            let dest = dest.split(['>', ' ']).next().unwrap_or("");
            dest.to_owned()
        })
        .filter(|dest| !dest.is_empty())
        .collect()
}

/// Whether `dest` leaves the repository (`https:`, `mailto:`, ...).
fn is_external(dest: &str) -> bool {
    match dest.split_once(':') {
        Some((scheme, _)) => {
            !scheme.is_empty()
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "+.-".contains(c))
        }
        None => false,
    }
}

/// GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a Markdown text's headings (`#`-style), with GitHub's `-1`, `-2` for repeats.
fn anchors(text: &str) -> HashSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = HashSet::new();
    for (_, line) in prose_lines(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if (1..=6).contains(&hashes) && line[hashes..].starts_with(' ') {
            let base = slug(&line[hashes..]);
            let n = seen.entry(base.clone()).or_insert(0);
            out.insert(if *n == 0 {
                base.clone()
            } else {
                format!("{base}-{n}")
            });
            *n += 1;
        }
    }
    out
}

#[test]
fn every_relative_link_in_markdown_resolves() {
    let root = common::repo_root();
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in repo_files() {
        if file.extension().is_none_or(|e| e != "md") {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in prose_lines(&text) {
            for dest in link_targets(line) {
                if is_external(&dest) {
                    continue;
                }
                checked += 1;
                let (path, anchor) = match dest.split_once('#') {
                    Some((path, anchor)) => (path, Some(anchor)),
                    None => (dest.as_str(), None),
                };
                let target = if path.is_empty() {
                    file.clone()
                } else if let Some(from_root) = path.strip_prefix('/') {
                    root.join(from_root)
                } else {
                    file.parent().unwrap().join(path)
                };
                let at = format!("{}:{n}: {dest}", relative(&file));
                if !target.exists() {
                    broken.push(format!("{at}: no such file"));
                    continue;
                }
                if let Some(anchor) = anchor
                    && target.extension().is_some_and(|e| e == "md")
                    && !anchors(&std::fs::read_to_string(&target).unwrap()).contains(anchor)
                {
                    broken.push(format!("{at}: no heading #{anchor} there"));
                }
            }
        }
    }
    assert!(
        checked > 0,
        "found no relative link at all: is the parser broken?"
    );
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// Files whose text may name repository paths: docs, code, migrations, scripts.
fn names_paths(file: &Path) -> bool {
    let name = file.file_name().unwrap().to_string_lossy();
    let in_scripts = file
        .parent()
        .and_then(Path::file_name)
        .is_some_and(|dir| dir == "scripts" || dir == ".ci");
    in_scripts
        || ["md", "rs", "toml", "lua", "sh", "py", "yml", "yaml"]
            .iter()
            .any(|ext| name.ends_with(&format!(".{ext}")))
}

/// The paths in `text` that start at a top-level folder of the repository and name a file
/// (`docs/semantics.md`, `crates/fleet-budget/src/allowance.rs`). Stops at characters that make
/// a pattern rather than a path (`lua/<name>.lua`, `migrations/*.toml`) and skips those.
fn path_mentions(text: &str, top: &HashSet<String>) -> Vec<String> {
    let is_path_char = |c: char| c.is_ascii_alphanumeric() || "._-/".contains(c);
    let mut out = Vec::new();
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let starts = i == 0 || !(is_path_char(chars[i - 1]) || chars[i - 1] == '\\');
        if !(starts && is_path_char(chars[i])) {
            i += 1;
            continue;
        }
        let start = i;
        while i < chars.len() && is_path_char(chars[i]) {
            i += 1;
        }
        let token: String = chars[start..i].iter().collect();
        let token = token.trim_end_matches(['.', '/']);
        let next = chars.get(i).copied().unwrap_or(' ');
        let pattern = matches!(next, '<' | '{' | '*' | '…' | '$');
        let file_like = token
            .rsplit_once('/')
            .and_then(|(_, last)| last.rsplit_once('.'))
            .is_some_and(|(stem, ext)| {
                !stem.is_empty()
                    && ["md", "rs", "lua", "toml", "txt", "sh", "py", "yml"].contains(&ext)
            });
        if !pattern
            && file_like
            && token
                .split_once('/')
                .is_some_and(|(first, _)| top.contains(first))
        {
            out.push(token.to_owned());
        }
    }
    out
}

#[test]
fn every_repository_path_named_in_docs_and_code_exists() {
    let root = common::repo_root();
    let top: HashSet<String> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| !SKIP_DIRS.contains(&name.as_str()))
        .collect();
    let mut missing = Vec::new();
    for file in repo_files() {
        // This file's own examples name paths that do not exist, on purpose.
        if !names_paths(&file) || file.ends_with("tests/doc_links.rs") {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        for (n, line) in text.lines().enumerate() {
            for path in path_mentions(line, &top) {
                if !root.join(&path).exists() {
                    missing.push(format!("{}:{}: {path}", relative(&file), n + 1));
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "paths named but not in the repository:\n{}",
        missing.join("\n")
    );
}

/// The README is a front page: at most this many lines, the manual in the guides.
const README_MAX_LINES: usize = 300;

#[test]
fn the_readme_is_a_front_page_that_links_every_guide() {
    let root = common::repo_root();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines: move the details into a guide (docs/guides)"
    );
    let linked: HashSet<String> = prose_lines(&readme)
        .into_iter()
        .flat_map(|(_, line)| link_targets(line))
        .map(|dest| dest.split('#').next().unwrap_or("").to_owned())
        .collect();
    let mut guides = 0;
    for entry in std::fs::read_dir(root.join("docs/guides")).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if name.ends_with(".md") {
            guides += 1;
            let path = format!("docs/guides/{name}");
            assert!(linked.contains(&path), "README.md does not link {path}");
        }
    }
    assert!(guides >= 5, "{guides} guides in docs/guides");
}

/// The places in `text` that name a section of a guide: `docs/guides/NAME.md#anchor` (the alert
/// rules' `runbook_url`s) and `docs/guides/NAME.md, "Heading"` or `docs/guides/NAME.md
/// ("Heading")` (comments and messages), as (guide, anchor).
fn guide_sections(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("docs/guides/") {
        rest = &rest[at..];
        let name_len = rest["docs/guides/".len()..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
            .unwrap_or(0);
        let end = "docs/guides/".len() + name_len;
        if name_len == 0 || !rest[end..].starts_with(".md") {
            rest = &rest["docs/guides/".len()..];
            continue;
        }
        let guide = rest[..end + 3].to_owned();
        let after = &rest[end + 3..];
        if let Some(anchor) = after.strip_prefix('#') {
            let anchor: String = anchor
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '-' || *c == '_')
                .collect();
            out.push((guide, anchor));
        } else if let Some(quoted) = [", \"", ", \\\"", " (\""]
            .iter()
            .find_map(|open| after.strip_prefix(open))
        {
            let heading = quoted.split(['"', '\\']).next().unwrap_or("");
            out.push((guide, slug(heading)));
        }
        rest = &rest[end..];
    }
    out
}

#[test]
fn every_guide_section_named_in_code_and_config_exists() {
    let root = common::repo_root();
    let mut missing = Vec::new();
    let mut checked = 0;
    for file in repo_files() {
        if !names_paths(&file) || file.ends_with("tests/doc_links.rs") {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        for (n, line) in text.lines().enumerate() {
            for (guide, anchor) in guide_sections(line) {
                checked += 1;
                let target = root.join(&guide);
                let found = std::fs::read_to_string(&target)
                    .is_ok_and(|guide_text| anchors(&guide_text).contains(&anchor));
                if !found {
                    missing.push(format!("{}:{}: {guide}#{anchor}", relative(&file), n + 1));
                }
            }
        }
    }
    assert!(
        checked >= 9,
        "only {checked} guide sections named: the alert rules' runbook_urls went missing?"
    );
    assert!(
        missing.is_empty(),
        "guide sections named but not there:\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_link_parser_finds_what_it_should() {
    assert_eq!(
        link_targets("see [a](docs/x.md#y) and ![b](<p q.png> \"t\") but not `[c](no.md)`"),
        vec!["docs/x.md#y", "p"]
    );
    assert_eq!(
        link_targets("[ref]: ../lua/README.md"),
        vec!["../lua/README.md"]
    );
    assert!(is_external("https://example.invalid/x"));
    assert!(!is_external("docs/semantics.md#the-decision-in-order"));
    assert_eq!(slug("The decision, in order"), "the-decision-in-order");
    assert_eq!(slug("`lua/` and `migrations/`"), "lua-and-migrations");
    let a = anchors("# A\n```\n# not a heading\n```\n## A\n### Why `x`?\n");
    assert_eq!(a, HashSet::from(["a".into(), "a-1".into(), "why-x".into()]));
    assert_eq!(
        guide_sections(
            "url: https://x.invalid/blob/main/docs/guides/ops.md#fleetbudgetexhausted, \
             (runbook: docs/guides/ops.md, \\\"A message\\\") and docs/guides/py.md (\"Celery\")"
        ),
        vec![
            (
                "docs/guides/ops.md".to_owned(),
                "fleetbudgetexhausted".to_owned()
            ),
            ("docs/guides/ops.md".to_owned(), "a-message".to_owned()),
            ("docs/guides/py.md".to_owned(), "celery".to_owned()),
        ]
    );
    let top = HashSet::from(["docs".to_owned(), "lua".to_owned()]);
    assert_eq!(
        path_mentions(
            "see docs/semantics.md, `lua/<name>.lua`, ../../lua/x.lua and docs/.",
            &top
        ),
        vec!["docs/semantics.md"]
    );
}
