//! A small HTTP server for `/metrics`, so that a worker exposes its metrics with one line
//! (`MetricsServer::bind(addr, budget.metrics().registry().clone())`) or one configuration key
//! (`[metrics] listen = "127.0.0.1:9464"`).
//!
//! Why hyper: it is the HTTP implementation under most of the Rust ecosystem (axum, reqwest,
//! tonic), it is maintained, and with only its `http1` server and hyper-util's tokio glue it adds
//! about a dozen small crates and no router, middleware or TLS stack a metrics endpoint does not
//! need (figures in the commit that added it).
//!
//! Hostile clients are bounded: at most [`MAX_CONNECTIONS`] connections at once (more wait in
//! the kernel's backlog), request heads within [`HEAD_TIMEOUT`] and 16 KiB, every connection
//! closed after [`CONNECTION_TIMEOUT`], and only `GET`/`HEAD` of `/metrics` (and `/`) answered.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus::Registry;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinHandle;

/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 64;
/// Time a client has to send a request head.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// Time after which a connection is closed, whatever it is doing.
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(60);
/// Largest request head read.
const MAX_HEAD_BYTES: usize = 16 * 1024;

/// The content type of the Prometheus text format.
pub const TEXT_FORMAT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A boxed future returned by [`Exposition::render`].
pub type RenderFuture<'a> = Pin<Box<dyn Future<Output = String> + Send + 'a>>;

/// The request header in which Prometheus says how long it waits for a scrape, in seconds.
pub const SCRAPE_TIMEOUT_HEADER: &str = "x-prometheus-scrape-timeout-seconds";

/// What `/metrics` serves: the Prometheus text exposition, rendered anew for each scrape.
pub trait Exposition: Send + Sync + 'static {
    /// The text of one scrape.
    fn render(&self) -> RenderFuture<'_>;

    /// The text of one scrape whose scraper gives up after `scraper_timeout` (Prometheus sends
    /// it in [`SCRAPE_TIMEOUT_HEADER`]): an exposition that reads slow sources answers within it,
    /// instead of answering a scraper that has gone. By default, [`Exposition::render`].
    fn render_within(&self, scraper_timeout: Option<Duration>) -> RenderFuture<'_> {
        let _ = scraper_timeout;
        self.render()
    }
}

impl Exposition for Registry {
    fn render(&self) -> RenderFuture<'_> {
        Box::pin(async move { encode(&self.gather()) })
    }
}

/// The text format of `families` (empty if they cannot be encoded, which only invalid metric
/// names cause).
#[must_use]
pub fn encode(families: &[prometheus::proto::MetricFamily]) -> String {
    prometheus::TextEncoder::new()
        .encode_to_string(families)
        .unwrap_or_default()
}

/// The server could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// Not called from within a tokio runtime (the server runs on the current one).
    #[error("the metrics server needs a tokio runtime")]
    NoRuntime,
    /// The address could not be bound (in use, not local, no permission).
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: String,
        /// What the system said.
        source: std::io::Error,
    },
}

/// A running `/metrics` server; stops when [`MetricsServer::shutdown`] is called or it is dropped.
#[derive(Debug)]
pub struct MetricsServer {
    local_addr: SocketAddr,
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Listens on `addr` (port 0 picks a free port: see [`MetricsServer::local_addr`]) and serves
    /// `exposition` on `/metrics`, on the current tokio runtime.
    ///
    /// # Errors
    /// [`ServeError::Bind`] when the address cannot be bound.
    pub async fn bind(addr: SocketAddr, exposition: impl Exposition) -> Result<Self, ServeError> {
        Self::start(addr, exposition)
    }

    /// [`MetricsServer::bind`] for code that is not async (binding does not wait).
    ///
    /// # Errors
    /// [`ServeError::NoRuntime`] outside a tokio runtime; [`ServeError::Bind`] when the address
    /// cannot be bound.
    pub fn start(addr: SocketAddr, exposition: impl Exposition) -> Result<Self, ServeError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| ServeError::NoRuntime)?;
        let bind_error = |source| ServeError::Bind {
            addr: addr.to_string(),
            source,
        };
        let listener = std::net::TcpListener::bind(addr).map_err(bind_error)?;
        listener.set_nonblocking(true).map_err(bind_error)?;
        let local_addr = listener.local_addr().map_err(bind_error)?;
        let listener = {
            let _entered = runtime.enter();
            TcpListener::from_std(listener).map_err(bind_error)?
        };
        let (stop, stopped) = watch::channel(false);
        let task = runtime.spawn(accept(listener, Arc::new(exposition), stopped));
        tracing::info!(%local_addr, "serving metrics on /metrics");
        Ok(Self {
            local_addr,
            stop,
            task: Some(task),
        })
    }

    /// Serves `exposition` on `settings.listen` when it is set (`[metrics] listen`), else
    /// nothing.
    ///
    /// # Errors
    /// [`ServeError::Bind`] when the address cannot be bound.
    pub async fn from_settings(
        settings: &crate::config::MetricsSettings,
        exposition: impl Exposition,
    ) -> Result<Option<Self>, ServeError> {
        match settings.listen {
            Some(addr) => Self::bind(addr, exposition).await.map(Some),
            None => Ok(None),
        }
    }

    /// The address it listens on.
    #[must_use]
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops accepting, closes open connections, and waits for the server to end.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

