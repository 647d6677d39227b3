//! `budgetctl status`: live per-dependency budget state, read from Redis.

mod trend;

use std::io::{IsTerminal, Write};
use std::time::Duration;

use clap::Args;
use fleet_budget::StoreError;
use fleet_budget::breaker::{BreakerState, BreakerStatus, status_on};
use fleet_budget::control::{FleetStatus, Overrides, fleet_status};
use fleet_budget::printable::escape_text;
use fleet_budget::store::RedisStore;
use fleet_budget::{BudgetSnapshot, Config, Dependency, WindowCounters};
use serde::Serialize;

use self::trend::Trend;
use crate::exit::usage;
use crate::output::{print_json, table_aligned};
use crate::redis_conn;

/// The version of this command's `--json` shape (`docs/schemas/status.schema.json`).
const JSON_SCHEMA_VERSION: u32 = 1;

/// `status`.
#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    /// Only this dependency.
    #[arg(long)]
    dependency: Option<String>,
    /// Print one JSON object on stdout.
    #[arg(long, conflicts_with = "watch")]
    json: bool,
    /// Redraw every second until interrupted.
    #[arg(long)]
    watch: bool,
}

/// Amplification above this, sustained, deserves an alert (docs/semantics: "Observability").
pub(crate) const AMPLIFICATION_ALERT: f64 = 1.5;

/// One dependency's budget, as `status` shows it. Counts are the sliding estimates over the
/// last window (current window + the part of the previous one still inside it), the same
/// numbers the allowance is computed from.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct DependencyStatus {
    pub(crate) dependency: String,
    pub(crate) window_secs: f64,
    pub(crate) window_remaining_secs: f64,
    pub(crate) successes: u64,
    pub(crate) first_attempts: u64,
    /// First attempts and retries granted.
    pub(crate) executions: u64,
    pub(crate) retries_granted: u64,
    pub(crate) retries_denied: u64,
    pub(crate) allowance: u64,
    pub(crate) remaining: u64,
    /// Executions per job, `executions / first_attempts`; null without traffic.
    pub(crate) amplification: Option<f64>,
    /// The policy in force in Redis (`window_ms ratio min_allowance basis mode`), not the CLI's.
    pub(crate) policy_in_force: String,
    /// Calls that sent another policy, the last of them, and how long ago (s).
    pub(crate) conflicts: u64,
    pub(crate) conflicting_policy: Option<String>,
    pub(crate) conflict_age_secs: Option<f64>,
    /// The operators' overrides in force, with who, why and when they expire.
    pub(crate) overrides: Overrides,
    /// Server ms of the read (override times are server ms too).
    pub(crate) now_ms: u64,
    /// The current window's index (server time / window length), for `--watch`'s trend.
    #[serde(skip)]
    pub(crate) window_index: u64,
    /// The circuit breaker, for a dependency with a `[dependencies.X.breaker]` section.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) breaker: Option<BreakerLine>,
    /// Deprecated: `retries_granted` under its name before 0.2.0, printed until 0.3.0.
    pub(crate) retries: u64,
    /// Deprecated: `retries_denied` under its name before 0.2.0, printed until 0.3.0.
    pub(crate) denied: u64,
}

/// A dependency's circuit breaker as Redis holds it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct BreakerLine {
    /// `closed`, `open` or `half_open` (an open breaker whose period ended half-opens at the
    /// next call: shown as `half_open` with `open_remaining_secs` 0).
    pub(crate) state: &'static str,
    pub(crate) open_remaining_secs: f64,
    pub(crate) probes_issued: u64,
    pub(crate) probe_successes: u64,
    /// Seconds since the last change of state; null if it never changed while the key lived.
    pub(crate) changed_secs_ago: Option<f64>,
    pub(crate) times_opened: u64,
    /// Calls and failures in the breaker's window (sliding estimates).
    pub(crate) calls: f64,
    pub(crate) failures: f64,
}

impl BreakerLine {
    #[allow(clippy::cast_precision_loss)]
    fn new(s: &BreakerStatus) -> Self {
        let due = s.state == BreakerState::Open && s.now_ms >= s.open_until_ms;
        Self {
            state: if due {
                BreakerState::HalfOpen.as_str()
            } else {
                s.state.as_str()
            },
            open_remaining_secs: if s.state == BreakerState::Open {
                s.open_until_ms.saturating_sub(s.now_ms) as f64 / 1000.0
            } else {
                0.0
            },
            probes_issued: s.probes_issued,
            probe_successes: s.probe_successes,
            changed_secs_ago: (s.changed_ms > 0)
                .then(|| s.now_ms.saturating_sub(s.changed_ms) as f64 / 1000.0),
            times_opened: s.times_opened,
            calls: s.volume,
            failures: s.failures,
        }
    }

