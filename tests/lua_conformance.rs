//! The contract's conformance vectors (`lua/conformance/README.md`), run with the scripts the Rust
//! crate loads, on a private redis-server: the crate's scripts hash to `lua/SHA1SUMS` (by Redis's
//! `SCRIPT LOAD` answer and by the crate's own `Script` hashes), every vector's replies are the
//! recorded ones, and a vector changed by one byte of an answer fails at that step.
#![allow(
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    clippy::unwrap_used,
    missing_docs
)]

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;

use fleet_budget::store::{
    BREAKER_SCRIPT, DEAD_LETTERS_SCRIPT, DEPOSIT_SCRIPT, HEARTBEAT_SCRIPT, LEASE_ACQUIRE_SCRIPT,
    LEASE_RELEASE_SCRIPT, OVERRIDE_SCRIPT, SPEND_BATCH_SCRIPT, SPEND_MANY_SCRIPT, SPEND_SCRIPT,
    STATUS_SCRIPT,
};
use fleet_budget::testing::RedisServer;
use rand::{Rng, SeedableRng};
use serde_json::Value as Json;

const CLOCK: &str = "redis.call('TIME')";

/// The crate's scripts by name, as it loads them.
fn crate_scripts() -> BTreeMap<&'static str, &'static redis::Script> {
    BTreeMap::from([
        ("breaker", &*BREAKER_SCRIPT),
        ("dead_letters", &*DEAD_LETTERS_SCRIPT),
        ("deposit", &*DEPOSIT_SCRIPT),
        ("heartbeat", &*HEARTBEAT_SCRIPT),
        ("lease_acquire", &*LEASE_ACQUIRE_SCRIPT),
        ("lease_release", &*LEASE_RELEASE_SCRIPT),
        ("override", &*OVERRIDE_SCRIPT),
        ("spend", &*SPEND_SCRIPT),
        ("spend_batch", &*SPEND_BATCH_SCRIPT),
        ("spend_many", &*SPEND_MANY_SCRIPT),
        ("status", &*STATUS_SCRIPT),
    ])
}

/// The text of a script as the crate has it (its `lua/` folder, which `include_str!` embeds; the
/// SHA1 test shows it is the text the crate's `Script` hashes).
fn text(name: &str) -> String {
    common::read(&format!("crates/fleet-budget/lua/{name}.lua"))
}

fn sha1sums() -> BTreeMap<String, String> {
    common::read("lua/SHA1SUMS")
        .lines()
        .map(|line| {
            let (digest, file) = line.split_once("  ").expect("sha1sum format");
            (file.trim_end_matches(".lua").to_owned(), digest.to_owned())
        })
        .collect()
}

fn vector_files() -> Vec<PathBuf> {
    let dir = common::repo_root().join("lua/conformance/vectors");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no vectors in {}", dir.display());
    files
}

/// A vector file, its shape checked: unknown keys are an error, so a typo never passes silently.
fn load(path: &PathBuf) -> Json {
    let doc: Json = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let name = path.display();
    let keys = |v: &Json| -> Vec<String> { v.as_object().unwrap().keys().cloned().collect() };
    assert_eq!(keys(&doc), ["about", "format", "vectors"], "{name}");
    assert_eq!(doc["format"], 1, "{name}");
    for vector in doc["vectors"].as_array().unwrap() {
        assert_eq!(keys(vector), ["about", "name", "steps"], "{name}");
        for (i, step) in vector["steps"].as_array().unwrap().iter().enumerate() {
            let k = keys(step);
            let known = [
                "script",
                "keys",
                "args",
                "now_ms",
                "redis",
                "reply",
                "error",
                "error_prefix",
            ];
            let expectations = ["reply", "error", "error_prefix"]
                .iter()
                .filter(|e| step.get(**e).is_some())
                .count();
            assert!(
                k.iter().all(|k| known.contains(&k.as_str()))
                    && expectations == 1
                    && (step.get("script").is_some() != step.get("redis").is_some()),
                "{name}: {} step {i}: bad step {k:?}",
                vector["name"]
            );
        }
    }
    doc
}

