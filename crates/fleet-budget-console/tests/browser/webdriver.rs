//! A small WebDriver client (W3C protocol over HTTP/1.1, JSON) for Debian's `chromium` driven by
//! `chromedriver`: the few commands the browser tests need, no dependency beyond tokio and
//! serde_json. Missing `chromedriver` or `chromium` fails the test (scripts/check installs them).

use std::os::unix::process::CommandExt as _;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One HTTP/1.1 exchange (`Connection: close`): status, raw headers, body.
pub(crate) async fn http(
    addr: &str,
    method: &str,
    path: &str,
    extra_headers: &[(&str, &str)],
    body: Option<(&str, &[u8])>,
) -> (u16, String, Vec<u8>) {
    let mut stream = tokio::time::timeout(Duration::from_secs(10), TcpStream::connect(addr))
        .await
        .unwrap_or_else(|_| panic!("connect to {addr}: timed out"))
        .unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
    let mut request = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in extra_headers {
        request.push_str(&format!("{k}: {v}\r\n"));
    }
    let (content_type, bytes) = body.unwrap_or(("application/json", b""));
    if body.is_some() || method == "POST" {
        request.push_str(&format!(
            "Content-Type: {content_type}\r\nContent-Length: {}\r\n",
            bytes.len()
        ));
    }
    request.push_str("\r\n");
    let mut out = request.into_bytes();
    out.extend_from_slice(bytes);
    // Read by Content-Length: chromedriver keeps the connection open whatever the request says.
    let exchange = async {
        stream.write_all(&out).await?;
        let mut reply = Vec::new();
        let mut chunk = [0u8; 16 * 1024];
        loop {
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                break;
            }
            reply.extend_from_slice(&chunk[..n]);
            if let Some(split) = reply.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&reply[..split]).to_ascii_lowercase();
                let length = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse::<usize>().ok());
                if length.is_some_and(|len| reply.len() >= split + 4 + len) {
                    break;
                }
            }
        }
        Ok::<_, std::io::Error>(reply)
    };
    let reply = tokio::time::timeout(Duration::from_secs(60), exchange)
        .await
        .unwrap_or_else(|_| panic!("{method} {addr}{path}: no answer within 60 s"))
        .unwrap_or_else(|e| panic!("{method} {addr}{path}: {e}"));
    let split = reply
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("{method} {path}: no header end"));
    let head = String::from_utf8_lossy(&reply[..split]).into_owned();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{method} {path}: no status in {head}"));
    (status, head, reply[split + 4..].to_vec())
}

/// `chromedriver` on a port of its own, killed on drop.
pub(crate) struct Driver {
    child: Child,
    addr: String,
}

