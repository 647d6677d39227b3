//! `budgetctl tune`: per dependency, the `ratio`, `min_allowance` and ceiling its own traffic
//! recommends, read from Prometheus (the workers' counters), with the rules and the evidence
//! beside each number (`fleet_budget_sim::history`); a table, a TOML snippet, an SVG chart per
//! dependency, or `--json`.

pub(crate) mod chart;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use clap::Args;
use fleet_budget::ceiling::{Schedule, TaskCeiling};
use fleet_budget::config::Config;
use fleet_budget::metrics::{Prometheus, PrometheusSeries as Series};
use fleet_budget::{Dependency, DepositBasis};
use fleet_budget_sim::history::{self, Recommendation, Rules, Sample};
use serde::Serialize;

use crate::exit::usage;
use crate::output::{print_json, table};
use crate::when::{self, When, rfc3339_ms};

/// Prometheus's limit of points per series of a range query.
const MAX_POINTS: u64 = Prometheus::MAX_POINTS;

/// The version of this command's `--json` shape (`docs/schemas/tune.schema.json`).
const JSON_SCHEMA_VERSION: u32 = 1;

/// What fleet-budget keeps itself, and why it is not enough to tune from: said when
/// `--prometheus` is missing.
pub(crate) const NO_HISTORY: &str = "fleet-budget keeps no history of its own to tune from: \
    Redis holds each budget's current and previous window only (window_secs each, the key expires \
    after two idle windows), the audit trail keeps overrides, replays and purges (not traffic), \
    and each worker's counters live in its process until Prometheus scrapes them. Give \
    --prometheus http://HOST:9090 (the server that scrapes the workers' /metrics)";

/// `tune`.
#[derive(Debug, Args)]
pub(crate) struct TuneArgs {
    /// Prometheus's URL (`http://[user:password@]host[:port][/path]`), the server that scrapes
    /// the workers' `/metrics`. Required: fleet-budget keeps no history of its own.
    #[arg(
        long,
        value_name = "URL",
        env = "FLEET_BUDGET_PROMETHEUS_URL",
        hide_env_values = true
    )]
    pub(crate) prometheus: Option<String>,
    /// The start of the history: a duration ago (`14d`) or an RFC 3339 time.
    #[arg(long, value_name = "WHEN", value_parser = when::when, default_value = "14d")]
    pub(crate) since: When,
    /// Its end (default now).
    #[arg(long, value_name = "WHEN", value_parser = when::when)]
    pub(crate) until: Option<When>,
    /// The step of the series, and the range each point counts over (`increase(…[STEP])`): at
    /// least twice Prometheus's scrape interval. Default: 60s, or longer to stay within 11,000
    /// points.
    #[arg(long, value_name = "DURATION", value_parser = when::duration)]
    pub(crate) step: Option<Duration>,
    /// Only these dependencies (repeat the flag); default every one Prometheus has.
    #[arg(long = "dependency", value_name = "NAME")]
    pub(crate) dependencies: Vec<String>,
    /// Deadline of each request to Prometheus.
    #[arg(long, value_name = "DURATION", value_parser = when::duration, default_value = "30s")]
    pub(crate) timeout: Duration,
    /// Write one SVG chart per dependency here (`<dependency>.svg`): the retry fraction over
    /// time, the recommended ratio, the incidents marked.
    #[arg(long, value_name = "DIR")]
    pub(crate) chart_dir: Option<PathBuf>,
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub(crate) json: bool,
}

/// The most dependencies one run tunes.
const MAX_DEPENDENCIES: usize = 500;

/// A dependency's history as fetched, and what the rules made of it.
#[derive(Debug, Serialize)]
pub(crate) struct Tuned {
    pub(crate) dependency: String,
    /// The policy in force in the configuration, for comparison.
    pub(crate) current: Current,
    /// The recommendation, or why there is none.
    pub(crate) recommendation: Option<Recommendation>,
    pub(crate) no_recommendation: Option<String>,
    /// Each task of the dependency and its ceiling with the recommended window.
    pub(crate) tasks: Vec<TaskAdvice>,
    /// `<dependency>.svg` written, when `--chart-dir` was given.
    pub(crate) chart: Option<String>,
    #[serde(skip)]
    pub(crate) samples: Vec<Sample>,
}