fn clocked(text: &str, now_ms: u64) -> String {
    assert_eq!(text.matches(CLOCK).count(), 1, "one clock read");
    text.replace(
        CLOCK,
        &format!("{{'{}', '{}'}}", now_ms / 1000, now_ms % 1000 * 1000),
    )
}

fn strings(v: &Json, prefix: &str) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().replace("$P", prefix))
        .collect()
}

/// A RESP2 reply as the vectors write it.
fn as_json(v: &redis::Value) -> Json {
    match v {
        redis::Value::Nil => Json::Null,
        redis::Value::Int(n) => Json::from(*n),
        redis::Value::BulkString(b) => Json::from(String::from_utf8(b.clone()).unwrap()),
        redis::Value::SimpleString(s) => Json::from(s.clone()),
        redis::Value::Okay => Json::from("OK"),
        redis::Value::Array(items) => Json::Array(items.iter().map(as_json).collect()),
        other => panic!("not a RESP2 reply: {other:?}"),
    }
}

fn matches(expected: &Json, got: &Json, prefix: &str) -> bool {
    match (expected, got) {
        (Json::Object(o), Json::Number(n)) => {
            o.len() == 1 && o.get("any_integer") == Some(&Json::Bool(true)) && n.is_i64()
        }
        (Json::Array(e), Json::Array(g)) => {
            e.len() == g.len() && e.iter().zip(g).all(|(e, g)| matches(e, g, prefix))
        }
        (Json::String(e), Json::String(g)) => &e.replace("$P", prefix) == g,
        (Json::Number(e), Json::Number(g)) => e == g,
        (Json::Null, Json::Null) => true,
        _ => false,
    }
}

/// An error reply's text as the vectors write it: Redis's own leading `ERR ` dropped, a code and
/// its detail (how redis-rs splits `fleet-budget: ARGV[1] ...`) joined by one space.
fn error_text(e: &redis::RedisError) -> String {
    match (e.code(), e.detail()) {
        (Some("ERR"), Some(detail)) => detail.to_owned(),
        (Some(code), Some(detail)) => format!("{code} {detail}"),
        (Some(code), None) => code.to_owned(),
        _ => e.to_string(),
    }
}

/// Runs a vector's steps in order: `Err` names the first step whose answer is not the vector's.
fn run_vector(c: &mut redis::Connection, vector: &Json, prefix: &str) -> Result<usize, String> {
    let steps = vector["steps"].as_array().unwrap();
    for (i, step) in steps.iter().enumerate() {
        let answer: redis::RedisResult<redis::Value> = if let Some(name) = step["script"].as_str() {
            let mut body = text(name);
            if let Some(now) = step.get("now_ms") {
                body = clocked(&body, now.as_u64().unwrap());
            }
            let keys = strings(&step["keys"], prefix);
            let args = strings(&step["args"], prefix);
            redis::cmd("EVAL")
                .arg(body)
                .arg(keys.len())
                .arg(&keys)
                .arg(&args)
                .query(c)
        } else {
            let words = strings(&step["redis"], prefix);
            redis::cmd(&words[0]).arg(&words[1..]).query(c)
        };
        let at = format!("{:?} step {i}", vector["name"].as_str().unwrap());
        match (answer, step.get("reply")) {
            (Ok(v), Some(expected)) => {
                let got = as_json(&v);
                if !matches(expected, &got, prefix) {
                    return Err(format!("{at}: expected {expected}, got {got}"));
                }
            }
            (Ok(v), None) => return Err(format!("{at}: expected an error, got {}", as_json(&v))),
            (Err(e), Some(_)) => return Err(format!("{at}: expected a reply, got the error {e}")),
            (Err(e), None) => {
                let got = error_text(&e);
                if let Some(want) = step["error"].as_str() {
                    if got != want.replace("$P", prefix) {
                        return Err(format!("{at}: expected the error {want:?}, got {got:?}"));
                    }
                } else {
                    let want = step["error_prefix"].as_str().unwrap();
                    if !got.starts_with(&want.replace("$P", prefix)) {
                        return Err(format!(
                            "{at}: expected an error starting {want:?}, got {got:?}"
                        ));
                    }
                }
            }
        }
    }
    Ok(steps.len())
}

fn clean(c: &mut redis::Connection, prefix: &str) {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query(c)
        .unwrap();
    if !keys.is_empty() {
        let _: i64 = redis::cmd("DEL").arg(&keys).query(c).unwrap();
    }
}

