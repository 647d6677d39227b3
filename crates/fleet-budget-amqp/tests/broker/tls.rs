//! `amqps://` through a real TLS handshake (a TLS front made by the test, forwarding to the
//! shared RabbitMQ), and each way the handshake can fail, refused with its name.
//!
//! The certificate files travel with each connection's configuration ([`ConnectionConfig`]).

use std::time::Duration;

use fleet_budget::testing::tls::{TestPki, TlsFront};
use fleet_budget::tls::{TlsFailure, TlsFiles};
use fleet_budget_amqp::AmqpError;
use fleet_budget_amqp::connection::{ConnectionConfig, Timeouts, connect};
use lapin::options::{QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::FieldTable;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn with_ca(ca: std::path::PathBuf) -> TlsFiles {
    TlsFiles {
        ca_file: Some(ca),
        ..TlsFiles::default()
    }
}

/// `url` with the default deadlines and the certificate files `tls`.
fn broker(url: &str, tls: TlsFiles) -> ConnectionConfig {
    ConnectionConfig {
        url: url.to_owned(),
        other_urls: Vec::new(),
        timeouts: Timeouts::DEFAULT,
        tls,
    }
}

async fn tls_refusal(url: &str, tls: TlsFiles) -> (TlsFailure, String) {
    let e = connect(broker(url, tls), "fleet-budget tls test")
        .await
        .expect_err("refused");
    let text = e.to_string();
    assert!(!text.contains("guest:guest"), "{text}");
    match e {
        AmqpError::Tls { failure, .. } => (failure, text),
        other => panic!("expected a TLS refusal, got {other}"),
    }
}

#[tokio::test]
async fn amqps_carries_the_broker_protocol_through_tls() {
    let pki = TestPki::generate();
    let front = TlsFront::start(&pki, "127.0.0.1:5672".parse().unwrap()).await;
    let url = format!("amqps://guest:guest@localhost:{}/%2f", front.port());
    let conn = connect(
        broker(&url, with_ca(pki.ca_file())),
        "fleet-budget tls test",
    )
    .await
    .unwrap();
    let channel = conn.create_channel().await.unwrap();
    let name = format!("fleet-budget-tls-{}", std::process::id());
    let queue = channel
        .queue_declare(
            name.as_str().into(),
            QueueDeclareOptions {
                auto_delete: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    assert_eq!(queue.name().as_str(), name);
    channel
        .queue_delete(name.as_str().into(), QueueDeleteOptions::default())
        .await
        .unwrap();
    conn.close(200, "done".into()).await.unwrap();
}

#[tokio::test]
async fn amqps_meeting_a_plaintext_broker_is_refused_before_any_amqp_byte_is_sent() {
    let pki = TestPki::generate();
    // The real broker, plaintext on 5672.
    let (failure, text) = tls_refusal(
        "amqps://guest:guest@localhost:5672/%2f",
        with_ca(pki.ca_file()),
    )
    .await;
    assert_eq!(failure, TlsFailure::NotTls, "{text}");
    // A plaintext listener that answers as RabbitMQ does and records what it received.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let received = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut buf = vec![0_u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(10), socket.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        socket.write_all(b"AMQP\x00\x00\x09\x01").await.unwrap();
        buf.truncate(n);
        buf
    });
    let url = format!("amqps://guest:s3cret-pw@localhost:{port}/%2f");
    let (failure, text) = tls_refusal(&url, with_ca(pki.ca_file())).await;
    assert_eq!(failure, TlsFailure::NotTls, "{text}");
    assert!(!text.contains("s3cret-pw"), "{text}");
    let bytes = received.await.unwrap();
    assert_eq!(
        bytes.first(),
        Some(&0x16),
        "a TLS handshake record, not {bytes:?}"
    );
    let seen = String::from_utf8_lossy(&bytes);
    assert!(
        !seen.contains("AMQP") && !seen.contains("s3cret-pw"),
        "{seen}"
    );
}

#[tokio::test]
async fn a_broker_certificate_from_another_ca_is_refused() {
    let pki = TestPki::generate();
    let front = TlsFront::start(&pki, "127.0.0.1:5672".parse().unwrap()).await;
    let url = format!("amqps://guest:guest@localhost:{}/%2f", front.port());
    let (failure, text) = tls_refusal(&url, with_ca(pki.other_ca_file())).await;
    assert_eq!(failure, TlsFailure::UntrustedCertificate, "{text}");
    assert!(text.contains("amqp.tls_ca_file"), "{text}");
    // Without a CA file: the system's roots, which do not hold the test CA.
    let (failure, text) = tls_refusal(&url, TlsFiles::default()).await;
    assert_eq!(failure, TlsFailure::UntrustedCertificate, "{text}");
}

#[tokio::test]
async fn a_broker_certificate_for_another_host_name_is_refused() {
    let pki = TestPki::generate();
    let front = TlsFront::start(&pki, "127.0.0.1:5672".parse().unwrap()).await;
    // The certificate is for `localhost` only.
    let url = format!("amqps://guest:guest@127.0.0.1:{}/%2f", front.port());
    let (failure, text) = tls_refusal(&url, with_ca(pki.ca_file())).await;
    assert_eq!(failure, TlsFailure::WrongHost, "{text}");
}
