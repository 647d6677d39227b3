//! A retry storm: `P` budget handles (as many worker processes, each with its own cluster
//! connections and its own fallback budget) and one task per process and dependency, each
//! taking a new job every [`PACE`], whose every execution fails (a brownout), asking for a retry
//! after each failure until it is denied or out of attempts. Every decision is recorded with
//! when it was asked, when it was answered and which budget answered; the denials answered in
//! the process (`fleet_cache`, the bulk of a storm) are only counted.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fleet_budget::{BudgetSource, Config, Decision, Failure, FleetBudget};

/// The time between two jobs of one task: ~100 jobs/s per task, enough for a storm and light
/// enough for a 2-core machine that also runs six Redis servers.
const PACE: Duration = Duration::from_millis(10);

/// One retry decision.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Event {
    pub(crate) process: usize,
    pub(crate) dependency: usize,
    /// Since the storm's start.
    pub(crate) asked: Duration,
    pub(crate) answered: Duration,
    pub(crate) source: BudgetSource,
    pub(crate) granted: bool,
}

/// The running storm.
pub(crate) struct Storm {
    pub(crate) epoch: Instant,
    stop: Arc<AtomicBool>,
    budgets: Vec<Arc<FleetBudget>>,
    /// `first_attempts[process][dependency]`: deposits made (basis `request`).
    first_attempts: Arc<Vec<Vec<AtomicU64>>>,
    /// Per dependency: the latest `asked` (ns since `epoch`) of a decision the fleet answered.
    last_fleet_asked_ns: Arc<Vec<AtomicU64>>,
    /// Per dependency: denials answered in the process (`fleet_cache`).
    cached_denials: Arc<Vec<AtomicU64>>,
    tasks: Vec<tokio::task::JoinHandle<Vec<Event>>>,
}

/// What the storm did, for the accounting.
pub(crate) struct Record {
    pub(crate) events: Vec<Event>,
    pub(crate) first_attempts: Vec<Vec<u64>>,
    pub(crate) cached_denials: Vec<u64>,
    /// Store calls that failed, by kind (`fleet_budget_store_errors_total`), all processes.
    pub(crate) store_errors: Vec<(&'static str, u64)>,
}

fn source(d: &Decision) -> BudgetSource {
    match d {
        Decision::Retry { source, .. } | Decision::DeadLetter { source, .. } => *source,
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Storm {
    /// Starts `processes` budgets on `config`, each with one task per dependency (task
    /// `job-<i>` of dependency `i`).
    pub(crate) async fn start(config: &Config, processes: usize, dependencies: usize) -> Self {
        let mut budgets = Vec::new();
        for _ in 0..processes {
            budgets.push(Arc::new(
                FleetBudget::from_config(config)
                    .await
                    .expect("a budget on the cluster"),
            ));
        }
        let first_attempts: Arc<Vec<Vec<AtomicU64>>> = Arc::new(
            (0..processes)
                .map(|_| (0..dependencies).map(|_| AtomicU64::new(0)).collect())
                .collect(),
        );
        let last_fleet_asked_ns: Arc<Vec<AtomicU64>> =
            Arc::new((0..dependencies).map(|_| AtomicU64::new(0)).collect());
        let cached_denials: Arc<Vec<AtomicU64>> =
            Arc::new((0..dependencies).map(|_| AtomicU64::new(0)).collect());
        let stop = Arc::new(AtomicBool::new(false));
        let epoch = Instant::now();
        let mut tasks = Vec::new();
        for (process, budget) in budgets.iter().enumerate() {
            for dependency in 0..dependencies {
                let budget = Arc::clone(budget);
                let stop = Arc::clone(&stop);
                let first_attempts = Arc::clone(&first_attempts);
                let last_fleet = Arc::clone(&last_fleet_asked_ns);
                let cached = Arc::clone(&cached_denials);
                tasks.push(tokio::spawn(async move {
                    let task = format!("job-{dependency}");
                    let mut events = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        budget.on_attempt(&task, 1).await.expect("a mapped task");
                        first_attempts[process][dependency].fetch_add(1, Ordering::Relaxed);
                        let mut attempt = 1;
                        loop {
                            let asked = epoch.elapsed();
                            let decision = budget
                                .on_failure(&task, attempt, &Failure::retryable("brownout: 503"))
                                .await
                                .expect("a mapped task");
                            let answered = epoch.elapsed();
                            let source = source(&decision);
                            match source {
                                BudgetSource::FleetCache => {
                                    cached[dependency].fetch_add(1, Ordering::Relaxed);
                                }
                                BudgetSource::NotConsulted => {}
                                _ => {
                                    if source == BudgetSource::Fleet {
                                        last_fleet[dependency]
                                            .fetch_max(nanos(asked), Ordering::Relaxed);
                                    }
                                    events.push(Event {
                                        process,
                                        dependency,
                                        asked,
                                        answered,
                                        source,
                                        granted: decision.is_retry(),
                                    });
                                }
                            }
                            if !decision.is_retry() {
                                break;
                            }
                            attempt += 1;
                        }
                        tokio::time::sleep(PACE).await;
                    }
                    events
                }));
            }
        }
        Self {
            epoch,
            stop,
            budgets,
            first_attempts,
            last_fleet_asked_ns,
            cached_denials,
            tasks,
        }
    }

    /// Whether the fleet store answered a decision for `dependency` asked after `since`.
    pub(crate) fn fleet_answered_since(&self, dependency: usize, since: Duration) -> bool {
        self.last_fleet_asked_ns
            .get(dependency)
            .is_some_and(|n| n.load(Ordering::Relaxed) > nanos(since))
    }

    /// Stops the tasks, flushes the deposits, and returns what happened.
    pub(crate) async fn stop(self) -> Record {
        self.stop.store(true, Ordering::Relaxed);
        let mut events = Vec::new();
        for task in self.tasks {
            events.extend(task.await.expect("a storm task"));
        }
        for budget in &self.budgets {
            // The cluster is healthy again by now; a failed flush only leaves Redis with fewer
            // deposits than the processes made, which the accounting allows for.
            let _ = budget.shutdown().await;
        }
        let store_errors = ["timeout", "connection", "server", "bad_reply"]
            .into_iter()
            .map(|kind| {
                let n = self
                    .budgets
                    .iter()
                    .map(|b| b.metrics().store_errors(kind))
                    .sum();
                (kind, n)
            })
            .collect();
        Record {
            store_errors,
            events,
            first_attempts: self
                .first_attempts
                .iter()
                .map(|p| p.iter().map(|n| n.load(Ordering::Relaxed)).collect())
                .collect(),
            cached_denials: self
                .cached_denials
                .iter()
                .map(|n| n.load(Ordering::Relaxed))
                .collect(),
        }
    }
}
