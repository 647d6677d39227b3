//! A worker's life: a killed process, graceful shutdown, a dropped connection, a delay longer
//! than every tier.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fleet_budget::{Dependency, Failure, FleetBudget};
use fleet_budget_amqp::{Worker, WorkerConfig, WorkerOptions};
use tokio::task::JoinHandle;

use super::{LONG, options, start, stop};
use crate::common::{Env, wait_until};

const CHILD_ENV: &str = "FLEET_BUDGET_AMQP_TEST_CHILD_CONFIG";

/// Not a test on its own: the body of the child process of
/// `a_killed_worker_process_has_its_job_redelivered` (runs only when the variable is set).
#[test]
fn child_worker_process() {
    let Ok(toml) = std::env::var(CHILD_ENV) else {
        return;
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async move {
        let config = WorkerConfig::from_toml(&toml, "child").unwrap();
        let topology = fleet_budget_amqp::Topology::new(&config.amqp);
        let budget = FleetBudget::from_config(&config.budget).await.unwrap();
        let worker = Worker::new(
            budget,
            topology.clone(),
            WorkerOptions::new(&config, &topology),
        );
        worker
            .run(|job| async move {
                println!("STARTED {}", job.message_id.unwrap_or_default());
                tokio::time::sleep(Duration::from_secs(3600)).await;
                Ok(())
            })
            .await
            .unwrap();
    });
}

/// Kills the child process even when the test fails.
struct ChildGuard(std::process::Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A worker process killed (SIGKILL) mid-job: the broker redelivers the job to another worker.
#[tokio::test]
async fn a_killed_worker_process_has_its_job_redelivered() {
    let env = Env::new("killed", "", "", "").await;
    let mut child = ChildGuard(
        Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "worker::lifecycle::child_worker_process",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env(CHILD_ENV, &env.toml)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let id = env.publish_one(b"x").await;
    let stdout = child.0.stdout.take().unwrap();
    let started = tokio::task::spawn_blocking(move || {
        for line in BufReader::new(stdout).lines() {
            let line = line.unwrap();
            // The harness prints "test child_worker_process ... " before the job's line.
            if let Some(at) = line.find("STARTED ") {
                return Some(line[at + "STARTED ".len()..].trim().to_owned());
            }
        }
        None
    });
    let started = tokio::time::timeout(LONG, started)
        .await
        .expect("the child starts the job")
        .unwrap();
    assert_eq!(started.as_deref(), Some(id.as_str()));
    child.0.kill().unwrap(); // SIGKILL: no shutdown, no ack, no nack
    child.0.wait().unwrap();

    let seen = Arc::new(Mutex::new(Vec::new()));
    let runner = {
        let seen = Arc::clone(&seen);
        start(env.budget().await, &env, move |job| {
            seen.lock().unwrap().push((
                job.message_id.clone().unwrap(),
                job.redelivered,
                job.attempt,
            ));
            async { Ok(()) }
        })
    };
    wait_until(LONG, "the redelivery", || async {
        !seen.lock().unwrap().is_empty()
    })
    .await;
    stop(runner).await;
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen, vec![(id, true, 1)]);
    assert_eq!(env.depth(&env.topology.work_queue).await, 0);
}

/// Graceful shutdown lets in-flight jobs finish (acked, not requeued) and flushes the coalesced
/// success counters to Redis.
#[tokio::test]
async fn graceful_shutdown_finishes_in_flight_jobs_and_flushes_counters() {
    let env = Env::new(
        "shutdown",
        "deposit_flush_ms = 10000",
        "",
        "[dependencies.search]\ntasks = [\"index\"]\n",
    )
    .await;
    let started = Arc::new(AtomicU32::new(0));
    let runner = {
        let started = Arc::clone(&started);
        start(env.budget().await, &env, move |_job| {
            started.fetch_add(1, Ordering::SeqCst);
            async {
                tokio::time::sleep(Duration::from_millis(800)).await;
                Ok(())
            }
        })
    };
    let publisher = env.publisher().await;
    for _ in 0..4 {
        publisher
            .publish_job(&env.topology.work_exchange, "index", "index", b"x")
            .await
            .unwrap();
    }
    wait_until(LONG, "four jobs in flight", || async {
        started.load(Ordering::SeqCst) == 4
    })
    .await;
    let counts = stop(runner).await;
    assert_eq!(counts.succeeded, 4, "{counts:?}");
    assert_eq!(env.depth(&env.topology.work_queue).await, 0);
    let (snapshot, _) = env
        .budget()
        .await
        .status(&Dependency::new("search").unwrap())
        .await;
    assert_eq!(
        snapshot.current.successes + snapshot.previous.successes,
        4,
        "counters flushed at shutdown: {snapshot:?}"
    );
}

/// A TCP forwarder to the broker whose connections the test can cut.
struct Proxy {
    port: u16,
    tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Proxy {
    async fn start(target: String) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let tasks: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let t = Arc::clone(&tasks);
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let target = target.clone();
                let task = tokio::spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                t.lock().unwrap().push(task);
            }
        });
        Self { port, tasks }
    }

    fn cut(&self) {
        for t in self.tasks.lock().unwrap().drain(..) {
            t.abort();
        }
    }
}

