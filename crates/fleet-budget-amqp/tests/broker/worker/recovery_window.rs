//! Ceilings by time, end to end: a task that always fails, with a recovery window, is retried
//! through the delay tiers (hop by hop, exact delays) until the window since its first failure
//! has passed, and dead-lettered there: first failure → dead-letter within 10% of the window,
//! never before it. The three windows run at once, so the test takes about the longest one.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fleet_budget::Failure;
use fleet_budget::ceiling::hops::powers_of_two;
use fleet_budget_amqp::headers;

use super::{start, stop};
use crate::common::{Env, header_str, header_u64, message_id, wait_until};

/// Jobs per window.
const JOBS: usize = 2;

/// One execution: when it started and failed, and the delay its retry headers asked for.
#[derive(Debug, Clone, Copy)]
struct Execution {
    attempt: u32,
    started: Instant,
    failed: Instant,
    delay: Option<Duration>,
}

/// A window to check: `scale` divides the real one (its base, cap, tiers and window).
struct Case {
    name: &'static str,
    /// The recovery window of the real deployment.
    window: Duration,
    /// The real window is divided by this for the test (1 = real time).
    scale: u32,
}

impl Case {
    fn window(&self) -> Duration {
        self.window / self.scale
    }

    /// Powers of two from 1 s, scaled: the default tiers at scale 1.
    fn tiers(&self) -> String {
        let tiers: Vec<String> = powers_of_two(Duration::from_secs(1) / self.scale, 11)
            .iter()
            .map(|t| format!("{}", t.as_secs_f64()))
            .collect();
        format!("retry_tiers_secs = [{}]", tiers.join(", "))
    }

    /// Base 2 s and cap 10 min, scaled; the floor of the budget far above the retries.
    fn task(&self) -> String {
        format!(
            "[tasks.t]\nrecovery_window_secs = {}\nbackoff_base_ms = {}\nbackoff_cap_ms = {}\n",
            self.window().as_secs(),
            2000 / self.scale,
            600_000 / self.scale
        )
    }
}

/// Runs `case`: publishes [`JOBS`] jobs whose handler always fails and waits for their
/// dead-letters; returns the report lines and the problems found.
async fn run(case: Case) -> (String, Vec<String>) {
    let env = Env::with_amqp(
        case.name,
        &case.tiers(),
        "",
        "min_allowance = 1000",
        &case.task(),
    )
    .await;
    let window = case.window();
    let log: Arc<Mutex<BTreeMap<String, Vec<Execution>>>> = Arc::default();
    let runner = {
        let log = Arc::clone(&log);
        start(env.budget().await, &env, move |job| {
            let started = Instant::now();
            log.lock()
                .unwrap()
                .entry(job.message_id.clone().unwrap_or_default())
                .or_default()
                .push(Execution {
                    attempt: job.attempt,
                    started,
                    failed: Instant::now(),
                    delay: job.retry_delay(),
                });
            async { Err(Failure::retryable("search returned 503").with_class("http_503")) }
        })
    };
    for i in 0..JOBS {
        env.publish_one(format!("job {i}").as_bytes()).await;
    }
    let dead_queue = env.topology.dead_queue.clone();
    wait_until(window * 3, "every job dead-lettered", || async {
        env.depth(&dead_queue).await >= u32::try_from(JOBS).unwrap()
    })
    .await;
    let counts = stop(runner).await;
    let dead = env.drain(&env.topology.dead_queue).await;
    let log = log.lock().unwrap().clone();

    let mut report = format!(
        "window {:?} (real {:?} / {}), {} (hops through the tiers: {})\n",
        window, case.window, case.scale, case.name, counts.waited_again
    );
    let mut problems = Vec::new();
    for (props, _) in &dead {
        let id = message_id(props);
        let reason = header_str(props, headers::REASON).unwrap_or_default();
        let first = header_u64(props, headers::FIRST_FAILURE_MS).unwrap_or_default();
        let dead_at = header_u64(props, headers::DEAD_LETTERED_MS).unwrap_or_default();
        let gap = Duration::from_millis(dead_at.saturating_sub(first));
        let runs = log.get(&id).cloned().unwrap_or_default();
        let Some(first_run) = runs.first() else {
            problems.push(format!("{}: {id} never ran", case.name));
            continue;
        };
        let times: Vec<String> = runs
            .iter()
            .map(|r| format!("{:.2}", (r.started - first_run.failed).as_secs_f64()))
            .collect();
        let ratio = gap.as_secs_f64() / window.as_secs_f64();
        report.push_str(&format!(
            "  {id}: attempts at [{}] s after the first failure; first failure → dead-letter \
             {:.2} s = {ratio:.3} × window ({reason})\n",
            times.join(", "),
            gap.as_secs_f64()
        ));
        if reason != "attempts_exhausted" {
            problems.push(format!("{}: {id} dead-lettered as {reason}", case.name));
        }
        if !(1.0..=1.1).contains(&ratio) {
            problems.push(format!(
                "{}: {id} dead-lettered {gap:?} after its first failure, {ratio:.3} × the window",
                case.name
            ));
        }
        for pair in runs.windows(2) {
            let (before, after) = (pair[0], pair[1]);
            let waited = after.started - before.failed;
            let asked = after.delay.unwrap_or_default();
            if after.attempt != before.attempt + 1 || waited < asked {
                problems.push(format!(
                    "{}: {id} attempt {} ran {waited:?} after the failure of attempt {}, its \
                     delay was {asked:?}",
                    case.name, after.attempt, before.attempt
                ));
            }
        }
    }
    if dead.len() != JOBS {
        problems.push(format!("{}: {} dead-letters", case.name, dead.len()));
    }
    (report, problems)
}

/// 15 s and 40 s with the default base (2 s), cap and tiers, and a 15-minute window scaled down
/// 25 times (base 80 ms, cap 24 s, tiers of 40 ms to 41 s, window 36 s), all at once.
#[tokio::test]
async fn first_failure_to_dead_letter_is_within_a_tenth_of_the_recovery_window() {
    let (a, b, c) = tokio::join!(
        run(Case {
            name: "window15s",
            window: Duration::from_secs(15),
            scale: 1,
        }),
        run(Case {
            name: "window40s",
            window: Duration::from_secs(40),
            scale: 1,
        }),
        run(Case {
            name: "window15m",
            window: Duration::from_secs(900),
            scale: 25,
        }),
    );
    let mut problems = Vec::new();
    for (report, p) in [a, b, c] {
        println!("{report}");
        problems.extend(p);
    }
    assert!(problems.is_empty(), "{problems:#?}");
}
