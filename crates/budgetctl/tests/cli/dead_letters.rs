//! `dlq peek`, `parked list|replay|purge`, and what `replay` promises about its dry run and its
//! exit code, against the real broker (a topology of the test's own).

use std::process::Output;

use fleet_budget::DeadLetterReason;
use fleet_budget::clock::now_ms;
use fleet_budget_amqp::headers;
use fleet_budget_amqp::testing::{TestBroker, block_on};
use fleet_budget_amqp::{DeadLetterRecord, Publisher};
use lapin::BasicProperties;
use lapin::types::ShortString;
use serde_json::{Value, json};

use crate::{assert_exit, has_fields, json, run_with, stderr, stdout, temp_file, unique};

/// Ready messages in `queue`.
fn depth(broker: &TestBroker, queue: &str) -> u32 {
    block_on(broker.depth(queue))
}

/// The global flags for `broker`'s topology (and a Redis key prefix of the test's own); the
/// audit trail keeps its last 12 entries.
fn flags(broker: &TestBroker) -> Vec<String> {
    let prefix = &broker.settings.prefix;
    let config = temp_file(
        &format!("{prefix}.toml"),
        &format!(
            "[amqp]\nprefix = \"{prefix}\"\nurl = \"{}\"\n[audit]\nmax_entries = 12\n",
            broker.url
        ),
    );
    vec![
        "--config".to_owned(),
        config.to_string_lossy().into_owned(),
        "--key-prefix".to_owned(),
        unique("deadletters"),
    ]
}

/// Seeds dead letters: each record, then one message without any dead-letter header.
fn seed(broker: &TestBroker, records: &[DeadLetterRecord]) {
    block_on(async {
        let publisher: Publisher = broker.publisher().await;
        for r in records {
            broker.publish_dead_letter(&publisher, r, b"{}").await;
        }
        let props = BasicProperties::default()
            .with_message_id(ShortString::from("no-headers"))
            .with_delivery_mode(2);
        publisher
            .publish(&broker.topology.dead_exchange, "x", b"?", props)
            .await
            .unwrap();
        publisher.close().await;
    });
}

fn record(broker: &TestBroker, dependency: &str, reason: DeadLetterReason) -> DeadLetterRecord {
    broker.dead_letter_record(dependency, reason, now_ms() - 60_000)
}

/// The JSON object on stdout, whatever the exit code.
fn json_any(o: &Output) -> Value {
    serde_json::from_str(&stdout(o))
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}\n{}", stdout(o), stderr(o)))
}

fn messages(v: &Value) -> &Vec<Value> {
    v["messages"].as_array().unwrap()
}

