//! fleet-budget-tower from the packaged crates, as a user adds it: the one-line layer over a
//! plain tower service retries on the budget and ends with `RetryRefused` once the floor is
//! spent (a budget without Redis: the packaged API is what is checked here; the crate's own tests
//! run it against Redis). Run by scripts/test-as-user.

use fleet_budget::{Config, FleetBudget};
use fleet_budget_tower::{FleetRetryLayer, RetryRefused};
use tower::{BoxError, Service, ServiceBuilder, ServiceExt};

#[tokio::test]
async fn the_layer_from_the_packages_draws_retries_from_the_budget() {
    let config = Config::from_toml(
        "[defaults]\nratio = 0.0\nmin_allowance = 2\nmax_attempts = 10\nbackoff_base_ms = 1\nbackoff_cap_ms = 2\n\
         [dependencies.search]\ntasks = [\"q\"]\n",
        "outside",
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
