//! The simulated dependency every worker process calls: a line server in the test process, so
//! the brownout is one schedule for the whole fleet and every call is logged where the test can
//! count it (a SIGKILLed worker loses nothing of the log).
//!
//! Protocol (see `tests/src/bin/fleet-worker.rs`): `CALL <id> <task> <attempt> <replays> <pid>`
//! → `OK` or `FAIL http_503`. During a brownout, calls of the browning-out tasks fail except one
//! in [`PASS_EVERY`]; every other task is always served.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

/// During a brownout, one call in this many succeeds.
pub(crate) const PASS_EVERY: u64 = 6;

/// One call as the dependency saw it.
#[derive(Debug, Clone)]
pub(crate) struct Call {
    pub(crate) ms: u64,
    pub(crate) id: String,
    pub(crate) task: String,
    pub(crate) attempt: u32,
    pub(crate) replays: u32,
    pub(crate) ok: bool,
}

#[derive(Debug, Default)]
struct State {
    brownout: AtomicBool,
    served: AtomicU64,
    calls: Mutex<Vec<Call>>,
}

/// The dependency, serving on a port of its own until dropped.
#[derive(Debug)]
pub(crate) struct Upstream {
    pub(crate) addr: std::net::SocketAddr,
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl Upstream {
    /// Starts serving; calls of `browning` tasks fail during a brownout.
    pub(crate) async fn start(browning: &[&str]) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the dependency's port");
        let addr = listener.local_addr().expect("its address");
        let state = Arc::new(State::default());
        let browning: Vec<String> = browning.iter().map(|s| (*s).to_owned()).collect();
        let (st, br) = (Arc::clone(&state), browning);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (st, br) = (Arc::clone(&st), br.clone());
                tokio::spawn(async move {
                    let (read, mut write) = stream.into_split();
                    let mut line = String::new();
                    // One line of at most 1 KiB: a broken client cannot grow it.
                    let mut reader = BufReader::new(read.take(1024));
                    if reader.read_line(&mut line).await.is_err() {
                        return;
                    }
                    let answer = match parse(&line) {
                        Some(mut call) => {
                            let failing = st.brownout.load(Ordering::Relaxed)
                                && br.contains(&call.task)
                                && st.served.fetch_add(1, Ordering::Relaxed) % PASS_EVERY != 0;
                            call.ok = !failing;
                            call.ms = now_ms();
                            let ok = call.ok;
                            st.calls
                                .lock()
                                .unwrap_or_else(PoisonError::into_inner)
                                .push(call);
                            if ok { "OK\n" } else { "FAIL http_503\n" }
                        }
                        None => "FAIL bad_request\n",
                    };
                    let _ = write.write_all(answer.as_bytes()).await;
                });
            }
        });
        Self { addr, state, task }
    }

    /// Starts or ends the brownout of the browning-out tasks.
    pub(crate) fn brownout(&self, on: bool) {
        self.state.brownout.store(on, Ordering::Relaxed);
    }

    /// Every call so far.
    pub(crate) fn calls(&self) -> Vec<Call> {
        self.state
            .calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn parse(line: &str) -> Option<Call> {
    let mut w = line.split_whitespace();
    if w.next()? != "CALL" {
        return None;
    }
    let call = Call {
        ms: 0,
        id: w.next()?.to_owned(),
        task: w.next()?.to_owned(),
        attempt: w.next()?.parse().ok()?,
        replays: w.next()?.parse().ok()?,
        ok: false,
    };
    // The caller's pid ends the line (for a human reading a capture).
    w.next()?.parse::<u32>().ok()?;
    Some(call)
}
