//! Every `--json` output held to its JSON Schema, `docs/schemas/<command>.schema.json`.
//!
//! Two ways. Every CLI test that runs a command with `--json` through [`crate::run`] has what it
//! printed validated against the command's schema ([`hold_to_schema`]): the shapes are checked on
//! every path the other tests take (healthy, empty, hostile, exit 1 after printing). And the
//! tests here run each command with `--json` for real, check that every command with `--json`
//! has a schema and every schema is a valid draft 2020-12 schema, and that a document with a
//! renamed, missing or unknown field is refused, so the check can fail.
//!
//! The validator is the reference implementation, Python `jsonschema` (pinned in
//! `tests/python/requirements.txt`), run by the suite's Python: `FLEET_BUDGET_PYTHON`, else the
//! repository's `.venv` (`python3.11 -m venv .venv && .venv/bin/pip install -r
//! tests/python/requirements.txt`). Without it these tests fail; they are never skipped.

use std::collections::BTreeSet;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::{Value, json};

use crate::{run, stderr, stdout, temp_file};

/// The repository's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `docs/schemas`.
fn schemas_dir() -> PathBuf {
    root().join("docs/schemas")
}

/// The suite's Python: `FLEET_BUDGET_PYTHON`, else the repository's `.venv`.
fn python() -> PathBuf {
    std::env::var_os("FLEET_BUDGET_PYTHON")
        .map_or_else(|| root().join(".venv/bin/python"), PathBuf::from)
}

/// What the validator said: each document's errors, and each checked schema's.
struct Verdict {
    documents: Vec<Vec<String>>,
    schemas: Vec<(String, Vec<String>)>,
}

/// Runs `validate_json.py` once over `documents` (schema name, document) and the schemas named
/// in `check_schemas`.
fn validate(documents: &[(&str, &Value)], check_schemas: &[String]) -> Verdict {
    let request = json!({
        "schemas": schemas_dir(),
        "documents": documents.iter().map(|(n, d)| json!([n, d])).collect::<Vec<_>>(),
        "check_schemas": check_schemas,
    });
    let python = python();
    let mut child = Command::new(&python)
        .args(["-c", include_str!("validate_json.py")])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run {} ({e}): the JSON Schema checks need the suite's Python, \
                 FLEET_BUDGET_PYTHON or .venv (python3.11 -m venv .venv && \
                 .venv/bin/pip install -r tests/python/requirements.txt)",
                python.display()
            )
        });
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(request.to_string().as_bytes()).unwrap();
    drop(stdin);
    let o = child.wait_with_output().unwrap();
    assert!(
        o.status.success(),
        "the validator failed ({}): {}",
        python.display(),
        stderr(&o)
    );
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let lines = |v: &Value| -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|l| l.as_str().unwrap().to_owned())
            .collect()
    };
    Verdict {
        documents: v["documents"]
            .as_array()
            .unwrap()
            .iter()
            .map(lines)
            .collect(),
        schemas: v["schemas"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, e)| (k.clone(), lines(e)))
            .collect(),
    }
}

/// Panics naming every document that does not match its schema, and why.
pub(crate) fn assert_valid(documents: &[(&str, &Value)]) {
    let verdict = validate(documents, &[]);
    let mut failures = String::new();
    for ((name, document), errors) in documents.iter().zip(&verdict.documents) {
        if !errors.is_empty() {
            let mut text = document.to_string();
            text.truncate(2000);
            failures.push_str(&format!(
                "\n{name} --json does not match docs/schemas/{name}.schema.json:\n  {}\n  document: {text}\n",
                errors.join("\n  ")
            ));
        }
    }
    assert!(failures.is_empty(), "{failures}");
}

/// The errors of one document against the schema `name`.
fn errors(name: &str, document: &Value) -> Vec<String> {
    validate(&[(name, document)], &[]).documents.remove(0)
}

/// The global flags that take a value: skipped to find the command.
const GLOBAL_WITH_VALUE: [&str; 4] = ["--config", "--redis-url", "--amqp-url", "--key-prefix"];

/// The schema of the command `args` run: `budget freeze X --json` → `budget-freeze`, `status
/// --json` → `status` (a command's first two words when a schema has that name, else its first).
fn schema_of(args: &[&str]) -> Option<String> {
    let mut words = Vec::new();
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        if GLOBAL_WITH_VALUE.contains(arg) {
            rest.next();
        } else if !arg.starts_with('-') {
            words.push(*arg);
        }
    }
    let first = words.first()?;
    if let Some(second) = words.get(1) {
        let both = format!("{first}-{second}");
        if schemas_dir().join(format!("{both}.schema.json")).exists() {
            return Some(both);
        }
    }
    Some((*first).to_owned())
}

