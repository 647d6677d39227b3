//! The dry run: what a replay would do, predicted without reading a message.
//!
//! [`Replayer::dry_run`] reads the source queue's depth (a passive declare) and its dead-letter
//! index ([`crate::dead_letters`]), and applies the run's own rules to each row: selected or not
//! ([`super::ReplayFilter::selects_row`]), parked for looping, moved up to the limit, failed when its
//! original exchange is gone. The prediction is exact when the index agrees with the depth and
//! the filter can be decided on rows; otherwise it says how many messages it could not place
//! ([`DryRunReport::uncertain`]) and why ([`DryRunReport::estimate`]). Nothing is read, so
//! nothing is rewritten, at any depth, and a dry run cut off leaves nothing behind.
//!
//! [`Replayer::dry_run_by_reading`] is the older way, kept for a queue whose index is not
//! kept (dead letters written by other tools): it reads every message and puts it back as a
//! copy through [`super::inspect`] (about 1 ms a message, and a read cut off half-way leaves
//! copies beside their originals until the read's end returns them).

use std::collections::{BTreeMap, HashMap};

use super::Replayer;
use super::inspect::{InspectOptions, inspect_queue};
use super::select::{Class, ReplayOptions, Selection};
use crate::connection::connect;
use crate::dead_letters::{QueueCounts, UNREADABLE, count_queue};
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
    /// The earliest dead-letter time among the messages read (Unix ms), for "oldest age"
    /// (from the index: the start of the earliest minute counted).
    pub oldest_dead_lettered_ms: Option<u64>,
    /// Selected messages by (dependency, reason, error class): what would be moved or parked.
    pub by_group: BTreeMap<(String, String, String), u64>,
    /// Messages the prediction could not place (the filter names a message id, error text or a
    /// time inside a minute; messages the index does not count): each of them is either moved
    /// or skipped by the run. 0 when [`DryRunReport::exact`].
    pub uncertain: u64,
    /// Whether the prediction is exactly what a run started now would do (the index agrees
    /// with the queue, and the filter is decided on its rows). Always true for a dry run by
    /// reading.
    pub exact: bool,
    /// Why the prediction is an estimate, when it is.
    pub estimate: Option<String>,
}

impl Replayer {
    /// Predicts what [`Replayer::run`] would do with `options` from the source queue's depth
    /// and dead-letter index, reading no message (see the module documentation).
    ///
    /// # Errors
    /// The broker cannot be reached or the queue does not exist. (An index that cannot be read
    /// is not an error: the prediction then says everything is uncertain, and why.)
    pub async fn dry_run(&self, options: &ReplayOptions) -> Result<DryRunReport, AmqpError> {
        let counts = self.counts().await?;
        let mut p = self.predict(options, &counts);
        let missing = self.missing_exchanges(report_exchanges(&p).iter()).await?;
        let missing: u64 = missing
            .iter()
            .map(|e| p.to_exchange.get(e).copied().unwrap_or(0))
            .sum();
        let r = &mut p.report;
        // The run checks each original exchange before moving to it, and counts a move to a
        // missing one failed; the limit counts both.
        let taken = p.candidates.min(options.limit.unwrap_or(u64::MAX));
        r.skipped += p.candidates - taken;
        if taken == p.candidates || missing == 0 {
            r.would_fail = missing.min(taken);
            r.would_move = taken - r.would_fail;
        } else {
            // The limit takes the oldest first: which of them go to a missing exchange cannot be
            // told from counts by the minute.
            r.would_fail = missing.min(taken);
            r.would_move = taken - r.would_fail;
            let unsure = missing.min(taken);
            r.uncertain += unsure;
            r.exact = false;
            let why = format!(
                "the limit takes {taken} of {} selected messages, oldest first, and {missing} of them go to an exchange that does not exist: how many of those are among the first {taken} cannot be told without reading",
                p.candidates
            );
            r.estimate = Some(match r.estimate.take() {
                Some(w) => format!("{w}; {why}"),
                None => why,
            });
        }
        Ok(p.report)
    }

    /// The source queue's depth and index, read without reading a message.
    ///
    /// # Errors
    /// The broker cannot be reached or the queue does not exist.
    pub async fn counts(&self) -> Result<QueueCounts, AmqpError> {
        let t = self.connection.timeouts;
        let conn = connect(&self.connection, "fleet-budget dead-letter counts").await?;
        let counted = async {
            let ch = t.within("open a channel", conn.create_channel()).await?;
            let counts = count_queue(&ch, &self.source_queue, t, self.index()).await?;
            t.close_channel(&ch, "counted").await;
            Ok(counts)
        }
        .await;
        t.close_connection(&conn, "bye").await;
        counted
    }

