//! A drill job, the same on RabbitMQ and in memory: its payload, whether its input is bad, the
//! call it makes to the dependency and the failure that call is, and the steady pace jobs are
//! submitted at.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fleet_budget::{DeadLetterReason, Failure, Metrics};
use fleet_budget_sim::upstream::{CallError, Upstream};

use crate::DEPENDENCY;

/// One job in this many has bad input: the dependency answers 400 whatever its load.
const BAD_INPUT_EVERY: u64 = 200;
/// What one call to the dependency costs a worker, as a real call would.
const CALL_COST: Duration = Duration::from_millis(1);

/// Whether job `id` has bad input.
pub(crate) fn bad_input(id: u64) -> bool {
    id % BAD_INPUT_EVERY == BAD_INPUT_EVERY - 1
}

/// Which failure a failed call is, for the budget's decision.
pub(crate) fn job_failure(e: CallError) -> Failure {
    match e {
        CallError::Overloaded => {
            Failure::retryable("search answered 503: over capacity").with_class("http_503")
        }
        CallError::BadInput => malformed_document(),
    }
}

/// The failure of a job with bad input, in the drill and the scenarios: 400, whatever the load.
pub(crate) fn malformed_document() -> Failure {
    Failure::non_retryable("search answered 400: malformed document").with_class("http_400")
}

/// One call to the dependency, now in the run that started at `started`.
pub(crate) async fn call(
    upstream: &Upstream,
    started: Instant,
    bad_input: bool,
) -> Result<(), CallError> {
    let answer = upstream.call(started.elapsed(), bad_input);
    tokio::time::sleep(CALL_COST).await;
    answer
}

/// Dead-letter decisions of the drill's dependency so far, by reason (the reasons seen).
pub(crate) fn dead_letters(metrics: &Metrics) -> BTreeMap<String, u64> {
    DeadLetterReason::ALL
        .iter()
        .map(|r| (r.as_str().to_owned(), metrics.dead_letters(DEPENDENCY, *r)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// The payload of job `id`.
pub(crate) fn payload(id: u64) -> Vec<u8> {
    format!("{{\"document\":{id},\"malformed\":{}}}", bad_input(id)).into_bytes()
}

/// (id, bad input) of a demo payload; `None` for anything else (dead-lettered as non-retryable).
pub(crate) fn parse_payload(payload: &[u8]) -> Option<(u64, bool)> {
    let v: serde_json::Value = serde_json::from_slice(payload).ok()?;
    Some((v.get("document")?.as_u64()?, v.get("malformed")?.as_bool()?))
}

/// Submits jobs `0..jobs` at `rate` per second, evenly: every 10 ms, the ids due by then go to
/// `submit`; `submitted` counts them for the progress line.
pub(crate) async fn submit_paced<E>(
    rate: u32,
    jobs: u64,
    submitted: &AtomicU64,
    mut submit: impl AsyncFnMut(Range<u64>) -> Result<(), E>,
) -> Result<(), E> {
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    let started = Instant::now();
    let mut next_id = 0u64;
    while next_id < jobs {
        tick.tick().await;
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let due = ((started.elapsed().as_secs_f64() * f64::from(rate)) as u64).min(jobs);
        submit(next_id..due).await?;
        next_id = next_id.max(due);
        submitted.store(next_id, Ordering::Relaxed);
    }
    Ok(())
}
