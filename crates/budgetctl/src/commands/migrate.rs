//! `budgetctl migrate`: declares or upgrades the broker topology of the repository's
//! `migrations/` (compiled into `fleet-budget-amqp`).

use clap::Args;
use fleet_budget::redact::redact_url;
use fleet_budget_amqp::{MigrationReport, Migrations, StepState, WorkerConfig};
use serde::Serialize;

use crate::amqp_conn::broker_error;
use crate::commands::audit::{Trail, record};
use crate::commands::dlq::{ReindexedQueue, index_unindexed};
use crate::output::print_json;

/// The version of this command's `--json` shape (`docs/schemas/migrate.schema.json`).
const JSON_SCHEMA_VERSION: u32 = 1;

/// `migrate`.
#[derive(Debug, Args)]
pub(crate) struct MigrateArgs {
    /// Show what would be declared, declare nothing.
    #[arg(long)]
    dry_run: bool,
    #[command(flatten)]
    trail: Trail,
    /// Print one JSON object on stdout.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Serialize)]
struct MigrateStep {
    version: u32,
    object: String,
    state: &'static str,
}

#[derive(Debug, Serialize)]
struct MigrateReport {
    amqp: String,
    prefix: String,
    dry_run: bool,
    created: usize,
    steps: Vec<MigrateStep>,
    /// Queues whose dead letters predated the dead-letter index, indexed once (read and put
    /// back); empty when there were none, and in a dry run.
    indexed: Vec<ReindexedQueue>,
}

/// `budgetctl migrate [--dry-run]`: applies the embedded migrations (idempotently). A migration
/// that created something is recorded in the audit trail; a dry run or a no-op is not (a deploy
/// that runs `migrate` every time would bury the changes).
pub(crate) async fn run(config: &WorkerConfig, args: &MigrateArgs) -> anyhow::Result<()> {
    let migrations =
        Migrations::embedded().map_err(|e| anyhow::anyhow!("embedded migrations: {e}"))?;
    let report =
        fleet_budget_amqp::migrate(&config.amqp.url, &config.amqp, &migrations, args.dry_run)
            .await
            .map_err(|e| broker_error(config, &e))?;
    let mut out = MigrateReport {
        amqp: redact_url(&config.amqp.url),
        prefix: config.amqp.prefix.clone(),
        dry_run: report.dry_run,
        created: report.created(),
        steps: report
            .steps
            .iter()
            .map(|(op, state)| MigrateStep {
                version: op.version,
                object: op.object.to_string(),
                state: state.as_str(),
            })
            .collect(),
        indexed: Vec::new(),
    };
    if !report.dry_run {
        out.indexed = index_unindexed(config).await;
    }
    let entry = (!report.dry_run && out.created > 0)
        .then(|| report.audit_entry(&args.trail.actor(), args.trail.note(), &config.amqp.prefix));
    if args.json {
        print_json(JSON_SCHEMA_VERSION, &out)?;
    } else {
        print_text(&out, &report);
    }
    match entry {
        Some(entry) => record(&config.budget, &entry).await,
        None => Ok(()),
    }
}

fn print_text(out: &MigrateReport, report: &MigrationReport) {
    outln!("RabbitMQ at {} (names under `{}`)", out.amqp, out.prefix);
    out!("{report}");
    let unchanged = report
        .steps
        .iter()
        .filter(|(_, s)| matches!(s, StepState::Unchanged))
        .count();
    for q in &out.indexed {
        outln!(
            "{}: {} dead letters from before the dead-letter index, indexed (read once and put back)",
            q.queue,
            q.indexed
        );
    }
    if report.dry_run {
        outln!(
            "{} objects would be created, {unchanged} exist already",
            out.created
        );
    } else {
        outln!(
            "{} objects created, {unchanged} existed already",
            out.created
        );
    }
}
