//! `simulate brownout` and `simulate capacity`: JSON shapes, the reference numbers, the chart.

use serde_json::Value;

use crate::{has_fields, json, run, stderr, stdout, unique};

#[test]
fn simulate_brownout_json_shape_and_reference_numbers() {
    let base = [
        "simulate",
        "brownout",
        "--requests",
        "2000",
        "--attempts",
        "3",
        "--runs",
        "10",
        "--json",
    ];
    let amp = |extra: &[&str]| {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        json(&run(&args))
    };
    let healthy = amp(&["--failure-rate", "0.05"]);
    has_fields(
        &healthy,
        &[
            "first_attempts",
            "executions",
            "amplification",
            "successes",
            "retries_granted",
            "retries_denied",
        ],
    );
    assert!(
        (healthy["amplification"].as_f64().unwrap() - 1.05).abs() < 0.01,
        "{healthy}"
    );
    let storm = amp(&["--failure-rate", "0.9"]);
    assert!(
        (storm["amplification"].as_f64().unwrap() - 2.71).abs() < 0.03,
        "{storm}"
    );
    let budget = amp(&[
        "--failure-rate",
        "0.9",
        "--budget-ratio",
        "0.1",
        "--deposit",
        "request",
    ]);
    assert!(
        (budget["amplification"].as_f64().unwrap() - 1.10).abs() < 0.015,
        "{budget}"
    );
    assert!(
        (budget["successes"].as_f64().unwrap() - 220.0).abs() < 25.0,
        "{budget}"
    );
    // One run: integers.
    let one = json(&run(&[
        "simulate",
        "brownout",
        "--failure-rate",
        "0.5",
        "--json",
        "--seed",
        "3",
    ]));
    assert!(one["executions"].is_u64(), "{one}");
    // The names before 0.2.0, kept beside the new ones until 0.3.0 (CHANGELOG.md).
    for v in [&healthy, &one] {
        assert_eq!(v["client_requests"], v["first_attempts"], "{v}");
        assert_eq!(v["upstream_calls"], v["executions"], "{v}");
    }
    let text = run(&["simulate", "brownout", "--failure-rate", "0.9"]);
    assert!(stdout(&text).contains("amplification"), "{}", stdout(&text));
}

