//! The crate's metrics against the real broker: a worker serving `/metrics` through
//! `[metrics] listen` (budget and AMQP metrics on one registry), and the exporter's queue
//! source reading depths and the oldest dead letter's age without taking it.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use fleet_budget::metrics::ExporterSource;
use fleet_budget::{DeadLetterReason, Failure};
use fleet_budget_amqp::{AmqpMetrics, QueueSource, Worker, WorkerOptions};
use prometheus::Registry;

use crate::common::{Env, wait_until};

const LONG: Duration = Duration::from_secs(60);

fn get_metrics(addr: std::net::SocketAddr) -> String {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: test\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_serve_one_metrics_endpoint_and_the_queue_source_reads_without_taking() {
    let env = Env::new(
        "metrics",
        "",
        "",
        "[dependencies.search]\ntasks = [\"t\"]\n[metrics]\nlisten = \"127.0.0.1:0\"\n",
    )
    .await;
    let budget = env.budget().await;
    let mut runners = Vec::new();
    for _ in 0..2 {
        let options = WorkerOptions::new(&env.config, &env.topology);
        assert!(options.metrics_listen.is_some(), "from [metrics] listen");
        let worker = Worker::new(budget.clone(), env.topology.clone(), options);
        let handle = worker.handle();
        let join =
            tokio::spawn(worker.run(|_job| async {
                Err(Failure::non_retryable("bad input").with_class("http_400"))
            }));
        runners.push((handle, join));
    }
    for i in 0..5 {
        env.publish_one(format!("{i}").as_bytes()).await;
    }
    wait_until(LONG, "5 dead-letters", || async {
        env.depth(&env.topology.dead_queue).await == 5
    })
    .await;

    // Both workers share the budget: one server, found again by its address.
    let addr = budget
        .metrics()
        .serve("127.0.0.1:0".parse().unwrap())
        .unwrap();
    let text = tokio::task::spawn_blocking(move || get_metrics(addr))
        .await
        .unwrap();
    for line in [
        "fleet_budget_first_attempts_total{dependency=\"search\"} 5",
        "fleet_budget_amqp_dead_letters_published_total{reason=\"non_retryable\"} 5",
        "fleet_budget_amqp_deliveries_in_flight 0",
        "fleet_budget_amqp_publish_confirm_duration_seconds_count{kind=\"dead_letter\"} 5",
        "fleet_budget_fallback_active{dependency=\"search\"} 0",
    ] {
        assert!(
            text.contains(&format!("{line}\n")),
            "{line} missing in\n{text}"
        );
    }
    let amqp = AmqpMetrics::of(&budget).unwrap();
    assert_eq!(
        amqp.dead_letters_published(DeadLetterReason::NonRetryable),
        5
    );
    for (handle, join) in runners {
        handle.shutdown();
        tokio::time::timeout(LONG, join)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }

    let registry = Registry::new();
    // A new look at every reading: the exporter's default looks at most once a minute.
    let source = QueueSource::register(env.url.clone(), env.topology.clone(), &registry)
        .unwrap()
        .scan_every(Duration::ZERO);
    for _ in 0..3 {
        source.read().await.unwrap();
    }
    let text = fleet_budget::metrics::encode(&registry.gather());
    let dead = &env.topology.dead_queue;
    assert!(
        text.contains(&format!(
            "fleet_budget_queue_messages{{queue=\"{dead}\",role=\"dead_letter\"}} 5\n"
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "fleet_budget_queue_oldest_message_age_seconds{{queue=\"{dead}\",role=\"dead_letter\"}}"
        )),
        "{text}"
    );
    let parked = &env.topology.parked_queue;
    assert!(
        !text.contains(&format!(
            "fleet_budget_queue_oldest_message_age_seconds{{queue=\"{parked}\",role=\"parked\"}}"
        )),
        "an empty parked queue has no age: {text}"
    );
    assert_eq!(env.depth(dead).await, 5, "every look put the messages back");
    // Three looks and none brought a message closer to a delivery limit: each message read was
    // put back as a fresh copy; the one the look's last `basic.get` (its wait behind the acks)
    // takes goes back with a count of 1, never more, because the next look replaces it first.
    let left = env.drain(dead).await;
    assert_eq!(left.len(), 5);
    for (props, _) in &left {
        let count = fleet_budget_amqp::headers::get_u64(
            &fleet_budget_amqp::headers::table(props),
            "x-delivery-count",
        )
        .unwrap()
        .unwrap_or(0);
        assert!(count <= 1, "{props:?}");
    }
}
