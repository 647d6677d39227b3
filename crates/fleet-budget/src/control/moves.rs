//! The moves of a replay, recorded in Redis so that a replay cut off half-way never makes a job
//! run twice (`<prefix>:v1:replay-moves:{<queue>}`, a hash of dead letter → run).
//!
//! Why: a replay copies a dead letter to its original exchange, waits for the broker's confirm,
//! then acks the original. A run killed between the copy and the ack leaves the original in the
//! queue beside a copy already delivered, and the next run would copy it again: the job runs
//! twice. Nothing in AMQP ties a publish on one queue to an ack on another, so the run writes
//! down each move before it sends the copy:
//!
//! 1. before the copy is sent, the dead letter is claimed for the run (`HSETNX`, "sent");
//! 2. once the copy is confirmed, and before the original's ack, the claim says "confirmed";
//! 3. once the original is acked, the claim is deleted.
//!
//! The next run that reads a dead letter still claimed by another run knows what happened: a
//! "confirmed" claim means the copy was delivered (the original is dropped, not copied again);
//! a "sent" claim means the copy may or may not have reached the broker, which no one can tell
//! any more: the message is parked with that reason, for an operator to decide, never copied
//! again blindly and never dropped. A dead letter is named by its message id, its replay count
//! and the time it was dead-lettered (`fleet_budget_amqp` computes it), so a job dead-lettered
//! again after a replay is a new dead letter.
//!
//! The hash is bounded by what is in flight (claims are deleted after the ack) and by the claims
//! of runs that were cut off, each deleted when the next run settles its dead letter; it expires
//! a week after its last write, whatever happens.

use std::sync::Arc;

use crate::error::StoreError;
use crate::keys::replay_moves_key;
use crate::store::RedisStore;

/// How long the hash outlives its last write.
const KEEP_MS: u64 = 7 * 24 * 3_600_000;

/// The claims of the runs over one queue, in the Redis of a [`RedisStore`].
#[derive(Debug, Clone)]
pub struct ReplayMoves {
    store: Arc<RedisStore>,
    key: String,
    run: String,
}

/// What a dead letter's claim says when a run reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// Claimed now by this run: copy it.
    Mine,
    /// Another run's copy of it was confirmed and that run stopped before acking it: the copy
    /// was delivered, this one is left over.
    Moved {
        /// The run that moved it.
        run: String,
    },
    /// Another run sent a copy of it and never saw the broker's answer: it may have been
    /// delivered.
    Uncertain {
        /// The run that sent the copy ("?" when the claim was not written by this library).
        run: String,
    },
    /// This run claimed it already (a second copy of the same dead letter in the queue, or one
    /// this run put back after its copy's confirmation did not come).
    ThisRun,
}

impl ReplayMoves {
    /// The claims of run `run` over `queue`, kept in `store`'s Redis.
    #[must_use]
    pub fn new(store: Arc<RedisStore>, queue: &str, run: &str) -> Self {
        Self {
            key: replay_moves_key(store.prefix(), queue),
            store,
            run: run.to_owned(),
        }
    }

    /// The run's id, as its claims name it.
    #[must_use]
    pub fn run(&self) -> &str {
        &self.run
    }

    /// Claims `dead_letter` for this run unless another run holds it (one round trip).
    ///
    /// # Errors
    /// Redis failed or passed the store's deadline, or the key is not a hash: the copy must not
    /// be sent (a cut-off run could not be told from a finished one).
    pub async fn claim(&self, dead_letter: &str) -> Result<Claim, StoreError> {
        let mine = format!("s {}", self.run);
        let mut pipe = redis::pipe();
        pipe.cmd("HSETNX")
            .arg(&self.key)
            .arg(dead_letter)
            .arg(&mine)
            .cmd("HGET")
            .arg(&self.key)
            .arg(dead_letter)
            .cmd("PEXPIRE")
            .arg(&self.key)
            .arg(KEEP_MS)
            .ignore();
        let (set, held): (i64, Option<String>) = self.store.query_pipeline(&pipe).await?;
        if set == 1 {
            return Ok(Claim::Mine);
        }
        Ok(match held.as_deref().and_then(|h| h.split_once(' ')) {
            Some((_, run)) if run == self.run => Claim::ThisRun,
            Some(("c", run)) => Claim::Moved {
                run: printable_run(run),
            },
            Some((_, run)) => Claim::Uncertain {
                run: printable_run(run),
            },
            None => Claim::Uncertain {
                run: "?".to_owned(),
            },
        })
    }

