//! The journal of running replays and purges: each run's last progress, kept in Redis beside the
//! audit trail (`<prefix>:v1:runs:{runs}`, a hash of run id → JSON), so that a run whose tool
//! was killed, or whose Redis went away before its end entry, still says where it stopped.
//!
//! A run records its intent in the audit trail before its first move
//! (`fleet_budget_amqp::replay::audit`), then its progress here every few seconds, then its end
//! in the audit trail. `budgetctl audit` shows, beside an intent without an end, the progress the
//! journal last held. The hash expires a week after its last write, and a progress text is cut at
//! 4,096 bytes: the journal is bounded whatever runs.

use std::sync::Arc;

use crate::error::StoreError;
use crate::keys::runs_key;
use crate::store::RedisStore;

/// How long the journal outlives its last write.
const KEEP_MS: u64 = 7 * 24 * 3_600_000;
/// The longest progress text kept.
const MAX_BYTES: usize = 4_096;

/// The journal of a fleet store.
#[derive(Debug, Clone)]
pub struct RunJournal {
    store: Arc<RedisStore>,
}

impl RunJournal {
    /// The journal kept in `store`'s Redis.
    #[must_use]
    pub fn new(store: Arc<RedisStore>) -> Self {
        Self { store }
    }

    /// Records `progress` (JSON) as run `run`'s latest.
    ///
    /// # Errors
    /// Redis failed or passed the store's deadline.
    pub async fn progress(
        &self,
        run: &str,
        progress: &serde_json::Value,
    ) -> Result<(), StoreError> {
        let mut text = progress.to_string();
        if text.len() > MAX_BYTES {
            text = serde_json::json!({ "cut": true }).to_string();
        }
        let key = runs_key(self.store.prefix());
        let _: () = self
            .store
            .query(redis::cmd("HSET").arg(&key).arg(run).arg(text))
            .await?;
        let _: i64 = self
            .store
            .query(redis::cmd("PEXPIRE").arg(&key).arg(KEEP_MS))
            .await?;
        Ok(())
    }

    /// The last progress of each of `runs` (`None`: none recorded, or not JSON).
    ///
    /// # Errors
    /// Redis failed or passed the store's deadline.
    pub async fn last(
        &self,
        runs: &[String],
    ) -> Result<Vec<Option<serde_json::Value>>, StoreError> {
        if runs.is_empty() {
            return Ok(Vec::new());
        }
        let key = runs_key(self.store.prefix());
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(&key);
        for run in runs {
            cmd.arg(run);
        }
        let texts: Vec<Option<String>> = self.store.query(&cmd).await?;
        Ok(texts
            .into_iter()
            .map(|t| t.and_then(|t| serde_json::from_str(&t).ok()))
            .collect())
    }
}
