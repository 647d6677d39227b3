//! `plan`: the schedule of a recovery window against the library's reference points, the
//! guide's table, the text output and refused values.

use crate::{assert_exit, has_fields, json, run, stdout};

#[test]
fn plan_fifteen_minutes_gives_ten_attempts_the_last_at_the_window() {
    let v = json(&run(&["plan", "--recovery-window", "15m", "--json"]));
    has_fields(
        &v,
        &[
            "recovery_window_ms",
            "attempts",
            "last_attempt_ms",
            "schedule",
            "guide",
            "tiers_ms",
        ],
    );
    assert_eq!(v["attempts"], 10, "{v}");
    assert_eq!(v["last_attempt_ms"], 900_000);
    let at: Vec<u64> = v["schedule"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["at_ms"].as_u64().unwrap() / 1000)
        .collect();
    assert_eq!(at, [0, 2, 6, 14, 30, 62, 126, 254, 510, 900]);
    let guide: Vec<(u64, u64)> = v["guide"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                g["window_ms"].as_u64().unwrap() / 1000,
                g["attempts"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        guide,
        [(60, 6), (300, 8), (900, 10), (3600, 14), (14_400, 32)]
    );
    // A faster backoff reaches the same window in more attempts.
    let fast = json(&run(&[
        "plan",
        "--recovery-window",
        "15m",
        "--base",
        "500ms",
        "--factor",
        "1.5",
        "--cap",
        "1m",
        "--json",
    ]));
    assert!(fast["attempts"].as_u64().unwrap() > 10, "{fast}");
    assert_eq!(fast["last_attempt_ms"], 900_000);
}

#[test]
fn plan_prints_the_schedule_and_refuses_bad_values() {
    let text = stdout(&run(&["plan", "--recovery-window", "40s"]));
    assert!(text.contains("attempts: 5"), "{text}");
    assert!(text.contains("ends at the window"), "{text}");
    assert!(text.contains("the guide's windows"), "{text}");
    for bad in [
        &["plan"][..],
        &["plan", "--recovery-window", "15"],
        &["plan", "--recovery-window", "-1m"],
        &["plan", "--recovery-window", "9d"],
        &["plan", "--max-attempts", "0"],
        &["plan", "--recovery-window", "1m", "--factor", "nan"],
    ] {
        assert_exit(&run(bad), 2, "");
    }
}
