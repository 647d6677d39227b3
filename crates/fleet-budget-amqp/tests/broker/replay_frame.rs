//! Dead letters whose headers nearly fill the broker's frame (a producer can publish straight to
//! the dead-letter exchange). A copy that a replay or a look makes can be larger than the message
//! it copies: the replay gives a message without an id one (33 bytes) and adds `fb-replays` and
//! `fb-replayed-ms`; every copy moves `expiration` and `user_id` into headers
//! (`fb-original-expiration`, `fb-original-user-id`). A copy over the frame makes the broker
//! close the whole connection (`501 FRAME_ERROR`), consumer included: the run, or the look behind
//! `dlq peek` and `dlq stats`, ended in an error at that message every time, so that nothing past
//! it could be replayed or looked at. The copies are fitted to the frame as the worker's are: the
//! largest header is dropped and named in `fb-dropped-headers`; the body is never touched.

use std::str::FromStr;

use fleet_budget::DeadLetterReason;
use fleet_budget_amqp::headers;
use fleet_budget_amqp::replay::{InspectOptions, inspect_queue};
use fleet_budget_amqp::{ReplayOptions, Replayer};
use lapin::BasicProperties;
use lapin::types::{FieldTable, ShortString};
use lapin::uri::AMQPUri;

use crate::common::{Env, header_str, message_id};

/// The user of the tests' broker URL (a `user_id` other than the publisher's is refused).
fn user(env: &Env) -> String {
    AMQPUri::from_str(&env.url)
        .unwrap()
        .authority
        .userinfo
        .username
}

/// Publishes to the dead-letter exchange a dead letter of `env`'s work exchange whose header
/// frame is `gap` bytes short of the frame, `properties` (without headers) as given, its headers
/// the headers a dead letter must have (those replay removes are few: its copy grows) and a `pad`
/// header.
async fn publish_filling_the_frame(env: &Env, properties: BasicProperties, gap: usize) {
    let publisher = env.publisher().await;
    let frame_max = publisher.frame_max().expect("a negotiated frame_max");
    let record = env.dead_letter_record(
        "search",
        DeadLetterReason::BudgetExhausted,
        headers::now_ms(),
    );
    let mut t = FieldTable::default();
    headers::set_str(&mut t, headers::REASON, record.reason.as_str());
    headers::set_str(&mut t, headers::DEPENDENCY, &record.dependency);
    headers::set_str(&mut t, headers::TASK, &record.task);
    headers::set_str(
        &mut t,
        headers::ORIGINAL_EXCHANGE,
        &record.original_exchange,
    );
    headers::set_str(
        &mut t,
        headers::ORIGINAL_ROUTING_KEY,
        &record.original_routing_key,
    );
    headers::set_u64(&mut t, headers::DEAD_LETTERED_MS, record.dead_lettered_ms);
    headers::set_str(&mut t, "pad", "");
    let empty = headers::header_frame_size(&properties.clone().with_headers(t.clone()));
    headers::set_str(&mut t, "pad", &"p".repeat(frame_max - empty - gap));
    let properties = properties.with_headers(t);
    assert_eq!(headers::header_frame_size(&properties), frame_max - gap);
    publisher
        .publish(
            &env.topology.dead_exchange,
            &record.original_routing_key,
            b"the job",
            properties,
        )
        .await
        .unwrap();
    publisher.close().await;
}

/// A dead letter without a message id, with `expiration` and `user_id`, filling the frame, then
/// five ordinary ones: one run moves all six, the big one with its `pad` header dropped and
/// named, its body intact.
#[tokio::test]
async fn a_dead_letter_filling_the_frame_is_replayed_with_the_largest_header_dropped() {
    let env = Env::new("framereplay", "", "", "").await;
    publish_filling_the_frame(
        &env,
        BasicProperties::default()
            .with_type(ShortString::from("search"))
            .with_delivery_mode(2)
            .with_expiration(ShortString::from("86400000"))
            .with_user_id(ShortString::from(user(&env).as_str())),
        4,
    )
    .await;
    let publisher = env.publisher().await;
    let ordinary = env
        .seed_dead_letters(
            &publisher,
            5,
            "search",
            DeadLetterReason::BudgetExhausted,
            0,
            headers::now_ms(),
        )
        .await;
    publisher.close().await;
    let replayer = Replayer::new(env.url.clone(), env.topology.clone(), None);
    let report = replayer
        .run(&ReplayOptions::new(&env.config), |_| {})
        .await
        .expect("the run ends without losing its connection");
    assert_eq!((report.moved, report.failed), (6, 0), "{report:?}");
    let moved = env.drain(&env.topology.work_queue).await;
    assert_eq!(moved.len(), 6);
    let (big, rest): (Vec<_>, Vec<_>) = moved
        .iter()
        .partition(|(p, _)| header_str(p, headers::DROPPED_HEADERS).is_some());
    assert_eq!(
        rest.iter().map(|(p, _)| message_id(p)).collect::<Vec<_>>(),
        ordinary
    );
    let [(props, body)] = big.as_slice() else {
        panic!("one fitted copy: {big:?}");
    };
    assert_eq!(body, b"the job");
    assert_eq!(header_str(props, "pad"), None);
    let note = header_str(props, headers::DROPPED_HEADERS).unwrap();
    assert!(note.contains("pad ("), "{note}");
    assert_eq!(
        crate::common::header_u64(props, headers::REPLAYS),
        Some(1),
        "a replayed job, not a dead letter"
    );
    assert_eq!(env.depth(&env.topology.dead_queue).await, 0);
}

/// A dead letter with `expiration` and `user_id` filling the frame: a look (what `dlq peek`,
/// `dlq stats` and `replay --dry-run` do) reads it and puts it back, fitted, with the values of
/// both properties kept in their headers.
#[tokio::test]
async fn a_look_at_a_dead_letter_filling_the_frame_puts_it_back_fitted() {
    let env = Env::new("framelook", "", "", "").await;
    let user = user(&env);
    let id = headers::new_message_id();
    publish_filling_the_frame(
        &env,
        BasicProperties::default()
            .with_message_id(ShortString::from(id.as_str()))
            .with_type(ShortString::from("search"))
            .with_delivery_mode(2)
            .with_expiration(ShortString::from("86400000"))
            .with_user_id(ShortString::from(user.as_str())),
        // Room for the `x-delivery-count` (26 bytes) the broker adds to a `basic.get` from
        // the quorum queue, without which nothing could read it.
        30,
    )
    .await;
    let look = inspect_queue(
        &env.url,
        &env.topology.dead_queue,
        &InspectOptions::default(),
        |_| {},
    )
    .await
    .expect("the look ends without losing its connection");
    assert_eq!((look.seen, look.put_back), (1, 1), "{look:?}");
    let left = env.drain(&env.topology.dead_queue).await;
    let [(props, body)] = left.as_slice() else {
        panic!("the dead letter, once: {left:?}");
    };
    assert_eq!((message_id(props), &body[..]), (id, &b"the job"[..]));
    assert!(header_str(props, headers::DROPPED_HEADERS).is_some());
    assert_eq!(
        header_str(props, headers::ORIGINAL_USER_ID).as_deref(),
        Some(user.as_str())
    );
    assert_eq!(
        header_str(props, headers::ORIGINAL_EXPIRATION).as_deref(),
        Some("86400000")
    );
    assert_eq!(
        header_str(props, headers::REASON).as_deref(),
        Some("budget_exhausted"),
        "the record is kept"
    );
}
