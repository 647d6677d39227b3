//! Why `RedisStore` shares one multiplexed connection instead of a pool: the same retry
//! decision (`lua/spend.lua`) through a `deadpool-redis` pool checkout per call and through the
//! store's shared `ConnectionManager`, beside a `PING` on each, in one run against a private
//! `redis-server`.
//!
//! `cargo run --release -p fleet-budget --features test-harness --example pool_vs_multiplexed -- [calls]`
//!
//! "server commands/call" is the growth of `total_commands_processed`: an `EVALSHA` counts
//! itself plus the commands the script runs in that one round trip (TIME, HMGET, HINCRBY; HSET
//! and PEXPIREAT instead of HINCRBY when the window rolls); a pool checkout adds `UNWATCH` and
//! `PING` (one more round trip) before every call.

use std::sync::Arc;
use std::time::{Duration, Instant};

use deadpool_redis::{Config as PoolConfig, Runtime};
use fleet_budget::store::{BudgetStore, RedisStore, RedisTarget, SPEND_SCRIPT};
use fleet_budget::testing::RedisServer;
use fleet_budget::{BudgetPolicy, Dependency};

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted.get(i).map_or(0.0, |d| d.as_secs_f64() * 1e6)
}

fn report(name: &str, mut samples: Vec<Duration>, commands_before: u64, commands_after: u64) {
    samples.sort();
    #[allow(clippy::cast_precision_loss)]
    let per_call = (commands_after - commands_before) as f64 / samples.len().max(1) as f64;
    println!(
        "{name:<40} p50 {:>7.1} µs   p99 {:>7.1} µs   server commands/call {per_call:.2}",
        percentile(&samples, 0.5),
        percentile(&samples, 0.99)
    );
}

fn total_commands(server: &RedisServer) -> u64 {
    let info: String = server.cmd(&["INFO", "stats"]);
    info.lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let calls: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(20_000);
    let server = RedisServer::start();
    let policy = BudgetPolicy {
        min_allowance: u64::MAX / 4,
        ..BudgetPolicy::default()
    };
    let dependency = Dependency::new("bench")?;
    let store = Arc::new(RedisStore::new(
        RedisTarget::Single(server.url()),
        "fb",
        Duration::from_secs(1),
    )?);
    let pool = PoolConfig::from_url(server.url()).create_pool(Some(Runtime::Tokio1))?;
    let key = store.key(&dependency);
    // Warm up both paths (connect, load the script).
    for _ in 0..200 {
        store.withdraw(&dependency, &policy).await?;
        let mut c = pool.get().await?;
        let _: String = redis::cmd("PING").query_async(&mut c).await?;
    }
    println!(
        "{calls} sequential calls each, private redis-server on 127.0.0.1:{}",
        server.port()
    );

    // Times `calls` runs of `$call` and reports them with the server commands they caused.
    macro_rules! measure {
        ($name:expr, $call:expr) => {{
            let mut samples = Vec::with_capacity(calls);
            let before = total_commands(&server);
            for _ in 0..calls {
                let t = Instant::now();
                $call;
                samples.push(t.elapsed());
            }
            report($name, samples, before, total_commands(&server));
        }};
    }

    let mut conn = redis::Client::open(server.url())?
        .get_multiplexed_async_connection()
        .await?;
    measure!("PING, multiplexed connection", {
        let _: String = redis::cmd("PING").query_async(&mut conn).await?;
    });
    measure!("decision, RedisStore (multiplexed)", {
        store.withdraw(&dependency, &policy).await?;
    });
    measure!("PING, deadpool checkout per call", {
        let mut c = pool.get().await?;
        let _: String = redis::cmd("PING").query_async(&mut c).await?;
    });
    measure!("decision, deadpool checkout per call", {
        let mut c = pool.get().await?;
        let mut invocation = SPEND_SCRIPT.key(&key);
        invocation
            .arg(policy.window_ms())
            .arg(policy.ratio.to_string())
            .arg(policy.min_allowance)
            .arg("s")
            .arg("sliding");
        let _: Vec<i64> = invocation.invoke_async(&mut *c).await?;
    });
    Ok(())
}
