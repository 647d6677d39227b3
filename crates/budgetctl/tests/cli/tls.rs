//! `rediss://` and `amqps://` from the command line: a working TLS connection, and each TLS
//! refusal as a named runtime error (exit 1); a URL whose TLS cannot be honoured (`#insecure`,
//! `rediss://` in `redis.cluster_urls`), or certificate files that cannot be used, as a
//! configuration error (exit 2).

use std::path::Path;
use std::process::Output;

use fleet_budget::testing::RedisServer;
use fleet_budget::testing::tls::{TestPki, TlsFront, TlsRedis};

use crate::{assert_exit, budgetctl, json, unique};

fn redis_with_ca(url: &str, ca: &Path, command: &[&str]) -> Output {
    let prefix = unique("tls");
    budgetctl()
        .args(["--redis-url", url, "--key-prefix", prefix.as_str()])
        .args(command)
        .env("FLEET_BUDGET_REDIS_CA_FILE", ca)
        .output()
        .expect("run budgetctl")
}

#[test]
fn status_and_bench_over_rediss_and_each_refusal_named() {
    let pki = TestPki::generate();
    let redis = TlsRedis::start(&pki, false);
    let url = redis.url();
    let ca = pki.ca_file();
    let bench = [
        "bench",
        "--dependency",
        "search",
        "--successes",
        "50",
        "--retries",
        "20",
        "--json",
    ];
    let v = json(&redis_with_ca(&url, &ca, &bench));
    assert_eq!(v["retries_granted"], 10, "{v}");
    json(&redis_with_ca(&url, &ca, &["status", "--json"]));

    let o = redis_with_ca(&url, &pki.other_ca_file(), &["status"]);
    assert_exit(&o, 1, "TLS refused (untrusted_certificate)");
    let wrong_host = format!("rediss://127.0.0.1:{}", redis.tls_port());
    let o = redis_with_ca(&wrong_host, &ca, &["status"]);
    assert_exit(&o, 1, "TLS refused (wrong_host)");
    let plain = RedisServer::start();
    let o = redis_with_ca(
        &format!("rediss://localhost:{}", plain.port()),
        &ca,
        &["status"],
    );
    assert_exit(&o, 1, "TLS refused (not_tls)");

    // What cannot be honoured is configuration: exit 2.
    let o = redis_with_ca(&format!("{url}/#insecure"), &ca, &["status"]);
    assert_exit(&o, 2, "#fragment");
    let o = redis_with_ca(&url, &pki.dir().join("missing.pem"), &["status"]);
    assert_exit(&o, 2, "redis.tls_ca_file");
    let o = redis_with_ca(&plain.url(), &ca, &["status"]);
    assert_exit(&o, 2, "not be encrypted");
    // TLS to a Redis Cluster is not built: refused by name, never connected in plaintext.
    let cluster = crate::temp_file(
        "tls-cluster.toml",
        &format!(
            "[redis]\ncluster_urls = [\"rediss://localhost:{}\"]\n",
            redis.tls_port()
        ),
    );
    let o = budgetctl()
        .args(["--config", cluster.to_str().unwrap(), "status"])
        .output()
        .expect("run budgetctl");
    assert_exit(&o, 2, "redis.cluster_urls[0]");
    assert!(crate::stderr(&o).contains("TLS (rediss://) is not available"));
}

fn amqp_with_ca(url: &str, ca: &Path) -> Output {
    budgetctl()
        .args(["--amqp-url", url, "migrate", "--dry-run", "--json"])
        .env("FLEET_BUDGET_AMQP_CA_FILE", ca)
        .output()
        .expect("run budgetctl")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_over_amqps_and_each_refusal_named() {
    let pki = TestPki::generate();
    let front = TlsFront::start(&pki, "127.0.0.1:5672".parse().unwrap()).await;
    let url = format!("amqps://guest:guest@localhost:{}/%2f", front.port());
    let ca = pki.ca_file();
    let plan = json(&amqp_with_ca(&url, &ca));
    assert_eq!(plan["dry_run"], true, "{plan}");

    let o = amqp_with_ca(&url, &pki.other_ca_file());
    assert_exit(&o, 1, "TLS refused (untrusted_certificate)");
    let wrong_host = format!("amqps://guest:guest@127.0.0.1:{}/%2f", front.port());
    assert_exit(
        &amqp_with_ca(&wrong_host, &ca),
        1,
        "TLS refused (wrong_host)",
    );
    let plain = "amqps://guest:guest@localhost:5672/%2f";
    assert_exit(&amqp_with_ca(plain, &ca), 1, "TLS refused (not_tls)");
    let o = amqp_with_ca(&url, &pki.dir().join("missing.pem"));
    assert_exit(&o, 2, "amqp.tls_ca_file");
    assert!(!String::from_utf8_lossy(&o.stderr).contains("guest:guest"));
}
