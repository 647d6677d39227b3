//! A plain tower client whose retries come from the fleet budget: one `layer` line.
//!
//! The "search" dependency here is a `service_fn` that fails its first `failures` calls (a
//! brownout) and then answers. Every failed call asks the budget of `search` in Redis, shared
//! with every other worker of the fleet under the same key prefix; a refusal ends the request
//! with `RetryRefused` (`budget_exhausted`) instead of one more call to a dependency in trouble.
//!
//! Run it against a Redis (it writes only keys under its own prefix):
//! `REDIS_URL=redis://127.0.0.1:6379 cargo run -p fleet-budget-tower --example plain_tower_client`.
//! `crates/fleet-budget-tower/tests/example.rs` runs `run` against a private redis-server.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use fleet_budget::{Config, FleetBudget};
use fleet_budget_tower::{FleetRetryLayer, RetryRefused};
use tower::{BoxError, Service, ServiceBuilder, ServiceExt};

/// What a run did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Requests that got an answer.
    pub answered: u32,
    /// Requests that ended with the budget's refusal.
    pub refused: u32,
    /// Calls that reached the dependency (first attempts and retries).
    pub calls: u32,
}

/// The budget of one worker: the `search_query` task on the `search` dependency, a floor of
/// `floor` retries per minute and no ratio (so the floor is the whole allowance while nothing
/// succeeds), backoff of a few ms so that the example runs in a blink.
pub async fn budget(redis_url: &str, prefix: &str, floor: u32) -> Result<FleetBudget, BoxError> {
    let config = Config::from_toml(
        &format!(
            r#"
            [redis]
            url = "{redis_url}"
            key_prefix = "{prefix}"
            # Every decision from Redis, none from a fallback: a store call may take its time
            # (the first loads the scripts), and one that fails refuses the retry.
            timeout_ms = 5000
            fallback = "deny"

            [defaults]
            window_secs = 60
            ratio = 0.0
            min_allowance = {floor}
            max_attempts = 4
            backoff_base_ms = 1
            backoff_cap_ms = 5

            [dependencies.search]
            tasks = ["search_query"]
            "#
        ),
        "plain_tower_client",
    )?;
    Ok(FleetBudget::from_config(&config).await?)
}

/// Sends `requests` queries through a tower client whose dependency fails its first `failures`
/// calls, retrying on `budget`.
pub async fn run(budget: FleetBudget, requests: u32, failures: u32) -> Result<Tally, BoxError> {
    let calls = Arc::new(AtomicU32::new(0));
    let seen = Arc::clone(&calls);
    let search = tower::service_fn(move |query: String| {
        let n = seen.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            if n <= failures {
                Err::<usize, BoxError>(format!("search answered 503 to {query:?}").into())
            } else {
                Ok(query.len())
            }
        }
    });

    // The one line: every retry of this client is drawn from the fleet budget of `search`.
    let mut client = ServiceBuilder::new()
        .layer(FleetRetryLayer::new(budget, "search_query")?)
        .service(search);

    let mut tally = Tally::default();
    for i in 0..requests {
        match client.ready().await?.call(format!("query {i}")).await {
            Ok(_) => tally.answered += 1,
            Err(e) if e.downcast_ref::<RetryRefused>().is_some() => tally.refused += 1,
            Err(e) => return Err(e),
        }
    }
    tally.calls = calls.load(Ordering::SeqCst);
    Ok(tally)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let prefix = format!("fb-tower-example-{}", std::process::id());
    let budget = budget(&url, &prefix, 5).await?;
    let tally = run(budget.clone(), 20, 1_000).await?;
    budget.shutdown().await?;
    println!(
        "20 requests to a dependency down for good: {} answered, {} refused by the budget, \
         {} calls reached it (20 first attempts + the floor of 5 retries)",
        tally.answered, tally.refused, tally.calls
    );
    Ok(())
}
