//! `budgetctl audit`: the trail of overrides, replays, purges and migrations kept in Redis
//! (`fleet_budget::control::audit`).

use clap::Args;
use fleet_budget::Config;
use fleet_budget::control::AuditEntry;
use fleet_budget::printable::escape_text;

use crate::output::{print_json, table_aligned};
use crate::redis_conn;
use crate::when::{self, When};

/// The version of this command's `--json` shape (`docs/schemas/audit.schema.json`).
const JSON_SCHEMA_VERSION: u32 = 1;

/// `audit`.
#[derive(Debug, Args)]
pub(crate) struct AuditArgs {
    /// Only entries since this time: RFC 3339 or a duration ago (`1h30m`).
    #[arg(long, value_parser = when::when)]
    since: Option<When>,
    /// Only entries until this time: RFC 3339 or a duration ago.
    #[arg(long, value_parser = when::when)]
    until: Option<When>,
    /// Only this dependency.
    #[arg(long)]
    dependency: Option<String>,
    /// At most this many (the newest).
    #[arg(long, allow_negative_numbers = true, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    limit: u64,
    /// Print one JSON object on stdout.
    #[arg(long)]
    json: bool,
}

/// Who runs a replay, purge or migration and why, for the audit trail.
#[derive(Debug, Args)]
pub(crate) struct Trail {
    /// Who, for the audit trail (default `$USER@<hostname>`).
    #[arg(long)]
    actor: Option<String>,
    /// Why, for the audit trail (`"INC-123: search recovered"`).
    #[arg(long, value_name = "TEXT", default_value = "")]
    note: String,
}

impl Trail {
    /// The actor: `--actor`, else `$USER@<hostname>`.
    pub(crate) fn actor(&self) -> String {
        self.actor.clone().unwrap_or_else(when::default_actor)
    }

    /// The operator's why (may be empty).
    pub(crate) fn note(&self) -> &str {
        &self.note
    }
}

/// Records `entry` in the audit trail (bounded by `[audit]`). Called after the action and its
/// output: a failure says the action was done but not recorded (exit 1).
pub(crate) async fn record(config: &Config, entry: &AuditEntry) -> anyhow::Result<()> {
    let not_recorded = |e: &dyn std::fmt::Display| {
        anyhow::anyhow!(
            "{} was done, but its audit entry could not be written: {}",
            entry.action,
            fleet_budget::redact::redact_text(&e.to_string())
        )
    };
    let store = redis_conn::connect(config, redis_conn::cli_timeout(config))
        .await
        .map_err(|e| not_recorded(&format!("{e:#}")))?;
    config
        .audit
        .log()
        .record(&store, entry)
        .await
        .map_err(|e| not_recorded(&e))?;
    Ok(())
}

/// The run id an entry names (`after.run`), for replays and purges.
fn run_of(e: &fleet_budget::control::AuditEntry) -> Option<String> {
    e.after.as_ref()?.get("run")?.as_str().map(str::to_owned)
}

/// Runs the command.
pub(crate) async fn run(config: &Config, args: &AuditArgs) -> anyhow::Result<()> {
    let store = redis_conn::connect(config, redis_conn::cli_timeout(config)).await?;
    let entries = config
        .audit
        .log()
        .read(
            &store,
            args.since.map(When::unix_ms),
            args.until.map(When::unix_ms),
            args.dependency.as_deref(),
            usize::try_from(args.limit).unwrap_or(usize::MAX),
        )
        .await
        .map_err(|e| redis_conn::unreachable(&config.redis_display(), &e))?;
    // An intent without its end in this listing: where the run stood last (the run journal).
    let open_runs: Vec<String> = entries
        .iter()
        .filter(|e| {
            e.action
                .ends_with(fleet_budget_amqp::replay::audit::STARTED)
        })
        .filter_map(run_of)
        .filter(|run| {
            !entries.iter().any(|end| {
                !end.action
                    .ends_with(fleet_budget_amqp::replay::audit::STARTED)
                    && run_of(end).as_deref() == Some(run.as_str())
            })
        })
        .collect();
    let last = fleet_budget::control::RunJournal::new(std::sync::Arc::clone(&store))
        .last(&open_runs)
        .await
        .unwrap_or_default();
    if args.json {
        return print_json(
            JSON_SCHEMA_VERSION,
            &serde_json::json!({ "entries": entries }),
        );
    }
    if entries.is_empty() {
        outln!("no audit entries");
        return Ok(());
    }
    let mut rows = vec![
        [
            "time",
            "actor",
            "action",
            "dependency",
            "reason",
            "before → after",
        ]
        .map(str::to_owned)
        .to_vec(),
    ];
    // Anyone with access to Redis can add an entry: its text is shown with control and
    // bidirectional characters as codes, so that it cannot drive the terminal, break the table
    // into lines of its own, or read as something it is not.
    let shown = |text: &str| escape_text(text).into_owned();
    for e in &entries {
        let json = |v: &Option<serde_json::Value>| {
            v.as_ref()
                .map_or_else(|| "-".to_owned(), |v| shown(&v.to_string()))
        };
        rows.push(vec![
            when::rfc3339_ms(e.at_ms),
            shown(&e.actor),
            shown(&e.action),
            e.dependency
                .as_deref()
                .map_or_else(|| "-".to_owned(), shown),
            if e.reason.is_empty() {
                "-".to_owned()
            } else {
                shown(&e.reason)
            },
            {
                let mut shown_after = format!("{} → {}", json(&e.before), json(&e.after));
                if let Some(run) = run_of(e)
                    && let Some(i) = open_runs.iter().position(|r| *r == run)
                {
                    let progress = last.get(i).cloned().flatten().map_or_else(
                        || "no progress recorded".to_owned(),
                        |p| shown(&p.to_string()),
                    );
                    shown_after.push_str(&format!(" [no end recorded; last progress: {progress}]"));
                }
                shown_after
            },
        ]);
    }
    out!("{}", table_aligned(&rows, &[0, 1, 2, 3, 4, 5]));
    Ok(())
}
