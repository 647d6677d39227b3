//! The broker migrations have one source, the top-level `migrations/`, and the crate that compiles
//! them in keeps a copy (`crates/fleet-budget-amqp/migrations/`, packaged with it) written by
//! `scripts/gen-migrations`. This test fails when the copy is stale or has no source:
//! `scripts/gen-migrations --check` (the crate's own unit test,
//! `embedded_migrations_are_the_files_of_the_directory`, compares the compiled-in text too).
#![allow(clippy::expect_used, clippy::panic, clippy::unwrap_used, missing_docs)]

mod common;

use fleet_budget_amqp::Migrations;

#[test]
fn the_crate_copy_of_every_migration_is_its_source() {
    let out = std::process::Command::new("python3")
        .arg(common::repo_root().join("scripts/gen-migrations"))
        .arg("--check")
        .output()
        .expect("run python3 scripts/gen-migrations --check");
    assert!(
        out.status.success(),
        "scripts/gen-migrations --check: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The "generated" comment is a comment: the copy parses to the migrations of the source.
#[test]
fn the_copy_reads_as_the_source_reads() {
    let root = common::repo_root();
    assert_eq!(
        Migrations::from_dir(&root.join("crates/fleet-budget-amqp/migrations")).unwrap(),
        Migrations::from_dir(&root.join("migrations")).unwrap()
    );
}

/// The check can fail: in a copy of the tree with one stale copy and one orphan, it names both
/// and exits 1, changing nothing; the generator then mends both.
#[test]
fn the_check_names_a_stale_copy_and_an_orphan() {
    let root = common::repo_root();
    let tmp = std::env::temp_dir().join(format!("fb-gen-migrations-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    for rel in [
        "scripts",
        "migrations",
        "crates/fleet-budget-amqp/migrations",
    ] {
        let to = tmp.join(rel);
        std::fs::create_dir_all(&to).unwrap();
        for entry in std::fs::read_dir(root.join(rel)).unwrap() {
            let path = entry.unwrap().path();
            if path.is_file() {
                std::fs::copy(&path, to.join(path.file_name().unwrap())).unwrap();
            }
        }
    }
    let copies = tmp.join("crates/fleet-budget-amqp/migrations");
    let stale = copies.join("0002_retry_tiers.toml");
    let text = std::fs::read_to_string(&stale).unwrap();
    let edited = text.replacen("version = 2", "version = 2 ", 1);
    std::fs::write(&stale, &edited).unwrap();
    // A copy with no source (named in pieces: it exists only in this test's tree).
    let orphan = ["0009_old", "toml"].join(".");
    std::fs::write(copies.join(&orphan), "version = 9\n").unwrap();
    let run = |args: &[&str]| {
        std::process::Command::new("python3")
            .arg(tmp.join("scripts/gen-migrations"))
            .args(args)
            .output()
            .unwrap()
    };
    let checked = run(&["--check"]);
    let said = String::from_utf8_lossy(&checked.stderr).into_owned();
    assert_eq!(checked.status.code(), Some(1), "{said}");
    assert!(
        said.contains("crates/fleet-budget-amqp/migrations/0002_retry_tiers.toml is stale"),
        "{said}"
    );
    assert!(
        said.contains(&format!("migrations/{orphan} has no source")),
        "{said}"
    );
    assert_eq!(std::fs::read_to_string(&stale).unwrap(), edited);
    assert!(run(&[]).status.success());
    assert_eq!(std::fs::read_to_string(&stale).unwrap(), text);
    assert!(!copies.join(&orphan).exists());
    assert!(run(&["--check"]).status.success());
    let _ = std::fs::remove_dir_all(&tmp);
}