    fn render(&self) -> String {
        let changed = self
            .changed_secs_ago
            .map_or_else(String::new, |s| format!(", changed {s:.1}s ago"));
        match self.state {
            "open" => format!(
                "  BREAKER OPEN: no call runs, jobs wait in the delay tiers; half-opens in {:.1}s (opened {} times{changed})\n",
                self.open_remaining_secs, self.times_opened
            ),
            "half_open" => format!(
                "  BREAKER HALF-OPEN: {} probes out, {} succeeded (opened {} times{changed})\n",
                self.probes_issued, self.probe_successes, self.times_opened
            ),
            _ => format!(
                "  breaker closed: {:.0} failures of {:.0} calls in its window (opened {} times{changed})\n",
                self.failures, self.calls, self.times_opened
            ),
        }
    }
}

impl DependencyStatus {
    #[allow(clippy::cast_precision_loss)]
    pub(crate) fn new(dependency: &Dependency, fleet: &FleetStatus) -> Self {
        let s: &BudgetSnapshot = &fleet.snapshot;
        let p = &fleet.policy;
        let WindowCounters {
            successes,
            first_attempts,
            retries,
            denied,
        } = s.estimates();
        Self {
            dependency: dependency.to_string(),
            window_secs: s.window_ms as f64 / 1000.0,
            window_remaining_secs: s.ms_until_roll() as f64 / 1000.0,
            successes,
            first_attempts,
            executions: first_attempts + retries,
            retries_granted: retries,
            retries_denied: denied,
            allowance: s.allowance,
            remaining: s.remaining(),
            amplification: (first_attempts > 0)
                .then(|| (first_attempts + retries) as f64 / first_attempts as f64),
            policy_in_force: format!(
                "window {}ms, ratio {}, min_allowance {}, deposit {}, mode {}",
                p.window_ms(),
                p.ratio,
                p.min_allowance,
                p.deposit.as_str(),
                p.mode.as_str()
            ),
            conflicts: fleet.conflicts,
            conflicting_policy: fleet.conflicting_policy.clone(),
            conflict_age_secs: fleet.conflict_age_ms.map(|ms| ms as f64 / 1000.0),
            overrides: fleet.overrides.clone(),
            now_ms: fleet.now_ms,
            window_index: s.window_index,
            breaker: None,
            retries,
            denied,
        }
    }

    /// The lines under the table: policy in force, conflicts, overrides.
    #[allow(clippy::cast_precision_loss)]
    fn details(&self) -> String {
        let secs = |until: u64| until.saturating_sub(self.now_ms) as f64 / 1000.0;
        let mut out = format!(
            "{}: policy in force: {}\n",
            self.dependency, self.policy_in_force
        );
        if let (Some(policy), Some(age)) = (&self.conflicting_policy, self.conflict_age_secs) {
            let policy = escape_text(policy);
            out.push_str(&format!(
                "  CONFLICT: {} calls sent another policy, the last `{policy}` {age:.1}s ago \
                 (window_ms ratio min_allowance basis mode); they are served by the policy in force\n",
                self.conflicts
            ));
        }
        if let Some(b) = &self.breaker {
            out.push_str(&b.render());
        }
        if let Some(f) = &self.overrides.freeze {
            out.push_str(&format!(
                "  FROZEN by {} (\"{}\"): no retry granted, expires in {:.1}s\n",
                escape_text(&f.actor),
                escape_text(&f.reason),
                secs(f.until_ms)
            ));
        }
        if let Some(o) = &self.overrides.set {
            let ratio = o.ratio.map_or_else(String::new, |r| format!(" ratio {r}"));
            let floor = o
                .min_allowance
                .map_or_else(String::new, |m| format!(" min_allowance {m}"));
            out.push_str(&format!(
                "  SET{ratio}{floor} by {} (\"{}\"), expires in {:.1}s\n",
                escape_text(&o.actor),
                escape_text(&o.reason),
                secs(o.until_ms)
            ));
        }
        out
    }

    /// What an operator should look at, if anything.
    pub(crate) fn alert(&self) -> &'static str {
        if self.overrides.freeze.is_some() {
            "FROZEN: an operator froze retries"
        } else if self
            .breaker
            .as_ref()
            .is_some_and(|b| b.state != BreakerState::Closed.as_str())
        {
            "BREAKER: circuit open, jobs wait instead of calling"
        } else if self.retries_denied > 0 && self.remaining == 0 {
            "DENYING: budget exhausted, retries are dead-lettered"
        } else if self.amplification.is_some_and(|a| a > AMPLIFICATION_ALERT) {
            "AMPLIFIED: retries above 50% of traffic"
        } else if self.retries_denied > 0 {
            "denials in the last window"
        } else {
            ""
        }
    }
}

/// A dependency whose key the scripts refuse (of another type, or tampered with): shown beside
/// the healthy ones, and `status` exits 1 after printing everything.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct KeyProblem {
    pub(crate) dependency: String,
    pub(crate) key: String,
    pub(crate) error: String,
}

#[derive(Debug, Serialize)]
struct StatusReport {
    redis: String,
    key_prefix: String,
    dependencies: Vec<DependencyStatus>,
    unusable: Vec<KeyProblem>,
}

