//! Entries anyone with access to Redis can write (input review, session 5): `audit` and
//! `status` show what they can and name the rest, never panic. A private `redis-server` each.

use fleet_budget::testing::RedisServer;

use super::*;

/// An audit entry whose id is a time past the year 9999 (`XADD` takes any id) made `audit`
/// panic in its text output: humantime's RFC 3339 formatter refuses such a time. It is shown
/// as its number beside the others, and `--json` is unchanged.
#[test]
fn audit_shows_an_entry_from_past_the_year_9999_without_panicking() {
    let redis = RedisServer::start();
    let url = redis.url();
    let on = ["--redis-url", url.as_str()];
    let _: String = redis.cmd(&[
        "XADD",
        "fb:v1:audit",
        "1796011200000-0",
        "actor",
        "alice",
        "action",
        "freeze",
    ]);
    for id in ["253402300800000-0", "18446744073709551615-0"] {
        let _: String = redis.cmd(&[
            "XADD",
            "fb:v1:audit",
            id,
            "actor",
            "mallory",
            "action",
            "set",
        ]);
    }
    let o = run_with(&on, "audit");
    assert_eq!(o.status.code(), Some(0), "stderr: {}", stderr(&o));
    let text = stdout(&o);
    assert!(text.contains("2026-11-30T04:00:00Z"), "{text}");
    for ms in ["253402300800000", "18446744073709551615"] {
        assert!(
            text.contains(&format!("{ms} ms after the epoch (past the year 9999)")),
            "{text}"
        );
    }
    let v = json(&run_with(&on, "audit --json"));
    assert_eq!(v["entries"].as_array().unwrap().len(), 3, "{v}");
}

/// A key under the prefix whose name is not UTF-8 used to end `status` in "Redis does not
/// answer" (exit 1) with every healthy budget unshown; a prefix with glob characters used to show
/// "no dependency found" beside live budgets.
#[test]
fn status_lists_budgets_beside_keys_it_cannot_read_and_under_glob_prefixes() {
    let redis = RedisServer::start();
    let url = redis.url();
    for prefix in ["fb", "t[7]"] {
        let on = ["--redis-url", url.as_str(), "--key-prefix", prefix];
        let o = run_with(
            &on,
            "bench --dependency search --successes 20 --retries 2 --json",
        );
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let mut conn = redis.connection().unwrap();
    let _: () = ::redis::cmd("SET")
        .arg(&b"fb:v1:{bad\xff}"[..])
        .arg("x")
        .query(&mut conn)
        .unwrap();
    for prefix in ["fb", "t[7]"] {
        let on = ["--redis-url", url.as_str(), "--key-prefix", prefix];
        let v = json(&run_with(&on, "status --json"));
        let found: Vec<&str> = v["dependencies"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["dependency"].as_str().unwrap())
            .collect();
        assert_eq!(found, ["search"], "prefix {prefix}: {v}");
    }
}

/// Text anyone with access to Redis can write (an audit entry's actor, dependency and reason; a
/// freeze's actor and reason in the budget hash) was printed raw by `audit` and `status`: an
/// escape sequence drove the operator's terminal, a newline broke the table into a line of its
/// own, U+202E made a name read backwards. Shown as codes now; `--json` keeps the text as is.
#[test]
fn audit_and_status_show_hand_written_control_characters_as_codes() {
    let redis = RedisServer::start();
    let url = redis.url();
    let on = ["--redis-url", url.as_str()];
    let _: String = redis.cmd(&[
        "XADD",
        "fb:v1:audit",
        "*",
        "actor",
        "eve\x1b[2J",
        "action",
        "freeze",
        "dependency",
        "pay\u{202e}lanoitan",
        "reason",
        "line1\nFAKE ROW",
    ]);
    let o = run_with(&on, "audit");
    assert_eq!(o.status.code(), Some(0), "stderr: {}", stderr(&o));
    let text = stdout(&o);
    assert!(text.contains("eve\\u{1b}[2J"), "{text}");
    assert!(text.contains("pay\\u{202e}lanoitan"), "{text}");
    assert!(text.contains("line1\\u{a}FAKE ROW"), "{text}");
    assert!(!text.lines().any(|l| l.starts_with("FAKE ROW")), "{text}");
    assert!(
        !text.contains('\x1b') && !text.contains('\u{202e}'),
        "{text}"
    );
    let v = json(&run_with(&on, "audit --json"));
    assert_eq!(v["entries"][0]["actor"], "eve\x1b[2J", "{v}");

    let o = run_with(
        &on,
        "budget freeze search --for 1h --reason incident --actor alice",
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let _: () = redis.cmd(&[
        "HSET",
        "fb:v1:{search}",
        "fa",
        "mal\x1b[31mlory",
        "fy",
        "why\u{202e}\nnot",
    ]);
    let o = run_with(&on, "status --dependency search");
    let text = stdout(&o);
    assert!(text.contains("FROZEN by mal\\u{1b}[31mlory"), "{text}");
    assert!(text.contains("why\\u{202e}\\u{a}not"), "{text}");
    assert!(
        !text.contains('\x1b') && !text.contains('\u{202e}'),
        "{text}"
    );
}
