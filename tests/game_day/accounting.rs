// Over ~500 lines on purpose: the game day's one ledger, every job accounted and every bound checked in one pass.
//! The game day's accounting, job by job, from what the dependency saw (every call is logged in
//! the test process, so a SIGKILLed worker hides nothing), what the workers printed, the dead
//! letters read before each replay, and what the queues hold at the end; then the bounds of
//! `docs/semantics.md` ("Bounds under faults") checked against it, and the table printed.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::time::Duration;

use fleet_budget_amqp::{ReplayReport, Topology, headers};
use lapin::BasicProperties;
use serde_json::Value;

use super::hostile::{self, End, Hostile};
use super::upstream::Call;

/// A dead letter as read (and put back) before a replay.
#[derive(Debug, Clone)]
pub(crate) struct DeadLetterSeen {
    pub(crate) id: String,
    pub(crate) reason: String,
    pub(crate) class: String,
    pub(crate) source: String,
    pub(crate) dead_lettered_ms: u64,
    pub(crate) seen_ms: u64,
    pub(crate) expiration: Option<String>,
    pub(crate) original_expiration: Option<String>,
}

/// The faults injected, as they happened.
#[derive(Debug, Default)]
pub(crate) struct Faults {
    pub(crate) brownout_from_ms: u64,
    pub(crate) brownout_until_ms: u64,
    pub(crate) sigkilled: u64,
    pub(crate) sigkill_in_flight: u64,
    pub(crate) redis_down_ms: u64,
    pub(crate) redis_up_ms: u64,
    pub(crate) redis_restarts: u64,
    pub(crate) proxy_dropped: usize,
    pub(crate) broker_restarts: u64,
    pub(crate) broker_down: Duration,
    pub(crate) broker_restart_skipped: Option<String>,
    pub(crate) producer_resent: u64,
}

/// Everything observed.
#[derive(Debug)]
pub(crate) struct Facts {
    pub(crate) calls: Vec<Call>,
    /// (worker index, SIGKILLed, events).
    pub(crate) events: Vec<(usize, bool, Vec<Value>)>,
    pub(crate) dead_seen: Vec<DeadLetterSeen>,
    /// What each queue held at the end.
    pub(crate) left: BTreeMap<String, Vec<(BasicProperties, Vec<u8>)>>,
    pub(crate) topology: Topology,
    pub(crate) search_jobs: Vec<String>,
    pub(crate) hostile: Vec<Hostile>,
    pub(crate) unmapped: Vec<(String, String)>,
    pub(crate) replays: Vec<ReplayReport>,
    pub(crate) metric_dependencies: Option<usize>,
    pub(crate) budget_keys: usize,
    /// `[unmapped_tasks] max_own_budgets`, when the build has it.
    pub(crate) unmapped_cap: Option<usize>,
    /// Dead letters more after looking at them than before (an original left beside its copy).
    pub(crate) inspection_copies: u64,
    /// Worker processes started in all.
    pub(crate) processes: usize,
    pub(crate) search_task: String,
    pub(crate) prefetch: u64,
    pub(crate) window_ms: u64,
    pub(crate) ratio: f64,
    pub(crate) min_allowance: u64,
    pub(crate) elapsed: Duration,
    pub(crate) broker: String,
}

/// Jobs by where they ended.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Tally {
    pub(crate) submitted: u64,
    pub(crate) succeeded: u64,
    pub(crate) replayed: u64,
    pub(crate) parked: u64,
    pub(crate) still_dead: u64,
    pub(crate) still_waiting: u64,
    pub(crate) lost: u64,
}

impl Tally {
    fn add(&mut self, end: &End) {
        self.submitted += 1;
        match end {
            End::Succeeded => self.succeeded += 1,
            End::Replayed => self.replayed += 1,
            End::Parked(_) => self.parked += 1,
            End::StillDead => self.still_dead += 1,
            End::StillWaiting => self.still_waiting += 1,
            End::Lost => self.lost += 1,
        }
    }
}

