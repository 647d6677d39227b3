//! Connecting to Redis: the target (one server or a cluster), the shared connection made on
//! first use, the certificates of `rediss://`, and telling a TLS handshake nobody answers from
//! a server that is down.

use std::sync::PoisonError;
use std::time::Duration;

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Client, ClientTlsConfig, TlsCertificates};
use tokio::sync::OnceCell;

use super::RedisStore;
use crate::config::RedisSettings;
use crate::error::StoreError;
use crate::redact::redact_url;
use crate::tls::{TlsFiles, install_crypto_provider, is_tls_url};

/// Where the fleet budgets live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisTarget {
    /// One server (or a primary behind a proxy).
    Single(String),
    /// Redis Cluster, by seed node URLs.
    Cluster(Vec<String>),
}

impl RedisTarget {
    /// The target of `settings`: the cluster when seed nodes are given, else the one server.
    #[must_use]
    pub fn from_settings(settings: &RedisSettings) -> Self {
        if settings.cluster_urls.is_empty() {
            Self::Single(settings.url.clone())
        } else {
            Self::Cluster(settings.cluster_urls.clone())
        }
    }

    /// The URLs with passwords redacted.
    #[must_use]
    pub fn display(&self) -> String {
        match self {
            Self::Single(url) => redact_url(url),
            Self::Cluster(urls) => {
                let urls: Vec<_> = urls.iter().map(|u| redact_url(u)).collect();
                format!("cluster [{}]", urls.join(", "))
            }
        }
    }
}

/// The shared connection: every call clones it (a handle on one multiplexed connection).
#[derive(Clone)]
pub(super) enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// A cluster connection being made in a task of its own, awaited by any number of callers.
pub(super) type Connecting = Shared<BoxFuture<'static, redis::RedisResult<ClusterConnection>>>;

/// What [`open`] makes of a target.
pub(super) struct Opened {
    /// One server's connection manager (it connects on first use); empty for a cluster, whose
    /// connection [`RedisStore::connection`] makes on first use.
    pub(super) connection: OnceCell<Connection>,
    /// The cluster's client.
    pub(super) cluster_client: Option<ClusterClient>,
    /// Host and port of a `rediss://` server (see [`RedisStore::ping`]).
    pub(super) tls_address: Option<(String, u16)>,
}

/// The connection of `target`, not yet made: nothing is sent until the first call.
pub(super) fn open(
    target: &RedisTarget,
    timeout: Duration,
    certificates: Option<&TlsCertificates>,
) -> Result<Opened, StoreError> {
    let mut tls_address = None;
    let (connection, cluster_client) = match target {
        RedisTarget::Single(url) => {
            let client = match certificates {
                Some(certs) => Client::build_with_tls(url.as_str(), certs.clone())?,
                None => Client::open(url.as_str())?,
            };
            if let redis::ConnectionAddr::TcpTls { host, port, .. } =
                client.get_connection_info().addr()
            {
                tls_address = Some((host.clone(), *port));
            }
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(timeout.max(Duration::from_millis(250))))
                .set_response_timeout(Some(timeout.max(Duration::from_millis(250))))
                .set_min_delay(Duration::from_millis(20))
                .set_max_delay(Duration::from_millis(500))
                .set_number_of_retries(2);
            let manager = ConnectionManager::new_lazy_with_config(client, config)?;
            (OnceCell::new_with(Some(Connection::Single(manager))), None)
        }
        RedisTarget::Cluster(urls) => {
            let mut builder = ClusterClient::builder(urls.iter().map(String::as_str))
                .connection_timeout(timeout.max(Duration::from_millis(250)))
                .response_timeout(timeout.max(Duration::from_millis(250)))
                .retries(3)
                .min_retry_wait(5)
                .max_retry_wait(200);
            if let Some(certs) = certificates {
                builder = builder.certs(certs.clone());
            }
            let client = builder.build()?;
            (OnceCell::new(), Some(client))
        }
    };
    Ok(Opened {
        connection,
        cluster_client,
        tls_address,
    })
}

impl RedisStore {
    /// Connects now and checks the server answers (`PING`), within the store's deadline × 20.
    ///
    /// # Errors
    /// The server does not answer. For a `rediss://` server that accepts TCP connections but
    /// never answers the TLS handshake (a plaintext server), the error's
    /// [`StoreError::tls_failure`] says so.
    pub async fn ping(&self) -> Result<Duration, StoreError> {
        let started = std::time::Instant::now();
        let deadline = self.timeout.saturating_mul(20).max(Duration::from_secs(1));
        let result = tokio::time::timeout(deadline, async {
            let mut cmd = redis::cmd("PING");
            let cmd = cmd.arg("fleet-budget");
            match self.connection().await? {
                Connection::Single(mut c) => cmd.query_async::<String>(&mut c).await?,
                Connection::Cluster(mut c) => cmd.query_async::<String>(&mut c).await?,
            };
            Ok::<_, StoreError>(())
        })
        .await
        .map_err(|_| StoreError::Timeout(deadline))
        .and_then(|inner| inner);
        match result {
            Ok(()) => Ok(started.elapsed()),
            Err(e) if e.is_timeout() => Err(self
                .unanswered_handshake(started.elapsed())
                .await
                .unwrap_or(e)),
            Err(e) => Err(e),
        }
    }

