//! The code blocks of the README and of the guides (`docs/guides/*.md`) say what the code accepts.
//! Every fenced block has a language this test knows, and each language is checked, here or by
//! the test named:
//!
//! - `toml`: a configuration parses with `WorkerConfig::from_toml` (as `budgetctl config check`
//!   reads it) and maps every task it lists under `[dependencies.X]` to X; a Cargo manifest names
//!   the workspace's crates at the workspace's version;
//! - `rust`: compiled here, line for line ([`embedding`] below);
//! - `promql`: each query returns data from a real Prometheus during a brownout drill
//!   (`tests/prometheus`, which reads the metrics guide: no other file may hold one);
//! - `python`: run as written as a Celery worker (`clients/python/tests/test_celery_readme.py`,
//!   which reads the Python guide: no other file may hold one);
//! - `sh`: the scripts, paths and packages it names exist;
//! - `text`: output recorded from a run (`budgetctl demo --scenario ...`), shown, not run.
#![allow(
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    clippy::unwrap_used,
    missing_docs
)]

mod common;

use std::collections::BTreeMap;

/// The files whose blocks are checked: the README and every guide.
fn doc_files() -> Vec<String> {
    let mut files = vec!["README.md".to_owned()];
    let mut guides: Vec<String> = std::fs::read_dir(common::repo_root().join("docs/guides"))
        .expect("docs/guides exists")
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".md"))
        .map(|name| format!("docs/guides/{name}"))
        .collect();
    guides.sort();
    files.extend(guides);
    files
}

/// A fenced code block: where it starts (file and 1-based line), its language, its text.
struct Block {
    at: String,
    lang: String,
    text: String,
}

/// The fenced code blocks of a Markdown text (` ``` ` fences).
fn blocks(file: &str, text: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut open: Option<(usize, String, Vec<&str>)> = None;
    for (n, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        match open.take() {
            None if trimmed.starts_with("```") => {
                open = Some((n + 1, trimmed[3..].trim().to_owned(), Vec::new()));
            }
            None => {}
            Some((start, lang, lines)) if trimmed.starts_with("```") => out.push(Block {
                at: format!("{file}:{start}"),
                lang,
                text: lines.join("\n"),
            }),
            Some((start, lang, mut lines)) => {
                lines.push(line);
                open = Some((start, lang, lines));
            }
        }
    }
    assert!(open.is_none(), "{file}: a code block is never closed");
    out
}

fn all_blocks() -> Vec<Block> {
    doc_files()
        .iter()
        .flat_map(|file| blocks(file, &common::read(file)))
        .collect()
}

#[test]
fn every_block_has_a_language_that_is_checked() {
    let mut unknown = Vec::new();
    let mut count = 0;
    for block in all_blocks() {
        count += 1;
        if !["toml", "rust", "promql", "python", "sh", "text"].contains(&block.lang.as_str()) {
            unknown.push(format!("{}: ```{}", block.at, block.lang));
        }
    }
    assert!(count >= 10, "found {count} blocks: is the parser broken?");
    assert!(
        unknown.is_empty(),
        "blocks no test checks (give them a language this test knows, and a check):\n{}",
        unknown.join("\n")
    );
}

/// The tasks each `[dependencies.X]` section of a configuration lists.
fn listed_tasks(text: &str) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut section = String::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap().trim();
        if let Some(header) = line.strip_prefix('[') {
            section = header.trim_end_matches(']').to_owned();
        } else if let Some(list) = line.strip_prefix("tasks") {
            let dependency = section
                .strip_prefix("dependencies.")
                .unwrap_or_else(|| panic!("`tasks` outside [dependencies.*]: [{section}]"));
            let names = list
                .split('"')
                .skip(1)
                .step_by(2)
                .map(str::to_owned)
                .collect();
            out.insert(dependency.to_owned(), names);
        }
    }
    out
}

#[test]
fn every_configuration_block_is_accepted_and_maps_its_tasks() {
    let mut configurations = 0;
    let mut manifests = 0;
    for block in all_blocks().into_iter().filter(|b| b.lang == "toml") {
        if block.text.contains("fleet-budget = \"") {
            // A worker's Cargo.toml: the published crates at this workspace's version.
            manifests += 1;
            let version = env!("CARGO_PKG_VERSION");
            let minor = version.rsplit_once('.').unwrap().0;
            for krate in ["fleet-budget", "fleet-budget-amqp"] {
                if let Some(line) = block
                    .text
                    .lines()
                    .find(|l| l.starts_with(&format!("{krate} =")))
                {
                    assert!(
                        line.contains(&format!("\"{minor}\"")) || line.contains(version),
                        "{}: {line:?} is not version {minor} of the workspace",
                        block.at
                    );
                }
            }
            continue;
        }
        configurations += 1;
        let config = fleet_budget_amqp::WorkerConfig::from_toml(&block.text, &block.at)
            .unwrap_or_else(|e| panic!("{}: the configuration is refused: {e}", block.at));
        let listed = listed_tasks(&block.text);
        assert!(!listed.is_empty(), "{}: no task is mapped", block.at);
        for (dependency, tasks) in listed {
            for task in tasks {
                let resolved = config.budget.map.resolve(&task).unwrap();
                assert_eq!(
                    resolved.as_str(),
                    dependency,
                    "{}: task {task} is listed under [dependencies.{dependency}]",
                    block.at
                );
            }
        }
    }
    assert!(
        configurations >= 2 && manifests >= 1,
        "{configurations} configurations, {manifests} Cargo manifests: blocks went missing"
    );
}

