//! The dead-letter index against the real broker and Redis: what workers dead-letter is counted
//! as they confirm it; a look (counts, dry run) reads no message and is exact while the index
//! agrees with the queue; a replay and a purge touch exactly their selection (error class
//! included) and count out what they took; a message the index does not know (a producer's
//! garbage) makes every look an estimate that says so, and is parked only by an empty filter.

use fleet_budget::Failure;
use fleet_budget_amqp::dead_letters::UNREADABLE;
use fleet_budget_amqp::{ReplayFilter, ReplayOptions, Replayer};
use lapin::BasicProperties;

use crate::common::{Env, wait_until};
use crate::worker::{start_worker, stop_worker};

const LONG: std::time::Duration = std::time::Duration::from_secs(60);

fn filter(dependency: &str, class: Option<&str>) -> ReplayFilter {
    ReplayFilter {
        dependency: Some(dependency.to_owned()),
        error_class: class.map(str::to_owned),
        ..ReplayFilter::default()
    }
}

#[tokio::test]
async fn looks_read_no_message_and_actions_touch_exactly_their_selection() {
    let env = Env::new(
        "dlindex",
        "",
        "",
        "[dependencies.search]\ntasks = [\"index\"]\n[dependencies.mail]\ntasks = [\"send\"]\n",
    )
    .await;
    let publisher = env.publisher().await;
    let jobs = [
        ("index", "timeout", 30),
        ("index", "http_503", 20),
        ("send", "bad_request", 10),
    ];
    for (task, class, n) in jobs {
        for _ in 0..n {
            publisher
                .publish_job(&env.topology.work_exchange, task, task, class.as_bytes())
                .await
                .unwrap();
        }
    }
    // Every job fails for good, with its body as its error class: 60 dead letters, counted by
    // the worker as the broker confirms them.
    let runner = start_worker(env.budget().await, &env, |job| async move {
        let class = String::from_utf8_lossy(&job.payload).into_owned();
        Err(Failure::non_retryable("it failed").with_class(class))
    });
    let handle = runner.0.clone();
    wait_until(LONG, "60 dead letters", || {
        let counts = handle.counts();
        async move { counts.dead_lettered == 60 }
    })
    .await;
    stop_worker(runner).await;
    env.depth_reaching(&env.topology.dead_queue, 60, LONG).await;

    let replayer = Replayer::new(
        env.url.clone(),
        env.topology.clone(),
        Some(env.budget().await),
    );
    let counts = replayer.counts().await.unwrap();
    assert_eq!(
        (counts.depth, counts.indexed()),
        (60, 60),
        "{:?} {counts:?}",
        counts.why_estimate()
    );
    assert!(counts.exact(), "{:?}", counts.why_estimate());
    let groups: Vec<_> = counts
        .groups()
        .into_iter()
        .map(|g| (g.dependency, g.error_class, g.messages))
        .collect();
    assert_eq!(
        groups,
        [
            ("search".to_owned(), "timeout".to_owned(), 30),
            ("search".to_owned(), "http_503".to_owned(), 20),
            ("mail".to_owned(), "bad_request".to_owned(), 10),
        ]
    );

    // The dry run of one row: exact, and what the run then does.
    let mut options = ReplayOptions::new(&env.config);
    options.filter = filter("search", Some("timeout"));
    let dry = replayer.dry_run(&options).await.unwrap();
    assert!(dry.exact, "{dry:?}");
    assert_eq!(
        (dry.total, dry.seen, dry.would_move, dry.skipped),
        (60, 0, 30, 30)
    );

    // A producer's garbage lands in the dead-letter queue, unknown to the index: looks say so.
    publisher
        .publish(
            "",
            &env.topology.dead_queue,
            b"garbage",
            BasicProperties::default().with_delivery_mode(2),
        )
        .await
        .unwrap();
    env.depth_reaching(&env.topology.dead_queue, 61, LONG).await;
    let counts = replayer.counts().await.unwrap();
    assert_eq!(
        (counts.depth, counts.indexed(), counts.difference()),
        (61, 60, 1)
    );
    assert!(!counts.exact());
    assert!(
        counts
            .why_estimate()
            .unwrap()
            .contains("1 messages in the queue are not in the index")
    );
    let dry = replayer.dry_run(&options).await.unwrap();
    assert_eq!(
        (dry.would_move, dry.uncertain, dry.exact),
        (30, 1, false),
        "{dry:?}"
    );

    // The run moves that row only; the garbage is not in its selection, so it is not parked.
    let run = replayer.run(&options, |_| {}).await.unwrap();
    assert_eq!((run.moved, run.parked, run.skipped), (30, 0, 31), "{run:?}");
    env.ready_again(&env.topology.dead_queue, 31).await;
    let counts = replayer.counts().await.unwrap();
    assert_eq!((counts.depth, counts.indexed()), (31, 30), "{counts:?}");
    assert_eq!(counts.matching(|r| r.error_class == "timeout"), 0);

    // A purge of the http_503 row removes those 20 and nothing else.
    let purged = replayer
        .purge(&filter("search", Some("http_503")), None)
        .await
        .unwrap();
    assert_eq!(
        (purged.removed, purged.index_unrecorded),
        (20, 0),
        "{purged:?}"
    );
    env.ready_again(&env.topology.dead_queue, 11).await;
    let counts = replayer.counts().await.unwrap();
    assert_eq!((counts.depth, counts.indexed()), (11, 10), "{counts:?}");
    assert_eq!(counts.matching(|r| r.dependency == "mail"), 10);

    // An empty filter selects everything, the garbage too: parked, and counted there.
    let run = replayer
        .run(&ReplayOptions::new(&env.config), |_| {})
        .await
        .unwrap();
    assert_eq!((run.moved, run.parked), (10, 1), "{run:?}");
    let counts = replayer.counts().await.unwrap();
    assert_eq!((counts.depth, counts.indexed()), (0, 0), "{counts:?}");
    assert!(counts.exact());
    // The parked copy is confirmed; the broker counts it ready a moment later.
    env.depth_reaching(&env.topology.parked_queue, 1, LONG)
        .await;
    let parked = Replayer::parked(
        env.url.clone(),
        env.topology.clone(),
        Some(env.budget().await),
    )
    .counts()
    .await
    .unwrap();
    assert_eq!((parked.depth, parked.indexed()), (1, 1), "{parked:?}");
    assert_eq!(parked.matching(|r| r.reason == UNREADABLE), 1);
    assert_eq!(
        env.depth_reaching(&env.topology.work_queue, 40, LONG).await,
        40
    );
}