/// `amqp://user:pass@host:port/vhost` → (host:port, the same URL through 127.0.0.1:`port`).
fn via_proxy(url: &str, port: u16) -> (String, String) {
    let (scheme, rest) = url.split_once("://").unwrap();
    let (auth, rest) = rest.split_once('@').map_or(("", rest), |(a, r)| (a, r));
    let (hostport, path) = rest.split_once('/').map_or((rest, ""), |(h, p)| (h, p));
    let target = if hostport.contains(':') {
        hostport.to_owned()
    } else {
        format!("{hostport}:5672")
    };
    let at = if auth.is_empty() {
        String::new()
    } else {
        format!("{auth}@")
    };
    (target, format!("{scheme}://{at}127.0.0.1:{port}/{path}"))
}

/// A dropped connection is re-established with backoff and consuming resumes.
#[tokio::test]
async fn a_dropped_connection_is_reestablished_and_consuming_resumes() {
    let env = Env::new("reconnect", "", "", "").await;
    let (target, _) = via_proxy(&env.url, 0);
    let proxy = Proxy::start(target).await;
    let (_, proxied) = via_proxy(&env.url, proxy.port);
    let mut opts = options(&env);
    opts.url = proxied;
    let done = Arc::new(Mutex::new(Vec::new()));
    let worker = Worker::new(env.budget().await, env.topology.clone(), opts);
    let handle = worker.handle();
    let join = {
        let done = Arc::clone(&done);
        tokio::spawn(async move {
            worker
                .run(move |job| {
                    done.lock().unwrap().push(job.message_id.unwrap());
                    async { Ok(()) }
                })
                .await
                .unwrap()
        })
    };
    let publisher = env.publisher().await;
    let first = publisher
        .publish_job(&env.topology.work_exchange, "t", "t", b"1")
        .await
        .unwrap();
    wait_until(LONG, "the first job", || async {
        done.lock().unwrap().len() == 1
    })
    .await;
    proxy.cut();
    let second = publisher
        .publish_job(&env.topology.work_exchange, "t", "t", b"2")
        .await
        .unwrap();
    wait_until(LONG, "the second job after reconnecting", || async {
        done.lock().unwrap().contains(&second)
    })
    .await;
    let counts = stop((handle, join)).await;
    assert!(counts.connections >= 2, "{counts:?}");
    assert!(done.lock().unwrap().contains(&first));
    assert_eq!(env.depth(&env.topology.work_queue).await, 0);
}

/// (attempt, started, retry delay)
type Run = (u32, Instant, Option<Duration>);

/// A backoff delay longer than the longest tier: the retry comes back early, waits in a tier
/// again without running (or spending budget), and runs no sooner than its delay.
#[tokio::test]
async fn a_delay_longer_than_every_tier_is_waited_out() {
    let env = Env::with_amqp(
        "longdelay",
        "retry_tiers_secs = [0.1, 0.2]",
        "",
        "",
        "[tasks.t]\nbackoff_base_ms = 1500\nbackoff_cap_ms = 1500\n",
    )
    .await;
    let runs: Arc<Mutex<Vec<Run>>> = Arc::default();
    let runner = {
        let runs = Arc::clone(&runs);
        start(env.budget().await, &env, move |job| {
            runs.lock()
                .unwrap()
                .push((job.attempt, Instant::now(), job.retry_delay()));
            let ok = job.attempt > 1;
            async move {
                if ok {
                    Ok(())
                } else {
                    Err(Failure::retryable("timeout"))
                }
            }
        })
    };
    env.publish_one(b"x").await;
    wait_until(LONG, "the retry to succeed", || async {
        runner.0.counts().succeeded == 1
    })
    .await;
    let counts = stop(runner).await;
    let runs = runs.lock().unwrap().clone();
    assert_eq!(runs.len(), 2, "the handler runs once per attempt: {runs:?}");
    let delay = runs[1].2.unwrap();
    // Far above the longest tier, so that the copy comes back early even on a loaded machine.
    assert!(
        delay > Duration::from_millis(700),
        "jitter keeps the delay in [1125, 1875] ms: {delay:?}"
    );
    assert!(
        runs[1].1 - runs[0].1 >= delay,
        "ran after {:?}, before its delay {delay:?}",
        runs[1].1 - runs[0].1
    );
    assert!(counts.waited_again >= 1, "{counts:?}");
    assert_eq!(counts.retried, 1, "{counts:?}");
}