/// Holds what a `--json` run printed to its command's schema (called by [`crate::run`]); runs
/// that printed nothing (refused before printing) or were not `--json` are left alone.
pub(crate) fn hold_to_schema(args: &[&str], o: &Output) {
    if !args.contains(&"--json") || o.stdout.is_empty() {
        return;
    }
    let Ok(document) = serde_json::from_slice::<Value>(&o.stdout) else {
        panic!(
            "{args:?} --json printed something that is not JSON:\n{}",
            stdout(o)
        );
    };
    let name = schema_of(args).unwrap_or_else(|| panic!("no command in {args:?}"));
    assert_valid(&[(&name, &document)]);
}

/// The names of the schema files: `status.schema.json` → `status`.
fn schema_names() -> BTreeSet<String> {
    std::fs::read_dir(schemas_dir())
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            name.strip_suffix(".schema.json").map(str::to_owned)
        })
        .collect()
}

/// The commands listed under `Commands:` in a help text (`help` left out).
fn subcommands(help: &str) -> Vec<String> {
    let Some(start) = help.find("\nCommands:\n") else {
        return Vec::new();
    };
    help.get(start + "\nCommands:\n".len()..)
        .unwrap_or_default()
        .lines()
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect()
}

/// Every command path (`["dlq", "peek"]`) whose help lists a `--json` flag, found by walking the
/// help of the real binary: a command added later is found too.
fn commands_with_json(path: &mut Vec<String>, found: &mut Vec<Vec<String>>) {
    let mut args: Vec<&str> = path.iter().map(String::as_str).collect();
    args.push("--help");
    let o = run(&args);
    assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    let help = stdout(&o);
    let children = subcommands(&help);
    if children.is_empty() {
        if help.lines().any(|l| l.trim_start().starts_with("--json")) {
            found.push(path.clone());
        }
        return;
    }
    for child in children {
        path.push(child);
        commands_with_json(path, found);
        path.pop();
    }
}

#[test]
fn every_command_with_json_has_a_schema_and_every_schema_a_command() {
    let mut found = Vec::new();
    commands_with_json(&mut Vec::new(), &mut found);
    let commands: BTreeSet<String> = found.iter().map(|p| p.join("-")).collect();
    assert!(
        commands.len() >= 20 && commands.contains("status") && commands.contains("dlq-peek"),
        "the walk of the help found too little: {commands:?}"
    );
    let schemas = schema_names();
    let missing: Vec<_> = commands.difference(&schemas).collect();
    assert!(
        missing.is_empty(),
        "commands with --json but no docs/schemas/<command>.schema.json: {missing:?}"
    );
    let orphans: Vec<_> = schemas.difference(&commands).collect();
    assert!(
        orphans.is_empty(),
        "schemas of no command with --json: {orphans:?}"
    );
}

#[test]
fn every_schema_is_a_valid_draft_2020_12_schema_that_requires_its_version() {
    let names: Vec<String> = schema_names().into_iter().collect();
    assert!(!names.is_empty());
    let verdict = validate(&[], &names);
    assert_eq!(verdict.schemas.len(), names.len());
    for (name, errors) in &verdict.schemas {
        assert!(errors.is_empty(), "{name}.schema.json: {errors:#?}");
    }
    // `schema_version` is required, as a constant, in the shape or in each of its variants.
    for name in &names {
        let path = schemas_dir().join(format!("{name}.schema.json"));
        let schema: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let shapes = schema["oneOf"]
            .as_array()
            .map_or_else(|| vec![&schema], |v| v.iter().collect());
        for shape in shapes {
            let required = shape["required"].as_array().unwrap();
            assert!(
                required.contains(&json!("schema_version")),
                "{name}: schema_version not required"
            );
            assert!(
                shape["properties"]["schema_version"]["const"].is_u64(),
                "{name}: schema_version is not a constant"
            );
            assert_eq!(shape["additionalProperties"], false, "{name}: open shape");
        }
    }
}

/// `value` with the field at `path` renamed to `to` (or removed, without `to`).
fn renamed(value: &Value, path: &[&str], to: Option<&str>) -> Value {
    let mut v = value.clone();
    let (last, parents) = path.split_last().unwrap();
    let mut at = &mut v;
    for p in parents {
        at = match p.parse::<usize>() {
            Ok(i) => &mut at[i],
            Err(_) => &mut at[*p],
        };
    }
    let map = at.as_object_mut().unwrap();
    let field = map
        .remove(*last)
        .unwrap_or_else(|| panic!("no {last} in {value}"));
    if let Some(to) = to {
        map.insert(to.to_owned(), field);
    }
    v
}