impl StatusReport {
    /// The error to exit with after printing, when a key was unusable.
    fn failure(&self) -> anyhow::Result<()> {
        match self.unusable.as_slice() {
            [] => Ok(()),
            [one] => Err(anyhow::anyhow!(
                "budget key {} of dependency {} cannot be used: {}",
                one.key,
                one.dependency,
                one.error
            )),
            many => Err(anyhow::anyhow!(
                "{} budget keys cannot be used (listed above)",
                many.len()
            )),
        }
    }
}

/// Runs the command.
pub(crate) async fn run(config: &Config, args: &StatusArgs) -> anyhow::Result<()> {
    let only = match &args.dependency {
        Some(d) => Some(
            Dependency::new(d)
                .map_err(|e| usage(format!("--dependency {d:?}: a dependency name {e}")))?,
        ),
        None => None,
    };
    let store = redis_conn::connect(config, redis_conn::cli_timeout(config)).await?;
    let mut first = true;
    let mut trend = Trend::default();
    loop {
        let report = collect(config, &store, only.as_ref()).await?;
        if args.json {
            print_json(JSON_SCHEMA_VERSION, &report)?;
            return report.failure();
        }
        let mut text = render(&report);
        if args.watch {
            trend.record(&report.dependencies);
            text.push_str(&trend.render());
        }
        let mut out = std::io::stdout().lock();
        if args.watch && std::io::stdout().is_terminal() {
            // Clear the screen and redraw in place.
            write!(out, "\x1b[2J\x1b[H")?;
        } else if args.watch && !first {
            writeln!(out)?;
        }
        write!(out, "{text}")?;
        out.flush()?;
        drop(out);
        first = false;
        if !args.watch {
            return report.failure();
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
    }
}

async fn collect(
    config: &Config,
    store: &RedisStore,
    only: Option<&Dependency>,
) -> anyhow::Result<StatusReport> {
    let shown = config.redis_display();
    let dependencies: Vec<Dependency> = match only {
        Some(d) => vec![d.clone()],
        None => {
            let mut deps: Vec<Dependency> = config.policies.keys().cloned().collect();
            let found = store
                .discover_dependencies()
                .await
                .map_err(|e| redis_conn::unreachable(&e.node, &e.source))?;
            deps.extend(found);
            deps.sort();
            deps.dedup();
            deps
        }
    };
    let mut rows = Vec::new();
    let mut unusable = Vec::new();
    for dependency in &dependencies {
        let policy = config.policy(dependency);
        match fleet_status(store, dependency, &policy).await {
            Ok(fleet) => {
                let mut row = DependencyStatus::new(dependency, &fleet);
                if let Some(policy) = config.breakers.get(dependency) {
                    match status_on(store, dependency, policy).await {
                        Ok(b) => row.breaker = Some(BreakerLine::new(&b)),
                        Err(StoreError::BadKey { key, detail }) => unusable.push(KeyProblem {
                            dependency: dependency.to_string(),
                            key,
                            error: fleet_budget::redact::redact_text(&detail),
                        }),
                        Err(e) => return Err(redis_conn::unreachable(&shown, &e)),
                    }
                }
                rows.push(row);
            }
            Err(StoreError::BadKey { key, detail }) => unusable.push(KeyProblem {
                dependency: dependency.to_string(),
                key,
                error: fleet_budget::redact::redact_text(&detail),
            }),
            Err(e) => return Err(redis_conn::unreachable(&shown, &e)),
        }
    }
    Ok(StatusReport {
        redis: shown,
        key_prefix: config.redis.key_prefix.clone(),
        dependencies: rows,
        unusable,
    })
}

fn render(report: &StatusReport) -> String {
    let mut out = format!(
        "budgets in {} under `{}` (sliding estimates over the last window)\n",
        report.redis, report.key_prefix
    );
    if report.dependencies.is_empty() && report.unusable.is_empty() {
        out.push_str("no dependency configured or found in Redis\n");
        return out;
    }
    let mut rows = vec![
        [
            "dependency",
            "window",
            "rolls in",
            "successes",
            "first attempts",
            "executions",
            "retries granted",
            "retries denied",
            "allowance",
            "remaining",
            "amplif.",
            "alert",
        ]
        .map(str::to_owned)
        .to_vec(),
    ];
    for d in &report.dependencies {
        rows.push(vec![
            d.dependency.clone(),
            format!("{}s", d.window_secs),
            format!("{:.1}s", d.window_remaining_secs),
            d.successes.to_string(),
            d.first_attempts.to_string(),
            d.executions.to_string(),
            d.retries_granted.to_string(),
            d.retries_denied.to_string(),
            d.allowance.to_string(),
            d.remaining.to_string(),
            d.amplification
                .map_or_else(|| "-".to_owned(), |a| format!("{a:.2}x")),
            d.alert().to_owned(),
        ]);
    }
    out.push_str(&table_aligned(&rows, &[0, 11]));
    for d in &report.dependencies {
        out.push_str(&d.details());
    }
    for p in &report.unusable {
        out.push_str(&format!(
            "UNUSABLE {}: key {} {}
",
            p.dependency, p.key, p.error
        ));
    }
    out
}