/// A Redis that stalls (a busy script of 300 ms every 400 ms, as a large `DEL` or a slow script
/// of another user does) while a worker with the default 50 ms deadline dead-letters 400 jobs:
/// the batches its tally sends pass their deadline and run later in Redis; it sends them again,
/// and the script applies each batch once. The index counts every dead letter exactly once:
/// none lost for want of an answer, none counted twice by a retry.
#[tokio::test]
async fn a_stalling_redis_counts_every_dead_letter_once() {
    let env = Env::new(
        "dlstall",
        "",
        "",
        "[dependencies.search]\ntasks = [\"index\"]\n",
    )
    .await;
    let publisher = env.publisher().await;
    for _ in 0..400 {
        publisher
            .publish_job(&env.topology.work_exchange, "index", "index", b"timeout")
            .await
            .unwrap();
    }
    publisher.close().await;
    let mut config = env.config.budget.clone();
    config.redis.timeout = std::time::Duration::from_millis(50);
    let budget = fleet_budget::FleetBudget::from_config(&config)
        .await
        .unwrap();

    // The stalls, from a connection of their own.
    let stalling = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let url = env.redis.url();
    let staller = {
        let stalling = std::sync::Arc::clone(&stalling);
        std::thread::spawn(move || {
            let mut stalls = 0_u32;
            while stalling.load(std::sync::atomic::Ordering::SeqCst) {
                let done = std::process::Command::new("redis-cli")
                    .args(["-u", &url, "EVAL"])
                    .arg(
                        "local t = redis.call('TIME') local until_us = t[1] * 1000000 + t[2] + 300000 \
                         repeat t = redis.call('TIME') until t[1] * 1000000 + t[2] >= until_us",
                    )
                    .arg("0")
                    .output()
                    .expect("redis-cli");
                assert!(done.status.success(), "{done:?}");
                stalls += 1;
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            stalls
        })
    };

    let runner = start_worker(budget, &env, |job| async move {
        let class = String::from_utf8_lossy(&job.payload).into_owned();
        Err(Failure::non_retryable("it failed").with_class(class))
    });
    let handle = runner.0.clone();
    wait_until(LONG, "400 dead letters", || {
        let counts = handle.counts();
        async move { counts.dead_lettered == 400 }
    })
    .await;
    // A few more stalls over the batches still unanswered, then Redis answers again.
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    stalling.store(false, std::sync::atomic::Ordering::SeqCst);
    let stalls = staller.join().unwrap();
    let counts = stop_worker(runner).await;
    env.depth_reaching(&env.topology.dead_queue, 400, LONG)
        .await;

    let replayer = Replayer::new(
        env.url.clone(),
        env.topology.clone(),
        Some(env.budget().await),
    );
    let looked = replayer.counts().await.unwrap();
    println!(
        "stalling Redis ({stalls} stalls of 300 ms): 400 dead-lettered, index {} of depth {}, \
         batches sent again {}, unrecorded {}",
        looked.indexed(),
        looked.depth,
        counts.index_sent_again,
        counts.index_unrecorded
    );
    assert_eq!(
        (looked.depth, looked.indexed(), counts.index_unrecorded),
        (400, 400, 0),
        "{:?} {looked:?} {counts:?}",
        looked.why_estimate()
    );
    assert!(looked.exact(), "{:?}", looked.why_estimate());
    assert!(
        counts.index_sent_again > 0,
        "the stalls made some batch go unanswered: {counts:?}"
    );
}
