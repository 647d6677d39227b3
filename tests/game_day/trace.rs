//! Where a job the broker game day could not account for went: every worker's events kept next
//! to its log (`worker-N.events.jsonl`), and for the first lost ids what the dependency saw and
//! what the workers ran, so a failed run can be read afterwards.

use std::fmt::Write as _;
use std::path::Path;

use super::fleet::WorkerProcess;
use super::upstream::Call;

/// Lost ids traced in the report (the rest are in the files).
const TRACED: usize = 4;

/// Writes each worker's events into `logs` and returns, for the first lost ids, the calls the
/// dependency saw and the workers' runs of each.
pub(crate) fn trace_lost(
    logs: &Path,
    workers: &[WorkerProcess],
    calls: &[Call],
    lost: &[String],
) -> String {
    let mut out = String::new();
    for w in workers {
        let lines: Vec<String> = w.events().iter().map(ToString::to_string).collect();
        let path = logs.join(format!("worker-{}.events.jsonl", w.index));
        if let Err(e) = std::fs::write(&path, lines.join("\n")) {
            let _ = writeln!(out, "could not keep {}: {e}", path.display());
        }
    }
    for id in lost.iter().take(TRACED) {
        let _ = writeln!(out, "lost {id}:");
        for c in calls.iter().filter(|c| &c.id == id) {
            let _ = writeln!(
                out,
                "  call at {} attempt {} replays {} ok {}",
                c.ms, c.attempt, c.replays, c.ok
            );
        }
        for w in workers {
            for e in w.events().iter().filter(|e| e["id"] == id.as_str()) {
                let _ = writeln!(out, "  worker {}: {e}", w.index);
            }
        }
    }
    out
}