/// The retry bound of `docs/semantics.md`, with its terms.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct RetryBound {
    /// Windows from the first failure to the last retry.
    pub(crate) windows: u64,
    /// Windows overlapping the Redis outage (fallback).
    pub(crate) outage_windows: u64,
    /// Processes alive during the outage.
    pub(crate) processes: u64,
    /// Successes (deposits).
    pub(crate) deposits: u64,
    /// Σ over the windows with retries of `max(floor, ratio × successes of the last three
    /// windows)`, plus the largest of those per Redis restart.
    pub(crate) fleet: u64,
    /// Σ over the outage windows of `processes × floor + ratio × successes of the last three
    /// windows`.
    pub(crate) fallback_slack: u64,
}

/// The accounting of one run.
#[derive(Debug)]
pub(crate) struct Report {
    pub(crate) search: Tally,
    pub(crate) all: Tally,
    pub(crate) ends: HashMap<String, End>,
    pub(crate) executions: u64,
    pub(crate) duplicates: u64,
    pub(crate) duplicates_after_replay: u64,
    pub(crate) dead_copies: u64,
    pub(crate) duplicate_bound: u64,
    pub(crate) prefetch: u64,
    pub(crate) connections: u64,
    pub(crate) requeued: u64,
    pub(crate) inspection_copies: u64,
    pub(crate) succeeded_twice: u64,
    pub(crate) retries_executed: u64,
    pub(crate) retries_reported: u64,
    pub(crate) retries_requested: u64,
    pub(crate) bound: RetryBound,
    pub(crate) budget_exhausted: u64,
    pub(crate) fallback_decisions: u64,
    pub(crate) dead_by_reason: BTreeMap<String, u64>,
    pub(crate) refused_by: BTreeMap<String, u64>,
    pub(crate) hostile_rows: Vec<HostileRow>,
    pub(crate) unmapped_ends: BTreeMap<String, u64>,
    pub(crate) unmapped_rule: String,
    faults_text: Vec<(String, String)>,
    facts_text: Vec<(String, String)>,
    problems: Vec<String>,
}

/// One hostile message in the table.
#[derive(Debug)]
pub(crate) struct HostileRow {
    pub(crate) what: String,
    pub(crate) rule: String,
    pub(crate) dead_lettered: String,
    pub(crate) end: End,
    pub(crate) ok: bool,
}

fn last_stats(events: &[Value]) -> Option<&Value> {
    events
        .iter()
        .rev()
        .find(|e| matches!(e["event"].as_str(), Some("stats" | "exit")))
}

fn windows_between(from_ms: u64, until_ms: u64, window_ms: u64) -> u64 {
    if until_ms < from_ms {
        return 0;
    }
    until_ms / window_ms - from_ms / window_ms + 1
}

#[allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_precision_loss
)]
fn floor_ratio(ratio: f64, n: u64) -> u64 {
    (ratio * n as f64).floor() as u64
}

