//! `budgetctl budget freeze|unfreeze|set|clear`: operators' overrides of a dependency's budget,
//! with expiry, read by every worker's next script call; `budgetctl budget shadow|enforce`:
//! the switch between shadow and enforcement, read by every worker within its deny cache's
//! staleness. Each is recorded in the audit trail. The logic is
//! `fleet_budget::control::overrides` and `fleet_budget::control::enforcement`; this module
//! parses and prints.

use std::time::Duration;

use clap::{Args, Subcommand};
use fleet_budget::control::overrides::{MAX_ACTOR_BYTES, MAX_OVERRIDE_DURATION, MAX_REASON_BYTES};
use fleet_budget::control::{Change, OverrideAction, Switched, enforcement, overrides};
use fleet_budget::{Config, Dependency, Enforcement};

use crate::exit::usage;
use crate::output::print_json;
use crate::redis_conn;
use crate::when;

/// The version of the `--json` shape of `budget freeze|unfreeze|set|clear`
/// (`docs/schemas/budget-*.schema.json`).
const JSON_SCHEMA_VERSION: u32 = 1;

/// `budget`.
#[derive(Debug, Subcommand)]
pub(crate) enum BudgetCommand {
    /// No retry is granted for DEP (the floor included) until it expires or is lifted; first
    /// attempts are untouched; refused jobs are dead-lettered `budget_frozen`.
    Freeze(FreezeArgs),
    /// Lifts a freeze.
    Unfreeze(PlainArgs),
    /// Replaces the ratio and/or the floor of DEP for a while.
    Set(SetArgs),
    /// Removes every override of DEP.
    Clear(PlainArgs),
    /// Puts DEP in shadow: its budget decides as always and counts what it refuses, but a
    /// retry it refuses (`budget_exhausted`) is retried anyway, marked `fb-shadow-denied`.
    Shadow(SwitchArgs),
    /// Holds DEP to its budget again (or for the first time, whatever its configuration says).
    Enforce(SwitchArgs),
}

/// Who and why, for every override.
#[derive(Debug, Args)]
pub(crate) struct Who {
    /// Why (recorded in the audit trail and shown by `status`).
    #[arg(long)]
    reason: String,
    /// Who (default `$USER@<hostname>`).
    #[arg(long)]
    actor: Option<String>,
    /// Print one JSON object on stdout.
    #[arg(long)]
    json: bool,
}

/// `budget freeze`.
#[derive(Debug, Args)]
pub(crate) struct FreezeArgs {
    /// The dependency.
    dependency: String,
    /// How long (`30m`, `1h30m`; at most 366 days).
    #[arg(long = "for", value_name = "DURATION", value_parser = override_duration)]
    duration: Duration,
    #[command(flatten)]
    who: Who,
}

/// `budget set`.
#[derive(Debug, Args)]
pub(crate) struct SetArgs {
    /// The dependency.
    dependency: String,
    /// Retries allowed per deposit meanwhile (0–1000).
    #[arg(long, allow_negative_numbers = true, value_parser = |s: &str| crate::args::number_in(s, 0.0..=1000.0, "from 0 to 1000"))]
    ratio: Option<f64>,
    /// Retries always allowed per window meanwhile.
    #[arg(long, allow_negative_numbers = true, value_parser = clap::value_parser!(u64).range(0..=1_000_000_000))]
    min_allowance: Option<u64>,
    /// How long (`30m`, `1h30m`; at most 366 days).
    #[arg(long = "for", value_name = "DURATION", value_parser = override_duration)]
    duration: Duration,
    #[command(flatten)]
    who: Who,
}

/// `budget shadow` and `budget enforce`.
#[derive(Debug, Args)]
pub(crate) struct SwitchArgs {
    /// The dependency.
    dependency: String,
    /// How long (`30m`, `2h`; at most 366 days); without it, until the next switch.
    #[arg(long = "for", value_name = "DURATION", value_parser = override_duration)]
    duration: Option<Duration>,
    #[command(flatten)]
    who: Who,
}

/// `budget unfreeze` and `budget clear`.
#[derive(Debug, Args)]
pub(crate) struct PlainArgs {
    /// The dependency.
    dependency: String,
    #[command(flatten)]
    who: Who,
}

/// Parses `--for`: a duration from 1 ms to 366 days, the longest override `override.lua` takes.
fn override_duration(s: &str) -> Result<Duration, String> {
    let d = when::duration(s)?;
    if d > MAX_OVERRIDE_DURATION {
        return Err(format!("`{s}` must be at most 366d"));
    }
    Ok(d)
}