/// The configured policy and ceiling.
#[derive(Debug, Serialize)]
pub(crate) struct Current {
    pub(crate) ratio: f64,
    pub(crate) min_allowance: u64,
    pub(crate) window_secs: u64,
    pub(crate) deposit: &'static str,
}

/// One task's ceiling with the recommended window.
#[derive(Debug, Serialize)]
pub(crate) struct TaskAdvice {
    pub(crate) task: String,
    /// `recovery_window_secs` when the task's ceiling is by time, `max_attempts` when by count.
    pub(crate) ceiling: &'static str,
    pub(crate) backoff_base_ms: u64,
    pub(crate) backoff_factor: f64,
    pub(crate) backoff_cap_ms: u64,
    /// Executions the recommended window takes with this backoff.
    pub(crate) attempts: u32,
    pub(crate) current_max_attempts: u32,
    pub(crate) current_recovery_window_secs: Option<u64>,
}

#[derive(Debug, Serialize)]
struct Report<'a> {
    prometheus: &'a str,
    since_ms: u64,
    until_ms: u64,
    step_ms: u64,
    rules: Rules,
    dependencies: &'a [Tuned],
}

/// `budgetctl tune --prometheus URL [--since 14d] [--step 60s] [--chart-dir DIR] [--json]`.
pub(crate) async fn run(config: &Config, args: &TuneArgs) -> anyhow::Result<()> {
    let url = args
        .prometheus
        .as_deref()
        .ok_or_else(|| usage(NO_HISTORY))?;
    let prometheus =
        Prometheus::parse(url, args.timeout).map_err(|e| usage(format!("--prometheus {e}")))?;
    let range = Range::of(args.since, args.until, args.step)?;
    let rules = Rules::default();
    let mut tuned = fetch(&prometheus, config, &range, &args.dependencies).await?;
    for t in &mut tuned {
        let backoff = task_ceilings(config, &t.dependency)
            .first()
            .map_or_else(|| config.ceilings.default.backoff, |(_, c)| c.backoff);
        let window_ms = t.current.window_secs.saturating_mul(1000);
        match history::recommend(&t.samples, range.step_ms, window_ms, &backoff, &rules) {
            Ok(r) => {
                t.tasks = task_advice(config, &t.dependency, &r);
                t.recommendation = Some(r);
            }
            Err(e) => t.no_recommendation = Some(e.to_string()),
        }
        if let Some(dir) = &args.chart_dir {
            t.chart = Some(chart::write(dir, t, &range)?);
        }
    }
    if args.json {
        return print_json(
            JSON_SCHEMA_VERSION,
            &Report {
                prometheus: prometheus.shown(),
                since_ms: range.start_ms,
                until_ms: range.end_ms,
                step_ms: range.step_ms,
                rules,
                dependencies: &tuned,
            },
        );
    }
    out!("{}", text(&tuned, &range, prometheus.shown()));
    Ok(())
}

/// The range of the queries.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Range {
    pub(crate) start_ms: u64,
    pub(crate) end_ms: u64,
    pub(crate) step_ms: u64,
}

impl Range {
    /// `since` to `until` (now by default) every `step` (60 s, or longer to stay within
    /// [`MAX_POINTS`] points).
    pub(crate) fn of(
        since: When,
        until: Option<When>,
        step: Option<Duration>,
    ) -> anyhow::Result<Self> {
        let start_ms = since.unix_ms();
        let end_ms = until.unwrap_or(When(SystemTime::now())).unix_ms();
        if end_ms <= start_ms {
            return Err(usage(format!(
                "--since {} is not before --until {}",
                rfc3339_ms(start_ms),
                rfc3339_ms(end_ms)
            )));
        }
        let span = end_ms - start_ms;
        let step_ms = match step {
            Some(s) => u64::try_from(s.as_millis()).unwrap_or(u64::MAX).max(1000),
            None => (span.div_ceil(MAX_POINTS - 1)).max(60_000).div_ceil(1000) * 1000,
        };
        if span / step_ms + 1 > MAX_POINTS {
            return Err(usage(format!(
                "--step {}s over {}s is more than {MAX_POINTS} points per series (Prometheus's \
                 limit): a longer step or a shorter range",
                step_ms / 1000,
                span / 1000
            )));
        }
        Ok(Self {
            start_ms,
            end_ms,
            step_ms,
        })
    }
}

