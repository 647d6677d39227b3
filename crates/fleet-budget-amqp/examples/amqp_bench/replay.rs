//! Benchmark 4: an unpaced replay of the dead-letter queue back to the work exchange.

use fleet_budget_amqp::{ReplayOptions, Replayer, Topology, WorkerConfig};

use crate::rate;

/// Replays the dead-letter queue (n messages) to the work queue, unpaced.
pub(crate) async fn unpaced_replay(
    url: &str,
    topology: &Topology,
    config: &WorkerConfig,
    n: usize,
    window: usize,
) -> f64 {
    let replayer = Replayer::new(url.to_owned(), topology.clone(), None);
    let mut options = ReplayOptions::new(config);
    options.window = window;
    let report = replayer.run(&options, |_| {}).await.unwrap();
    assert_eq!(usize::try_from(report.moved).unwrap(), n, "{report:?}");
    rate(n, report.elapsed)
}
