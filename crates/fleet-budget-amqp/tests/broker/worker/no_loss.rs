//! No loss: when a retry or dead-letter copy cannot be confirmed, the original comes back.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use fleet_budget::Failure;
use lapin::options::{ExchangeDeleteOptions, QueueDeleteOptions};
use lapin::types::ShortString;

use super::{LONG, start, stop};
use crate::common::{Env, message_id, wait_until};

async fn delete_exchange(env: &Env, name: &str) {
    let conn = env.connection().await;
    let ch = conn.create_channel().await.unwrap();
    ch.exchange_delete(ShortString::from(name), ExchangeDeleteOptions::default())
        .await
        .unwrap();
    let _ = conn.close(200, ShortString::from("bye")).await;
}

async fn remigrate(env: &Env) {
    env.broker.migrate().await;
}

/// No loss: the dead-letter exchange is missing (the broker closes the publishing channel), so
/// the original is not acked and comes back; once the exchange exists again it is dead-lettered.
#[tokio::test]
async fn no_loss_when_the_dead_letter_exchange_is_missing() {
    let env = Env::new("noloss-dlx", "", "", "").await;
    delete_exchange(&env, &env.topology.dead_exchange).await;
    let calls = Arc::new(AtomicU32::new(0));
    let redelivered = Arc::new(AtomicBool::new(false));
    let runner = {
        let (calls, redelivered) = (Arc::clone(&calls), Arc::clone(&redelivered));
        start(env.budget().await, &env, move |job| {
            calls.fetch_add(1, Ordering::SeqCst);
            if job.redelivered {
                redelivered.store(true, Ordering::SeqCst);
            }
            async { Err(Failure::non_retryable("bad input")) }
        })
    };
    let id = env.publish_one(b"x").await;
    wait_until(LONG, "the job to come back", || async {
        calls.load(Ordering::SeqCst) >= 3
    })
    .await;
    assert!(
        redelivered.load(Ordering::SeqCst),
        "the original came back as a redelivery"
    );
    assert_eq!(runner.0.counts().dead_lettered, 0);
    assert!(runner.0.counts().requeued >= 2);
    remigrate(&env).await;
    wait_until(LONG, "the dead-letter", || async {
        env.depth(&env.topology.dead_queue).await == 1
    })
    .await;
    let counts = stop(runner).await;
    assert_eq!(counts.dead_lettered, 1);
    let dead = env.drain(&env.topology.dead_queue).await;
    assert_eq!(message_id(&dead[0].0), id);
    assert_eq!(env.depth(&env.topology.work_queue).await, 0);
}

/// No loss: the retry tier exchanges are missing, so the retry is not confirmed, the original is
/// requeued, and once the tiers exist the job is retried and succeeds.
#[tokio::test]
async fn no_loss_when_the_retry_publish_cannot_be_confirmed() {
    let env = Env::new("noloss-retry", "", "", "").await;
    for tier in &env.topology.retry_tiers {
        delete_exchange(&env, &tier.exchange).await;
    }
    let calls = Arc::new(AtomicU32::new(0));
    let tiers_back = Arc::new(AtomicBool::new(false));
    let runner = {
        let (calls, tiers_back) = (Arc::clone(&calls), Arc::clone(&tiers_back));
        start(env.budget().await, &env, move |job| {
            calls.fetch_add(1, Ordering::SeqCst);
            let ok = job.attempt > 1 && tiers_back.load(Ordering::SeqCst);
            async move {
                if ok {
                    Ok(())
                } else {
                    Err(Failure::retryable("timeout").with_class("timeout"))
                }
            }
        })
    };
    env.publish_one(b"x").await;
    wait_until(LONG, "the job to come back", || async {
        calls.load(Ordering::SeqCst) >= 3
    })
    .await;
    assert_eq!(runner.0.counts().retried, 0);
    assert!(runner.0.counts().requeued >= 2);
    remigrate(&env).await;
    tiers_back.store(true, Ordering::SeqCst);
    wait_until(LONG, "the retried job to succeed", || async {
        runner.0.counts().succeeded == 1
    })
    .await;
    let counts = stop(runner).await;
    assert!(counts.retried >= 1, "{counts:?}");
    assert_eq!(
        env.depth(&env.topology.work_queue).await + env.depth(&env.topology.dead_queue).await,
        0
    );
}

/// No loss: the dead-letter queue is gone, so the dead-letter is returned unroutable (`Ack`
/// with a returned message is not a delivery); the original is requeued until it can go.
#[tokio::test]
async fn no_loss_when_the_dead_letter_is_returned_unroutable() {
    let env = Env::new("noloss-return", "", "", "").await;
    let conn = env.connection().await;
    let ch = conn.create_channel().await.unwrap();
    ch.queue_delete(
        ShortString::from(env.topology.dead_queue.as_str()),
        QueueDeleteOptions::default(),
    )
    .await
    .unwrap();
    let _ = conn.close(200, ShortString::from("bye")).await;
    let calls = Arc::new(AtomicU32::new(0));
    let runner = {
        let calls = Arc::clone(&calls);
        start(env.budget().await, &env, move |_job| {
            calls.fetch_add(1, Ordering::SeqCst);
            async { Err(Failure::poison("not json")) }
        })
    };
    let id = env.publish_one(b"{").await;
    wait_until(LONG, "the job to come back", || async {
        calls.load(Ordering::SeqCst) >= 3
    })
    .await;
    assert_eq!(runner.0.counts().dead_lettered, 0);
    remigrate(&env).await;
    wait_until(LONG, "the dead-letter", || async {
        env.depth(&env.topology.dead_queue).await == 1
    })
    .await;
    stop(runner).await;
    assert_eq!(
        message_id(&env.drain(&env.topology.dead_queue).await[0].0),
        id
    );
}