/// `sum by (dependency) (increase(metric[range]))`.
fn increase(metric: &str, range_ms: u64) -> String {
    format!("sum by (dependency) (increase({metric}[{range_ms}ms]))")
}

/// Fetches every series the rules read, and puts them together per dependency.
pub(crate) async fn fetch(
    prometheus: &Prometheus,
    config: &Config,
    range: &Range,
    only: &[String],
) -> anyhow::Result<Vec<Tuned>> {
    let step = range.step_ms;
    let get = async |query: String| {
        prometheus
            .range(&query, range.start_ms, range.end_ms, step)
            .await
            .map_err(anyhow::Error::msg)
    };
    let successes = get(increase("fleet_budget_successes_total", step)).await?;
    let firsts = get(increase("fleet_budget_first_attempts_total", step)).await?;
    let granted = get(increase("fleet_budget_retries_granted_total", step)).await?;
    let denied = get(increase("fleet_budget_retries_denied_total", step)).await?;
    let would = get(increase("fleet_budget_retries_would_deny_total", step)).await?;
    let breaker = get("max by (dependency) (fleet_budget_breaker_state)".to_owned()).await?;

    let mut names: BTreeSet<String> = BTreeSet::new();
    for s in [&successes, &firsts, &granted, &denied] {
        names.extend(s.keys().cloned());
    }
    if !only.is_empty() {
        names.retain(|n| only.contains(n));
        if names.is_empty() {
            return Err(anyhow::anyhow!(
                "{}: no series of fleet_budget_* counters for {} in the range",
                prometheus.shown(),
                only.join(", ")
            ));
        }
    }
    if names.is_empty() {
        return Err(anyhow::anyhow!(
            "{}: no fleet_budget_* counters in the range: does this Prometheus scrape the \
             workers' /metrics?",
            prometheus.shown()
        ));
    }
    if names.len() > MAX_DEPENDENCIES {
        return Err(usage(format!(
            "{} dependencies, more than the {MAX_DEPENDENCIES} one run tunes: name them with \
             --dependency",
            names.len()
        )));
    }
    // The budget window of each dependency: one set of window queries per distinct window.
    let mut windows: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for name in &names {
        let window_ms = policy(config, name).map_or(60_000, |p| {
            u64::try_from(p.window.as_millis()).unwrap_or(u64::MAX)
        });
        windows.entry(window_ms).or_default().push(name.clone());
    }
    let mut per_window: BTreeMap<u64, [Series; 4]> = BTreeMap::new();
    for window_ms in windows.keys() {
        per_window.insert(
            *window_ms,
            [
                get(increase("fleet_budget_successes_total", *window_ms)).await?,
                get(increase("fleet_budget_first_attempts_total", *window_ms)).await?,
                get(increase("fleet_budget_retries_granted_total", *window_ms)).await?,
                get(increase("fleet_budget_retries_denied_total", *window_ms)).await?,
            ],
        );
    }
    let value = |s: &Series, name: &str, t: u64| {
        s.get(name).and_then(|p| p.get(&t)).copied().unwrap_or(0.0)
    };
    let mut tuned = Vec::new();
    for (window_ms, deps) in &windows {
        let Some(w) = per_window.get(window_ms) else {
            continue;
        };
        for name in deps {
            let p = policy(config, name).unwrap_or_default();
            let request = p.deposit == DepositBasis::Request;
            let deposits = if request { &firsts } else { &successes };
            let window_deposits = if request { &w[1] } else { &w[0] };
            let shadow = would.contains_key(name);
            let samples = (0..=(range.end_ms - range.start_ms) / step)
                .map(|k| {
                    let t = range.start_ms + k * step;
                    let denied_now = value(&denied, name, t);
                    Sample {
                        at_ms: t,
                        deposits: value(deposits, name, t),
                        retries: value(&granted, name, t) + denied_now,
                        denied: denied_now,
                        breaker_open: value(&breaker, name, t) >= 1.0,
                        window_deposits: value(window_deposits, name, t),
                        window_retries: value(&w[2], name, t) + value(&w[3], name, t),
                        would_deny: shadow.then(|| value(&would, name, t)),
                    }
                })
                .collect();
            tuned.push(Tuned {
                dependency: name.clone(),
                current: Current {
                    ratio: p.ratio,
                    min_allowance: p.min_allowance,
                    window_secs: p.window.as_secs(),
                    deposit: if request { "request" } else { "success" },
                },
                recommendation: None,
                no_recommendation: None,
                tasks: Vec::new(),
                chart: None,
                samples,
            });
        }
    }
    tuned.sort_by(|a, b| a.dependency.cmp(&b.dependency));
    Ok(tuned)
}