    /// Records that the copies of `dead_letters` were confirmed (before their originals' ack).
    ///
    /// # Errors
    /// Redis failed or passed the store's deadline three times: the claims still say "sent", so
    /// a run cut off before the ack parks these instead of dropping them (safe, not silent).
    pub async fn confirmed(&self, dead_letters: &[String]) -> Result<(), StoreError> {
        if dead_letters.is_empty() {
            return Ok(());
        }
        let done = format!("c {}", self.run);
        let mut pipe = redis::pipe();
        for chunk in dead_letters.chunks(500) {
            let cmd = pipe.cmd("HSET").arg(&self.key);
            for d in chunk {
                cmd.arg(d).arg(&done);
            }
            cmd.ignore();
        }
        pipe.cmd("PEXPIRE").arg(&self.key).arg(KEEP_MS).ignore();
        // The same value written again changes nothing: repeatable.
        let () = self.store.query_pipeline_repeatable(&pipe).await?;
        Ok(())
    }

    /// Deletes the claims of `dead_letters` (their originals are acked: settled for good).
    ///
    /// # Errors
    /// Redis failed or passed the store's deadline three times (a delete is tried again: CI at
    /// load 14 left 3 claims behind with one try): the claims stay until the hash expires
    /// (harmless: no run reads these dead letters again).
    pub async fn forget(&self, dead_letters: &[String]) -> Result<(), StoreError> {
        if dead_letters.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        for chunk in dead_letters.chunks(500) {
            pipe.cmd("HDEL").arg(&self.key).arg(chunk).ignore();
        }
        let () = self.store.query_pipeline_repeatable(&pipe).await?;
        Ok(())
    }

    /// How many claims the hash holds now (those of runs in flight and of runs cut off).
    ///
    /// # Errors
    /// Redis failed or passed the store's deadline.
    pub async fn held(&self) -> Result<u64, StoreError> {
        self.store
            .query_repeatable(redis::cmd("HLEN").arg(&self.key))
            .await
    }
}

/// A run's id read back from Redis (anyone may have written it): at most 64 characters, escaped.
fn printable_run(run: &str) -> String {
    let cut: String = run.chars().take(64).collect();
    crate::printable::escape_text(&cut).into_owned()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::store::RedisTarget;
    use crate::testing::RedisServer;

    fn store(server: &RedisServer) -> Arc<RedisStore> {
        Arc::new(
            RedisStore::new(
                RedisTarget::Single(server.url()),
                "fb",
                Duration::from_secs(2),
            )
            .unwrap(),
        )
    }

    /// What each run learns of a dead letter from the claims, against a private redis-server:
    /// its own, another run's confirmed or only sent, one written by someone else; deleted once
    /// settled, and the hash expiring.
    #[tokio::test]
    async fn each_run_learns_what_a_cut_off_run_left() {
        let server = RedisServer::start();
        let first = ReplayMoves::new(store(&server), "q.dead", "run-1");
        let second = ReplayMoves::new(store(&server), "q.dead", "run-2");
        assert_eq!(first.claim("a 0 1").await.unwrap(), Claim::Mine);
        assert_eq!(first.claim("b 0 1").await.unwrap(), Claim::Mine);
        assert_eq!(first.claim("a 0 1").await.unwrap(), Claim::ThisRun);
        first.confirmed(&["a 0 1".to_owned()]).await.unwrap();
        // run-1 is killed here: a confirmed, b only sent.
        assert_eq!(
            second.claim("a 0 1").await.unwrap(),
            Claim::Moved {
                run: "run-1".to_owned()
            }
        );
        assert_eq!(
            second.claim("b 0 1").await.unwrap(),
            Claim::Uncertain {
                run: "run-1".to_owned()
            }
        );
        // A dead letter dead-lettered again after a replay is another dead letter.
        assert_eq!(second.claim("a 1 9").await.unwrap(), Claim::Mine);
        second
            .forget(&["a 0 1".to_owned(), "b 0 1".to_owned(), "a 1 9".to_owned()])
            .await
            .unwrap();
        assert_eq!(second.held().await.unwrap(), 0);

        // Written by someone else: in doubt, its text bounded and escaped.
        let key = replay_moves_key("fb", "q.dead");
        let hostile = format!("x\u{1b}[31m{}", "r".repeat(500));
        let _: i64 = server.cmd(&["HSET", &key, "c 0 1", &hostile]);
        let _: i64 = server.cmd(&["HSET", &key, "d 0 1", "garbage"]);
        match second.claim("c 0 1").await.unwrap() {
            Claim::Uncertain { run } => {
                assert!(
                    run.chars().count() <= 64 * 4 && !run.contains('\u{1b}'),
                    "{run}"
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            second.claim("d 0 1").await.unwrap(),
            Claim::Uncertain {
                run: "?".to_owned()
            }
        );
        let ttl: i64 = server.cmd(&["PTTL", &key]);
        assert!(ttl > 0 && ttl <= i64::try_from(KEEP_MS).unwrap(), "{ttl}");
        // Not a hash: an error, so no copy is sent unclaimed.
        let _: i64 = server.cmd(&["DEL", &key]);
        let _: String = server.cmd(&["SET", &key, "x"]);
        assert!(second.claim("e 0 1").await.is_err());
    }
}
