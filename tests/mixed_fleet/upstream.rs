//! The mixed fleet's dependency: a line server owned by the test, so that both languages see one
//! brownout schedule and every call is logged.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One call the dependency answered.
#[derive(Debug, Clone)]
pub(crate) struct Call {
    pub(crate) id: String,
    pub(crate) attempt: u32,
    pub(crate) replays: u32,
    pub(crate) ok: bool,
}

/// The dependency: `CALL <id> <task> <attempt> <replays> <pid>` → `OK` | `FAIL http_503`.
pub(crate) struct Upstream {
    pub(crate) addr: String,
    pub(crate) failing: Arc<AtomicBool>,
    pub(crate) calls: Arc<Mutex<Vec<Call>>>,
}

impl Upstream {
    pub(crate) fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let failing = Arc::new(AtomicBool::new(false));
        let calls = Arc::new(Mutex::new(Vec::new()));
        let (f, c) = (failing.clone(), calls.clone());
        // Lives as long as the test process: each connection is one line and one answer.
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let (f, c) = (f.clone(), c.clone());
                std::thread::spawn(move || {
                    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
                    let mut line = String::new();
                    if BufReader::new(&stream).read_line(&mut line).is_err() {
                        return;
                    }
                    let words: Vec<&str> = line.split_whitespace().collect();
                    let [_, id, _, attempt, replays, _] = words[..] else {
                        let _ = stream.write_all(b"REJECT bad_call\n");
                        return;
                    };
                    let ok = !f.load(Ordering::SeqCst);
                    c.lock().unwrap().push(Call {
                        id: id.to_owned(),
                        attempt: attempt.parse().unwrap_or(0),
                        replays: replays.parse().unwrap_or(0),
                        ok,
                    });
                    let answer: &[u8] = if ok { b"OK\n" } else { b"FAIL http_503\n" };
                    let _ = stream.write_all(answer);
                });
            }
        });
        Self {
            addr,
            failing,
            calls,
        }
    }

    pub(crate) fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    pub(crate) fn succeeded(&self, ids: &[String]) -> usize {
        let calls = self.calls();
        ids.iter()
            .filter(|id| calls.iter().any(|c| c.ok && &c.id == *id))
            .count()
    }
}