/// The languages another test runs, and the one file it reads them from.
#[test]
fn blocks_run_elsewhere_are_in_the_file_that_test_reads() {
    let blocks = all_blocks();
    for (lang, file, test) in [
        (
            "promql",
            "docs/guides/metrics-and-alerts.md",
            "tests/prometheus",
        ),
        (
            "python",
            "docs/guides/python.md",
            "clients/python/tests/test_celery_readme.py",
        ),
    ] {
        let found: Vec<&Block> = blocks.iter().filter(|b| b.lang == lang).collect();
        assert!(!found.is_empty(), "no ```{lang} block: {test} reads one");
        for block in found {
            assert!(
                block.at.starts_with(&format!("{file}:")),
                "{}: ```{lang} blocks are run by {test}, which reads only {file}",
                block.at
            );
        }
    }
    let celery = common::read("docs/guides/python.md");
    let section = celery
        .split_once("## Celery in five lines")
        .expect("the heading test_celery_readme.py looks for")
        .1;
    assert!(
        section.contains("```python"),
        "no Celery block under its heading"
    );
}

#[test]
fn shell_blocks_name_what_exists() {
    let root = common::repo_root();
    let mut checked = 0;
    for block in all_blocks().into_iter().filter(|b| b.lang == "sh") {
        for line in block.text.lines() {
            let line = line.split(" #").next().unwrap();
            let words: Vec<&str> = line.split_whitespace().collect();
            for (i, word) in words.iter().enumerate() {
                let word = word.trim_matches(|c| c == '"' || c == '\'');
                if word.starts_with("scripts/") || word.starts_with("./") {
                    let path = word.split('[').next().unwrap();
                    checked += 1;
                    assert!(
                        root.join(path).exists(),
                        "{}: {path} does not exist",
                        block.at
                    );
                }
                if word == "-p" {
                    let package = words[i + 1];
                    checked += 1;
                    assert!(
                        root.join("crates")
                            .join(package)
                            .join("Cargo.toml")
                            .exists(),
                        "{}: no workspace package {package}",
                        block.at
                    );
                }
            }
        }
    }
    assert!(checked >= 3, "only {checked} names checked in shell blocks");
}

/// The guide's embedding block, compiled: the lines between the markers are the block of
/// docs/guides/worker-and-replay.md ("Embedding"), line for line (indentation aside), which
/// [`the_embedding_block_is_the_compiled_one`] checks. The scaffold around them gives the
/// block's free names (`attempt`, `handler`, `job`) a type.
#[allow(dead_code, unused_variables)]
mod embedding {
    /// A job as the queue hands it over.
    struct Job;

    /// The call to the dependency.
    async fn handler(_job: Job) -> Result<(), std::io::Error> {
        Ok(())
    }

    #[rustfmt::skip]
    async fn block(attempt: u32, job: Job) -> Result<(), Box<dyn std::error::Error>> {
        // BEGIN docs/guides/worker-and-replay.md
        use fleet_budget::{Config, Decision, Failure, FleetBudget};

        let config = Config::from_path("fleet-budget.toml".as_ref())?;
        let budget = FleetBudget::from_config(&config).await?;      // Redis; falls back if unreachable

        budget.on_attempt("index_document", attempt).await?;       // every execution (1 = first)
        match handler(job).await {
            Ok(()) => budget.on_success("index_document").await?,   // earns allowance
            Err(e) => match budget.on_failure("index_document", attempt, &Failure::retryable(e)).await? {
                Decision::Retry { delay, next_attempt, .. } => { /* reschedule after `delay` */ }
                Decision::DeadLetter { reason, snapshot, .. } => { /* dead-letter with `reason` */ }
            },
        }
        budget.shutdown().await?;                                   // flush coalesced deposits
        // END
        Ok(())
    }
}

#[test]
fn the_embedding_block_is_the_compiled_one() {
    let rust: Vec<Block> = all_blocks()
        .into_iter()
        .filter(|b| b.lang == "rust")
        .collect();
    assert_eq!(
        rust.len(),
        1,
        "one ```rust block, compiled here; another needs its own compiled copy"
    );
    let block = &rust[0];
    assert!(block.at.starts_with("docs/guides/worker-and-replay.md:"));
    let source = common::read("tests/doc_blocks.rs");
    let compiled: Vec<&str> = source
        .split_once("// BEGIN docs/guides/worker-and-replay.md\n")
        .unwrap()
        .1
        .split_once("        // END")
        .unwrap()
        .0
        .lines()
        .map(str::trim)
        .collect();
    let documented: Vec<&str> = block.text.lines().map(str::trim).collect();
    assert_eq!(
        documented, compiled,
        "{}: the block differs from the compiled copy in tests/doc_blocks.rs",
        block.at
    );
}
