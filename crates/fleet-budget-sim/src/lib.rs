//! # fleet-budget-sim
//!
//! Models of retry storms, run through fleet-budget's real budget code: a
//! [`fleet_budget::FleetBudget`] on a [`fleet_budget::store::LocalStore`] whose clock only moves
//! when the model says so. Same arithmetic as a worker (`fleet_budget::allowance`), same decision
//! order, no copy of either.
//!
//! Why a library and not code inside `budgetctl`: the reference numbers of the CLI reference
//! (docs/guides/operations.md) come from these models, and anyone sizing a budget (a capacity
//! planner, a notebook, a test of another worker) should get the same numbers without going
//! through a command line.
//!
//! * [`brownout`]: requests with up to K attempts against a dependency whose attempts fail
//!   independently with probability P. One window covers the run.
//! * [`capacity`]: ticks of load against a dependency whose capacity drops for a while; failed
//!   attempts retry next tick while attempts remain and the budget (a sliding window of W ticks)
//!   grants.
//! * [`concurrency`]: a dependency with a cap on calls in flight; what retries, a separate
//!   retry pool and a concurrency budget put in flight at a failure rate (pure arithmetic).
//! * [`slowing`]: the same dependency tick by tick while it slows down: latency rising near the
//!   cap, queueing past it, timeouts becoming failures and failures retries, with and without
//!   the concurrency budget.
//! * [`history`]: a dependency's past read back (series from Prometheus): its incidents, its
//!   healthy retry fraction, and the ratio, floor and recovery window its traffic recommends
//!   (`budgetctl tune`, `budgetctl incident report`).
//! * [`chart`]: that past drawn as an SVG line chart, the same for `budgetctl tune`,
//!   `budgetctl incident report` and the console's incident page.
//! * [`upstream`], [`queue`] and [`accounting`]: the pieces of the incident drill
//!   (`budgetctl demo`): a dependency that browns out on a schedule, a queue with delayed
//!   retries, a dead-letter queue and a parking lot, and the tally that accounts for every job.
//!
//! No model does I/O or reads a clock: time is handed in (ticks, or the time since the start of
//! a run), so a model gives the same result for the same inputs and seed.
//!
//! ```
//! use fleet_budget::DepositBasis;
//! use fleet_budget_sim::{BudgetParams, brownout};
//!
//! let storm = brownout::run(&brownout::BrownoutParams {
//!     requests: 2000,
//!     attempts: 3,
//!     failure_rate: 0.9,
//!     budget: Some(BudgetParams { ratio: 0.1, deposit: DepositBasis::Request, min_allowance: 10 }),
//!     seed: 1,
//! })?;
//! assert!(storm.amplification < 1.2);
//! # Ok::<(), fleet_budget::Error>(())
//! ```

pub mod accounting;
pub mod brownout;
mod budget;
pub mod capacity;
pub mod chart;
pub mod concurrency;
pub mod history;
pub mod queue;
pub mod slowing;
pub mod upstream;

pub use budget::BudgetParams;
