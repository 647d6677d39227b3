//! The headers written to RabbitMQ never carry a secret: a property test that puts generated
//! secrets in the error shapes a handler's error can take (URLs of every form, HTTP
//! credentials, JSON and form keys in any case, AWS keys) and writes them as a worker writes a
//! retry and a dead-letter, and as the replayer writes a parked copy; and a connection's
//! configuration never prints its password.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use fleet_budget::DeadLetterReason;
use fleet_budget_amqp::ConnectionConfig;
use fleet_budget_amqp::headers::{DeadLetterRecord, RetryRecord, park_headers};
use lapin::types::FieldTable;
use proptest::prelude::*;

fn secret() -> impl Strategy<Value = String> {
    "[A-Za-z0-9]{5,9}[!$*+=~_-][A-Za-z0-9]{5,9}"
}

/// Every shape of error text a secret arrives in.
fn shapes(s: &str) -> Vec<String> {
    vec![
        format!("redis://:{s}@h:6379/0 refused"),
        format!("rediss://user:{s}@h/0?x=1"),
        format!("unix:///run/r.sock?pass={s}"),
        format!("redis://h/0?password={s}"),
        format!("amqps://guest:{s}@h:5671/%2f"),
        format!("GET https://bob:{s}@api.example/x?token={s} failed"),
        format!("Authorization: Basic {s}"),
        format!("authorization: bearer {s}"),
        format!("upstream said 401 (Bearer {s})"),
        format!("Cookie: sid={s}; theme=dark"),
        format!("X-Api-Key: {s}"),
        format!("x-api-key:{s}"),
        format!("{{\"password\": \"{s}\", \"user\": \"bob\"}}"),
        format!("{{\"API_KEY\":\"{s}\"}}"),
        format!("{{\"Secret\" : \"{s}\"}}"),
        format!("user=bob&passwd={s}&x=1"),
        format!("Token={s}"),
        format!("access_key: {s}"),
        format!("private_key={s}"),
        format!("aws_secret_access_key = {s}"),
        format!("AWS_SECRET_ACCESS_KEY={s}"),
    ]
}

fn leaks(table: &FieldTable, s: &str) -> Option<String> {
    let text = format!("{table:?}");
    let windows: Vec<&str> = (0..=s.len().saturating_sub(8))
        .filter_map(|i| s.get(i..i + 8))
        .collect();
    windows
        .into_iter()
        .find(|w| text.contains(w))
        .map(|w| format!("{w:?} in {text}"))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn no_header_written_to_rabbitmq_carries_a_secret(s in secret(), pad in "[a-z ]{0,600}") {
        for shape in shapes(&s) {
            // Before and after other text, and past the 512-byte cut.
            let error = format!("{pad}{shape} (attempt 3)");
            let mut retry = FieldTable::default();
            RetryRecord {
                task: "t".to_owned(),
                attempt: 2,
                delay_ms: 1000,
                tier_ms: 1000,
                not_before_ms: None,
                original_exchange: "x".to_owned(),
                original_routing_key: "t".to_owned(),
                original_queue: "q".to_owned(),
                first_failure_ms: 1,
                error_class: "http_401".to_owned(),
                error: error.clone(),
                shadow_denied: None,
            }
            .write(&mut retry);
            prop_assert!(leaks(&retry, &s).is_none(), "retry: {:?}", leaks(&retry, &s));
            let mut dead = FieldTable::default();
            DeadLetterRecord {
                task: "t".to_owned(),
                dependency: "d".to_owned(),
                reason: DeadLetterReason::NonRetryable,
                original_exchange: "x".to_owned(),
                original_routing_key: "t".to_owned(),
                original_queue: "q".to_owned(),
                attempts: 3,
                first_failure_ms: 1,
                dead_lettered_ms: 2,
                error_class: "http_401".to_owned(),
                error: error.clone(),
                budget: None,
                budget_source: None,
                replays: 0,
            }
            .write(&mut dead);
            prop_assert!(leaks(&dead, &s).is_none(), "dead-letter: {:?}", leaks(&dead, &s));
            let parked = park_headers(&FieldTable::default(), &error);
            prop_assert!(leaks(&parked, &s).is_none(), "parked: {:?}", leaks(&parked, &s));
        }
    }

    /// A connection's configuration travels with everything that connects (and may be logged
    /// with it): its `Debug` shows the URL with the password redacted.
    #[test]
    fn a_connection_configuration_prints_its_url_redacted(s in secret()) {
        for url in [format!("amqp://guest:{s}@h:5672/%2f"), format!("amqps://u:{s}@h/v")] {
            let shown = format!("{:?}", ConnectionConfig::from(url.as_str()));
            prop_assert!(!shown.contains(&s), "{shown}");
            prop_assert!(shown.contains("@h"), "the host is shown: {shown}");
        }
    }
}