#[test]
fn simulate_capacity_json_shape_reference_and_svg() {
    let svg = std::env::temp_dir().join(format!("{}.svg", unique("capacity")));
    let o = run(&[
        "simulate",
        "capacity",
        "--incoming",
        "900",
        "--capacity",
        "1000",
        "--degraded-capacity",
        "200",
        "--degraded-ticks",
        "3",
        "--attempts",
        "3",
        "--budget-ratio",
        "0.1",
        "--json",
        "--svg",
        svg.to_str().unwrap(),
    ]);
    let v = json(&o);
    has_fields(
        &v,
        &[
            "ticks",
            "peak_offered",
            "served_total",
            "dead_lettered_total",
            "without_budget",
        ],
    );
    has_fields(
        &v["ticks"][0],
        &[
            "tick",
            "offered",
            "served",
            "failed",
            "retries_granted",
            "dead_lettered",
        ],
    );
    let without = v["without_budget"]["peak_offered"].as_u64().unwrap();
    let with = v["peak_offered"].as_u64().unwrap();
    assert!((2300..=2450).contains(&without), "{without}");
    #[allow(clippy::cast_precision_loss)]
    let cut = 1.0 - with as f64 / without as f64;
    assert!((0.4..=0.6).contains(&cut), "{with} vs {without}");
    let chart = std::fs::read_to_string(&svg).unwrap();
    assert!(
        chart.starts_with("<svg") && chart.contains("polyline") && chart.contains("without budget"),
        "{chart}"
    );
    let _ = std::fs::remove_file(&svg);
    let o = run(&["simulate", "capacity", "--svg", "/nonexistent-dir/x.svg"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let text = stdout(&run(&[
        "simulate",
        "capacity",
        "--budget-ratio",
        "0.1",
        "--ticks",
        "10",
    ]));
    assert!(text.contains("peak offered"), "{text}");
}

#[test]
fn simulate_concurrency_reproduces_the_issue_arithmetic() {
    let v = json(&run(&[
        "simulate",
        "concurrency",
        "--cap",
        "20",
        "--primary",
        "16",
        "--failure-rate",
        "0.2",
        "--json",
    ]));
    // The independent calculation, written out: the budget's share of the cap left after the
    // primary calls; one retry per failure; a primary pool sized to the cap beside a pool of
    // the remaining slots.
    let (cap, primary, rate) = (20.0_f64, 16.0_f64, 0.2_f64);
    let fraction = (cap - primary) / primary;
    let offered = primary + primary * rate;
    let separate = cap + (cap - primary);
    let close = |field: &str, want: f64| {
        let got = v[field].as_f64().unwrap_or(f64::NAN);
        assert!((got - want).abs() < 1e-9, "{field}: {got} != {want} in {v}");
    };
    close("max_retry_fraction", fraction);
    close("offered_in_flight", offered);
    close("separate_pools_worst_case", separate);
    assert!((fraction - 0.25).abs() < 1e-12 && (offered - 19.2).abs() < 1e-12);
    assert!((separate - 24.0).abs() < 1e-12);
    // 3.2 retries fit in the 4 slots: the budget refuses none.
    close("offered_in_flight_with_budget", offered);

    // At 40% the storm passes the cap; the budget holds the sum at the cap.
    let v = json(&run(&[
        "simulate",
        "concurrency",
        "--failure-rate",
        "0.4",
        "--json",
    ]));
    let offered = primary + primary * 0.4;
    assert!(
        (v["offered_in_flight"].as_f64().unwrap() - offered).abs() < 1e-9,
        "{v}"
    );
    assert!(offered > cap);
    assert!(
        (v["offered_in_flight_with_budget"].as_f64().unwrap() - cap).abs() < 1e-9,
        "{v}"
    );

    // Two retries per failure: 16 × (0.5 + 0.25) = 12 retries asked for.
    let v = json(&run(&[
        "simulate",
        "concurrency",
        "--failure-rate",
        "0.5",
        "--retries",
        "2",
        "--json",
    ]));
    assert!(
        (v["retry_demand"].as_f64().unwrap() - 12.0).abs() < 1e-9,
        "{v}"
    );

    let text = stdout(&run(&["simulate", "concurrency"]));
    assert!(text.contains("19.2") && text.contains("24"), "{text}");
    let o = run(&["simulate", "concurrency", "--primary", "30"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}

#[test]
fn simulate_concurrency_timeline_shows_the_storm_and_the_budget_s_cut() {
    let v = json(&run(&["simulate", "concurrency", "--timeline", "--json"]));
    assert_eq!(v["model"], "timeline");
    let (without, with) = (&v["without_budget"], &v["with_budget"]);
    assert_eq!(without["ticks"].as_array().unwrap().len(), 600);
    let f = |r: &Value, k: &str| r[k].as_f64().unwrap_or(f64::NAN);
    // A slowdown of 8% past the cap's slack: without a budget the retries turn it into a storm
    // that outlives it; the budget keeps the calls in flight under the cap and recovers.
    assert!(f(without, "peak_in_flight") > 20.0, "{without}");
    assert!(without["recovery_ticks"].is_null());
    assert!(f(with, "peak_in_flight") <= 20.0, "{with}");
    assert!(with["recovery_ticks"].as_u64().is_some());
    assert!(f(with, "timeouts_total") < f(without, "timeouts_total"));
    assert!(f(with, "retries_refused_total") > 0.0);
    // Every tick's in-flight count with the budget stays under the cap.
    for t in with["ticks"].as_array().unwrap() {
        assert!(t["in_flight"].as_f64().unwrap() <= 20.0 + 1e-9, "{t}");
    }

    let path = std::env::temp_dir().join(format!("{}.svg", unique("timeline")));
    let o = run(&[
        "simulate",
        "concurrency",
        "--svg",
        path.to_str().unwrap(),
        "--ticks",
        "100",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let svg = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    assert!(svg.starts_with("<svg") && svg.contains("concurrency budget"));
    assert!(stdout(&o).contains("back to its load"), "{}", stdout(&o));
    let o = run(&[
        "simulate",
        "concurrency",
        "--timeline",
        "--slow-factor",
        "0.5",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--slow-factor"), "{}", stderr(&o));
}
