//! `budgetctl doctor`: what the budgets depend on, checked before it costs an incident.
//!
//! Every fault the project's tests make is one they chose; production infrastructure has its
//! own (issue 33): an eviction policy that lifts an operator's freeze, a Redis that forgets
//! every budget on restart, a renamed `SCRIPT`, an ACL user without `EVALSHA`, a policy with
//! `max-length` on the dead-letter queue, a memory alarm that blocks every publish. Each check
//! here names what it found and, for a risk, what it costs and what to do:
//!
//! * `redis.rs`: the server (version, mode, cluster slots), the settings of
//!   `fleet_budget::risks` (eviction, persistence), latency (`PING` beside one `status.lua`),
//!   every script loaded, `EVALSHA`, and the key patterns under the user's ACL;
//! * `rabbitmq.rs`: the broker (version, quorum queues), the topology against `migrations/`
//!   (a dry run of `migrate`: nothing is declared), and through the management HTTP API
//!   (`management.rs`), policies on our queues, resource alarms and `consumer_timeout`.
//!
//! No key is written and nothing declared: the scripts are loaded into the script cache (as every
//! worker does), and the script calls read a budget key of doctor's own that never exists.
//! Exit 0 when no check finds a risk, 3 when one does, 4 when none does but some could not
//! check ([`crate::exit`]).

mod management;
mod rabbitmq;
mod redis;

use clap::Args;
use fleet_budget::redact::redact_url;
use fleet_budget_amqp::WorkerConfig;
use serde::Serialize;

use crate::exit::{NOT_CHECKED, RISK, Verdict};
use crate::output::{print_json, table_aligned};

/// The version of this command's `--json` shape (`docs/schemas/doctor.schema.json`).
const JSON_SCHEMA_VERSION: u32 = 1;

/// `doctor`.
#[derive(Debug, Args)]
pub(crate) struct DoctorArgs {
    /// RabbitMQ's management HTTP API (`http://user:password@host:15672`; without credentials,
    /// those of the AMQP URL): policies on our queues, resource alarms, `consumer_timeout`.
    /// Without it those checks say "not checked".
    #[arg(
        long,
        value_name = "URL",
        env = "FLEET_BUDGET_RABBITMQ_MANAGEMENT_URL",
        hide_env_values = true
    )]
    rabbitmq_management_url: Option<String>,
    /// Skip the RabbitMQ checks (a fleet that only uses the budget).
    #[arg(long)]
    no_rabbitmq: bool,
    /// Skip the Redis checks.
    #[arg(long)]
    no_redis: bool,
    /// Print one JSON object on stdout.
    #[arg(long)]
    json: bool,
}

/// What a check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum State {
    /// No risk.
    Ok,
    /// A risk: the check says what it costs and what to do.
    Risk,
    /// The check could not run; `found` says why.
    NotChecked,
}

impl State {
    fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Risk => "RISK",
            Self::NotChecked => "not checked",
        }
    }
}

/// One check.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Check {
    service: &'static str,
    check: &'static str,
    state: State,
    found: String,
    cost: Option<String>,
    action: Option<String>,
}

impl Check {
    pub(crate) fn ok(service: &'static str, check: &'static str, found: impl Into<String>) -> Self {
        Self {
            service,
            check,
            state: State::Ok,
            found: found.into(),
            cost: None,
            action: None,
        }
    }

    pub(crate) fn risk(
        service: &'static str,
        check: &'static str,
        found: impl Into<String>,
        cost: impl Into<String>,
        action: impl Into<String>,
    ) -> Self {
        Self {
            service,
            check,
            state: State::Risk,
            found: found.into(),
            cost: Some(cost.into()),
            action: Some(action.into()),
        }
    }

    pub(crate) fn not_checked(
        service: &'static str,
        check: &'static str,
        why: impl Into<String>,
    ) -> Self {
        Self {
            service,
            check,
            state: State::NotChecked,
            found: why.into(),
            cost: None,
            action: None,
        }
    }
}

