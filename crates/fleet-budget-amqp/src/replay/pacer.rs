//! The pace of a replay run: sends spaced `1 / rate` apart.

use std::time::Duration;

use tokio::time::Instant;

/// Spaces sends `1 / rate` apart on a fixed schedule (late sends catch up, up to one second).
pub(super) struct Pacer {
    interval: Option<Duration>,
    next: Instant,
}

impl Pacer {
    pub(super) fn new(rate: Option<f64>) -> Self {
        let interval = rate
            .filter(|r| r.is_finite() && *r > 0.0)
            .map(|r| Duration::from_secs_f64(1.0 / r));
        Self {
            interval,
            next: Instant::now(),
        }
    }

    pub(super) fn reset(&mut self) {
        self.next = Instant::now();
    }

    pub(super) async fn wait(&mut self) {
        let Some(interval) = self.interval else {
            return;
        };
        let now = Instant::now();
        if self.next > now {
            tokio::time::sleep_until(self.next).await;
        } else if now.duration_since(self.next) > Duration::from_secs(1) {
            self.next = now;
        }
        self.next += interval;
    }
}
