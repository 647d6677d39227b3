//! The drill's live progress on stderr: one line redrawn in place on a terminal, plain
//! periodic lines otherwise (logs, CI); a scenario's, one line a second.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use fleet_budget_drill::{DrillProgress, ScenarioProgress, Watcher};

use crate::output::thousands;

/// Progress lines on stderr.
pub(super) struct Stderr {
    terminal: bool,
}

impl Stderr {
    pub(super) fn new() -> Self {
        Self {
            terminal: std::io::stderr().is_terminal(),
        }
    }
}

impl Watcher for Stderr {
    fn every(&self) -> Duration {
        if self.terminal {
            Duration::from_millis(250)
        } else {
            Duration::from_secs(2)
        }
    }

    fn drill(&self, p: &DrillProgress, last: bool) {
        let line = drill_line(p);
        let mut err = std::io::stderr().lock();
        if self.terminal {
            let _ = write!(err, "\r\x1b[2K{line}");
            if last {
                let _ = writeln!(err);
            }
        } else {
            let _ = writeln!(err, "{line}");
        }
        let _ = err.flush();
    }

    fn scenario(&self, p: &ScenarioProgress) {
        eprintln!(
            "[{}] {:>5.1}s {:<9} in flight {:>3} (peak {}) | calls {} | timeouts {} | submitted {}/{} | succeeded {} | dead-lettered {}",
            p.label,
            p.elapsed.as_secs_f64(),
            if p.in_trouble { "TROUBLE" } else { "ok" },
            p.in_flight,
            p.peak_in_flight,
            thousands(p.calls),
            thousands(p.timeouts),
            thousands(p.submitted),
            thousands(p.jobs),
            thousands(p.succeeded),
            thousands(p.dead_lettered),
        );
    }
}

fn drill_line(p: &DrillProgress) -> String {
    let phase = match p.phase {
        None => "replaying dead letters".to_owned(),
        Some((name, capacity)) => format!("{name} (capacity {capacity}/s)"),
    };
    format!(
        "[{}] {:>5.1}s {phase:<27} calls {:>5}/s | submitted {}/{} | succeeded {} | waiting {} | dead-lettered {} (in DLQ {}, parked {})",
        p.label,
        p.elapsed.as_secs_f64(),
        p.calls_last_second,
        thousands(p.submitted),
        thousands(p.jobs),
        thousands(p.succeeded),
        thousands(p.waiting),
        thousands(p.dead_lettered),
        thousands(p.in_dead_letter_queue),
        thousands(p.parked),
    )
}
