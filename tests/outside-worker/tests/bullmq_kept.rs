//! `fleet_budget::control::bullmq` from the packaged crates, as an operator's own tool would use
//! it: the BullMQ jobs the budget refused that a Node.js worker kept, listed by queue with their
//! lists' lengths and read newest first, with what anyone with access to Redis may have written
//! beside them (an entry that is no JSON, a key of another type, a name BullMQ refuses) reported,
//! never taken for a job. Run by scripts/test-as-user (Redis on FLEET_BUDGET_REDIS_URL).

use fleet_budget::Config;
use fleet_budget::control::bullmq;
use fleet_budget::keys::bullmq_key;
use fleet_budget::store::RedisStore;

/// An entry as the Node.js client writes it (`clients/node/src/bullmqKept.ts`).
fn entry(id: &str, at_ms: u64) -> String {
    format!(
        r#"{{"id":"{id}","task":"send_mail","dependency":"mail","reason":"budget_exhausted","error_class":"http_503","error":"503 from the provider","at_ms":{at_ms}}}"#
    )
}

#[tokio::test]
async fn kept_bullmq_jobs_are_listed_and_read_from_the_packages() {
    let url =
        std::env::var("FLEET_BUDGET_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let prefix = format!(
        "outside-bullmq-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    );
    let config = Config::from_toml(
        &format!(
            "[redis]\nurl = \"{url}\"\nkey_prefix = \"{prefix}\"\n\
             [dependencies.mail]\ntasks = [\"send_mail\"]\n"
        ),
        "outside",
    )
    .unwrap();
    let store = RedisStore::from_settings(&config.redis).unwrap();

    // What a Node.js worker kept (pushed on the left: newest first), and what others wrote.
    let mut redis = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let kept = bullmq_key(&prefix, "kept", "mail-jobs");
    let written = [
        entry("41", 1_000),
        entry("42~r2", 2_000),
        "not json".to_owned(),
        entry("43", 3_000),
    ];
    for e in &written {
        let _: i64 = redis::cmd("LPUSH")
            .arg(&kept)
            .arg(e)
            .query(&mut redis)
            .unwrap();
    }
    let () = redis::cmd("SET")
        .arg(bullmq_key(&prefix, "kept-dropped", "mail-jobs"))
        .arg("7")
        .query(&mut redis)
        .unwrap();
    let _: i64 = redis::cmd("HSET")
        .arg(bullmq_key(&prefix, "kept", "odd"))
        .arg("f")
        .arg("v")
        .query(&mut redis)
        .unwrap();
    let _: i64 = redis::cmd("LPUSH")
        .arg(format!("{prefix}:v1:bullmq-kept:{{a:b}}"))
        .arg(entry("1", 1))
        .query(&mut redis)
        .unwrap();

    let listed = bullmq::kept_queues(&store).await.unwrap();
    assert_eq!(listed.queues, ["mail-jobs", "odd"], "a:b is no BullMQ name");
    assert!(!listed.truncated);

    let lengths = bullmq::kept_lengths(&store, &listed.queues).await.unwrap();
    assert_eq!(
        lengths[0],
        bullmq::KeptQueue {
            queue: "mail-jobs".into(),
            kept: Some(4),
            dropped: Some(7),
            replay: Some(0),
            parked: Some(0),
        }
    );
    assert_eq!(lengths[1].kept, None, "a hash is no list of kept jobs");

    let jobs = bullmq::kept_jobs(&store, "mail-jobs", 0, 10).await.unwrap();
    let ids: Vec<Result<&str, &str>> = jobs
        .iter()
        .map(|j| j.as_ref().map(|j| j.id.as_str()).map_err(|_| "not a job"))
        .collect();
    assert_eq!(ids, [Ok("43"), Err("not a job"), Ok("42~r2"), Ok("41")]);
    let second = jobs[2].as_ref().unwrap();
    assert_eq!(
        (
            second.dependency.as_str(),
            second.error_class.as_str(),
            second.at_ms
        ),
        ("mail", "http_503", 2_000)
    );
    assert_eq!(bullmq::replays_of(&second.id), 2);
    assert!(bullmq::kept_jobs(&store, "a:b", 0, 10).await.is_err());

    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:*"))
        .query(&mut redis)
        .unwrap();
    let _: i64 = redis::cmd("DEL").arg(&keys).query(&mut redis).unwrap();
}
