//! The hostile messages that ride along with the game day, and where `docs/semantics.md` says
//! each must end. They use the `ledger` dependency (a generous budget of its own, never browning
//! out), so that what decides their fate is the contract, not the brownout.

use std::time::Duration;

use fleet_budget::DeadLetterReason;
use fleet_budget_amqp::headers;
use lapin::BasicProperties;
use lapin::types::{AMQPValue, DecimalValue, FieldArray, FieldTable, LongString, ShortString};

/// The task the hostile messages run (mapped to dependency `ledger`).
pub(crate) const TASK: &str = "ledger_entry";
/// How many unmapped task names ride along.
pub(crate) const UNMAPPED: usize = 1000;
/// The per-message TTL of the expiring jobs, in ms.
pub(crate) const EXPIRATION_MS: u64 = 1500;
/// Ten years: a Retry-After or a not-before no job should wait for.
pub(crate) const FAR_FUTURE: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// Where a job ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum End {
    /// Its handler succeeded before any replay.
    Succeeded,
    /// Dead-lettered, replayed, then succeeded.
    Replayed,
    /// In the parked queue, with this `fb-park-reason`.
    Parked(String),
    /// Still in the dead-letter queue.
    StillDead,
    /// Still waiting in the work queue or a retry tier.
    StillWaiting,
    /// Nowhere.
    Lost,
}

impl std::fmt::Display for End {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Succeeded => write!(f, "succeeded"),
            Self::Replayed => write!(f, "dead-lettered, replayed, succeeded"),
            Self::Parked(r) => write!(f, "parked ({})", shorten(r, 60)),
            Self::StillDead => write!(f, "still dead-lettered"),
            Self::StillWaiting => write!(f, "still waiting in a retry tier"),
            Self::Lost => write!(f, "LOST"),
        }
    }
}

pub(crate) fn shorten(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_owned()
    } else {
        format!("{}…", s.chars().take(max).collect::<String>())
    }
}