impl Report {
    #[allow(clippy::too_many_lines)]
    pub(crate) fn of(f: &Facts, faults: &Faults, unsettled: Vec<String>) -> Self {
        let mut problems = unsettled;
        let id_of = |p: &BasicProperties| headers::message_id(p).unwrap_or("").to_owned();
        let parked: HashMap<String, String> = f
            .left
            .get(&f.topology.parked_queue)
            .into_iter()
            .flatten()
            .map(|(p, _)| {
                let t = headers::table(p);
                let reason = headers::get_str(&t, headers::PARK_REASON)
                    .ok()
                    .flatten()
                    .unwrap_or_default();
                (id_of(p), reason)
            })
            .collect();
        let still_dead: BTreeSet<String> = f
            .left
            .get(&f.topology.dead_queue)
            .into_iter()
            .flatten()
            .map(|(p, _)| id_of(p))
            .collect();
        let waiting: BTreeSet<String> = f
            .left
            .iter()
            .filter(|(q, _)| **q != f.topology.dead_queue && **q != f.topology.parked_queue)
            .flat_map(|(_, ms)| ms.iter().map(|(p, _)| id_of(p)))
            .collect();
        let mut ok_first: BTreeSet<&str> = BTreeSet::new();
        let mut ok_replayed: BTreeSet<&str> = BTreeSet::new();
        let mut ok_count: HashMap<&str, u64> = HashMap::new();
        for c in f.calls.iter().filter(|c| c.ok) {
            if c.replays == 0 {
                ok_first.insert(&c.id);
            } else {
                ok_replayed.insert(&c.id);
            }
            *ok_count.entry(&c.id).or_default() += 1;
        }
        let end_of = |id: &str| -> End {
            if ok_first.contains(id) {
                End::Succeeded
            } else if ok_replayed.contains(id) {
                End::Replayed
            } else if let Some(r) = parked.get(id) {
                End::Parked(r.clone())
            } else if still_dead.contains(id) {
                End::StillDead
            } else if waiting.contains(id) {
                End::StillWaiting
            } else {
                End::Lost
            }
        };
        let mut ends = HashMap::new();
        let mut search = Tally::default();
        let mut all = Tally::default();
        for id in &f.search_jobs {
            let e = end_of(id);
            search.add(&e);
            all.add(&e);
            ends.insert(id.clone(), e);
        }
        let mut unmapped_ends = BTreeMap::new();
        for (id, _) in &f.unmapped {
            let e = end_of(id);
            all.add(&e);
            *unmapped_ends.entry(e.to_string()).or_default() += 1;
            ends.insert(id.clone(), e);
        }

        // Executions: every dependency call, and the handler runs that failed before calling.
        let mut runs: HashMap<(String, u64, u64), u64> = HashMap::new();
        for c in &f.calls {
            *runs
                .entry((c.id.clone(), u64::from(c.attempt), u64::from(c.replays)))
                .or_default() += 1;
        }
        for (_, _, events) in &f.events {
            for e in events.iter().filter(|e| e["event"] == "run") {
                let result = e["result"].as_str().unwrap_or("");
                if result.starts_with("fail:told_") || result == "fail:poison" {
                    let key = (
                        e["id"].as_str().unwrap_or("").to_owned(),
                        e["attempt"].as_u64().unwrap_or(0),
                        e["replays"].as_u64().unwrap_or(0),
                    );
                    *runs.entry(key).or_default() += 1;
                }
            }
        }
        let executions: u64 = runs.values().sum();
        let duplicates: u64 = runs.values().map(|n| n - 1).sum();
        let duplicates_after_replay: u64 = runs
            .iter()
            .filter(|((_, _, replays), _)| *replays > 0)
            .map(|(_, n)| n - 1)
            .sum();
        let dead_copies = f.dead_seen.len() as u64;
        let succeeded_twice = ok_count.values().filter(|n| **n > 1).count() as u64;
        let stat = |k: &str| -> u64 {
            f.events
                .iter()
                .filter_map(|(_, _, ev)| last_stats(ev))
                .map(|s| s["counts"][k].as_u64().unwrap_or(0))
                .sum()
        };
        let connections = stat("connections");
        let requeued = stat("requeued");
        let duplicate_bound = f.prefetch * connections + requeued + f.inspection_copies;

        // Retries of the browning-out dependency, against the bound.
        let search_calls: Vec<&Call> = f.calls.iter().filter(|c| c.task == f.search_task).collect();
        let retries_executed = search_calls.iter().filter(|c| c.attempt >= 2).count() as u64;
        let retries_requested = search_calls
            .iter()
            .filter(|c| !c.ok && c.attempt < 3)
            .count() as u64;
        let retries_reported: u64 = f
            .events
            .iter()
            .filter_map(|(_, _, ev)| last_stats(ev))
            .map(|s| {
                s["dependencies"]["search"]["retries_granted"]
                    .as_u64()
                    .unwrap_or(0)
            })
            .sum();
        let fallback_decisions: u64 = f
            .events
            .iter()
            .filter_map(|(_, _, ev)| last_stats(ev))
            .map(|s| s["fallback_decisions"].as_u64().unwrap_or(0))
            .sum();
        let deposits = search_calls.iter().filter(|c| c.ok).count() as u64;
        let first_failure = search_calls.iter().filter(|c| !c.ok).map(|c| c.ms).min();
        let last_retry = search_calls
            .iter()
            .filter(|c| c.attempt >= 2)
            .map(|c| c.ms)
            .max();
        let fallback_reports: Vec<u64> = f
            .events
            .iter()
            .flat_map(|(_, _, ev)| ev.iter())
            .filter(|e| {
                e["event"] == "stats" && e["dependencies"]["search"]["fallback_active"] == true
            })
            .filter_map(|e| e["ms"].as_u64())
            .collect();
        let outage_from = fallback_reports
            .iter()
            .copied()
            .chain([faults.redis_down_ms])
            .min()
            .unwrap_or(faults.redis_down_ms);
        let outage_until = fallback_reports
            .iter()
            .copied()
            .chain([faults.redis_up_ms])
            .max()
            .unwrap_or(faults.redis_up_ms)
            + 200;
        let processes = f
            .events
            .iter()
            .filter(|(_, _, ev)| {
                let first = ev
                    .first()
                    .and_then(|e| e["ms"].as_u64())
                    .unwrap_or(u64::MAX);
                let last = ev.last().and_then(|e| e["ms"].as_u64()).unwrap_or(0);
                first <= outage_until && last >= outage_from
            })
            .count() as u64;
        let windows = match (first_failure, last_retry) {
            (Some(a), Some(b)) => windows_between(a, b, f.window_ms),
            _ => 0,
        };
        let outage_windows = if faults.redis_restarts > 0 {
            windows_between(outage_from, outage_until, f.window_ms)
        } else {
            0
        };
        // Per window k: the fleet grants at most max(floor, ratio × deposits of k and k − 1), and
        // a deposit is credited at most one window after its success, so at most
        // max(floor, ratio × successes of k, k − 1 and k − 2).
        let w = f.window_ms;
        let mut successes: HashMap<u64, u64> = HashMap::new();
        for c in search_calls.iter().filter(|c| c.ok) {
            *successes.entry(c.ms / w).or_default() += 1;
        }
        let last3 = |k: u64| -> u64 {
            (0..3)
                .filter_map(|back| k.checked_sub(back))
                .map(|i| successes.get(&i).copied().unwrap_or(0))
                .sum()
        };
        let allowance = |k: u64| f.min_allowance.max(floor_ratio(f.ratio, last3(k)));
        let grant_windows: Vec<u64> = match (first_failure, last_retry) {
            (Some(a), Some(b)) => (a / w..=b / w).collect(),
            _ => Vec::new(),
        };
        let outage: Vec<u64> = if faults.redis_restarts > 0 {
            (outage_from / w..=outage_until / w).collect()
        } else {
            Vec::new()
        };
        let most = grant_windows
            .iter()
            .map(|k| allowance(*k))
            .max()
            .unwrap_or(0);
        let bound = RetryBound {
            windows,
            outage_windows,
            processes,
            deposits,
            fleet: grant_windows.iter().map(|k| allowance(*k)).sum::<u64>()
                + faults.redis_restarts * most,
            fallback_slack: outage
                .iter()
                .map(|k| processes * f.min_allowance + floor_ratio(f.ratio, last3(*k)))
                .sum(),
        };

        // Dead letters, first sighting of each job.
        let mut first_dead: HashMap<&str, &DeadLetterSeen> = HashMap::new();
        for d in &f.dead_seen {
            first_dead.entry(d.id.as_str()).or_insert(d);
        }
        let mut dead_by_reason: BTreeMap<String, u64> = BTreeMap::new();
        for d in first_dead.values() {
            *dead_by_reason.entry(d.reason.clone()).or_default() += 1;
        }
        let mut refused_by: BTreeMap<String, u64> = BTreeMap::new();
        for d in first_dead
            .values()
            .filter(|d| d.reason == "budget_exhausted")
        {
            *refused_by.entry(d.source.clone()).or_default() += 1;
        }
        let budget_exhausted = f
            .search_jobs
            .iter()
            .filter(|id| {
                first_dead
                    .get(id.as_str())
                    .is_some_and(|d| d.reason == "budget_exhausted")
            })
            .count() as u64;

        // The hostile messages, each against the contract.
        let mut hostile_rows = Vec::new();
        for h in &f.hostile {
            let e = end_of(&h.id);
            all.add(&e);
            let seen = first_dead.get(h.id.as_str());
            let mut ok = e.kind().is_some_and(|k| h.expect.ends.contains(&k));
            if let Some((reason, class)) = h.expect.dead_lettered {
                ok &= seen.is_some_and(|d| {
                    d.reason == reason.as_str() && class.is_none_or(|c| d.class == c)
                });
            }
            if h.id.ends_with("expiration-dead") {
                // The copy outlived the producer's TTL: no `expiration`, the value kept.
                ok &= seen.is_some_and(|d| {
                    d.expiration.is_none()
                        && d.original_expiration.as_deref()
                            == Some(hostile::EXPIRATION_MS.to_string().as_str())
                        && d.seen_ms.saturating_sub(d.dead_lettered_ms) > hostile::EXPIRATION_MS
                });
            }
            if !ok {
                problems.push(format!(
                    "hostile {:?} ({}): ended {e}, dead-lettered as {:?}; the contract says {:?} ({})",
                    h.id,
                    h.what,
                    seen.map(|d| format!("{}/{}", d.reason, d.class)),
                    h.expect.ends,
                    h.expect.rule
                ));
            }
            hostile_rows.push(HostileRow {
                what: h.what.to_owned(),
                rule: h.expect.rule.to_owned(),
                dead_lettered: seen.map_or_else(
                    || "—".to_owned(),
                    |d| {
                        let mut s = format!("{} ({})", d.reason, d.class);
                        if let Some(x) = &d.original_expiration {
                            let _ = write!(
                                s,
                                ", fb-original-expiration {x}, no expiration, read {:.1} s later",
                                d.seen_ms.saturating_sub(d.dead_lettered_ms) as f64 / 1000.0
                            );
                        }
                        s
                    },
                ),
                end: e.clone(),
                ok,
            });
            ends.insert(h.id.clone(), e);
        }

        let secs = |a: u64, b: u64| format!("{:.1} s", b.saturating_sub(a) as f64 / 1000.0);
        let mut faults_text = vec![
            (
                "brownout".to_owned(),
                format!(
                    "search serves 1 call in {} for {}",
                    super::upstream::PASS_EVERY,
                    secs(faults.brownout_from_ms, faults.brownout_until_ms)
                ),
            ),
            (
                "SIGKILL".to_owned(),
                format!(
                    "{} worker killed holding {} unacknowledged deliveries; a replacement started",
                    faults.sigkilled, faults.sigkill_in_flight
                ),
            ),
            (
                "Redis killed".to_owned(),
                format!(
                    "{} restart(s), down {}, back empty",
                    faults.redis_restarts,
                    secs(faults.redis_down_ms, faults.redis_up_ms)
                ),
            ),
            (
                "connections dropped".to_owned(),
                format!(
                    "{} proxied broker connections closed at once",
                    faults.proxy_dropped
                ),
            ),
        ];
        faults_text.push((
            "broker restarted".to_owned(),
            match &faults.broker_restart_skipped {
                Some(why) => format!("skipped: {why}"),
                None => format!(
                    "{} restart(s) of the private node, {:.1} s until it accepted connections again",
                    faults.broker_restarts,
                    faults.broker_down.as_secs_f64()
                ),
            },
        ));
        faults_text.push((
            "producer".to_owned(),
            format!(
                "{} publishes not confirmed and sent again",
                faults.producer_resent
            ),
        ));
        let facts_text = vec![
            ("broker".to_owned(), f.broker.clone()),
            (
                "run took".to_owned(),
                format!("{:.1} s", f.elapsed.as_secs_f64()),
            ),
            (
                "unmapped names".to_owned(),
                format!(
                    "at most {} budget keys in Redis at once (sampled every 250 ms); at most {} values of the `dependency` label on one worker's /metrics at the end",
                    f.budget_keys,
                    f.metric_dependencies
                        .map_or_else(|| "(not scraped)".to_owned(), |n| n.to_string())
                ),
            ),
            (
                "replay rounds".to_owned(),
                f.replays
                    .iter()
                    .map(|r| format!("moved {} parked {} failed {}", r.moved, r.parked, r.failed))
                    .collect::<Vec<_>>()
                    .join("; "),
            ),
        ];

        let mut report = Self {
            search,
            all,
            ends,
            executions,
            duplicates,
            duplicates_after_replay,
            dead_copies,
            duplicate_bound,
            prefetch: f.prefetch,
            connections,
            requeued,
            inspection_copies: f.inspection_copies,
            succeeded_twice,
            retries_executed,
            retries_reported,
            retries_requested,
            bound,
            budget_exhausted,
            fallback_decisions,
            dead_by_reason,
            refused_by,
            hostile_rows,
            unmapped_ends,
            unmapped_rule: match f.unmapped_cap {
                Some(cap) => format!(
                    "at most {cap} own budgets per process, the rest share `unmapped`: labels ≤ {} per worker, keys ≤ {} in Redis",
                    cap + 3,
                    f.processes * cap + 3
                ),
                None => "own budget each (the contract before item 5)".to_owned(),
            },
            faults_text,
            facts_text,
            problems,
        };
        report.check(f, faults);
        report
    }

