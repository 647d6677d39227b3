//! The layer on a budget without Redis (`FleetBudget::local`, what a worker's fallback decides
//! with): the same code as `tests/outside-worker/tests/tower_layer.rs`, which runs it from the
//! packaged crates.
#![allow(clippy::expect_used, clippy::panic, clippy::unwrap_used, missing_docs)]

use fleet_budget::{Config, FleetBudget};
use fleet_budget_tower::{FleetRetryLayer, RetryRefused};
use tower::{BoxError, Service, ServiceBuilder, ServiceExt};

#[tokio::test]
async fn the_layer_draws_retries_from_a_local_budget() {
    let config = Config::from_toml(
        "[defaults]\nratio = 0.0\nmin_allowance = 2\nmax_attempts = 10\nbackoff_base_ms = 1\nbackoff_cap_ms = 2\n\
         [dependencies.search]\ntasks = [\"q\"]\n",
        "local",
    )
    .unwrap();
    let budget = FleetBudget::local(&config);
    let mut client = ServiceBuilder::new()
        .layer(FleetRetryLayer::new(budget, "q").unwrap())
        .service(tower::service_fn(|_: u32| async {
            Err::<u32, BoxError>("503".into())
        }));
    let err = client.ready().await.unwrap().call(1).await.unwrap_err();
    let refused = err.downcast_ref::<RetryRefused>().unwrap();
    assert_eq!(
        (refused.attempt, refused.reason.as_str()),
        (3, "budget_exhausted")
    );
}