/// What the contract says about one hostile message.
#[derive(Debug, Clone)]
pub(crate) struct Expect {
    /// The endings the contract allows.
    pub(crate) ends: Vec<EndKind>,
    /// The dead-letter reason (and error class, when given) it must have been dead-lettered
    /// with first, if it is to be dead-lettered.
    pub(crate) dead_lettered: Option<(DeadLetterReason, Option<&'static str>)>,
    /// Which part of the contract, in a few words (printed in the table).
    pub(crate) rule: &'static str,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EndKind {
    Succeeded,
    Replayed,
    Parked,
    StillWaiting,
}

impl End {
    pub(crate) fn kind(&self) -> Option<EndKind> {
        match self {
            Self::Succeeded => Some(EndKind::Succeeded),
            Self::Replayed => Some(EndKind::Replayed),
            Self::Parked(_) => Some(EndKind::Parked),
            Self::StillWaiting => Some(EndKind::StillWaiting),
            Self::StillDead | Self::Lost => None,
        }
    }
}

/// One hostile message: id, what it is, how it is published, what must become of it.
#[derive(Debug, Clone)]
pub(crate) struct Hostile {
    pub(crate) id: String,
    pub(crate) what: &'static str,
    pub(crate) routing_key: String,
    pub(crate) properties: BasicProperties,
    pub(crate) body: Vec<u8>,
    pub(crate) expect: Expect,
}

/// Whether issue 9's item 6 (`max_delay`, reason `delay_exceeded`) is in this build.
pub(crate) fn delay_is_bounded() -> bool {
    DeadLetterReason::parse("delay_exceeded").is_some()
}

fn props(id: &str, task: &str, table: FieldTable) -> BasicProperties {
    BasicProperties::default()
        .with_message_id(ShortString::from(id))
        .with_type(ShortString::from(task))
        .with_delivery_mode(2)
        .with_headers(table)
}

fn task_table(task: &str) -> FieldTable {
    let mut t = FieldTable::default();
    headers::set_str(&mut t, headers::TASK, task);
    t
}

/// The hostile messages (the thousand unmapped names are made by [`unmapped`]).
pub(crate) fn messages(prefix: &str, work_exchange: &str) -> Vec<Hostile> {
    let id = |s: &str| format!("{prefix}-hostile-{s}");
    let mut out = Vec::new();
    let expiring =
        |p: BasicProperties| p.with_expiration(ShortString::from(EXPIRATION_MS.to_string()));

    out.push(Hostile {
        id: id("expiration-dead"),
        what: "expiration=1500 ms, dead-lettered, replayed after the TTL",
        routing_key: TASK.to_owned(),
        properties: expiring(props(&id("expiration-dead"), TASK, task_table(TASK))),
        body: br#"{"fail":"non_retryable","until_replay":1}"#.to_vec(),
        expect: Expect {
            ends: vec![EndKind::Replayed],
            dead_lettered: Some((DeadLetterReason::NonRetryable, Some("told_non_retryable"))),
            rule: "copies never expire",
        },
    });
    out.push(Hostile {
        id: id("expiration-retry"),
        what: "expiration=1500 ms, retried through a tier",
        routing_key: TASK.to_owned(),
        properties: expiring(props(&id("expiration-retry"), TASK, task_table(TASK))),
        body: br#"{"fail":"retryable","until_attempt":2}"#.to_vec(),
        expect: Expect {
            ends: vec![EndKind::Succeeded, EndKind::Replayed],
            dead_lettered: None,
            rule: "tier copies keep only the tier TTL",
        },
    });

    let mut long = task_table(TASK);
    headers::set_str(&mut long, headers::ORIGINAL_ROUTING_KEY, &"r".repeat(300));
    headers::set_str(&mut long, headers::ORIGINAL_EXCHANGE, work_exchange);
    out.push(Hostile {
        id: id("routing-key-300"),
        what: "fb-original-routing-key of 300 bytes",
        routing_key: TASK.to_owned(),
        properties: props(&id("routing-key-300"), TASK, long),
        body: br#"{"fail":"non_retryable"}"#.to_vec(),
        expect: Expect {
            ends: vec![EndKind::Parked],
            dead_lettered: Some((DeadLetterReason::NonRetryable, None)),
            rule: "dead-lettered, parked by replay (key > 255 bytes)",
        },
    });

    let (delay_ends, delay_dead) = if delay_is_bounded() {
        (
            vec![EndKind::Replayed],
            DeadLetterReason::parse("delay_exceeded").map(|r| (r, None)),
        )
    } else {
        // Before item 6: a far-future delay cycles through the longest tier, never run and
        // never dead-lettered (the behaviour the issue reports).
        (vec![EndKind::StillWaiting], None)
    };
    let far_ms = u64::try_from(FAR_FUTURE.as_millis()).unwrap_or(u64::MAX);
    out.push(Hostile {
        id: id("retry-after-10y"),
        what: "Retry-After of ten years",
        routing_key: TASK.to_owned(),
        properties: props(&id("retry-after-10y"), TASK, task_table(TASK)),
        body: format!(r#"{{"fail":"retry_after","retry_after_ms":{far_ms},"until_replay":1}}"#)
            .into_bytes(),
        expect: Expect {
            ends: delay_ends.clone(),
            dead_lettered: delay_dead,
            rule: if delay_is_bounded() {
                "max_delay: dead-lettered delay_exceeded"
            } else {
                "before item 6: cycles in the longest tier"
            },
        },
    });
    let mut not_before = task_table(TASK);
    headers::set_u64(&mut not_before, headers::ATTEMPT, 2);
    headers::set_u64(
        &mut not_before,
        headers::NOT_BEFORE_MS,
        headers::now_ms() + far_ms,
    );
    out.push(Hostile {
        id: id("not-before-10y"),
        what: "fb-not-before-ms ten years ahead",
        routing_key: TASK.to_owned(),
        properties: props(&id("not-before-10y"), TASK, not_before),
        body: br#"{}"#.to_vec(),
        expect: Expect {
            ends: delay_ends,
            dead_lettered: delay_dead,
            rule: if delay_is_bounded() {
                "max_delay: dead-lettered delay_exceeded"
            } else {
                "before item 6: cycles in the longest tier"
            },
        },
    });

    let mut banana = task_table(TASK);
    headers::set_str(&mut banana, headers::ATTEMPT, "banana");
    out.push(Hostile {
        id: id("attempt-banana"),
        what: "fb-attempt = \"banana\"",
        routing_key: TASK.to_owned(),
        properties: props(&id("attempt-banana"), TASK, banana),
        body: br#"{}"#.to_vec(),
        expect: Expect {
            ends: vec![EndKind::Replayed],
            dead_lettered: Some((DeadLetterReason::NonRetryable, Some("malformed_header"))),
            rule: "malformed fb- header: non_retryable, handler not run",
        },
    });
    let mut nested = task_table(TASK);
    nested.insert(
        ShortString::from(headers::FIRST_FAILURE_MS),
        AMQPValue::FieldTable(task_table("inside")),
    );
    nested.insert(ShortString::from(headers::REPLAYS), AMQPValue::LongInt(-3));
    out.push(Hostile {
        id: id("headers-wrong-types"),
        what: "fb-first-failure-ms a table, fb-replays = -3",
        routing_key: TASK.to_owned(),
        properties: props(&id("headers-wrong-types"), TASK, nested),
        body: br#"{}"#.to_vec(),
        expect: Expect {
            ends: vec![EndKind::Replayed],
            dead_lettered: Some((DeadLetterReason::NonRetryable, Some("malformed_header"))),
            rule: "malformed fb- header: non_retryable, handler not run",
        },
    });
    let mut odd = task_table(TASK);
    for (name, value) in [
        ("x-game-day-float", AMQPValue::Float(1.5)),
        ("x-game-day-double", AMQPValue::Double(f64::MAX)),
        (
            "x-game-day-decimal",
            AMQPValue::DecimalValue(DecimalValue {
                scale: 2,
                value: 12345,
            }),
        ),
        (
            "x-game-day-bytes",
            AMQPValue::ByteArray(vec![0, 255, 1, 254].into()),
        ),
        ("x-game-day-void", AMQPValue::Void),
        (
            "x-game-day-array",
            AMQPValue::FieldArray(FieldArray::from(vec![
                AMQPValue::Boolean(true),
                AMQPValue::LongString(LongString::from(vec![0xff, 0xfe, 0x00])),
            ])),
        ),
        (
            "game-day-latin1",
            AMQPValue::LongString(LongString::from(vec![0xe9, 0xe8, 0xff])),
        ),
    ] {
        odd.insert(ShortString::from(name), value);
    }
    out.push(Hostile {
        id: id("odd-header-types"),
        what: "foreign headers of every odd type, invalid UTF-8",
        routing_key: TASK.to_owned(),
        properties: props(&id("odd-header-types"), TASK, odd),
        body: br#"{"fail":"retryable","until_attempt":2}"#.to_vec(),
        expect: Expect {
            ends: vec![EndKind::Succeeded],
            dead_lettered: None,
            rule: "retried with its headers as they were",
        },
    });
    out.push(Hostile {
        id: id("body-not-json"),
        what: "a body that is not a job (bytes ff fe 00)",
        routing_key: TASK.to_owned(),
        properties: props(&id("body-not-json"), TASK, task_table(TASK)),
        body: vec![0xff, 0xfe, 0x00],
        expect: Expect {
            ends: vec![EndKind::Parked],
            dead_lettered: Some((DeadLetterReason::NonRetryable, Some("poison"))),
            rule: "poison: non_retryable; replayed max_replays times, then parked",
        },
    });
    out
}

/// The thousand unmapped task names: `(id, task)`; each job succeeds on its first run.
pub(crate) fn unmapped(prefix: &str) -> Vec<(String, String)> {
    (0..UNMAPPED)
        .map(|i| {
            (
                format!("{prefix}-unmapped-{i:04}"),
                format!("unmapped-task-{i:04}"),
            )
        })
        .collect()
}

/// The properties of an unmapped job.
pub(crate) fn unmapped_properties(id: &str, task: &str) -> BasicProperties {
    props(id, task, task_table(task))
}
