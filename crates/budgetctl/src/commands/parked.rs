//! `budgetctl parked list|replay|purge`: the parked queue, where the replayer puts what it will
//! not replay (looping jobs, unreadable dead letters). `list` reads through the non-destructive
//! inspection, `replay` is the dead-letter replayer pointed at the parked queue
//! (`Replayer::parked`), and `purge` deletes for good, so it asks for `--yes`.

use clap::{Args, Subcommand};
use fleet_budget_amqp::dead_letters::Counted;
use fleet_budget_amqp::replay::{audit, purge_queue_by_group};
use fleet_budget_amqp::{ReplayOptions, Replayer, Topology, WorkerConfig, queue_depths};
use serde::Serialize;

use super::audit::{Trail, record};
use super::dlq::{MessageFilterArgs, PeekArgs, show_messages};
use super::replay::{PaceArgs, RunArgs, Source, replay};
use crate::amqp_conn::broker_error;
use crate::exit::usage;
use crate::output::{print_json, thousands};

/// The version of `parked purge`'s `--json` shape (`docs/schemas/parked-purge.schema.json`).
const JSON_SCHEMA_VERSION: u32 = 1;

/// `parked` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum ParkedCommand {
    /// Parked messages one by one: id, task, dependency, reason, attempts, when, why parked,
    /// and the error (redacted). Read and put back: looking removes nothing.
    List(PeekArgs),
    /// Move parked jobs back to their original exchange (an operator's decision: their
    /// replay count does not park them again). Paced, pausing while the budget is exhausted.
    Replay(ParkedReplayArgs),
    /// Delete parked messages for good (those the filters select). Refuses without `--yes`.
    Purge(PurgeArgs),
}

/// `parked replay`.
#[derive(Debug, Args)]
pub(crate) struct ParkedReplayArgs {
    #[command(flatten)]
    filter: MessageFilterArgs,
    #[command(flatten)]
    pace: PaceArgs,
    #[command(flatten)]
    run: RunArgs,
}

/// `parked purge`.
#[derive(Debug, Args)]
pub(crate) struct PurgeArgs {
    #[command(flatten)]
    filter: MessageFilterArgs,
    /// Delete at most this many messages.
    #[arg(long, allow_negative_numbers = true, value_parser = clap::value_parser!(u64).range(1..))]
    limit: Option<u64>,
    /// Yes, delete them: parked messages are jobs, and a purge cannot be undone.
    #[arg(long)]
    yes: bool,
    #[command(flatten)]
    trail: Trail,
    /// Print one JSON object on stdout.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Serialize)]
struct PurgeOutput {
    queue: String,
    /// Messages in the queue at the start.
    total: u64,
    /// Deleted for good.
    purged: u64,
    /// Read and put back (not selected).
    kept: u64,
}

/// Runs a `parked` subcommand.
pub(crate) async fn run(config: &WorkerConfig, command: &ParkedCommand) -> anyhow::Result<()> {
    let topology = Topology::new(&config.amqp);
    match command {
        ParkedCommand::List(args) => show_messages(config, &topology.parked_queue, args).await,
        ParkedCommand::Replay(args) => {
            let mut options = ReplayOptions::new(config);
            options.filter = args.filter.filter()?;
            args.pace.apply(&mut options);
            replay(config, Source::Parked, &options, &args.run).await
        }
        ParkedCommand::Purge(args) => purge(config, &topology, args).await,
    }
}

async fn purge(config: &WorkerConfig, topology: &Topology, args: &PurgeArgs) -> anyhow::Result<()> {
    let filter = args.filter.filter()?;
    if !args.yes {
        return Err(usage(format!(
            "parked purge deletes the selected messages of {} for good, and they are jobs that \
             never ran to the end; refusing without --yes (see them first with `budgetctl parked \
             list`, or move them back with `parked replay`)",
            topology.parked_queue
        )));
    }
    let before = queue_depths(config.amqp.connection(), topology)
        .await
        .map_err(|e| broker_error(config, &e))?;
    let index = crate::commands::dlq::dead_letter_index(config);
    // The intent first (who, what selection, how many the index expects); not recorded,
    // nothing is deleted.
    let run_id = fleet_budget_amqp::headers::new_message_id();
    let expected = match Replayer::parked(config.amqp.connection(), topology.clone(), None)
        .with_index(index.clone())
        .counts()
        .await
    {
        Ok(c) => serde_json::json!({
            "purged": c.matching(|row| filter.selects_row(row) == Some(true)),
            "exact": c.exact(),
        }),
        Err(_) => serde_json::Value::Null,
    };
    let intent = audit::intent_entry(
        &args.trail.actor(),
        audit::PARKED_PURGE,
        &filter,
        args.trail.note(),
        &run_id,
        &before,
        &expected,
    );
    record(&config.budget, &intent).await.map_err(|e| {
        anyhow::anyhow!("nothing deleted: the purge's intent could not be audited: {e:#}")
    })?;
    let (r, groups) = purge_queue_by_group(
        config.amqp.connection(),
        &topology.parked_queue,
        &filter,
        args.limit,
        index.as_ref().map(|i| (i, Counted::Parked)),
    )
    .await
    .map_err(|e| broker_error(config, &e))?;
    let after = queue_depths(config.amqp.connection(), topology)
        .await
        .map_err(|e| broker_error(config, &e))?;
    let entry = audit::ended(
        audit::with_groups(
            audit::purge_entry(
                &args.trail.actor(),
                &filter,
                args.trail.note(),
                &before,
                &after,
                &r,
            ),
            &groups,
        ),
        &run_id,
        "completed",
    );
    let out = PurgeOutput {
        queue: topology.parked_queue.clone(),
        total: r.total,
        purged: r.removed,
        kept: r.kept,
    };
    if args.json {
        print_json(JSON_SCHEMA_VERSION, &out)?;
    } else {
        outln!(
            "{}: {} purged, {} kept (of {} messages)",
            out.queue,
            thousands(out.purged),
            thousands(out.kept),
            thousands(out.total)
        );
    }
    record(&config.budget, &entry).await
}