    /// The retries granted, counted both ways (the larger is held to the bound).
    pub(crate) fn retries_granted(&self) -> u64 {
        self.retries_executed.max(self.retries_reported)
    }

    fn check(&mut self, f: &Facts, faults: &Faults) {
        let mut p = Vec::new();
        if self.all.lost > 0 {
            let lost: Vec<&String> = self
                .ends
                .iter()
                .filter(|(_, e)| **e == End::Lost)
                .map(|(id, _)| id)
                .take(10)
                .collect();
            p.push(format!("{} jobs lost, e.g. {lost:?}", self.all.lost));
        }
        if self.search.still_dead + self.search.still_waiting + self.search.parked > 0 {
            p.push(format!(
                "search jobs not ended after the replay: {:?}",
                self.search
            ));
        }
        if self.search.succeeded + self.search.replayed + self.search.parked
            != self.search.submitted
        {
            p.push(format!("search jobs do not add up: {:?}", self.search));
        }
        if self.duplicates > self.duplicate_bound {
            p.push(format!(
                "{} duplicate executions, above the bound prefetch × connections + requeued + dead letters duplicated by looking = {}",
                self.duplicates, self.duplicate_bound
            ));
        }
        let bound = self.bound.fleet + self.bound.fallback_slack;
        if self.retries_granted() > bound {
            p.push(format!(
                "{} retries granted, above the fleet allowance {} + fallback slack {}",
                self.retries_granted(),
                self.bound.fleet,
                self.bound.fallback_slack
            ));
        }
        if self.budget_exhausted == 0 {
            p.push("the budget refused nothing: the brownout did not test it".to_owned());
        }
        if faults.sigkill_in_flight == 0 {
            p.push("the SIGKILLed worker held no delivery: not mid-batch".to_owned());
        }
        if faults.proxy_dropped == 0 {
            p.push("the proxy dropped no connection".to_owned());
        }
        if faults.redis_restarts > 0 && self.fallback_decisions == 0 {
            p.push("no decision came from the fallback while Redis was down".to_owned());
        }
        let unmapped_ok = self.unmapped_ends.get("succeeded").copied().unwrap_or(0);
        if unmapped_ok != f.unmapped.len() as u64 {
            p.push(format!("unmapped names ended {:?}", self.unmapped_ends));
        }
        if let Some(cap) = f.unmapped_cap {
            // Per process: the cap's own budgets, the shared `unmapped` one, and the two
            // configured dependencies; in Redis, each process may have admitted other names.
            let labels = cap + 3;
            if f.metric_dependencies.is_none_or(|n| n > labels) {
                p.push(format!(
                    "unmapped names: {:?} dependency label values on a worker, above the cap {cap} + 3",
                    f.metric_dependencies
                ));
            }
            let keys = f.processes * cap + 3;
            if f.budget_keys > keys {
                p.push(format!(
                    "unmapped names: {} budget keys in Redis, above {} processes × the cap {cap} + 3",
                    f.budget_keys, f.processes
                ));
            }
        }
        self.problems.extend(p);
    }