#[test]
fn dlq_peek_and_parked_list_replay_purge_against_rabbitmq() {
    let broker = TestBroker::new("peek");
    let t = &broker.topology;
    let secret = DeadLetterRecord {
        error: "GET https://bob:hunter2@search.internal/x failed".to_owned(),
        ..record(&broker, "search", DeadLetterReason::BudgetExhausted)
    };
    let looping = DeadLetterRecord {
        replays: 3,
        ..record(&broker, "search", DeadLetterReason::AttemptsExhausted)
    };
    let flags = flags(&broker);
    let on: Vec<&str> = flags.iter().map(String::as_str).collect();
    let with = |command: &str| run_with(&on, command);
    let who = |command: &str, note: &str| {
        let mut args = on.clone();
        args.extend(command.split_whitespace());
        args.extend(["--actor", "ann@ops", "--note", note]);
        crate::run(&args)
    };
    json(&who("migrate --json", "first deploy"));
    json(&who(
        "migrate --json",
        "again: nothing to create, nothing recorded",
    ));
    seed(
        &broker,
        &[
            secret.clone(),
            secret,
            record(&broker, "mail", DeadLetterReason::AttemptsExhausted),
            looping,
        ],
    );

    // Every message, one by one; looking three times takes nothing.
    for _ in 0..3 {
        let all = json(&with("dlq peek --json"));
        assert_eq!(all["depth"], 5, "{all}");
        assert_eq!(messages(&all).len(), 5, "{all}");
    }
    let found = json(&with(
        "dlq peek --dependency search --reason budget_exhausted --json",
    ));
    let found = messages(&found);
    assert_eq!(found.len(), 2, "{found:?}");
    for m in found {
        has_fields(
            m,
            &[
                "message_id",
                "task",
                "dependency",
                "reason",
                "attempts",
                "dead_lettered_at",
                "error",
            ],
        );
        assert_eq!(m["attempts"], 3, "{m}");
        let error = m["error"].as_str().unwrap();
        assert!(
            error.contains("search.internal") && !error.contains("hunter2"),
            "redacted: {error}"
        );
    }
    let one = json(&with("dlq peek --limit 1 --json"));
    assert_eq!(messages(&one).len(), 1, "{one}");
    let text = stdout(&with("dlq peek --task mail"));
    assert!(
        text.contains("attempts_exhausted") && !text.contains("budget_exhausted"),
        "{text}"
    );
    let text = stdout(&with("dlq peek"));
    assert!(
        text.contains("unreadable headers") && !text.contains("hunter2"),
        "{text}"
    );
    assert_exit(&with("dlq peek --reason tired"), 2, "--reason");
    assert_exit(&with("dlq peek --limit 0"), 2, "--limit");
    assert_eq!(depth(&broker, &t.dead_queue), 5);

    // Dead letters from before the index (seeded by hand): indexed once, as `migrate` does on
    // an upgrade; then the counts are exact without reading a message.
    let reindexed = json(&with("dlq reindex --json"));
    assert_eq!(reindexed["dead_letter"]["read"], 5, "{reindexed}");
    assert_eq!(
        reindexed["dead_letter"]["indexed"], 4,
        "the unreadable one has no row: {reindexed}"
    );
    let stats = json(&with("dlq stats --json"));
    assert_eq!(stats["dead_letter"]["read"], 0, "{stats}");
    assert_eq!(
        stats["dead_letter"]["difference"], 1,
        "the unreadable one: {stats}"
    );

    // A replay of search leaves the unreadable one (not in its selection) where it is.
    let dry = json(&with("replay --dependency search --dry-run --json"));
    assert_eq!(
        (dry["moved"].as_u64(), dry["parked"].as_u64()),
        (Some(2), Some(1)),
        "{dry}"
    );
    // With --include-malformed it moves search's two, parks the looping one and the unreadable
    // one.
    let r = json(&who(
        "replay --dependency search --include-malformed --json",
        "INC-7 search recovered",
    ));
    assert_eq!(
        (r["moved"].as_u64(), r["parked"].as_u64()),
        (Some(2), Some(2)),
        "{r}"
    );

    let parked = json(&with("parked list --json"));
    let list = messages(&parked);
    assert_eq!(list.len(), 2, "{parked}");
    assert!(
        list.iter().any(|m| m["park_reason"]
            .as_str()
            .is_some_and(|r| r.contains("replayed 3 times"))),
        "{parked}"
    );
    assert!(list.iter().any(|m| !m["unreadable"].is_null()), "{parked}");
    let only = json(&with("parked list --dependency search --json"));
    assert_eq!(
        messages(&only).len(),
        1,
        "a filter never selects unreadable messages: {only}"
    );

    // Purge refuses without --yes, and says why; nothing is deleted.
    let refused = with("parked purge");
    assert_exit(&refused, 2, "--yes");
    assert!(
        stderr(&refused).contains("for good"),
        "{}",
        stderr(&refused)
    );
    assert_eq!(depth(&broker, &t.parked_queue), 2);

    // Parked replay: the dry run predicts the run exactly; the looping job goes back to work.
    let dry = json(&with("parked replay --dependency search --dry-run --json"));
    let moved = json(&who(
        "parked replay --dependency search --json",
        "INC-7 loopers",
    ));
    for f in ["matched", "moved", "parked", "skipped", "failed"] {
        assert_eq!(dry[f], moved[f], "{f}: dry run {dry} vs run {moved}");
    }
    assert_eq!(moved["moved"], 1, "{moved}");
    assert_eq!(depth(&broker, &t.work_queue), 3);
    assert_eq!(
        depth(&broker, &t.parked_queue),
        1,
        "the unreadable one stays"
    );

    let purged = json(&who("parked purge --yes --json", "INC-7 garbage"));
    assert_eq!(
        (purged["purged"].as_u64(), purged["kept"].as_u64()),
        (Some(1), Some(0)),
        "{purged}"
    );
    assert_eq!(depth(&broker, &t.parked_queue), 0);

    // The trail: the migration that created something, the replays and the purge, with who,
    // why and the counts before and after; dry runs, refusals and looks left nothing.
    let trail = json(&with("audit --json"));
    let entries = trail["entries"].as_array().unwrap();
    let actions: Vec<&str> = entries
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    // Each replay and purge: its intent before the first message moved, then its end, tied by
    // the run's id.
    assert_eq!(
        actions,
        [
            "migrate",
            "replay_started",
            "replay",
            "parked_replay_started",
            "parked_replay",
            "parked_purge_started",
            "parked_purge"
        ],
        "{trail}"
    );
    for e in entries {
        assert_eq!(e["actor"], "ann@ops", "{e}");
        has_fields(e, &["at_ms", "reason", "before", "after"]);
    }
    for pair in entries[1..].chunks(2) {
        assert_eq!(pair[0]["after"]["run"], pair[1]["after"]["run"], "{pair:?}");
        assert_eq!(pair[1]["after"]["ended"], "completed", "{pair:?}");
    }
    assert_eq!(entries[1]["after"]["expected"]["moved"], 2, "{trail}");
    let (migrate, replay, parked, purge) = (&entries[0], &entries[2], &entries[4], &entries[6]);
    assert_eq!(migrate["reason"], "first deploy");
    assert!(
        migrate["after"]["created"].as_u64().unwrap() >= 6,
        "{migrate}"
    );
    assert_eq!(replay["dependency"], "search");
    assert_eq!(replay["reason"], "INC-7 search recovered");
    assert_eq!(replay["before"]["dead_letter_queue"], 5, "{replay}");
    assert_eq!(replay["after"]["dead_letter_queue"], 1, "{replay}");
    assert_eq!(replay["after"]["work_queue"], 2, "{replay}");
    assert_eq!(replay["after"]["moved"], 2, "{replay}");
    assert!(
        replay["after"]["selected"]
            .as_str()
            .is_some_and(|s| s.starts_with("dependency=search")),
        "{replay}"
    );
    assert_eq!(parked["after"]["moved"], 1, "{parked}");
    assert_eq!(purge["before"]["parked_queue"], 1, "{purge}");
    assert_eq!(purge["after"]["parked_queue"], 0, "{purge}");
    assert_eq!(purge["after"]["purged"], 1, "{purge}");
    let text = stdout(&with("audit --dependency search"));
    assert!(
        text.contains("INC-7 search recovered") && text.contains("parked_replay"),
        "{text}"
    );
    // `[audit] max_entries = 12`: the trail keeps the newest twelve.
    for i in 0..4 {
        json(&who(&format!("replay --dependency d{i} --json"), "bound"));
    }
    let trail = json(&with("audit --json"));
    let entries = trail["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 12, "{trail}");
    assert_eq!(entries[0]["action"], "parked_replay_started", "{trail}");

    // Five peeks and a replay that skipped it: the peeks count nothing; the replay's consumer
    // may have had its put-back copy pushed past its bound and returned (counted once, the
    // documented bound: the next look replaces it with a fresh copy).
    let left = block_on(broker.drain(&t.dead_queue));
    assert_eq!(left.len(), 1);
    for (props, _) in &left {
        let count = headers::get_u64(&headers::table(props), "x-delivery-count")
            .unwrap()
            .unwrap_or(0);
        assert!(count <= 1, "{props:?}");
    }
}

/// Regressions of issue 9: `replay --json` exited 0 when copies failed (text mode exited 1); the
/// dry run predicted 4 moves where the run moved 1; "paused 0.0s" was printed when nothing
/// paused.
#[test]
fn replay_dry_run_predicts_the_run_and_failures_exit_1_in_both_modes() {
    let broker = TestBroker::new("predict");
    let t = &broker.topology;
    let lost_exchange = DeadLetterRecord {
        original_exchange: format!("{}.gone", broker.settings.prefix),
        ..record(&broker, "search", DeadLetterReason::BudgetExhausted)
    };
    let looping = DeadLetterRecord {
        replays: 3,
        ..record(&broker, "search", DeadLetterReason::BudgetExhausted)
    };
    let search = record(&broker, "search", DeadLetterReason::BudgetExhausted);
    block_on(broker.migrate());
    seed(
        &broker,
        &[
            search.clone(),
            lost_exchange,
            search.clone(),
            looping,
            record(&broker, "mail", DeadLetterReason::BudgetExhausted),
            search,
        ],
    );
    let flags = flags(&broker);
    let on: Vec<&str> = flags.iter().map(String::as_str).collect();
    let with = |command: &str| run_with(&on, command);

    json(&with("dlq reindex --json"));
    // Exact without the limit: the index agrees with the queue but for the seeded garbage,
    // which a filter does not select.
    let all = json(&with("replay --dependency search --dry-run --json"));
    assert_eq!(
        (&all["moved"], &all["failed"], &all["parked"]),
        (&json!(3), &json!(1), &json!(1)),
        "{all}"
    );
    let dry = json(&with(
        "replay --dependency search --limit 3 --dry-run --json",
    ));
    // The limit takes 3 of the 4 movable ones, oldest first, one of them to a missing exchange:
    // which, counts by the minute cannot tell, and the prediction says so.
    assert_eq!(dry["exact"], false, "{dry}");
    assert!(
        dry["estimate"]
            .as_str()
            .is_some_and(|e| e.contains("the limit takes 3 of 4")),
        "{dry}"
    );
    let ran = with("replay --dependency search --limit 3 --json");
    assert_eq!(
        ran.status.code(),
        Some(1),
        "a failed copy is exit 1 with --json"
    );
    assert!(stderr(&ran).contains("not confirmed"), "{}", stderr(&ran));
    let ran = json_any(&ran);
    for f in ["matched", "parked", "skipped", "malformed"] {
        assert_eq!(dry[f], ran[f], "{f}: dry run {dry} vs run {ran}");
    }
    let sum = |v: &Value| v["moved"].as_u64().unwrap() + v["failed"].as_u64().unwrap();
    assert_eq!(
        sum(&dry),
        sum(&ran),
        "moved + failed: dry run {dry} vs run {ran}"
    );
    assert_eq!(ran["failed"], 1, "{ran}");
    assert_eq!(ran["moved"], 2, "{ran}");
    assert_eq!(ran["paused_secs"], 0.0, "{ran}");
    assert_eq!(ran["not_ready"], 0, "{ran}");
    assert_eq!(depth(&broker, &t.work_queue), 2);

    // Text mode: the same exit code for the same failure, and no pause that did not happen.
    let text = with("replay --dependency search");
    assert_exit(&text, 1, "not confirmed");
    assert!(!stdout(&text).contains("paused"), "{}", stdout(&text));
    assert_eq!(depth(&broker, &t.work_queue), 3);
}

/// A replay or purge whose intent cannot be audited (Redis does not answer) moves nothing, and
/// says so: the trail never misses an action that moved messages.
#[test]
fn an_action_whose_intent_cannot_be_audited_moves_nothing() {
    let broker = TestBroker::new("intent");
    block_on(broker.migrate());
    seed(
        &broker,
        &[record(&broker, "search", DeadLetterReason::BudgetExhausted)],
    );
    let mut flags = flags(&broker);
    // A port nothing listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("redis://{}", closed.local_addr().unwrap());
    drop(closed);
    flags.extend(["--redis-url".to_owned(), url]);
    let on: Vec<&str> = flags.iter().map(String::as_str).collect();
    for command in [
        "replay --dependency search --json",
        "parked purge --yes --json",
    ] {
        let o = run_with(&on, command);
        assert_eq!(o.status.code(), Some(1), "{command}: {o:?}");
        assert!(
            stderr(&o).contains("could not be audited"),
            "{command}: {}",
            stderr(&o)
        );
    }
    assert_eq!(
        depth(&broker, &broker.topology.dead_queue),
        2,
        "nothing moved"
    );
    assert_eq!(depth(&broker, &broker.topology.work_queue), 0);
}

/// A replay killed half-way (SIGKILL, no end entry): its intent is in the trail, and `audit`
/// shows where it stopped from the run journal; a second replay moves the rest, no message is
/// lost and none is moved twice: what the killed run had moved (confirmed, not yet acked) is
/// dropped, and what it had sent without seeing the broker's answer is parked as in doubt, never
/// copied again (the claims of `fleet_budget::control::ReplayMoves`).
#[test]
fn a_killed_replay_leaves_its_intent_and_where_it_stopped_and_loses_nothing() {
    let broker = TestBroker::new("killed");
    block_on(broker.migrate());
    let records: Vec<DeadLetterRecord> = (0..40)
        .map(|_| record(&broker, "search", DeadLetterReason::BudgetExhausted))
        .collect();
    seed(&broker, &records);
    let flags = flags(&broker);
    let on: Vec<&str> = flags.iter().map(String::as_str).collect();
    let with = |command: &str| run_with(&on, command);
    json(&with("dlq reindex --json"));

    // Paced at 4/s (--fixed-rate: no slow start), killed after about 5 s.
    let mut child = crate::budgetctl()
        .args(&on)
        .args([
            "replay",
            "--dependency",
            "search",
            "--rate",
            "4",
            "--fixed-rate",
            "--actor",
            "ann@ops",
            "--note",
            "INC-8",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while depth(&broker, &broker.topology.work_queue) < 8 {
        assert!(std::time::Instant::now() < deadline, "the replay moves");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    // Past a journal write (every 2 s).
    std::thread::sleep(std::time::Duration::from_millis(2500));
    child.kill().unwrap();
    child.wait().unwrap();

    let trail = json(&with("audit --json"));
    let actions: Vec<&str> = trail["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert_eq!(actions, ["replay_started"], "{trail}");
    let text = stdout(&with("audit"));
    assert!(
        text.contains("no end recorded; last progress") && text.contains("\"moved\""),
        "{text}"
    );

    // The rest, to the end; then every message is in the work queue once, or parked as in
    // doubt (its copy may be in the work queue: an operator decides), none lost.
    let second = json(&with("replay --dependency search --rate 1000 --json"));
    let moved = block_on(broker.drain(&broker.topology.work_queue));
    let parked = block_on(broker.drain(&broker.topology.parked_queue));
    let id = |p: &lapin::BasicProperties| p.message_id().as_ref().map(|id| id.to_string());
    let ids: std::collections::BTreeSet<String> = moved.iter().filter_map(|(p, _)| id(p)).collect();
    let in_doubt: std::collections::BTreeSet<String> =
        parked.iter().filter_map(|(p, _)| id(p)).collect();
    let duplicates = moved.len() - ids.len();
    println!(
        "killed replay: {} of 40 in the work queue, {duplicates} moved twice, {} already moved (dropped), {} parked in doubt",
        ids.len(),
        second["already_moved"],
        in_doubt.len()
    );
    assert_eq!(duplicates, 0, "no job copied twice");
    assert_eq!(ids.union(&in_doubt).count(), 40, "none lost");
    assert_eq!(
        second["in_doubt"].as_u64(),
        Some(in_doubt.len() as u64),
        "{second}"
    );
    for (p, _) in &parked {
        let table = fleet_budget_amqp::headers::table(p);
        let reason = fleet_budget_amqp::headers::fields::get_str(
            &table,
            fleet_budget_amqp::headers::PARK_REASON,
        )
        .unwrap()
        .unwrap_or_default();
        assert!(reason.contains("interrupted replay"), "{reason}");
    }
    // The claims are settled: none left behind.
    let key = format!(
        "{}:v1:replay-moves:{{{}}}",
        flags[3], broker.topology.dead_queue
    );
    let claims = std::process::Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", "6379", "HLEN", &key])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&claims.stdout).trim(),
        "0",
        "claims left behind in {key}"
    );
}

/// What a run cut off half-way leaves, written as its claims would be (run "killed"): 150 dead
/// letters whose copies it had confirmed, 10 it had sent without an answer, 40 it never reached.
/// The next replay drops the 150 (no copy), parks the 10 in doubt and moves the 40, with up to
/// 256 originals unsettled at a time (more than the prefetch are dropped in a row); it reads all
/// 200, and leaves no claim behind.
#[test]
fn a_replay_settles_what_a_cut_off_run_left() {
    let broker = TestBroker::new("leftovers");
    block_on(broker.migrate());
    let r = record(&broker, "search", DeadLetterReason::BudgetExhausted);
    let ids: Vec<String> = block_on(async {
        let publisher: Publisher = broker.publisher().await;
        let mut ids = Vec::new();
        for _ in 0..200 {
            ids.push(broker.publish_dead_letter(&publisher, &r, b"{}").await);
        }
        publisher.close().await;
        ids
    });
    let flags = flags(&broker);
    let on: Vec<&str> = flags.iter().map(String::as_str).collect();
    let with = |command: &str| run_with(&on, command);
    json(&with("dlq reindex --json"));
    let key = format!(
        "{}:v1:replay-moves:{{{}}}",
        flags[3], broker.topology.dead_queue
    );
    let claim = |id: &str, state: &str| {
        let field = format!("{id} {} {}", r.replays, r.dead_lettered_ms);
        let out = std::process::Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", "6379", "HSET", &key, &field])
            .arg(format!("{state} killed"))
            .output()
            .unwrap();
        assert!(out.status.success());
    };
    for id in &ids[..150] {
        claim(id, "c");
    }
    for id in &ids[150..160] {
        claim(id, "s");
    }
    let ran = json(&with(
        "replay --dependency search --rate 10000 --fixed-rate --json",
    ));
    assert_eq!(ran["already_moved"], 150, "{ran}");
    assert_eq!(ran["in_doubt"], 10, "{ran}");
    assert_eq!(ran["moved"], 40, "{ran}");
    assert_eq!(ran["parked"], 10, "{ran}");
    let moved = block_on(broker.drain(&broker.topology.work_queue));
    let moved: std::collections::BTreeSet<String> = moved
        .iter()
        .filter_map(|(p, _)| p.message_id().as_ref().map(ToString::to_string))
        .collect();
    let expected: std::collections::BTreeSet<String> = ids[160..].iter().cloned().collect();
    assert_eq!(
        moved, expected,
        "exactly those the cut-off run never reached"
    );
    assert_eq!(depth(&broker, &broker.topology.parked_queue), 10);
    assert_eq!(
        depth(&broker, &broker.topology.dead_queue),
        0,
        "all 200 settled"
    );
    let stats = json(&with("dlq stats --json"));
    assert_eq!(stats["dead_letter"]["exact"], true, "{stats}");
    let left = std::process::Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", "6379", "HLEN", &key])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&left.stdout).trim(), "0");
}