    /// The prediction of a run with `options` over `counts`, before the limit and the
    /// exchanges: the messages it would move are its candidates.
    fn predict(&self, options: &ReplayOptions, counts: &QueueCounts) -> Prediction {
        let options = &self.effective(options);
        let filter = &options.filter;
        let mut p = Prediction::default();
        let r = &mut p.report;
        r.total = counts.depth;
        r.oldest_dead_lettered_ms = counts.oldest_minute().map(|m| m.saturating_mul(60_000));
        for (row, n) in &counts.rows {
            let n = *n;
            match filter.selects_row(row) {
                Some(false) => r.skipped += n,
                None => {
                    r.skipped += n;
                    r.uncertain += n;
                }
                Some(true) if row.reason == UNREADABLE => {
                    // Only in the parked queue: there it stays (counted malformed, as by reading).
                    r.malformed += n;
                }
                Some(true) => {
                    *r.by_group
                        .entry((
                            row.dependency.clone(),
                            row.reason.clone(),
                            row.error_class.clone(),
                        ))
                        .or_default() += n;
                    *r.by_dependency_reason
                        .entry((row.dependency.clone(), row.reason.clone()))
                        .or_default() += n;
                    if row.replays >= options.max_replays {
                        r.would_park_looping += n;
                    } else {
                        // Moved (or failed), up to the limit: settled in `dry_run`.
                        p.candidates += n;
                        *p.to_exchange
                            .entry(row.original_exchange.clone())
                            .or_default() += n;
                    }
                }
            }
        }
        // What the index does not place: messages it does not count (the broker's own dead
        // letters among them, which a run parks when the filter is empty), or counts beyond its
        // bound of rows.
        let unplaced = u64::try_from(counts.difference().max(0)).unwrap_or(0) + counts.beyond;
        r.skipped += unplaced;
        r.uncertain += unplaced;
        if counts.index_error.is_some() {
            r.uncertain = r.total;
        }
        r.exact = counts.exact() && r.uncertain == 0;
        r.estimate = (!r.exact).then(|| {
            let mut why = Vec::new();
            if let Some(w) = counts.why_estimate() {
                why.push(w);
            }
            let undecided = r.uncertain.saturating_sub(unplaced);
            if undecided > 0 {
                why.push(format!(
                    "the filter cannot be decided for {undecided} counted messages without reading them (a message id, error text, or a time inside a minute)"
                ));
            }
            why.join("; ")
        });
        p
    }

    /// Counts what [`Replayer::run`] would do with `options` by reading every message and
    /// putting it back as a copy (see the module documentation: slow, and it rewrites the
    /// queue). For a queue whose index is not kept.
    ///
    /// # Errors
    /// The broker cannot be reached or the queue does not exist.
    pub async fn dry_run_by_reading(
        &self,
        options: &ReplayOptions,
    ) -> Result<DryRunReport, AmqpError> {
        self.dry_run_by_reading_with(options, |_| {}).await
    }

    /// [`Replayer::dry_run_by_reading`], calling `progress` with the messages read so far
    /// after each.
    ///
    /// # Errors
    /// As [`Replayer::dry_run_by_reading`].
    pub async fn dry_run_by_reading_with(
        &self,
        options: &ReplayOptions,
        mut progress: impl FnMut(u64) + Send,
    ) -> Result<DryRunReport, AmqpError> {
        let options = &self.effective(options);
        let mut report = DryRunReport {
            exact: true,
            ..DryRunReport::default()
        };
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
                        .by_group
                        .entry((
                            r.dependency.clone(),
                            r.reason.to_string(),
                            r.error_class.clone(),
                        ))
                        .or_default() += 1;
                    *report
                        .by_dependency_reason
                        .entry((r.dependency, r.reason.to_string()))
                        .or_default() += 1;
                }
                Class::Replay(r) => {
                    report.would_move += 1;
                    *report
                        .by_group
                        .entry((
                            r.dependency.clone(),
                            r.reason.to_string(),
                            r.error_class.clone(),
                        ))
                        .or_default() += 1;
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

/// A prediction, and the messages it would move (before the limit) per original exchange (to
/// check they exist).
#[derive(Default)]
struct Prediction {
    report: DryRunReport,
    candidates: u64,
    to_exchange: HashMap<String, u64>,
}

/// The exchanges a prediction moves to.
fn report_exchanges(p: &Prediction) -> Vec<String> {
    p.to_exchange
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(e, _)| e.clone())
        .collect()
}