/// The configured policy of `name` (`None` for a name that is not a valid dependency).
fn policy(config: &Config, name: &str) -> Option<fleet_budget::BudgetPolicy> {
    Dependency::new(name).ok().map(|d| config.policy(&d))
}

/// The tasks mapped to `dependency` and their ceilings; an unmapped dependency is a task of its
/// own name (the default of `[unmapped_tasks]`).
fn task_ceilings(config: &Config, dependency: &str) -> Vec<(String, TaskCeiling)> {
    let mut tasks: Vec<(String, TaskCeiling)> = config
        .map
        .entries()
        .into_iter()
        .filter(|(_, d)| d.as_str() == dependency)
        .map(|(t, _)| (t.to_owned(), config.ceilings.for_task(t)))
        .collect();
    if tasks.is_empty() {
        tasks.push((dependency.to_owned(), config.ceilings.for_task(dependency)));
    }
    tasks.sort_by(|a, b| a.0.cmp(&b.0));
    tasks
}

fn task_advice(config: &Config, dependency: &str, r: &Recommendation) -> Vec<TaskAdvice> {
    let Some(window) = r.window else {
        return Vec::new();
    };
    task_ceilings(config, dependency)
        .into_iter()
        .map(|(task, c)| {
            let schedule =
                Schedule::for_window(&c.backoff, Duration::from_secs(window.recovery_window_secs));
            TaskAdvice {
                task,
                ceiling: if c.recovery_window.is_some() {
                    "recovery_window_secs"
                } else {
                    "max_attempts"
                },
                backoff_base_ms: ms(c.backoff.base),
                backoff_factor: c.backoff.factor,
                backoff_cap_ms: ms(c.backoff.cap),
                attempts: schedule.max_attempts(),
                current_max_attempts: c.max_attempts,
                current_recovery_window_secs: c.recovery_window.map(|w| w.as_secs()),
            }
        })
        .collect()
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A duration in ms as people read it: the chart's words, one format for the tools.
pub(crate) use fleet_budget_sim::chart::human_ms;

fn fraction(f: f64) -> String {
    format!("{f:.4}")
}

fn text(tuned: &[Tuned], range: &Range, shown: &str) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "history: {shown}, {} to {}, a point every {} (counts over the step ending there)\n",
        rfc3339_ms(range.start_ms),
        rfc3339_ms(range.end_ms),
        human_ms(range.step_ms)
    );
    let mut rows = vec![
        [
            "dependency",
            "healthy p99",
            "ratio",
            "margin",
            "min_allowance",
            "incidents",
            "p95",
            "window",
            "shadow would_deny",
        ]
        .map(str::to_owned)
        .to_vec(),
    ];
    for t in tuned {
        let name = fleet_budget::printable::escape_text(&t.dependency).into_owned();
        let Some(r) = &t.recommendation else {
            rows.push(vec![name, "-".into(), "-".into()]);
            continue;
        };
        rows.push(vec![
            name,
            fraction(r.healthy_fraction),
            format!("{}", r.ratio),
            r.margin.map_or("-".into(), |m| format!("{m:.2}x")),
            r.min_allowance.to_string(),
            r.incidents.len().to_string(),
            r.window.map_or("-".into(), |w| human_ms(w.incident_p95_ms)),
            r.window
                .map_or("-".into(), |w| format!("{}s", w.recovery_window_secs)),
            r.shadow
                .map_or("no shadow data".into(), |s| format!("{:.0}", s.would_deny)),
        ]);
    }
    out.push_str(&table(&rows));
    for t in tuned {
        out.push('\n');
        out.push_str(&evidence(t));
    }
    out.push_str("\n# paste into the configuration:\n");
    for t in tuned {
        out.push_str(&toml_snippet(t));
    }
    out
}

