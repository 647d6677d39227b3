//! [`ConnectionWatch`] against the real broker: the error it names for a lost connection.

use std::time::Duration;

use fleet_budget_amqp::connection::ConnectionWatch;
use fleet_budget_amqp::testing::{amqp_url, unique_prefix};
use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;

use crate::common::{close_the_connection_named, connections_named, rabbitmqctl};

const LONG: Duration = Duration::from_secs(30);

/// A channel's error (a passive declare of a missing queue: 404; a replay's scout meets one for
/// every missing exchange) is not the connection's: the watch used to keep it as the
/// connection's last error, and a loss it read before lapin handed out the loss's own error
/// (the broker's `connection.close` marks the connection closing at once, its error comes once
/// the close-ok is sent) was named by that old 404: the worker counted and logged the loss
/// under the wrong cause. Then the broker closes the connection (an operator's `rabbitmqctl
/// close_connection`, a restart): the loss is named by the broker's reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_closed_by_the_broker_is_not_named_by_an_earlier_channel_error() {
    let prefix = unique_prefix("watch");
    let name = format!("{prefix} watched");
    let conn = fleet_budget_amqp::connect(&amqp_url(), &name)
        .await
        .unwrap();
    let watch = ConnectionWatch::new(&conn);
    let ch = conn.create_channel().await.unwrap();
    let missing = ch
        .queue_declare(
            format!("{prefix}.missing").into(),
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await;
    assert!(missing.is_err(), "{missing:?}");
    // lapin hands the channel's error to the watch once it has sent the close-ok, before it
    // opens the next channel (a round trip later). (A listener of the test's own would take the
    // error from the watch's: lapin's listeners share one queue.)
    let after = conn.create_channel().await.unwrap();
    assert!(!ch.status().connected(), "{:?}", ch.status());
    assert!(!watch.is_lost());
    let before = watch.last_error();
    assert!(
        before.is_none(),
        "a channel's error taken for the connection's: {before:?}"
    );

    // Closed before the broker closes the connection: a channel closed *as* it does is the
    // race of the next test.
    after.close(200, "OK".into()).await.unwrap();

    close_the_connection_named(&name, "watch test: closed by the broker").await;
    let source = tokio::time::timeout(LONG, watch.lost())
        .await
        .expect("the loss seen");
    let said = source.map(|e| e.to_string()).unwrap_or_default();
    assert!(
        said.contains("CONNECTION_FORCED"),
        "the broker's close named by another error: {said}"
    );
}

/// A channel closed just as the broker closes the connection (a worker dropping a channel, a
/// replay's scout closing one) fails in lapin with `invalid channel state: Closing
/// (channel.close)`, and when that failure is handled before the broker's own reason, lapin makes
/// it the connection's error and drops the reason (it keeps the first). The loss must then go
/// unnamed rather than named by the channel's state: a worker counted it under the wrong cause,
/// and once, at load 37, this module's first test saw it. Here 16 tasks open and close channels
/// without pause while the broker closes the connection, on several connections; each loss is
/// named by the broker's reason or by nothing, never by a channel's state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_closed_as_the_broker_closes_the_connection_does_not_name_the_loss() {
    const CONNECTIONS: usize = 8;
    const CHURNERS: usize = 16;
    let prefix = unique_prefix("watch-race");
    let (mut by_the_broker, mut unnamed, mut gone_first) = (0, 0, Vec::new());
    for i in 0..CONNECTIONS {
        let name = format!("{prefix} churn {i}");
        let conn = std::sync::Arc::new(
            fleet_budget_amqp::connect(&amqp_url(), &name)
                .await
                .unwrap(),
        );
        let watch = ConnectionWatch::new(&conn);
        let churn: Vec<_> = (0..CHURNERS)
            .map(|_| {
                let conn = std::sync::Arc::clone(&conn);
                tokio::spawn(async move {
                    let mut closed = 0_u64;
                    while let Ok(ch) = conn.create_channel().await {
                        drop(ch);
                        closed += 1;
                    }
                    closed
                })
            })
            .collect();
        drop(conn);
        // The churn can end the connection before `rabbitmqctl` (seconds to start on a loaded
        // machine) lists it: the broker closes it for a reason of its own (CI, session 17: none
        // listed). Its loss must still not be named by a channel's state.
        let pids = connections_named(&name).await;
        let closed_here = match pids.as_slice() {
            [pid] => {
                rabbitmqctl(&["close_connection", pid, "watch test: closed by the broker"]).await;
                true
            }
            [] => false,
            more => panic!("connections named {name}: {more:?}"),
        };
        let source = tokio::time::timeout(LONG, watch.lost())
            .await
            .expect("the loss seen");
        let mut churned = 0;
        for task in churn {
            churned += tokio::time::timeout(LONG, task)
                .await
                .expect("the churn ends with the connection")
                .unwrap();
        }
        assert!(churned > 0, "no channel opened on connection {i}");
        match source {
            Some(e) if !closed_here => {
                let said = e.to_string();
                assert!(
                    !said.contains("invalid channel state"),
                    "connection {i}: a loss named by a channel's state: {said}"
                );
                gone_first.push(said);
            }
            Some(e) => {
                let said = e.to_string();
                assert!(
                    said.contains("CONNECTION_FORCED"),
                    "connection {i}: the broker's close named by another error: {said}"
                );
                by_the_broker += 1;
            }
            None => unnamed += 1,
        }
    }
    assert!(
        by_the_broker + unnamed > 0,
        "no connection was left for the broker to close: {gone_first:?}"
    );
    println!(
        "{CONNECTIONS} connections under channel churn: {by_the_broker} closed by the broker and named by its reason, {unnamed} left unnamed (lapin dropped the reason), {} ended before the test closed them: {gone_first:?}",
        gone_first.len()
    );
}
