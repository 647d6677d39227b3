//! The dry run: what a replay would do, counted without moving anything (messages are read and
//! put back by [`super::inspect`], so looking never brings one closer to a delivery limit).
//! `budgetctl dlq stats` and `budgetctl replay --dry-run` read it.

use std::collections::{BTreeMap, HashMap};

use super::Replayer;
use super::inspect::{InspectOptions, inspect_queue};
use super::select::{Class, ReplayOptions, Selection};
use crate::connection::connect;
use crate::error::AmqpError;
use crate::headers;
use crate::topology::inspect::exchange_exists;

/// What a replay would do, without doing it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DryRunReport {
    /// Messages in the dead-letter queue at the start.
    pub total: u64,
    /// Messages read.
    pub seen: u64,
    /// Matching messages by (dependency, reason).
    pub by_dependency_reason: BTreeMap<(String, String), u64>,
    /// Would be moved.
    pub would_move: u64,
    /// Would fail: selected, but their original exchange does not exist (the run leaves them
    /// in the queue and counts them failed).
    pub would_fail: u64,
    /// Would be parked for looping (replayed `max_replays` times).
    pub would_park_looping: u64,
    /// Would be parked as malformed (replaying the parked queue: would stay there).
    pub malformed: u64,
    /// Not matching the filter.
    pub skipped: u64,
    /// The earliest dead-letter time among the messages read (Unix ms), for "oldest age".
    pub oldest_dead_lettered_ms: Option<u64>,
}

impl Replayer {
    /// Counts what [`Replayer::run`] would do with `options`, changing nothing (messages are
    /// read and put back).
    ///
    /// # Errors
    /// The broker cannot be reached or the queue does not exist.
    pub async fn dry_run(&self, options: &ReplayOptions) -> Result<DryRunReport, AmqpError> {
        self.dry_run_with(options, |_| {}).await
    }

    /// [`Replayer::dry_run`], calling `progress` with the messages read so far after each.
    ///
    /// # Errors
    /// As [`Replayer::dry_run`].
    pub async fn dry_run_with(
        &self,
        options: &ReplayOptions,
        mut progress: impl FnMut(u64) + Send,
    ) -> Result<DryRunReport, AmqpError> {
        let options = &self.effective(options);
        let mut report = DryRunReport::default();
        let mut selection = Selection::new(options);
        let mut to_exchange: HashMap<String, u64> = HashMap::new();
        let look = InspectOptions {
            limit: None,
            idle_timeout: options.idle_timeout,
        };
        let mut read = 0;
        let inspection = inspect_queue(&self.connection, &self.source_queue, &look, |d| {
            read += 1;
            progress(read);
            let at = headers::get_u64(&headers::table(&d.properties), headers::DEAD_LETTERED_MS)
                .ok()
                .flatten();
            if let Some(at) = at {
                report.oldest_dead_lettered_ms =
                    Some(report.oldest_dead_lettered_ms.map_or(at, |o| o.min(at)));
            }
            match selection.sort(d) {
                Class::Malformed(_) => report.malformed += 1,
                Class::Skip => report.skipped += 1,
                Class::Looping(r) => {
                    report.would_park_looping += 1;
                    *report
                        .by_dependency_reason
                        .entry((r.dependency, r.reason.to_string()))
                        .or_default() += 1;
                }
                Class::Replay(r) => {
                    report.would_move += 1;
                    *to_exchange.entry(r.original_exchange.clone()).or_default() += 1;
                    *report
                        .by_dependency_reason
                        .entry((r.dependency, r.reason.to_string()))
                        .or_default() += 1;
                }
            }
        })
        .await?;
        report.total = inspection.total;
        report.seen = inspection.seen;
        // The run checks each original exchange before moving to it; so does the prediction.
        let missing = self.missing_exchanges(to_exchange.keys()).await?;
        for exchange in missing {
            let n = to_exchange.get(&exchange).copied().unwrap_or(0);
            report.would_move -= n;
            report.would_fail += n;
        }
        Ok(report)
    }

    /// Which of `exchanges` do not exist (each asked on a channel of its own: a missing
    /// exchange closes the channel that asked).
    async fn missing_exchanges(
        &self,
        exchanges: impl Iterator<Item = &String>,
    ) -> Result<Vec<String>, AmqpError> {
        let exchanges: Vec<&String> = exchanges.collect();
        if exchanges.is_empty() {
            return Ok(Vec::new());
        }
        let t = self.connection.timeouts;
        let conn = connect(&self.connection, "fleet-budget replay dry run").await?;
        let mut missing = Vec::new();
        for exchange in exchanges {
            let ch = t.within("open a channel", conn.create_channel()).await?;
            if exchange_exists(&ch, exchange, t).await? {
                t.close_channel(&ch, "probed").await;
            } else {
                missing.push(exchange.clone());
            }
        }
        t.close_connection(&conn, "bye").await;
        Ok(missing)
    }
}