#[test]
fn a_document_with_a_renamed_missing_or_unknown_field_is_refused() {
    let one = crate::json(&run(&[
        "simulate",
        "brownout",
        "--failure-rate",
        "0.3",
        "--json",
    ]));
    assert!(errors("simulate-brownout", &one).is_empty(), "{one}");
    // The rename that broke a script: refused, naming the field.
    let bad = renamed(&one, &["retries_granted"], Some("granted_retries"));
    let e = errors("simulate-brownout", &bad);
    assert!(e.join("\n").contains("retries_granted"), "{e:?}");
    for bad in [
        renamed(&one, &["schema_version"], None),
        renamed(&one, &["client_requests"], None),
        renamed(&one, &["executions"], Some("calls")),
    ] {
        assert!(!errors("simulate-brownout", &bad).is_empty(), "{bad}");
    }
    let mut next = one.clone();
    next["schema_version"] = json!(2);
    assert!(!errors("simulate-brownout", &next).is_empty());
    let mut unknown = one.clone();
    unknown["retries_maybe"] = json!(1);
    let e = errors("simulate-brownout", &unknown);
    assert!(e.join("\n").contains("retries_maybe"), "{e:?}");
    let mut text = one;
    text["executions"] = json!("2152");
    assert!(!errors("simulate-brownout", &text).is_empty());

    // Nested: a rename inside a list of objects.
    let plan = crate::json(&run(&["plan", "--recovery-window", "15m", "--json"]));
    assert!(errors("plan", &plan).is_empty(), "{plan}");
    let bad = renamed(&plan, &["schedule", "0", "delay_ms"], Some("delay"));
    let e = errors("plan", &bad);
    assert!(e.join("\n").contains("$.schedule[0]"), "{e:?}");
    // A schema that does not exist is an error too, not a pass.
    assert!(!errors("no-such-command", &plan).is_empty());
}

#[test]
fn the_schema_of_a_run_is_its_command_s() {
    assert_eq!(schema_of(&["status", "--json"]).unwrap(), "status");
    assert_eq!(
        schema_of(&[
            "--key-prefix",
            "p",
            "status",
            "--dependency",
            "mail",
            "--json"
        ])
        .unwrap(),
        "status"
    );
    assert_eq!(
        schema_of(&["--config", "f", "budget", "freeze", "x", "--json"]).unwrap(),
        "budget-freeze"
    );
    assert_eq!(schema_of(&["dlq", "peek", "--json"]).unwrap(), "dlq-peek");
    assert_eq!(schema_of(&["plan", "--max-attempts", "3"]).unwrap(), "plan");
}

/// The commands that need no service, each shape of each: held to their schemas by
/// [`crate::run`], and checked here to have printed.
#[test]
fn commands_without_services_match_their_schemas() {
    let config = temp_file(
        "schemas-config.toml",
        "[dependencies.search]\nratio = 0.1\ntasks = [\"index\", \"query\"]\n\
         [dependencies.search.breaker]\n",
    );
    let bad = temp_file("schemas-bad.toml", "[redis]\nurl = \"ftp://x\"\n");
    let runs: [&[&str]; 12] = [
        &["plan", "--recovery-window", "15m", "--json"],
        &["plan", "--max-attempts", "4", "--json"],
        &["simulate", "brownout", "--failure-rate", "0.3", "--json"],
        &[
            "simulate",
            "brownout",
            "--failure-rate",
            "0.3",
            "--runs",
            "3",
            "--json",
        ],
        &["simulate", "capacity", "--json"],
        &["simulate", "capacity", "--budget-ratio", "0.1", "--json"],
        &["simulate", "concurrency", "--json"],
        &[
            "simulate",
            "concurrency",
            "--timeline",
            "--ticks",
            "100",
            "--json",
        ],
        &["config", "check", config.to_str().unwrap(), "--json"],
        &["config", "check", bad.to_str().unwrap(), "--json"],
        &[
            "demo",
            "--in-process",
            "--phase-secs",
            "1",
            "--rate",
            "100",
            "--json",
        ],
        &["simulate", "capacity", "--ticks", "1", "--json"],
    ];
    for args in runs {
        let o = run(args);
        assert!(
            !o.stdout.is_empty(),
            "{args:?} printed nothing: {}",
            stderr(&o)
        );
    }
}
