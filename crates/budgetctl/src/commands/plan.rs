//! `budgetctl plan`: the retry schedule of a recovery window (or an attempt count), and the
//! guide's table of windows, from `fleet_budget::ceiling` (no services needed).

use std::time::Duration;

use clap::Args;
use fleet_budget::ceiling::hops::{hop_plan, powers_of_two};
use fleet_budget::ceiling::{Backoff, GUIDE_WINDOWS, Schedule};
use serde::Serialize;

use crate::output::print_json;

/// The version of this command's `--json` shape (`docs/schemas/plan.schema.json`).
const JSON_SCHEMA_VERSION: u32 = 1;

/// `plan`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("ceiling").required(true).args(["recovery_window", "max_attempts"])))]
pub(crate) struct PlanArgs {
    /// How long to keep retrying after the first failure (`90s`, `15m`, `4h`): a ceiling by
    /// time, as `recovery_window_secs` configures.
    #[arg(long, value_name = "DURATION", value_parser = duration_arg)]
    recovery_window: Option<Duration>,
    /// Or a ceiling by count: executions including the first.
    #[arg(long, allow_negative_numbers = true, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1000))]
    max_attempts: Option<u32>,
    /// Delay after the first failure, before jitter.
    #[arg(long, value_name = "DURATION", value_parser = duration_arg, default_value = "2s")]
    base: Duration,
    /// Growth per attempt.
    #[arg(long, allow_negative_numbers = true, value_name = "F", value_parser = factor_arg, default_value = "2")]
    factor: f64,
    /// Longest nominal delay.
    #[arg(long, value_name = "DURATION", value_parser = duration_arg, default_value = "10m")]
    cap: Duration,
    /// Print one JSON object on stdout.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Serialize)]
struct PlannedRow {
    attempt: u32,
    delay_ms: u64,
    jitter_low_ms: u64,
    jitter_high_ms: u64,
    at_ms: u64,
    hops: usize,
}

#[derive(Debug, Serialize)]
struct GuideRow {
    window_ms: u64,
    attempts: u32,
    last_attempt_ms: u64,
}

#[derive(Debug, Serialize)]
struct PlanReport {
    recovery_window_ms: Option<u64>,
    base_ms: u64,
    factor: f64,
    cap_ms: u64,
    attempts: u32,
    last_attempt_ms: u64,
    last_attempt_low_ms: u64,
    last_attempt_high_ms: u64,
    tiers_ms: Vec<u64>,
    schedule: Vec<PlannedRow>,
    guide: Vec<GuideRow>,
}

/// `budgetctl plan --recovery-window 15m [--base 2s --factor 2 --cap 10m]`.
pub(crate) fn run(args: &PlanArgs) -> anyhow::Result<()> {
    let backoff = Backoff {
        base: args.base,
        factor: args.factor,
        cap: args.cap.max(args.base),
    };
    let schedule = match (args.recovery_window, args.max_attempts) {
        (Some(window), _) => Schedule::for_window(&backoff, window),
        (None, n) => Schedule::for_attempts(&backoff, n.unwrap_or(1)),
    };
    // The hops through the default tiers (1, 2, 4, ... 1,024 s).
    let tiers = powers_of_two(Duration::from_secs(1), 11);
    let (low, high) = schedule.span_bounds();
    let report = PlanReport {
        recovery_window_ms: schedule.window.map(ms),
        base_ms: ms(backoff.base),
        factor: backoff.factor,
        cap_ms: ms(backoff.cap),
        attempts: schedule.max_attempts(),
        last_attempt_ms: ms(schedule.span()),
        last_attempt_low_ms: ms(low),
        last_attempt_high_ms: ms(high),
        tiers_ms: tiers.iter().copied().map(ms).collect(),
        schedule: schedule
            .attempts
            .iter()
            .map(|a| PlannedRow {
                attempt: a.attempt,
                delay_ms: ms(a.delay),
                jitter_low_ms: ms(a.jitter.0),
                jitter_high_ms: ms(a.jitter.1),
                at_ms: ms(a.at),
                hops: hop_plan(a.delay, &tiers, 64).len(),
            })
            .collect(),
        guide: GUIDE_WINDOWS
            .iter()
            .map(|w| {
                let s = Schedule::for_window(&backoff, *w);
                GuideRow {
                    window_ms: ms(*w),
                    attempts: s.max_attempts(),
                    last_attempt_ms: ms(s.span()),
                }
            })
            .collect(),
    };
    if args.json {
        return print_json(JSON_SCHEMA_VERSION, &report);
    }
    print!("{}", text(&report));
    Ok(())
}

fn text(r: &PlanReport) -> String {
    use std::fmt::Write as _;
    let d = |v: u64| human(Duration::from_millis(v));
    let mut out = String::new();
    let ceiling = r.recovery_window_ms.map_or_else(
        || format!("{} attempts", r.attempts),
        |w| format!("recovery window {}", d(w)),
    );
    let _ = writeln!(
        out,
        "{ceiling}, base {}, factor {}, cap {}",
        d(r.base_ms),
        r.factor,
        d(r.cap_ms)
    );
    let _ = writeln!(
        out,
        "attempts: {} (the first included); the last runs {} after the first failure \
         ({} .. {} with jitter)",
        r.attempts,
        d(r.last_attempt_ms),
        d(r.last_attempt_low_ms),
        d(r.last_attempt_high_ms)
    );
    let _ = writeln!(
        out,
        "jitter: centred, each delay drawn from 3/4 to 5/4 of its nominal (mean = nominal); \
         hops: tiers of 1, 2, 4 .. 1024 s\n"
    );
    let _ = writeln!(
        out,
        "{:>7}  {:>10}  {:>21}  {:>10}  {:>4}",
        "attempt", "delay", "jitter range", "at", "hops"
    );
    for a in &r.schedule {
        let (delay, range) = if a.attempt == 1 {
            ("-".to_owned(), "-".to_owned())
        } else if r.recovery_window_ms == Some(a.at_ms) {
            (d(a.delay_ms), "ends at the window".to_owned())
        } else {
            (
                d(a.delay_ms),
                format!("{} .. {}", d(a.jitter_low_ms), d(a.jitter_high_ms)),
            )
        };
        let _ = writeln!(
            out,
            "{:>7}  {:>10}  {:>21}  {:>10}  {:>4}",
            a.attempt,
            delay,
            range,
            d(a.at_ms),
            a.hops
        );
    }
    let _ = writeln!(
        out,
        "\nthe guide's windows with this backoff (a ceiling by time: the last attempt runs when \
         the window ends):"
    );
    let _ = writeln!(
        out,
        "{:>7}  {:>8}  {:>12}",
        "window", "attempts", "last attempt"
    );
    for g in &r.guide {
        let _ = writeln!(
            out,
            "{:>7}  {:>8}  {:>12}",
            d(g.window_ms),
            g.attempts,
            d(g.last_attempt_ms)
        );
    }
    out
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `d` as the largest units that say it: `1h`, `6m30s`, `1.5s`, `250ms`.
fn human(d: Duration) -> String {
    let total_ms = ms(d);
    if total_ms == 0 {
        return "0s".to_owned();
    }
    if total_ms < 1000 {
        return format!("{total_ms}ms");
    }
    let (h, rest) = (total_ms / 3_600_000, total_ms % 3_600_000);
    let (m, rest) = (rest / 60_000, rest % 60_000);
    let (s, milli) = (rest / 1000, rest % 1000);
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if m > 0 {
        out.push_str(&format!("{m}m"));
    }
    if s > 0 || milli > 0 {
        if milli > 0 {
            let frac = format!("{milli:03}");
            out.push_str(&format!("{s}.{}s", frac.trim_end_matches('0')));
        } else {
            out.push_str(&format!("{s}s"));
        }
    }
    out
}

/// A duration flag: a number and a unit (`ms`, `s`, `m`, `h`, `d`), e.g. `250ms`, `1.5s`, `15m`;
/// from 1 ms to 7 days.
fn duration_arg(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| format!("`{s}` needs a unit: ms, s, m, h or d (e.g. 15m)"))?;
    let (number, unit) = t.split_at(split);
    let scale = match unit {
        "ms" => 0.001,
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        "d" => 86_400.0,
        _ => return Err(format!("`{s}`: unknown unit `{unit}` (ms, s, m, h or d)")),
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("`{s}`: `{number}` is not a number"))?;
    let secs = value * scale;
    if secs.is_finite() && (0.001..=7.0 * 86_400.0).contains(&secs) {
        Ok(Duration::from_secs_f64(secs))
    } else {
        Err(format!("`{s}` must be from 1ms to 7d"))
    }
}

/// `--factor`: from 1 (no growth) to 10.
fn factor_arg(s: &str) -> Result<f64, String> {
    crate::args::number_in(s, 1.0..=10.0, "from 1 to 10")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_their_unit_and_refuse_the_rest() {
        assert_eq!(duration_arg("15m"), Ok(Duration::from_secs(900)));
        assert_eq!(duration_arg("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(duration_arg("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(duration_arg("1.5h"), Ok(Duration::from_secs(5400)));
        for bad in ["15", "m", "15x", "-1s", "0s", "8d", "1e9s", "NaNs", ""] {
            assert!(duration_arg(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations_print_in_their_largest_units() {
        assert_eq!(human(Duration::from_millis(250)), "250ms");
        assert_eq!(human(Duration::from_millis(1500)), "1.5s");
        assert_eq!(human(Duration::from_secs(390)), "6m30s");
        assert_eq!(human(Duration::from_secs(4 * 3600)), "4h");
    }
}