impl Driver {
    pub(crate) async fn start() -> Self {
        let port = fleet_budget::testing::free_port();
        // A process group of its own: Drop ends the driver and every browser it started,
        // even when a test fails before it quits its session.
        let child = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("chromedriver cannot start ({e}): install Debian's `chromium chromium-driver` (scripts/check does)")
            });
        let addr = format!("127.0.0.1:{port}");
        let started = Instant::now();
        loop {
            if TcpStream::connect(&addr).await.is_ok() {
                let (status, _, body) = http(&addr, "GET", "/status", &[], None).await;
                let v: Value = serde_json::from_slice(&body).unwrap_or_default();
                if status == 200 && v["value"]["ready"] == true {
                    break;
                }
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "chromedriver did not get ready"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Self { child, addr }
    }

    /// A headless Chromium session.
    pub(crate) async fn browser(&self) -> Browser {
        self.browser_with(&[]).await
    }

    /// A headless Chromium session with more command-line switches (`--host-resolver-rules=...`).
    pub(crate) async fn browser_with(&self, more: &[&str]) -> Browser {
        let mut args = vec![
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--window-size=1280,900",
        ];
        args.extend_from_slice(more);
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": args
            }
        }}});
        let v = call(&self.addr, "POST", "/session", Some(&caps)).await;
        let id = v["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session from chromedriver (is chromium installed?): {v}"))
            .to_owned();
        Browser {
            addr: self.addr.clone(),
            session: id,
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg("--")
            .arg(format!("-{}", self.child.id()))
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn call(addr: &str, method: &str, path: &str, body: Option<&Value>) -> Value {
    match try_call(addr, method, path, body).await {
        Ok(v) => v,
        Err(e) => panic!("{e}"),
    }
}

/// A WebDriver command: its value, or the error the driver answered.
async fn try_call(
    addr: &str,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> Result<Value, String> {
    let bytes = body.map(|b| b.to_string().into_bytes());
    let (status, _, reply) = http(
        addr,
        method,
        path,
        &[],
        bytes.as_deref().map(|b| ("application/json", b)),
    )
    .await;
    let v: Value = serde_json::from_slice(&reply).unwrap_or_else(|e| {
        panic!(
            "{method} {path}: not JSON ({e}): {}",
            String::from_utf8_lossy(&reply)
        )
    });
    if status == 200 {
        Ok(v["value"].clone())
    } else {
        Err(format!("{method} {path}: HTTP {status}: {v}"))
    }
}

/// One browser session.
pub(crate) struct Browser {
    addr: String,
    session: String,
}

impl Browser {
    async fn cmd(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        call(
            &self.addr,
            method,
            &format!("/session/{}{path}", self.session),
            body.as_ref(),
        )
        .await
    }

    pub(crate) async fn goto(&self, url: &str) {
        self.cmd("POST", "/url", Some(json!({ "url": url }))).await;
    }

    /// The element `css` selects, waiting (bounded) until the page has one: a click that
    /// posts a form returns before the next page is there.
    pub(crate) async fn find(&self, css: &str) -> String {
        let started = Instant::now();
        loop {
            let found = self
                .cmd(
                    "POST",
                    "/elements",
                    Some(json!({"using": "css selector", "value": css})),
                )
                .await;
            let first = found
                .as_array()
                .and_then(|a| a.first())
                .and_then(Value::as_object)
                .and_then(|o| o.values().next())
                .and_then(Value::as_str);
            if let Some(e) = first {
                return e.to_owned();
            }
            assert!(
                started.elapsed() < Duration::from_secs(45),
                "no element {css}; page: {}",
                self.source().await
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The text of the element `css` selects, once there is one with text.
    pub(crate) async fn text(&self, css: &str) -> String {
        self.until_text(css, None, |t| !t.is_empty()).await
    }

    pub(crate) async fn type_into(&self, css: &str, text: &str) {
        let e = self.find(css).await;
        self.cmd("POST", &format!("/element/{e}/clear"), Some(json!({})))
            .await;
        self.cmd(
            "POST",
            &format!("/element/{e}/value"),
            Some(json!({ "text": text })),
        )
        .await;
    }

    pub(crate) async fn click(&self, css: &str) {
        let e = self.find(css).await;
        self.cmd("POST", &format!("/element/{e}/click"), Some(json!({})))
            .await;
    }

    /// Runs `script` in the page (through the driver: the page's CSP does not apply to it).
    pub(crate) async fn run(&self, script: &str) -> Value {
        self.cmd(
            "POST",
            "/execute/sync",
            Some(json!({"script": script, "args": []})),
        )
        .await
    }

    /// Runs an async `script` whose last argument is the callback.
    pub(crate) async fn run_async(&self, script: &str) -> Value {
        self.cmd(
            "POST",
            "/execute/async",
            Some(json!({"script": script, "args": []})),
        )
        .await
    }

    pub(crate) async fn source(&self) -> String {
        self.cmd("GET", "/source", None)
            .await
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// Saves a PNG of the page to `$FLEET_BUDGET_CONSOLE_SCREENSHOTS/console-<name>.png`
    /// (relative to the workspace) when that variable is set (how `docs/console-*.png` are made).
    pub(crate) async fn screenshot(&self, name: &str) {
        let Some(dir) = std::env::var_os("FLEET_BUDGET_CONSOLE_SCREENSHOTS") else {
            return;
        };
        use base64::Engine as _;
        let v = self.cmd("GET", "/screenshot", None).await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(v.as_str().unwrap_or_default())
            .unwrap_or_else(|e| panic!("screenshot: {e}"));
        // A relative directory is the workspace's (`=docs`), not the crate's, where cargo runs
        // the test.
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .join(dir)
            .join(format!("console-{name}.png"));
        std::fs::write(&path, png).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }

    /// Waits (bounded) until `css`'s text satisfies `ok`, reloading with `reload` between reads.
    pub(crate) async fn until_text(
        &self,
        css: &str,
        reload: Option<&str>,
        ok: impl Fn(&str) -> bool,
    ) -> String {
        self.until_text_within(css, reload, Duration::from_secs(45), ok)
            .await
    }

    /// [`Browser::until_text`] bounded by `within` instead of 45 s (what takes minutes on
    /// purpose: a sample of 10,000 messages read from a queue of 100,000).
    pub(crate) async fn until_text_within(
        &self,
        css: &str,
        reload: Option<&str>,
        within: Duration,
        ok: impl Fn(&str) -> bool,
    ) -> String {
        let started = Instant::now();
        loop {
            if let Some(url) = reload {
                self.goto(url).await;
            }
            let found = self
                .cmd(
                    "POST",
                    "/elements",
                    Some(json!({"using": "css selector", "value": css})),
                )
                .await;
            let mut text = String::new();
            let first = found
                .as_array()
                .and_then(|a| a.first())
                .and_then(Value::as_object)
                .and_then(|o| o.values().next())
                .and_then(Value::as_str);
            if let Some(e) = first {
                // A live page replaces its rows: an element may go stale between the two calls.
                let path = format!("/session/{}/element/{e}/text", self.session);
                if let Ok(v) = try_call(&self.addr, "GET", &path, None).await {
                    v.as_str().unwrap_or_default().clone_into(&mut text);
                }
            }
            if ok(&text) {
                return text;
            }
            assert!(
                started.elapsed() < within,
                "{css} never satisfied the test; last text {text:?}\npage: {}",
                self.source().await
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    pub(crate) async fn quit(self) {
        call(
            &self.addr,
            "DELETE",
            &format!("/session/{}", self.session),
            None,
        )
        .await;
    }
}