/// The rules and the evidence of one dependency, in words.
fn evidence(t: &Tuned) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let name = fleet_budget::printable::escape_text(&t.dependency);
    let c = &t.current;
    let _ = writeln!(
        out,
        "{name} (now: ratio {}, min_allowance {}, window {}s, deposit = \"{}\")",
        c.ratio, c.min_allowance, c.window_secs, c.deposit
    );
    let Some(r) = &t.recommendation else {
        let why = t
            .no_recommendation
            .as_deref()
            .unwrap_or("no recommendation");
        let _ = writeln!(out, "  no recommendation: {why}");
        return out;
    };
    let _ = writeln!(
        out,
        "  healthy retry fraction: p99 {} (mean {}) over {} healthy steps of {} with traffic \
         (retries asked / {} per step; steps in an incident or with the breaker open left out)",
        fraction(r.healthy_fraction),
        fraction(r.healthy_mean_fraction),
        r.healthy_steps,
        r.steps_with_traffic,
        if c.deposit == "request" {
            "first attempts"
        } else {
            "successes"
        }
    );
    let _ = writeln!(
        out,
        "  ratio {}: 1.5 x the healthy p99, rounded up to two digits{}; it would have denied \
         retries in {} healthy steps",
        r.ratio,
        r.margin
            .map_or_else(String::new, |m| format!(" ({m:.2} x)")),
        r.healthy_steps_above_ratio
    );
    let _ = writeln!(
        out,
        "  min_allowance {}: {} healthy budget windows had more retries than ratio x deposits \
         (p99 short by {:.1}, at most {:.1}); at least 1, the probe",
        r.min_allowance, r.floor.windows_short, r.floor.needed_p99, r.floor.needed_max
    );
    if r.incidents.is_empty() {
        let _ = writeln!(
            out,
            "  incidents: none (no stretch of 2+ steps above the ratio or with the breaker \
             open): keep the ceilings as they are"
        );
    } else {
        let _ = writeln!(
            out,
            "  incidents: {} (stretches of 2+ steps above the ratio or with the breaker open):",
            r.incidents.len()
        );
        for i in r.incidents.iter().take(20) {
            let _ = writeln!(
                out,
                "    {}  {:>8}  peak {}  {} steps without a success, breaker open {} steps, \
                 {:.0} retries asked, {:.0} denied",
                rfc3339_ms(i.start_ms),
                human_ms(i.duration_ms),
                i.peak_fraction.map_or("inf".into(), fraction),
                i.steps_without_deposits,
                i.breaker_open_steps,
                i.retries,
                i.denied
            );
        }
        if r.incidents.len() > 20 {
            let _ = writeln!(out, "    ... and {} more", r.incidents.len() - 20);
        }
    }
    if let Some(w) = r.window {
        let _ = writeln!(
            out,
            "  recovery window {}s: the p95 of the incidents' durations ({})",
            w.recovery_window_secs,
            human_ms(w.incident_p95_ms)
        );
        for a in &t.tasks {
            let _ = writeln!(
                out,
                "    task {}: {} attempts with backoff {} x{} cap {} (budgetctl plan \
                 --recovery-window {}s --base {}ms --factor {} --cap {}ms); now {}",
                fleet_budget::printable::escape_text(&a.task),
                a.attempts,
                human_ms(a.backoff_base_ms),
                a.backoff_factor,
                human_ms(a.backoff_cap_ms),
                w.recovery_window_secs,
                a.backoff_base_ms,
                a.backoff_factor,
                a.backoff_cap_ms,
                a.current_recovery_window_secs.map_or_else(
                    || format!("max_attempts {}", a.current_max_attempts),
                    |w| format!("recovery_window_secs {w}")
                )
            );
        }
    }
    match r.shadow {
        Some(s) => {
            let _ = writeln!(
                out,
                "  shadow: enforcement would have denied {:.0} retries ({:.0} in healthy steps) \
                 with the policy in force",
                s.would_deny, s.would_deny_healthy
            );
        }
        None => {
            let _ = writeln!(
                out,
                "  shadow: no shadow data (no fleet_budget_retries_would_deny_total series)"
            );
        }
    }
    out
}