#[test]
fn the_crates_scripts_hash_to_sha1sums() {
    let server = RedisServer::start();
    let mut c = server.connection().unwrap();
    let sums = sha1sums();
    let scripts = crate_scripts();
    assert_eq!(
        sums.keys().collect::<Vec<_>>(),
        scripts.keys().collect::<Vec<_>>(),
        "lua/SHA1SUMS lists every script the crate loads, and no other"
    );
    for (name, script) in scripts {
        let loaded: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(text(name))
            .query(&mut c)
            .unwrap();
        assert_eq!(
            loaded, sums[name],
            "{name}: Redis's SHA1 of the crate's text"
        );
        let published: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(common::read(&format!("lua/{name}.lua")))
            .query(&mut c)
            .unwrap();
        assert_eq!(
            published, sums[name],
            "{name}: Redis's SHA1 of lua/{name}.lua"
        );
        assert_eq!(script.get_hash(), sums[name], "{name}: the crate's Script");
    }
}

#[test]
fn every_vector_passes() {
    let server = RedisServer::start();
    let mut c = server.connection().unwrap();
    for path in vector_files() {
        let doc = load(&path);
        let mut steps = 0;
        for (n, vector) in doc["vectors"].as_array().unwrap().iter().enumerate() {
            let prefix = format!("fbconf-rs-{n}");
            let result = run_vector(&mut c, vector, &prefix);
            clean(&mut c, &prefix);
            steps += result.unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        }
        println!(
            "{}: {} vectors, {steps} steps passed",
            path.file_name().unwrap().to_string_lossy(),
            doc["vectors"].as_array().unwrap().len()
        );
    }
}

/// The expectation with one byte of its JSON text changed (a digit or a letter).
fn mutate(expected: &Json, rng: &mut rand::rngs::StdRng) -> Json {
    let text = expected.to_string();
    let spots: Vec<usize> = text
        .char_indices()
        .filter(|(_, ch)| ch.is_ascii_alphanumeric())
        .map(|(i, _)| i)
        .collect();
    for _ in 0..100 {
        let i = spots[rng.random_range(0..spots.len())];
        let ch = text.as_bytes()[i];
        let new = if ch.is_ascii_digit() {
            b'0' + (ch - b'0' + 1) % 10
        } else if ch == b'x' {
            b'y'
        } else {
            b'x'
        };
        let mut bytes = text.clone().into_bytes();
        bytes[i] = new;
        if let Ok(changed) = serde_json::from_slice::<Json>(&bytes)
            && &changed != expected
        {
            return changed;
        }
    }
    panic!("no one-byte change of {text}");
}

#[test]
fn an_answer_changed_by_one_byte_fails_at_its_step() {
    let server = RedisServer::start();
    let mut c = server.connection().unwrap();
    let mut mutated = 0;
    for path in vector_files() {
        let doc = load(&path);
        let mut rng = rand::rngs::StdRng::seed_from_u64(path.to_string_lossy().len() as u64);
        for (n, vector) in doc["vectors"].as_array().unwrap().iter().enumerate() {
            let answers: Vec<(usize, &str)> = vector["steps"]
                .as_array()
                .unwrap()
                .iter()
                .enumerate()
                .flat_map(|(i, s)| {
                    ["reply", "error", "error_prefix"]
                        .into_iter()
                        .filter(move |k| {
                            s.get(*k).is_some_and(|v| {
                                v.to_string().chars().any(|c| c.is_ascii_alphanumeric())
                            })
                        })
                        .map(move |k| (i, k))
                })
                .collect();
            let (i, k) = answers[rng.random_range(0..answers.len())];
            let mut changed = vector.clone();
            changed["steps"][i][k] = mutate(&vector["steps"][i][k], &mut rng);
            let prefix = format!("fbconf-rs-mut-{n}");
            let result = run_vector(&mut c, &changed, &prefix);
            clean(&mut c, &prefix);
            let err = result.expect_err("a changed answer must fail");
            assert!(err.contains(&format!("step {i}:")), "{err}");
            mutated += 1;
        }
    }
    println!("{mutated} vectors changed by one byte, each failed at its step");
}