/// Runs the command.
pub(crate) async fn run(config: &Config, command: &BudgetCommand) -> anyhow::Result<()> {
    let (dependency, who, action) = match command {
        BudgetCommand::Shadow(a) => return switch(config, a, Enforcement::Shadow).await,
        BudgetCommand::Enforce(a) => return switch(config, a, Enforcement::Enforce).await,
        BudgetCommand::Freeze(a) => (
            &a.dependency,
            &a.who,
            OverrideAction::Freeze {
                duration: a.duration,
            },
        ),
        BudgetCommand::Unfreeze(a) => (&a.dependency, &a.who, OverrideAction::Unfreeze),
        BudgetCommand::Set(a) => {
            if a.ratio.is_none() && a.min_allowance.is_none() {
                return Err(usage("budget set needs --ratio and/or --min-allowance"));
            }
            (
                &a.dependency,
                &a.who,
                OverrideAction::Set {
                    duration: a.duration,
                    ratio: a.ratio,
                    min_allowance: a.min_allowance,
                },
            )
        }
        BudgetCommand::Clear(a) => (&a.dependency, &a.who, OverrideAction::Clear),
    };
    let (dep, actor) = checked(dependency, who)?;
    let store = redis_conn::connect(config, redis_conn::cli_timeout(config)).await?;
    let change = overrides::apply(
        &store,
        &config.audit.log(),
        &dep,
        action,
        &actor,
        &who.reason,
    )
    .await
    .map_err(|e| redis_conn::unreachable(&config.redis_display(), &e))?;
    if who.json {
        return print_json(
            JSON_SCHEMA_VERSION,
            &serde_json::json!({
                "dependency": dep.as_str(),
                "action": action.as_str(),
                "actor": actor,
                "reason": who.reason,
                "change": change,
            }),
        );
    }
    outln!("{}", describe(&dep, action, &change));
    Ok(())
}

/// The dependency and the actor of a command, refused here, naming the flag, before anything is
/// sent when Redis would refuse them.
fn checked(dependency: &str, who: &Who) -> anyhow::Result<(Dependency, String)> {
    let dep = Dependency::new(dependency)
        .map_err(|e| usage(format!("{dependency:?}: a dependency name {e}")))?;
    let actor = who.actor.clone().unwrap_or_else(when::default_actor);
    if who.reason.len() > MAX_REASON_BYTES {
        return Err(usage(format!(
            "--reason is {} bytes long, at most {MAX_REASON_BYTES} allowed",
            who.reason.len()
        )));
    }
    if actor.len() > MAX_ACTOR_BYTES {
        return Err(usage(format!(
            "--actor (or $USER@<hostname>) is {} bytes long, at most {MAX_ACTOR_BYTES} allowed",
            actor.len()
        )));
    }
    Ok((dep, actor))
}

/// `budget shadow|enforce`: switches the dependency to `to`.
async fn switch(config: &Config, a: &SwitchArgs, to: Enforcement) -> anyhow::Result<()> {
    let (dep, actor) = checked(&a.dependency, &a.who)?;
    let store = redis_conn::connect(config, redis_conn::cli_timeout(config)).await?;
    let switched = enforcement::switch(
        &store,
        &config.audit.log(),
        &dep,
        to,
        a.duration,
        &actor,
        &a.who.reason,
    )
    .await
    .map_err(|e| redis_conn::unreachable(&config.redis_display(), &e))?;
    if a.who.json {
        return print_json(
            JSON_SCHEMA_VERSION,
            &serde_json::json!({
                "dependency": dep.as_str(),
                "action": to.as_str(),
                "actor": actor,
                "reason": a.who.reason,
                "configured": config.enforcement.of(&dep).as_str(),
                "switch": switched,
            }),
        );
    }
    outln!(
        "{}",
        describe_switch(&dep, config.enforcement.of(&dep), &switched)
    );
    Ok(())
}

#[allow(clippy::cast_precision_loss)]
fn describe_switch(dep: &Dependency, configured: Enforcement, switched: &Switched) -> String {
    let what = match switched.after.enforcement {
        Enforcement::Shadow => "in shadow: refused retries are counted and retried anyway",
        Enforcement::Enforce => "enforced: refused retries are dead-lettered",
    };
    let ends = switched.after.until_ms.map_or_else(
        || "until the next switch".to_owned(),
        |until| {
            format!(
                "until {} (in {:.0}s), then {configured} as configured",
                when::rfc3339_ms(until),
                until.saturating_sub(switched.at_ms) as f64 / 1000.0
            )
        },
    );
    format!("{dep}: {what}, {ends}; every worker follows within its deny cache's staleness")
}

#[allow(clippy::cast_precision_loss)]
fn describe(dep: &Dependency, action: OverrideAction, change: &Change) -> String {
    let ends = |until: u64| {
        format!(
            "until {} (in {:.0}s)",
            when::rfc3339_ms(until),
            until.saturating_sub(change.at_ms) as f64 / 1000.0
        )
    };
    match action {
        OverrideAction::Freeze { .. } => change.after.freeze.as_ref().map_or_else(
            || format!("{dep}: freeze not in force"),
            |f| format!("{dep}: frozen {}: no retry is granted", ends(f.until_ms)),
        ),
        OverrideAction::Set { .. } => change.after.set.as_ref().map_or_else(
            || format!("{dep}: set override not in force"),
            |s| {
                format!(
                    "{dep}: ratio {} min_allowance {} {}",
                    s.ratio
                        .map_or_else(|| "(policy's)".to_owned(), |r| r.to_string()),
                    s.min_allowance
                        .map_or_else(|| "(policy's)".to_owned(), |m| m.to_string()),
                    ends(s.until_ms)
                )
            },
        ),
        OverrideAction::Unfreeze => format!(
            "{dep}: unfrozen{}",
            if change.before.freeze.is_some() {
                ""
            } else {
                " (was not frozen)"
            }
        ),
        OverrideAction::Clear => format!(
            "{dep}: overrides cleared{}",
            if change.before.is_empty() {
                " (there were none)"
            } else {
                ""
            }
        ),
    }
}
