//! `budgetctl console` started by a test (no viewer token, on a free port), stopped on drop, and
//! its pages read over HTTP/1.0. Included with `#[path]` by the incident tests.

use std::io::{Read as _, Write as _};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fleet_budget::testing::free_port;

/// A console of the test's own.
pub(crate) struct Console {
    child: Child,
    pub(crate) port: u16,
}

impl Drop for Console {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Console {
    /// `budgetctl --config CONFIG console ... EXTRA`, once it listens.
    pub(crate) fn start(config: &Path, extra: &[&str]) -> Self {
        let port = free_port();
        let child = Command::new(env!("CARGO_BIN_EXE_budgetctl"))
            .env_remove("FLEET_BUDGET_REDIS_URL")
            .env_remove("FLEET_BUDGET_AMQP_URL")
            .env_remove("FLEET_BUDGET_PROMETHEUS_URL")
            .env_remove("RUST_LOG")
            .env(
                "FLEET_BUDGET_CONSOLE_OPERATOR_TOKEN",
                "op:incident-operator-token-0123",
            )
            .arg("--config")
            .arg(config)
            .args(["console", "--bind", &format!("127.0.0.1:{port}")])
            .arg("--no-viewer-token")
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut console = Self { child, port };
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                console.child.try_wait().unwrap().is_none(),
                "the console exited"
            );
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the console did not listen"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        console
    }

    /// The body of `GET path`, which must answer 200.
    pub(crate) fn get(&self, path: &str) -> String {
        let port = self.port;
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        write!(
            s,
            "GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        let (head, body) = answer.split_once("\r\n\r\n").unwrap();
        assert!(head.contains(" 200 "), "{head}\n{body}");
        body.to_owned()
    }
}
