//! The HTTP/1 server: hyper's connection driver with the console's bounds on the network.
//!
//! Why not `axum::serve`: it sets no deadline and no bound, so half-sent requests were held for
//! ever (issue 32: 200 still open after 35 s; 1,100 of them, under a 1,024-file limit, stopped
//! `/login` answering). Here:
//! - a request's head must arrive within [`NetLimits::header_timeout`] (hyper's
//!   `header_read_timeout`, which also ends a keep-alive connection idle that long); the body
//!   within `body_timeout` (the routes' guard, which answers 408);
//! - a write the client does not read for `write_idle_timeout` ends the connection ([`Watched`]);
//! - at most `max_connections` are open, and `max_connections_per_address` from one address
//!   (trusted proxies exempt). When the table is full a new connection evicts the one that has
//!   waited longest for a request head (a half-sent request, an idle keep-alive), so a flood of
//!   half-sent requests delays a real one by nothing; only when every connection is inside a
//!   request is the new one closed.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, oneshot, watch};
use tokio::task::JoinSet;
use tower_service::Service as _;

use crate::NetLimits;
use crate::access::{Counters, address_key, lock};

/// Headers hyper parses before answering 431 itself: above the guard's own limit
/// (`routes::MAX_HEADERS`), so the guard answers first, with the security headers.
const HYPER_MAX_HEADERS: usize = 200;
/// The most hyper buffers of a request head before answering 431 itself (per connection; the
/// guard's own limit on a head is `routes::MAX_HEAD_BYTES`).
const HYPER_MAX_BUF: usize = 128 * 1024;
/// How long a stop waits for requests under way.
const STOP_GRACE: Duration = Duration::from_secs(5);
/// `Conn::waiting_since` of a connection inside a request.
const IN_REQUEST: u64 = u64::MAX;

struct Conn {
    /// The address it counts under (`None`: a trusted proxy, not counted).
    key: Option<IpAddr>,
    /// Milliseconds (since the server started) from which it has waited for a request head.
    waiting_since: Arc<AtomicU64>,
    kill: Arc<Notify>,
}

#[derive(Default)]
struct Table {
    conns: HashMap<u64, Conn>,
    per_address: HashMap<IpAddr, usize>,
}

impl Table {
    fn forget(&mut self, id: u64) -> Option<Conn> {
        let c = self.conns.remove(&id)?;
        if let Some(key) = c.key
            && let Some(n) = self.per_address.get_mut(&key)
        {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.per_address.remove(&key);
            }
        }
        Some(c)
    }
}

fn millis(base: Instant) -> u64 {
    u64::try_from(base.elapsed().as_millis()).unwrap_or(IN_REQUEST - 1)
}

