//! Names that arrive in messages (task, dependency, error text) are printed escaped: a bidi
//! override or a terminal escape in a dead-letter's headers shows as `\u{…}`, never raw, in
//! `dlq peek` and `dlq stats`.

use fleet_budget::DeadLetterReason;
use fleet_budget::clock::now_ms;
use fleet_budget_amqp::testing::{TestBroker, block_on};

use crate::{json, run_with, stdout, temp_file, unique};

const HOSTILE_DEPENDENCY: &str = "pay\u{202E}lanoitan";
const HOSTILE_TASK: &str = "send\u{1b}[2J\u{2066}mail";
const HOSTILE_ERROR: &str = "refused \u{202D}by\u{202C} upstream\r\n\u{1b}]0;owned\u{7}";

#[test]
fn names_from_messages_print_escaped() {
    let broker = TestBroker::new("hostile");
    let prefix = &broker.settings.prefix;
    let config = temp_file(
        &format!("{prefix}.toml"),
        &format!("[amqp]\nprefix = \"{prefix}\"\nurl = \"{}\"\n", broker.url),
    );
    let cfg = config.to_str().unwrap();
    let redis_prefix = unique("hostile");
    let base = ["--config", cfg, "--key-prefix", redis_prefix.as_str()];
    let with = |command: &str| run_with(&base, command);
    json(&with("migrate --json"));
    block_on(async {
        let publisher = broker.publisher().await;
        let mut record = broker.dead_letter_record(
            HOSTILE_DEPENDENCY,
            DeadLetterReason::NonRetryable,
            now_ms() - 1000,
        );
        record.task = HOSTILE_TASK.to_owned();
        record.error = HOSTILE_ERROR.to_owned();
        broker.publish_dead_letter(&publisher, &record, b"{}").await;
        publisher.close().await;
    });

    json(&with("dlq reindex --json"));
    for command in ["dlq peek", "dlq stats"] {
        let o = with(command);
        assert!(o.status.success(), "{command}: {o:?}");
        let text = stdout(&o);
        for c in ['\u{202E}', '\u{202D}', '\u{2066}', '\u{1b}', '\u{7}', '\r'] {
            assert!(!text.contains(c), "{command} printed {c:?} raw:\n{text}");
        }
        assert!(text.contains("pay\\u{202e}lanoitan"), "{command}:\n{text}");
        if command == "dlq peek" {
            assert!(text.contains("send\\u{1b}[2J\\u{2066}mail"), "{text}");
            assert!(text.contains("\\u{202d}by\\u{202c}"), "{text}");
        }
    }
    // --json keeps the data as it is (JSON escapes the control characters itself).
    let v = json(&with("dlq stats --json"));
    assert!(v.to_string().contains(HOSTILE_DEPENDENCY), "{v}");
}