/// Round trips timed side by side on the same connection (milliseconds).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Latency {
    samples: usize,
    ping_median_ms: f64,
    ping_max_ms: f64,
    status_script_median_ms: f64,
    status_script_max_ms: f64,
}

#[derive(Debug, Serialize)]
struct DoctorReport {
    redis: Option<String>,
    rabbitmq: Option<String>,
    rabbitmq_management: Option<String>,
    verdict: State,
    risks: usize,
    not_checked: usize,
    latency: Option<Latency>,
    checks: Vec<Check>,
}

/// Runs every check and prints them; the verdict is the exit code.
pub(crate) async fn run(config: &WorkerConfig, args: &DoctorArgs) -> anyhow::Result<()> {
    let management = match &args.rabbitmq_management_url {
        Some(url) if !args.no_rabbitmq => Some(management::Management::new(url, config)?),
        _ => None,
    };
    let mut checks = Vec::new();
    let mut latency = None;
    if !args.no_redis {
        let (redis_checks, measured) = redis::checks(config).await;
        checks.extend(redis_checks);
        latency = measured;
    }
    if !args.no_rabbitmq {
        checks.extend(rabbitmq::checks(config, management.as_ref()).await);
    }
    let risks = checks.iter().filter(|c| c.state == State::Risk).count();
    let not_checked = checks
        .iter()
        .filter(|c| c.state == State::NotChecked)
        .count();
    let verdict = if risks > 0 {
        State::Risk
    } else if not_checked > 0 {
        State::NotChecked
    } else {
        State::Ok
    };
    let report = DoctorReport {
        redis: (!args.no_redis).then(|| config.budget.redis_display()),
        rabbitmq: (!args.no_rabbitmq).then(|| config.amqp.shown_urls()),
        rabbitmq_management: management.as_ref().map(|m| m.shown().to_owned()),
        verdict,
        risks,
        not_checked,
        latency,
        checks,
    };
    if args.json {
        print_json(JSON_SCHEMA_VERSION, &report)?;
    } else {
        print_text(&report);
    }
    match verdict {
        State::Ok => Ok(()),
        State::Risk => Err(Verdict(RISK).into()),
        State::NotChecked => Err(Verdict(NOT_CHECKED).into()),
    }
}

fn print_text(report: &DoctorReport) {
    if let Some(redis) = &report.redis {
        outln!("Redis at {redis}");
    }
    if let Some(amqp) = &report.rabbitmq {
        outln!("RabbitMQ at {amqp}");
    }
    if let Some(m) = &report.rabbitmq_management {
        outln!("RabbitMQ management API at {}", redact_url(m));
    }
    outln!();
    let mut rows = vec![vec![
        "service".to_owned(),
        "check".to_owned(),
        "state".to_owned(),
        "found".to_owned(),
    ]];
    for c in &report.checks {
        rows.push(vec![
            c.service.to_owned(),
            c.check.to_owned(),
            c.state.as_str().to_owned(),
            c.found.clone(),
        ]);
    }
    out!("{}", table_aligned(&rows, &[0, 1, 2, 3]));
    if let Some(l) = &report.latency {
        outln!();
        outln!(
            "latency ({} samples each, same connection): PING median {:.2} ms (max {:.2}), status.lua median {:.2} ms (max {:.2})",
            l.samples,
            l.ping_median_ms,
            l.ping_max_ms,
            l.status_script_median_ms,
            l.status_script_max_ms
        );
    }
    for c in report.checks.iter().filter(|c| c.state == State::Risk) {
        outln!();
        outln!("RISK {} {}: {}", c.service, c.check, c.found);
        if let Some(cost) = &c.cost {
            outln!("  what it costs: {cost}");
        }
        if let Some(action) = &c.action {
            outln!("  what to do: {action}");
        }
    }
    outln!();
    outln!(
        "{} risk(s), {} check(s) not made, {} check(s) in all",
        report.risks,
        report.not_checked,
        report.checks.len()
    );
}