async fn accept(
    listener: TcpListener,
    exposition: Arc<dyn Exposition>,
    mut stopped: watch::Receiver<bool>,
) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        // Wait for a free slot first, so that a flood waits in the backlog, not in memory.
        let permit = tokio::select! {
            p = Arc::clone(&slots).acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return,
            },
            _ = stopped.changed() => return,
        };
        let (stream, _) = tokio::select! {
            r = listener.accept() => match r {
                Ok(s) => s,
                Err(e) => {
                    // Out of file descriptors and the like: pause instead of spinning.
                    tracing::warn!(error = %e, "metrics server: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = stopped.changed() => return,
        };
        let exposition = Arc::clone(&exposition);
        let mut stop = stopped.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let service = service_fn(move |req| {
                let exposition = Arc::clone(&exposition);
                async move { Ok::<_, Infallible>(respond(&req, &*exposition).await) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEAD_TIMEOUT)
                .max_buf_size(MAX_HEAD_BYTES)
                .serve_connection(TokioIo::new(stream), service);
            let mut conn = std::pin::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                () = tokio::time::sleep(CONNECTION_TIMEOUT) => {}
                _ = stop.changed() => {}
            }
        });
    }
}

async fn respond(req: &Request<Incoming>, exposition: &dyn Exposition) -> Response<Full<Bytes>> {
    let head = req.method() == Method::HEAD;
    if req.method() != Method::GET && !head {
        return plain(StatusCode::METHOD_NOT_ALLOWED, "only GET and HEAD\n");
    }
    match req.uri().path() {
        "/metrics" => {
            let body = exposition.render_within(scraper_timeout(req)).await;
            let mut response = Response::new(Full::new(if head {
                Bytes::new()
            } else {
                Bytes::from(body)
            }));
            response
                .headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static(TEXT_FORMAT));
            response
        }
        "/" => plain(StatusCode::OK, "fleet-budget: metrics on /metrics\n"),
        _ => plain(
            StatusCode::NOT_FOUND,
            "not found: metrics are on /metrics\n",
        ),
    }
}

/// The scraper's timeout from [`SCRAPE_TIMEOUT_HEADER`]: a positive number of seconds, at most an
/// hour; anything else is ignored.
fn scraper_timeout(req: &Request<Incoming>) -> Option<Duration> {
    let seconds: f64 = req
        .headers()
        .get(SCRAPE_TIMEOUT_HEADER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    (seconds.is_finite() && seconds > 0.0).then(|| Duration::from_secs_f64(seconds.min(3600.0)))
}

fn plain(status: StatusCode, text: &'static str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from_static(text.as_bytes())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

    use std::net::SocketAddr;

    use prometheus::{IntCounter, Registry};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use super::{MAX_CONNECTIONS, MetricsServer};

    async fn get(addr: SocketAddr, request: &str) -> String {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        response
    }

    fn registry_with_a_counter() -> Registry {
        let registry = Registry::new();
        let c = IntCounter::new("fleet_budget_test_total", "A counter.").unwrap();
        c.inc_by(7);
        registry.register(Box::new(c)).unwrap();
        registry
    }

    #[tokio::test]
    async fn serves_the_registry_on_metrics_and_nothing_else() {
        let server = MetricsServer::bind("127.0.0.1:0".parse().unwrap(), registry_with_a_counter())
            .await
            .unwrap();
        let addr = server.local_addr();
        let ok = get(
            addr,
            "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert!(ok.starts_with("HTTP/1.1 200 OK"), "{ok}");
        assert!(
            ok.contains("content-type: text/plain; version=0.0.4"),
            "{ok}"
        );
        assert!(ok.contains("\nfleet_budget_test_total 7\n"), "{ok}");

        let head = get(
            addr,
            "HEAD /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert!(head.starts_with("HTTP/1.1 200 OK") && !head.contains("fleet_budget_test_total"));
        let missing = get(
            addr,
            "GET /other HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");
        let post = get(
            addr,
            "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert!(post.starts_with("HTTP/1.1 405"), "{post}");
        let garbage = get(addr, "\x00\x01 not http at all\r\n\r\n").await;
        assert!(
            garbage.is_empty() || garbage.starts_with("HTTP/1.1 400"),
            "{garbage}"
        );
        server.shutdown().await;
        assert!(
            TcpStream::connect(addr).await.is_err(),
            "closed after shutdown"
        );
    }

    #[tokio::test]
    async fn idle_connections_beyond_the_limit_do_not_starve_a_scrape_for_ever() {
        tokio::time::pause();
        let server = MetricsServer::bind("127.0.0.1:0".parse().unwrap(), registry_with_a_counter())
            .await
            .unwrap();
        let addr = server.local_addr();
        // Every slot taken by a client that never sends its request head.
        let mut idle = Vec::new();
        for _ in 0..MAX_CONNECTIONS {
            idle.push(TcpStream::connect(addr).await.unwrap());
        }
        let scrape = tokio::spawn(get(
            addr,
            "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        ));
        // The head timeout frees the slots; the scrape that waited in the backlog is served.
        let response = scrape.await.unwrap();
        assert!(response.contains("fleet_budget_test_total 7"), "{response}");
        drop(idle);
        server.shutdown().await;
    }

    #[tokio::test]
    async fn a_port_in_use_is_an_error_naming_the_address() {
        let first = MetricsServer::bind("127.0.0.1:0".parse().unwrap(), Registry::new())
            .await
            .unwrap();
        let err = MetricsServer::bind(first.local_addr(), Registry::new())
            .await
            .unwrap_err();
        assert!(
            err.to_string()
                .contains(&format!("cannot listen on {}", first.local_addr())),
            "{err}"
        );
    }
}
