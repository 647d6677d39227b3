//! `search`'s breaker, opened and closed from outside as the workers would, and a replay made
//! ready for it on the page.

use std::time::Duration;

use std::sync::Arc;

use fleet_budget::Dependency;
use fleet_budget::breaker::{Breaker, BreakerState, Verdict};
use fleet_budget_amqp::WorkerConfig;

use crate::webdriver::Browser;

use crate::*;

/// `search`'s breaker: opens on one failure, open 10 s (long enough for the page to show the
/// hold on a busy machine; the test waits it out), closed by one probe's success.
pub(crate) const BREAKER: &str = "[dependencies.search.breaker]\nfailure_ratio = 0.5\nmin_volume = 1\n\
                       open_secs = 10\nhalf_open_probes = 1\nclose_after = 1\n";

/// `search`'s breaker as the workers share it: the core crate's `Breaker` on the fleet's Redis.
pub(crate) fn breaker(
    config: &WorkerConfig,
) -> (Breaker, fleet_budget::breaker::BreakerPolicy, Dependency) {
    let dep = Dependency::new("search").unwrap_or_else(|e| panic!("{e}"));
    let policy = config.budget.breakers[&dep];
    (Breaker::new(Arc::new(store(config))), policy, dep)
}

/// Opens `search`'s breaker the way workers do: calls' failures reported to it (after a probe
/// closed it, its window still counts that success: a few failures outweigh it).
pub(crate) async fn open_breaker(config: &WorkerConfig) {
    let (breaker, policy, dep) = breaker(config);
    for _ in 0..50 {
        let d = breaker
            .record(&dep, &policy, false, None)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        if d.state == BreakerState::Open {
            return;
        }
    }
    panic!("50 failures did not open the breaker");
}

/// Closes `search`'s breaker once its open period ends: the first call half-opens it and is the
/// probe, whose success closes it (as a worker's probe would).
pub(crate) async fn close_breaker(config: &WorkerConfig) {
    let (breaker, policy, dep) = breaker(config);
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let admitted = breaker
            .admit(&dep, &policy)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        if let Verdict::Probe { generation } = admitted.verdict {
            let d = breaker
                .record(&dep, &policy, true, Some(generation))
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(d.state, BreakerState::Closed, "{d:?}");
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the breaker never half-opened"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The replay page's state, hold and moved count, read at one instant.
pub(crate) async fn progress_now(b: &Browser) -> (String, String, String) {
    let v = b
        .run(
            "const t = id => document.getElementById(id).textContent;\
             return [t('j-state'), t('j-held'), t('j-moved')];",
        )
        .await;
    let at = |i: usize| v[i].as_str().unwrap_or_default().to_owned();
    (at(0), at(1), at(2))
}

/// From the dead-letter page: the search group's replay, its dry run, the note; returns once
/// the confirm button is on the page (not clicked).
pub(crate) async fn prepare_search_replay(b: &Browser, base: &str, count: usize, note: &str) {
    let dlq = format!("{base}/dead-letters");
    let want = format!("search budget_exhausted http_503 {count}");
    b.until_text("#groups tbody tr:first-child", Some(&dlq), |t| {
        t.starts_with(&want)
    })
    .await;
    b.click("#groups tbody tr:first-child form.replay button")
        .await;
    assert_eq!(b.text("#p-moved").await, count.to_string());
    b.type_into("#confirm-replay input[name=note]", note).await;
}
