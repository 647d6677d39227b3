//! A Prometheus server of a test's own (Debian's `prometheus`, on a free port with its own
//! configuration and data folder, scraping its targets every 250 ms), for the tests that read
//! what it scraped (`tune_prometheus`, `incident_prometheus`). Included with `#[path]`.

use std::io::{Read as _, Write as _};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fleet_budget::testing::free_port;

/// A Prometheus server of the test's own, stopped on drop.
pub(crate) struct PromServer {
    child: Child,
    pub(crate) port: u16,
    _dir: TempDir,
}

impl Drop for PromServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) struct TempDir(pub(crate) std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub(crate) fn temp_dir(name: &str) -> TempDir {
    let dir = std::env::temp_dir().join(format!("{name}-{}-{}", std::process::id(), free_port()));
    std::fs::create_dir_all(&dir).unwrap();
    TempDir(dir)
}

impl PromServer {
    pub(crate) fn start(targets: &[String]) -> Self {
        let dir = temp_dir("fb-prometheus");
        let port = free_port();
        let config = dir.0.join("prometheus.yml");
        let targets: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 250ms\n  scrape_timeout: 200ms\n  \
                 evaluation_interval: 1s\nscrape_configs:\n  - job_name: workers\n    \
                 static_configs:\n      - targets: [{}]\n",
                targets.join(", ")
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.0.join("prometheus.log")).unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.0.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("Debian's `prometheus` binary on the PATH (apt-get install prometheus)");
        let server = Self {
            child,
            port,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !server.ready() {
            assert!(
                Instant::now() < deadline,
                "prometheus not ready in 60 s: {}",
                std::fs::read_to_string(server._dir.0.join("prometheus.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        server
    }

    /// `GET /-/ready` answers 200.
    fn ready(&self) -> bool {
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        if s.write_all(b"GET /-/ready HTTP/1.0\r\nHost: localhost\r\n\r\n")
            .is_err()
        {
            return false;
        }
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        answer.starts_with("HTTP/1.0 200") || answer.starts_with("HTTP/1.1 200")
    }
}