/// Serves `router` on `listener` until `stopped`.
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    limits: NetLimits,
    trusted: Vec<IpAddr>,
    counters: Arc<Counters>,
    mut stopped: oneshot::Receiver<()>,
) -> io::Result<()> {
    let base = Instant::now();
    let table = Arc::new(Mutex::new(Table::default()));
    let (shutdown, shutting_down) = watch::channel(false);
    let mut tasks = JoinSet::new();
    let mut next_id = 0u64;
    let mut last_accept_warning: Option<Instant> = None;
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = &mut stopped => break,
            Some(_) = tasks.join_next(), if !tasks.is_empty() => continue,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of file descriptors, most often: wait for connections to end.
                if last_accept_warning.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
                    tracing::warn!(error = %e, "console: accepting a connection failed");
                    last_accept_warning = Some(Instant::now());
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let key = (!trusted.contains(&peer.ip().to_canonical())).then(|| address_key(peer.ip()));
        let id = next_id;
        next_id += 1;
        let waiting_since = Arc::new(AtomicU64::new(millis(base)));
        let kill = Arc::new(Notify::new());
        {
            let mut t = lock(&table);
            if let Some(key) = key
                && t.per_address.get(&key).copied().unwrap_or(0)
                    >= limits.max_connections_per_address
            {
                Counters::add(&counters.conns_refused_per_address);
                drop(stream);
                continue;
            }
            if t.conns.len() >= limits.max_connections {
                let oldest = t
                    .conns
                    .iter()
                    .filter_map(|(id, c)| {
                        let w = c.waiting_since.load(Ordering::Relaxed);
                        (w != IN_REQUEST).then_some((w, *id))
                    })
                    .min();
                match oldest.and_then(|(_, victim)| t.forget(victim)) {
                    Some(victim) => {
                        victim.kill.notify_one();
                        Counters::add(&counters.conns_evicted);
                    }
                    None => {
                        Counters::add(&counters.conns_refused_full);
                        drop(stream);
                        continue;
                    }
                }
            }
            if let Some(key) = key {
                *t.per_address.entry(key).or_insert(0) += 1;
            }
            t.conns.insert(
                id,
                Conn {
                    key,
                    waiting_since: Arc::clone(&waiting_since),
                    kill: Arc::clone(&kill),
                },
            );
            counters
                .conns_open
                .store(t.conns.len() as u64, Ordering::Relaxed);
        }
        let _ = stream.set_nodelay(true);
        let service = {
            let router = router.clone();
            let waiting_since = Arc::clone(&waiting_since);
            hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
                let mut router = router.clone();
                let waiting_since = Arc::clone(&waiting_since);
                waiting_since.store(IN_REQUEST, Ordering::Relaxed);
                let mut request = request.map(axum::body::Body::new);
                request.extensions_mut().insert(ConnectInfo(peer));
                async move {
                    let response = router.call(request).await;
                    waiting_since.store(millis(base), Ordering::Relaxed);
                    response
                }
            })
        };
        let io = TokioIo::new(Watched {
            io: stream,
            idle: limits.write_idle_timeout,
            stalled: None,
            counters: Arc::clone(&counters),
        });
        let header_timeout = limits.header_timeout;
        let slot = Slot {
            table: Arc::clone(&table),
            id,
            counters: Arc::clone(&counters),
        };
        let counters = Arc::clone(&counters);
        let mut shutting_down = shutting_down.clone();
        tasks.spawn(async move {
            // Freed when the task ends, however it ends (a panic included).
            let _slot = slot;
            let conn = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout)
                .max_headers(HYPER_MAX_HEADERS)
                .max_buf_size(HYPER_MAX_BUF)
                .serve_connection(io, service);
            tokio::pin!(conn);
            let ended = tokio::select! {
                r = conn.as_mut() => Some(r),
                () = kill.notified() => None,
                _ = shutting_down.changed() => {
                    conn.as_mut().graceful_shutdown();
                    tokio::time::timeout(STOP_GRACE, conn.as_mut()).await.ok()
                }
            };
            if let Some(Err(e)) = ended {
                if e.is_timeout() {
                    Counters::add(&counters.timed_out_header);
                } else {
                    tracing::debug!(error = %e, "console: a connection ended in error");
                }
            }
        });
    }
    let _ = shutdown.send(true);
    let _ = tokio::time::timeout(STOP_GRACE + Duration::from_secs(1), async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    Ok(())
}

/// A connection's place in the table, given back on drop.
struct Slot {
    table: Arc<Mutex<Table>>,
    id: u64,
    counters: Arc<Counters>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut t = lock(&self.table);
        t.forget(self.id);
        self.counters
            .conns_open
            .store(t.conns.len() as u64, Ordering::Relaxed);
    }
}

/// A connection whose writes end it when the client reads nothing for `idle`.
struct Watched {
    io: TcpStream,
    idle: Duration,
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
    counters: Arc<Counters>,
}

impl Watched {
    fn watch<T>(&mut self, cx: &mut Context<'_>, r: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        if r.is_ready() {
            self.stalled = None;
            return r;
        }
        let idle = self.idle;
        let sleep = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(idle)));
        if sleep.as_mut().poll(cx).is_ready() {
            self.stalled = None;
            Counters::add(&self.counters.timed_out_write);
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client read nothing within the write deadline",
            )));
        }
        Poll::Pending
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_write(cx, buf);
        this.watch(cx, r)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.watch(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_flush(cx);
        this.watch(cx, r)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_shutdown(cx);
        this.watch(cx, r)
    }
}

/// The client's address: the peer's, or, from a trusted proxy, the last address of its
/// `X-Forwarded-For` (the one the proxy appended).
pub(crate) fn client_address(
    peer: SocketAddr,
    trusted: &[IpAddr],
    forwarded_for: Option<&str>,
) -> IpAddr {
    let ip = peer.ip().to_canonical();
    if !trusted.contains(&ip) {
        return ip;
    }
    forwarded_for
        .and_then(|v| v.rsplit(',').next())
        .and_then(|last| last.trim().parse::<IpAddr>().ok())
        .map_or(ip, |c| c.to_canonical())
}