    /// After a timeout on a `rediss://` server: when a plain TCP connection (nothing sent) is
    /// accepted at once, the server is up and it is the TLS handshake that got no answer.
    async fn unanswered_handshake(&self, after: Duration) -> Option<StoreError> {
        let (host, port) = self.tls_address.as_ref()?;
        let probe = tokio::net::TcpStream::connect((host.as_str(), *port));
        tokio::time::timeout(Duration::from_secs(1), probe)
            .await
            .ok()?
            .ok()?;
        let unanswered = crate::tls::HandshakeUnanswered { after };
        Some(StoreError::Redis(
            std::io::Error::new(std::io::ErrorKind::TimedOut, unanswered).into(),
        ))
    }

    /// A client for another connection to `url` (a node of the target), with the store's TLS
    /// certificates.
    pub(super) fn client_for(&self, url: &str) -> redis::RedisResult<Client> {
        match &self.certificates {
            Some(certs) if is_tls_url(url) => Client::build_with_tls(url, certs.clone()),
            _ => Client::open(url),
        }
    }

    pub(super) async fn connection(&self) -> Result<Connection, StoreError> {
        if let Some(connection) = self.connection.get() {
            return Ok(connection.clone());
        }
        let Some(client) = &self.cluster_client else {
            return Err(StoreError::BadReply {
                script: "connect",
                detail: "no connection configured".to_owned(),
            });
        };
        // Making a cluster connection (seed node, CLUSTER SLOTS, one connection per master) can
        // take longer than one call's deadline. It runs in a task of its own, shared by the
        // callers, so a caller that gives up does not cancel it: the next caller finds it done.
        // (Awaited inside the caller's deadline, it was cancelled every time and a cluster
        // slower to connect than the deadline was never used.)
        let connecting = {
            let mut slot = self
                .connecting
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            slot.get_or_insert_with(|| {
                let client = client.clone();
                let task = tokio::spawn(async move { client.get_async_connection().await });
                async move {
                    match task.await {
                        Ok(result) => result,
                        Err(join) => Err(redis::RedisError::from((
                            redis::ErrorKind::Io,
                            "cluster connection task failed",
                            join.to_string(),
                        ))),
                    }
                }
                .boxed()
                .shared()
            })
            .clone()
        };
        let result = connecting.clone().await;
        {
            let mut slot = self
                .connecting
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if slot
                .as_ref()
                .is_some_and(|current| current.ptr_eq(&connecting))
            {
                // Done: after a failure the next caller starts afresh.
                *slot = None;
            }
        }
        let cluster = result?;
        Ok(self
            .connection
            .get_or_init(|| async { Connection::Cluster(cluster) })
            .await
            .clone())
    }
}

/// The certificates of a TLS target when files are given (`None`: the system's roots, or no
/// TLS); files for a target that is not `rediss://` are refused, since nothing would be
/// encrypted.
pub(super) fn tls_certificates(
    target: &RedisTarget,
    tls: &TlsFiles,
) -> Result<Option<TlsCertificates>, StoreError> {
    let urls: Vec<&str> = match target {
        RedisTarget::Single(url) => vec![url.as_str()],
        RedisTarget::Cluster(urls) => urls.iter().map(String::as_str).collect(),
    };
    if urls.iter().any(|url| is_tls_url(url)) {
        install_crypto_provider();
    }
    if !tls.is_set() {
        return Ok(None);
    }
    if let Some(plain) = urls.iter().find(|url| !is_tls_url(url)) {
        return Err(StoreError::Redis(redis::RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            "TLS certificate files are set (redis.tls_*) but the URL is not rediss://, so the connection would not be encrypted",
            redact_url(plain),
        ))));
    }
    let material = tls.load("redis").map_err(|e| {
        StoreError::Redis(redis::RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            "TLS certificate file",
            e.to_string(),
        )))
    })?;
    Ok(Some(TlsCertificates {
        client_tls: material
            .client
            .map(|(client_cert, client_key)| ClientTlsConfig {
                client_cert,
                client_key,
            }),
        root_cert: material.ca_pem,
    }))
}