    pub(crate) fn broken(&self) -> bool {
        !self.problems.is_empty()
    }

    pub(crate) fn assert_contract(&self) {
        assert!(
            self.problems.is_empty(),
            "the game day broke the contract:\n  {}",
            self.problems.join("\n  ")
        );
    }

    /// The accounting as Markdown tables.
    #[allow(clippy::too_many_lines)]
    pub(crate) fn table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "\n## Game day\n");
        for (k, v) in &self.facts_text {
            let _ = writeln!(s, "- {k}: {v}");
        }
        let _ = writeln!(s, "\n| fault injected | what happened |\n|---|---|");
        for (k, v) in &self.faults_text {
            let _ = writeln!(s, "| {k} | {v} |");
        }
        let t = |x: &Tally| {
            format!(
                "{} | {} | {} | {} | {} | {} | **{}**",
                x.submitted,
                x.succeeded,
                x.replayed,
                x.parked,
                x.still_dead,
                x.still_waiting,
                x.lost
            )
        };
        let _ = writeln!(
            s,
            "\n| jobs | submitted | succeeded | dead-lettered, replayed, succeeded | parked | still dead-lettered | still waiting | lost |\n|---|---|---|---|---|---|---|---|"
        );
        let _ = writeln!(s, "| search (browning out) | {} |", t(&self.search));
        let _ = writeln!(s, "| all (search, hostile, unmapped) | {} |", t(&self.all));
        let _ = writeln!(
            s,
            "\nDead-lettered on the first pass, by reason (first sighting of each job): {}",
            self.dead_by_reason
                .iter()
                .map(|(r, n)| format!("{r} {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let _ = writeln!(
            s,
            "Refused by the budget (`budget_exhausted`), by the budget that answered: {}",
            self.refused_by
                .iter()
                .map(|(r, n)| format!("{r} {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let b = &self.bound;
        let _ = writeln!(s, "\n| measure | value | bound |\n|---|---|---|");
        let _ = writeln!(
            s,
            "| executions (dependency calls and handler runs) | {} | — |",
            self.executions
        );
        let _ = writeln!(
            s,
            "| duplicate executions (same job, attempt and replay run again) | {} ({} of them after a replay; {} jobs succeeded twice; {} dead letters read for {} jobs) | ≤ prefetch × connections + requeued + dead letters duplicated by looking = {} × {} + {} + {} = {} |",
            self.duplicates,
            self.duplicates_after_replay,
            self.succeeded_twice,
            self.dead_copies,
            self.dead_by_reason.values().sum::<u64>(),
            self.prefetch,
            self.connections,
            self.requeued,
            self.inspection_copies,
            self.duplicate_bound
        );
        let _ = writeln!(
            s,
            "| search retries wanted (failed before the last attempt) | {} | — |",
            self.retries_requested
        );
        let _ = writeln!(
            s,
            "| search retries granted (executions of attempt ≥ 2: {}; workers' counters: {}) | {} | ≤ fleet allowance {} + fallback slack {} = {} |",
            self.retries_executed,
            self.retries_reported,
            self.retries_granted(),
            b.fleet,
            b.fallback_slack,
            b.fleet + b.fallback_slack
        );
        let _ = writeln!(
            s,
            "| terms | {} windows with retries, {} in the Redis outage, {} processes, {} successes | fleet: Σ per window max(floor, ratio × successes of it and the two before), + one window per Redis restart; slack: Σ per outage window processes × floor + ratio × those successes |",
            b.windows, b.outage_windows, b.processes, b.deposits
        );
        let _ = writeln!(
            s,
            "| decisions taken by the fallback | {} | — |",
            self.fallback_decisions
        );
        let _ = writeln!(
            s,
            "\n| hostile input | dead-lettered as | ended | contract | ok |\n|---|---|---|---|---|"
        );
        for r in &self.hostile_rows {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} |",
                r.what,
                r.dead_lettered,
                r.end,
                r.rule,
                if r.ok { "yes" } else { "**NO**" }
            );
        }
        let _ = writeln!(
            s,
            "| {} unmapped task names | — | {} | {} | {} |",
            hostile::UNMAPPED,
            self.unmapped_ends
                .iter()
                .map(|(e, n)| format!("{e} {n}"))
                .collect::<Vec<_>>()
                .join(", "),
            self.unmapped_rule,
            if self.problems.iter().any(|p| p.starts_with("unmapped")) {
                "**NO**"
            } else {
                "yes"
            }
        );
        if !self.problems.is_empty() {
            let _ = writeln!(s, "\nProblems:\n- {}", self.problems.join("\n- "));
        }
        s
    }
}
