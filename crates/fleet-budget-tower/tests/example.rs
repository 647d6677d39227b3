//! The example's tower client against a private redis-server: two workers, each with its own
//! `FleetBudget` and one `FleetRetryLayer` line, draw their retries from one fleet budget; a
//! dependency that recovers is retried until it answers, and its deposits reach Redis.
#![allow(clippy::expect_used, clippy::panic, clippy::unwrap_used, missing_docs)]

#[path = "../examples/plain_tower_client.rs"]
#[allow(dead_code, unreachable_pub)]
mod example;

use fleet_budget::testing::RedisServer;
use fleet_budget_tower::{FleetRetryLayer, RetryRefused};
use tower::{BoxError, Service, ServiceBuilder, ServiceExt};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_share_one_floor_of_retries() {
    let server = RedisServer::start();
    let floor = 5;
    let a = example::budget(&server.url(), "fbtower", floor)
        .await
        .unwrap();
    let b = example::budget(&server.url(), "fbtower", floor)
        .await
        .unwrap();
    // The dependency is down for good: every retry either worker makes is one of the floor.
    let (ta, tb) = tokio::join!(
        example::run(a.clone(), 20, u32::MAX),
        example::run(b.clone(), 20, u32::MAX)
    );
    let (ta, tb) = (ta.unwrap(), tb.unwrap());
    println!("worker a: {ta:?}; worker b: {tb:?}");
    assert_eq!(ta.answered + tb.answered, 0);
    assert_eq!(
        ta.refused + tb.refused,
        40,
        "every request ends with the budget's refusal"
    );
    assert_eq!(
        ta.calls + tb.calls,
        40 + floor,
        "the dependency saw 40 first attempts and exactly the fleet's floor of retries"
    );
    a.flush().await.unwrap();
    b.flush().await.unwrap();
    let search = a.dependency("search_query").unwrap();
    let (snapshot, source) = a.status(&search).await;
    println!("fleet budget of search: {snapshot:?} ({})", source.as_str());
    assert_eq!(
        snapshot.current.retries,
        u64::from(floor),
        "retries granted, counted in Redis"
    );
    assert_eq!(
        snapshot.current.first_attempts, 40,
        "first attempts deposited"
    );
    assert!(snapshot.current.denied >= 1, "the refusals were counted");
    let keys: Vec<String> = server.cmd(&["KEYS", "fbtower:v1:{*}"]);
    assert_eq!(
        keys,
        ["fbtower:v1:{search}"],
        "one budget, under the workers' prefix"
    );
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dependency_that_recovers_is_answered_and_its_successes_deposited() {
    let server = RedisServer::start();
    let budget = example::budget(&server.url(), "fbtower", 5).await.unwrap();
    // Fails three calls, then answers: the first request's three retries are granted.
    let tally = example::run(budget.clone(), 10, 3).await.unwrap();
    println!("{tally:?}");
    assert_eq!(
        tally,
        example::Tally {
            answered: 10,
            refused: 0,
            calls: 13
        }
    );
    budget.flush().await.unwrap();
    let search = budget.dependency("search_query").unwrap();
    let (snapshot, _) = budget.status(&search).await;
    assert_eq!(snapshot.current.successes, 10);
    assert_eq!(snapshot.current.first_attempts, 10);
    assert_eq!(snapshot.current.retries, 3);
    budget.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_retryable_failure_is_returned_as_it_is_and_asks_no_budget() {
    let server = RedisServer::start();
    let budget = example::budget(&server.url(), "fbtower", 5).await.unwrap();
    let layer = FleetRetryLayer::<fleet_budget_tower::ErrorsAreRetryable>::with_classify(
        budget.clone(),
        "search_query",
        |r: &Result<usize, BoxError>| match r {
            Ok(_) => fleet_budget_tower::Outcome::Success,
            Err(e) => fleet_budget_tower::Outcome::Failure(fleet_budget::Failure::non_retryable(e)),
        },
    )
    .unwrap();
    let mut client = ServiceBuilder::new()
        .layer(layer)
        .service(tower::service_fn(|_: ()| async {
            Err::<usize, BoxError>("400 bad query".into())
        }));
    let err = client.ready().await.unwrap().call(()).await.unwrap_err();
    assert_eq!(err.to_string(), "400 bad query");
    assert!(err.downcast_ref::<RetryRefused>().is_none());
    budget.flush().await.unwrap();
    let search = budget.dependency("search_query").unwrap();
    let (snapshot, _) = budget.status(&search).await;
    assert_eq!((snapshot.current.retries, snapshot.current.denied), (0, 0));
    budget.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_names_the_reason_and_the_failure() {
    let server = RedisServer::start();
    let budget = example::budget(&server.url(), "fbtower", 0).await.unwrap();
    let mut client = ServiceBuilder::new()
        .layer(FleetRetryLayer::new(budget.clone(), "search_query").unwrap())
        .service(tower::service_fn(|_: ()| async {
            Err::<usize, BoxError>("search answered 503".into())
        }));
    let err = client.ready().await.unwrap().call(()).await.unwrap_err();
    let refused = err
        .downcast_ref::<RetryRefused>()
        .expect("the budget's refusal");
    assert_eq!(refused.reason, "budget_exhausted");
    assert_eq!(refused.attempt, 1);
    assert_eq!(
        err.to_string(),
        "no retry after attempt 1 (budget_exhausted): search answered 503"
    );
    assert!(
        FleetRetryLayer::new(budget.clone(), "bad{task}").is_err(),
        "a task that cannot be a dependency is refused at once"
    );
    budget.shutdown().await.unwrap();
}