/// The TOML to paste. A dependency name TOML cannot take bare is quoted.
fn toml_snippet(t: &Tuned) -> String {
    use std::fmt::Write as _;
    let Some(r) = &t.recommendation else {
        return String::new();
    };
    let mut out = String::new();
    let _ = writeln!(out, "[dependencies.{}]", toml_key(&t.dependency));
    let _ = writeln!(
        out,
        "ratio = {}    # 1.5 x p99 healthy retry fraction {}",
        r.ratio,
        fraction(r.healthy_fraction)
    );
    let _ = writeln!(
        out,
        "min_allowance = {}    # p99 of what quiet windows lacked: {:.1}",
        r.min_allowance, r.floor.needed_p99
    );
    if let Some(w) = r.window {
        for a in &t.tasks {
            let _ = writeln!(out, "[tasks.{}]", toml_key(&a.task));
            if a.ceiling == "recovery_window_secs" {
                let _ = writeln!(
                    out,
                    "recovery_window_secs = {}    # p95 of {} incidents; {} attempts",
                    w.recovery_window_secs,
                    r.incidents.len(),
                    a.attempts
                );
            } else {
                let _ = writeln!(
                    out,
                    "max_attempts = {}    # what a {}s window (p95 of {} incidents) takes with \
                     this backoff",
                    a.attempts,
                    w.recovery_window_secs,
                    r.incidents.len()
                );
            }
        }
    }
    out
}

/// `name` as a TOML key: bare when it can be, else a basic string with escapes.
fn toml_key(name: &str) -> String {
    if !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return name.to_owned();
    }
    let mut out = String::from("\"");
    for c in name.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() || fleet_budget::printable::is_unsafe_char(c) => {
                out.push_str(&format!("\\u{:04X}", u32::from(c)));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_keys_are_bare_or_quoted() {
        assert_eq!(toml_key("paid-api"), "paid-api");
        assert_eq!(toml_key("a.b"), "\"a.b\"");
        assert_eq!(toml_key("x\"\n"), "\"x\\\"\\u000A\"");
    }

    #[test]
    fn the_step_keeps_within_the_points_prometheus_serves() {
        let now = SystemTime::now();
        let ago = |d: u64| When(now - Duration::from_secs(d));
        let r =
            Range::of(ago(14 * 86_400), Some(When(now)), None).unwrap_or_else(|e| panic!("{e}"));
        assert!((r.end_ms - r.start_ms) / r.step_ms < MAX_POINTS, "{r:?}");
        let r = Range::of(ago(3600), Some(When(now)), None).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.step_ms, 60_000);
        assert!(
            Range::of(
                ago(30 * 86_400),
                Some(When(now)),
                Some(Duration::from_secs(1))
            )
            .is_err()
        );
        assert!(Range::of(ago(10), Some(ago(20)), None).is_err());
    }
}
