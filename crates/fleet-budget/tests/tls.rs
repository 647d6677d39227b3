//! `rediss://` against a private `redis-server` with a TLS port and certificates made by the
//! test: the budget works over TLS (CA file, client certificate), and each way the handshake
//! can fail is refused with its name — never connected in plaintext.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::time::Duration;

use fleet_budget::store::{BudgetStore, RedisStore, RedisTarget};
use fleet_budget::testing::RedisServer;
use fleet_budget::testing::tls::{TestPki, TlsRedis};
use fleet_budget::tls::{TlsFailure, TlsFiles};
use fleet_budget::{BudgetPolicy, Config, Dependency, StoreError};

fn store(url: &str, tls: &TlsFiles) -> RedisStore {
    RedisStore::new_with_tls(
        RedisTarget::Single(url.to_owned()),
        "fbtls",
        Duration::from_secs(5),
        tls,
    )
    .unwrap()
}

fn with_ca(ca: std::path::PathBuf) -> TlsFiles {
    TlsFiles {
        ca_file: Some(ca),
        ..TlsFiles::default()
    }
}

async fn refusal(url: &str, tls: &TlsFiles) -> StoreError {
    store(url, tls)
        .ping()
        .await
        .expect_err("the handshake must fail")
}

#[tokio::test]
async fn budget_decisions_run_over_rediss_with_the_configured_ca() {
    let pki = TestPki::generate();
    let redis = TlsRedis::start(&pki, false);
    // A deadline of seconds: this test is about TLS, and with the default 50 ms, `ping` (20
    // deadlines, at least 1 s) was cut on a loaded machine while a debug build's handshake ran.
    let text = format!(
        "[redis]\nurl = \"{}\"\nkey_prefix = \"fbtls\"\ntimeout_ms = 2000\ntls_ca_file = \"{}\"\n",
        redis.url(),
        pki.ca_file().display()
    );
    let config = Config::from_toml(&text, "t").unwrap();
    let store = RedisStore::from_settings(&config.redis).unwrap();
    store.ping().await.unwrap();
    let dep = Dependency::new("search").unwrap();
    let policy = BudgetPolicy::default();
    let withdrawal = store.withdraw(&dep, &policy).await.unwrap();
    assert!(withdrawal.granted, "the floor allows the first retry");
    // The script ran on this server, through the TLS port.
    let exists: i64 = redis.server.cmd(&["EXISTS", &store.key(&dep)]);
    assert_eq!(exists, 1);
}

#[tokio::test]
async fn a_client_certificate_is_sent_when_the_server_requires_one() {
    let pki = TestPki::generate();
    let redis = TlsRedis::start(&pki, true);
    let without = refusal(&redis.url(), &with_ca(pki.ca_file())).await;
    assert_eq!(
        without.tls_failure(),
        Some(TlsFailure::RefusedByServer),
        "{without}"
    );
    let (cert, key) = pki.client_files();
    let tls = TlsFiles {
        ca_file: Some(pki.ca_file()),
        cert_file: Some(cert),
        key_file: Some(key),
    };
    store(&redis.url(), &tls).ping().await.unwrap();
}

#[tokio::test]
async fn rediss_meeting_a_plaintext_server_is_refused_and_sends_nothing_in_plaintext() {
    let pki = TestPki::generate();
    let plain = RedisServer::start();
    let calls = || {
        let mut calls = plain.command_calls();
        calls.remove("info"); // the harness's own
        calls
    };
    let before = calls();
    let url = format!("rediss://localhost:{}", plain.port());
    let e = refusal(&url, &with_ca(pki.ca_file())).await;
    assert_eq!(e.tls_failure(), Some(TlsFailure::NotTls), "{e}");
    // No command (PING, AUTH, a script) reached the plaintext server.
    assert_eq!(calls(), before);
}

#[tokio::test]
async fn a_certificate_from_another_ca_is_refused() {
    let pki = TestPki::generate();
    let redis = TlsRedis::start(&pki, false);
    let e = refusal(&redis.url(), &with_ca(pki.other_ca_file())).await;
    assert_eq!(
        e.tls_failure(),
        Some(TlsFailure::UntrustedCertificate),
        "{e}"
    );
    // Without a CA file the system's roots are used: the test CA is not among them.
    let e = refusal(&redis.url(), &TlsFiles::default()).await;
    assert_eq!(
        e.tls_failure(),
        Some(TlsFailure::UntrustedCertificate),
        "{e}"
    );
}

#[tokio::test]
async fn a_certificate_for_another_host_name_is_refused() {
    let pki = TestPki::generate();
    let redis = TlsRedis::start(&pki, false);
    // The certificate is for `localhost` only.
    let url = format!("rediss://127.0.0.1:{}", redis.tls_port());
    let e = refusal(&url, &with_ca(pki.ca_file())).await;
    assert_eq!(e.tls_failure(), Some(TlsFailure::WrongHost), "{e}");
}

#[test]
fn certificate_files_for_a_plaintext_url_are_refused() {
    let pki = TestPki::generate();
    let e = RedisStore::new_with_tls(
        RedisTarget::Single("redis://u:hunter2@localhost:1".to_owned()),
        "fbtls",
        Duration::from_secs(1),
        &with_ca(pki.ca_file()),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("not be encrypted"), "{e}");
    assert!(!e.contains("hunter2"), "{e}");
}
