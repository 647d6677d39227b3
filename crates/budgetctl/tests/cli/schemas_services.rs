//! Every `--json` command that needs Redis or RabbitMQ, run for real once here (on a private
//! Redis and a topology of the test's own on the shared broker), each shape of each, so that
//! every schema is held to a real output whatever the other tests run. [`crate::run`] validates
//! what each printed ([`crate::schemas::hold_to_schema`]); these check that something was printed.

use fleet_budget::DeadLetterReason;
use fleet_budget::clock::now_ms;
use fleet_budget::testing::RedisServer;
use fleet_budget_amqp::testing::{TestBroker, block_on};

use crate::{run, stderr, temp_file, unique};

/// Runs `global` + `command` (split at spaces); asserts it printed and exited `code`.
fn printed(global: &[&str], command: &str, code: i32) {
    let mut args = global.to_vec();
    args.extend(command.split_whitespace());
    let o = run(&args);
    assert_eq!(o.status.code(), Some(code), "{args:?}: {}", stderr(&o));
    assert!(!o.stdout.is_empty(), "{args:?} printed nothing");
}

#[test]
fn redis_commands_match_their_schemas() {
    let redis = RedisServer::start();
    let url = redis.url();
    let prefix = unique("schemas");
    let config = temp_file(
        &format!("{prefix}.toml"),
        "[dependencies.search]\ntasks = [\"t\"]\n[dependencies.search.breaker]\n",
    );
    let on = [
        "--config",
        config.to_str().unwrap(),
        "--redis-url",
        url.as_str(),
        "--key-prefix",
        prefix.as_str(),
    ];
    printed(
        &on,
        "bench --dependency search --successes 50 --retries 20 --json",
        0,
    );
    printed(
        &on,
        "bench --dependency search --successes 5 --retries 2 --no-group-commit --json",
        0,
    );
    printed(&on, "budget freeze search --for 1h --reason r --json", 0);
    printed(
        &on,
        "budget set search --ratio 0.5 --for 1h --reason r --json",
        0,
    );
    // Overrides in force, a breaker, a conflict-free policy: the fullest row.
    printed(&on, "status --json", 0);
    printed(&on, "budget unfreeze search --reason r --json", 0);
    printed(&on, "budget clear search --reason r --json", 0);
    printed(&on, "audit --json", 0);
    printed(&on, "audit --dependency nobody --json", 0);
    // A breaker key the script cannot read: listed as unusable, printed, then exit 1.
    let key = format!("{prefix}:v1:{{search}}:cb");
    let _: () = redis.cmd(&["HSET", &key, "st", "7"]);
    printed(&on, "status --json", 1);
}

#[test]
fn broker_commands_match_their_schemas() {
    let broker = TestBroker::new("schemas");
    let redis = RedisServer::start();
    let url = redis.url();
    let prefix = &broker.settings.prefix;
    let config = temp_file(
        &format!("{prefix}.toml"),
        &format!("[amqp]\nprefix = \"{prefix}\"\nurl = \"{}\"\n", broker.url),
    );
    let key_prefix = unique("schemas");
    let on = [
        "--config",
        config.to_str().unwrap(),
        "--redis-url",
        url.as_str(),
        "--key-prefix",
        key_prefix.as_str(),
    ];
    printed(&on, "migrate --dry-run --json", 0);
    printed(&on, "migrate --json", 0);
    block_on(async {
        let publisher = broker.publisher().await;
        let at = now_ms() - 60_000;
        let search = broker.dead_letter_record("search", DeadLetterReason::BudgetExhausted, at);
        let looping = fleet_budget_amqp::DeadLetterRecord {
            replays: 3,
            ..broker.dead_letter_record("search", DeadLetterReason::AttemptsExhausted, at)
        };
        for r in [&search, &search, &looping] {
            broker.publish_dead_letter(&publisher, r, b"{}").await;
        }
        publisher.close().await;
    });
    printed(&on, "dlq stats --json", 0);
    printed(&on, "dlq peek --json", 0);
    printed(&on, "replay --dependency search --dry-run --json", 0);
    // Moves the two, parks the looping one.
    printed(&on, "replay --dependency search --json", 0);
    printed(&on, "dlq stats --json", 0);
    printed(&on, "parked list --json", 0);
    printed(&on, "parked replay --dry-run --json", 0);
    printed(&on, "parked replay --limit 1 --json", 0);
    printed(&on, "parked purge --yes --json", 0);
}
