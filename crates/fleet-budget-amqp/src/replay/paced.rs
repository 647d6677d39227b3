//! The pace of a replay that moves something other than the broker's dead letters (the BullMQ
//! jobs the budget kept in Redis, `budgetctl replay --bullmq-queue`): the same gate (breaker,
//! freeze, the rate the dependency's health decides: `control`) and the same pacer as a run of
//! the dead-letter queue, one move at a time, so that every replay of a dependency goes at one
//! pace whatever it moves.

use fleet_budget::FleetBudget;

use super::Replayer;
use super::gate::{Breakers, Gates};
use super::handle::Stop;
use super::pacer::Pacer;
use super::report::{ReplayProgress, ReplayReport};
use super::select::ReplayOptions;
use crate::topology::Topology;

/// Turns for moves made by the caller, paced as [`Replayer::run`] paces its own; what it held
/// and how fast it went in [`PacedMoves::report`] (`held_frozen`, `held_breaker`, `slowdowns`,
/// `lowest_rate`, `highest_rate`, `reached_rate`; the counts are the caller's to fill).
pub struct PacedMoves {
    replayer: Replayer,
    options: ReplayOptions,
    gates: Gates,
    pacer: Pacer,
    report: ReplayReport,
    progress: ReplayProgress,
}

impl PacedMoves {
    /// Paced by `budget` (the slow start, the cuts, the freeze) and `breakers` (held while one
    /// is open), at `options.rate` at most (`options.control`: the closed loop, or the fixed
    /// rate). No broker is connected to.
    #[must_use]
    pub fn new(
        budget: Option<FleetBudget>,
        breakers: Option<Breakers>,
        options: &ReplayOptions,
    ) -> Self {
        // The replayer only lends its gate (the budget and the breakers it reads); its broker
        // settings are never used.
        let replayer = Replayer::new(
            "amqp://unused",
            Topology::new(&crate::AmqpSettings::default()),
            budget,
        )
        .with_breakers(breakers);
        Self {
            replayer,
            options: options.clone(),
            gates: Gates::default(),
            pacer: Pacer::new(options.rate),
            report: ReplayReport::default(),
            progress: ReplayProgress::default(),
        }
    }

    /// Waits for the turn of the next move of `dependency`: held while its breaker is open or
    /// its budget frozen, then spaced at the rate its health decides. `progress` is told of
    /// holds, resumes and new rates.
    pub async fn turn(
        &mut self,
        dependency: &str,
        mut progress: impl FnMut(&ReplayProgress) + Send,
    ) {
        let mut stop = Stop::default();
        let _ = self
            .replayer
            .pace(
                dependency,
                &self.options,
                (&mut self.gates, &mut self.pacer),
                &mut self.report,
                &mut self.progress,
                &mut progress,
                &mut stop,
            )
            .await;
        self.report.slowdowns = self.progress.slowdowns;
    }

    /// The pace so far: the times held, the rates moved at, the cuts.
    #[must_use]
    pub fn report(&self) -> &ReplayReport {
        &self.report
    }

    /// The pace now (the rate, why it is what it is, a hold): [`ReplayProgress::pace_text`].
    #[must_use]
    pub fn progress(&self) -> &ReplayProgress {
        &self.progress
    }
}
