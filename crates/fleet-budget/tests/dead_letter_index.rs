//! The dead-letter index (`lua/dead_letters.lua`) against a real, private `redis-server`: counts
//! add up from many tasks at once; a decrease never goes below 0 and falls back to the row
//! beyond the bound; the bound holds against a flood of new rows; bad arguments and a key of
//! another type are refused, naming what is wrong, and write nothing.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::sync::Arc;
use std::time::Duration;

use fleet_budget::control::DeadLetterIndex;
use fleet_budget::store::{RedisStore, RedisTarget};
use fleet_budget::testing::RedisServer;
use tokio::task::JoinSet;

fn store(server: &RedisServer) -> Arc<RedisStore> {
    Arc::new(
        RedisStore::new(
            RedisTarget::Single(server.url()),
            "fbt",
            Duration::from_secs(5),
        )
        .unwrap(),
    )
}

fn count(rows: &fleet_budget::control::IndexRows, row: &str) -> u64 {
    rows.rows
        .iter()
        .find(|(r, _)| r == row)
        .map_or(0, |(_, n)| *n)
}

#[tokio::test]
async fn concurrent_changes_add_up_and_never_go_below_zero() {
    let server = RedisServer::start();
    let index = DeadLetterIndex::new(store(&server));
    let mut tasks = JoinSet::new();
    for t in 0..16 {
        let index = index.clone();
        tasks.spawn(async move {
            for _ in 0..50 {
                index
                    .change("q", &[("a".to_owned(), 2), (format!("t{}", t % 4), 1)])
                    .await
                    .unwrap();
                index.change("q", &[("a".to_owned(), -1)]).await.unwrap();
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
    }
    let rows = index.read("q").await.unwrap();
    assert_eq!(count(&rows, "a"), 16 * 50);
    assert_eq!(count(&rows, "t0"), 4 * 50);
    assert_eq!(rows.total(), 16 * 50 * 2);

    // Taking more than a row holds takes what it holds, and removes the row.
    let applied = index
        .change("q", &[("t1".to_owned(), -1000)])
        .await
        .unwrap();
    assert_eq!(applied, [-200]);
    let applied = index
        .change("q", &[("never".to_owned(), -5)])
        .await
        .unwrap();
    assert_eq!(applied, [0], "a message never counted takes nothing");
    let rows = index.read("q").await.unwrap();
    assert_eq!(count(&rows, "t1"), 0);
    assert!(rows.rows.iter().all(|(r, _)| r != "t1"));
}

#[tokio::test]
async fn the_bound_holds_and_decreases_fall_back_to_the_rows_beyond_it() {
    let server = RedisServer::start();
    let index = DeadLetterIndex::new(store(&server)).with_max_rows(10);
    let flood: Vec<(String, i64)> = (0..1000).map(|i| (format!("class-{i}"), 1)).collect();
    index.change("q", &flood).await.unwrap();
    let rows = index.read("q").await.unwrap();
    assert_eq!(rows.rows.len(), 11, "10 rows and the one beyond the bound");
    assert_eq!(count(&rows, "[]"), 990);
    assert_eq!(rows.total(), 1000);
    // A row beyond the bound is taken out of `[]`.
    let applied = index
        .change("q", &[("class-999".to_owned(), -1)])
        .await
        .unwrap();
    assert_eq!(applied, [-1]);
    assert_eq!(count(&index.read("q").await.unwrap(), "[]"), 989);
}

#[tokio::test]
async fn bad_arguments_and_foreign_keys_are_refused_and_write_nothing() {
    let server = RedisServer::start();
    let store = store(&server);
    let index = DeadLetterIndex::new(Arc::clone(&store));
    let long = "x".repeat(2049);
    let e = index.change("q", &[(long, 1)]).await.unwrap_err();
    assert!(e.to_string().contains("row must be 1 to 2048 bytes"), "{e}");
    let e = index.change("q", &[(String::new(), 1)]).await.unwrap_err();
    assert!(e.to_string().contains("row must be"), "{e}");
    assert_eq!(index.read("q").await.unwrap().total(), 0);

    let key = fleet_budget::keys::dead_letters_key("fbt", "other");
    let _: () = store
        .query(redis::cmd("SET").arg(&key).arg("hello"))
        .await
        .unwrap();
    let e = index
        .change("other", &[("a".to_owned(), 1)])
        .await
        .unwrap_err();
    assert!(e.to_string().contains("is not a dead-letter index"), "{e}");
    assert!(index.read("other").await.is_err());

    // Rows someone else wrote are skipped and counted as such.
    let key = fleet_budget::keys::dead_letters_key("fbt", "mixed");
    let _: () = store
        .query(
            redis::cmd("HSET")
                .arg(&key)
                .arg("ok")
                .arg(3)
                .arg("bad")
                .arg("many"),
        )
        .await
        .unwrap();
    let rows = index.read("mixed").await.unwrap();
    assert_eq!((rows.total(), rows.unreadable), (3, 1));
}
