//! A private RabbitMQ node: its own node name, ports, database and logs under a temporary
//! directory, started in the foreground as a child of the test (`RABBITMQ_NODENAME`,
//! `RABBITMQ_NODE_PORT`, `RABBITMQ_DIST_PORT`, `RABBITMQ_MNESIA_BASE`, `RABBITMQ_LOG_BASE`, its
//! own configuration and environment files so `/etc/rabbitmq` is not read, no plugins). The
//! shared broker on 5672 is never touched: every `rabbitmqctl` call names this node. The game
//! day's broker restart runs one alone ([`RabbitNode::start`]); the broker game day's cluster
//! (`rabbit_cluster.rs`) is three of them.
//!
//! Stopping is SIGTERM to the foreground script, which stops the node gracefully
//! (`rabbitmqctl stop` of this node); the database stays, so durable queues and persistent
//! messages come back with the restart.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fleet_budget::testing::free_port;

pub(crate) const SCRIPTS: &str = "/usr/lib/rabbitmq/bin";

#[derive(Debug)]
pub(crate) struct RabbitNode {
    pub(crate) node: String,
    pub(crate) port: u16,
    dist_port: u16,
    pub(crate) dir: PathBuf,
    /// How long a start may take: a bound against a node that never comes up.
    start_within: Duration,
    child: Option<Child>,
}

impl RabbitNode {
    /// Starts a node of its own and waits until it accepts AMQP connections, or says why it
    /// could not.
    pub(crate) async fn start() -> Result<Self, String> {
        Self::installed()?;
        let port = free_port();
        let mut me = Self::prepare(
            std::env::temp_dir().join(format!("fleet-budget-rabbit-{port}")),
            format!("fbgameday{}x{port}@localhost", std::process::id()),
            port,
            "",
            Duration::from_secs(90),
        )?;
        me.spawn()?;
        me.wait_ready().await?;
        Ok(me)
    }

    /// Whether RabbitMQ's server scripts are installed, or why not.
    pub(crate) fn installed() -> Result<(), String> {
        if Path::new(SCRIPTS).join("rabbitmq-server").exists() {
            Ok(())
        } else {
            Err(format!("{SCRIPTS}/rabbitmq-server is not installed"))
        }
    }

    /// A node named `node` listening on `port`, its files in `dir` (`extra_conf` appended to
    /// its `rabbitmq.conf`); not started.
    pub(crate) fn prepare(
        dir: PathBuf,
        node: String,
        port: u16,
        extra_conf: &str,
        start_within: Duration,
    ) -> Result<Self, String> {
        for sub in ["mnesia", "log", "home"] {
            std::fs::create_dir_all(dir.join(sub))
                .map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        let write = |name: &str, text: &str| {
            std::fs::write(dir.join(name), text).map_err(|e| format!("{name}: {e}"))
        };
        write("enabled_plugins", "[].\n")?;
        write(
            "rabbitmq.conf",
            &format!(
                "listeners.tcp.default = 127.0.0.1:{port}\nloopback_users = none\n{extra_conf}"
            ),
        )?;
        write("env.conf", "ERL_EPMD_ADDRESS=127.0.0.1\n")?;
        Ok(Self {
            node,
            port,
            dist_port: free_port(),
            dir,
            start_within,
            child: None,
        })
    }

    pub(crate) fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
    }

    fn command(&self, program: &str) -> Command {
        let d = &self.dir;
        let mut cmd = Command::new(Path::new(SCRIPTS).join(program));
        cmd.env("HOME", d.join("home"))
            .env("RABBITMQ_CONF_ENV_FILE", d.join("env.conf"))
            .env("RABBITMQ_NODENAME", &self.node)
            .env("RABBITMQ_NODE_PORT", self.port.to_string())
            .env("RABBITMQ_DIST_PORT", self.dist_port.to_string())
            .env("RABBITMQ_MNESIA_BASE", d.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", d.join("log"))
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", d.join("enabled_plugins"))
            .env("RABBITMQ_CONFIG_FILE", d.join("rabbitmq.conf"))
            .env("RABBITMQ_PID_FILE", d.join("pid"))
            .env("ERL_FLAGS", "-kernel inet_dist_use_interface {127,0,0,1}")
            .current_dir(d)
            .stdin(Stdio::null());
        cmd
    }

    /// Starts the node's script (its output appended to `server.out`), without waiting.
    pub(crate) fn spawn(&mut self) -> Result<(), String> {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("server.out"))
            .map_err(|e| e.to_string())?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let child = self
            .command("rabbitmq-server")
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("spawn rabbitmq-server {}: {e}", self.node))?;
        self.child = Some(child);
        Ok(())
    }

    /// Waits until the node accepts AMQP connections, or says why it could not.
    pub(crate) async fn wait_ready(&mut self) -> Result<(), String> {
        let within = self.start_within;
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                return Err(format!(
                    "rabbitmq-server {} exited ({status}) before it was ready:\n{}",
                    self.node,
                    self.log_tail()
                ));
            }
            if let Ok(Ok(conn)) = tokio::time::timeout(
                Duration::from_secs(2),
                fleet_budget_amqp::connect(&self.url(), "private node readiness"),
            )
            .await
            {
                let _ = conn.close(200, "ready".into()).await;
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        Err(format!(
            "rabbitmq-server {} was not ready within {within:?}:\n{}",
            self.node,
            self.log_tail()
        ))
    }

    /// Whether the node's script is running (stopped nodes are not).
    pub(crate) fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Stops the node gracefully (SIGTERM to its script, which runs `rabbitmqctl stop` for it),
    /// then makes sure its VM is gone.
    pub(crate) fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(60);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            if !matches!(child.try_wait(), Ok(Some(_))) {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        // Whatever the script did, the VM of this node is gone afterwards: killed by its pid
        // only while that pid is still this node's VM (its command line names our directory).
        if let Ok(pid) = std::fs::read_to_string(self.dir.join("pid")) {
            let pid = pid.trim();
            let ours = std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                String::from_utf8_lossy(&c).contains(self.dir.to_string_lossy().as_ref())
            });
            if ours {
                let _ = Command::new("kill")
                    .args(["-KILL", pid])
                    .stderr(Stdio::null())
                    .status();
            }
        }
    }

    /// Stops, then starts again with the same name, ports and database.
    pub(crate) async fn restart(&mut self) -> Result<(), String> {
        self.stop();
        self.spawn()?;
        self.wait_ready().await
    }

    /// Evaluates an Erlang expression on this node (`rabbitmqctl eval`, bounded by its own
    /// timeout): changes to its settings for tests, such as a lower `max_message_size`.
    pub(crate) fn eval(&self, expression: &str) -> Result<String, String> {
        self.ctl(&["eval", expression])
    }

    /// Runs `rabbitmqctl` against this node only, bounded by its own timeout (`add_user`,
    /// `set_permissions`, ...).
    pub(crate) fn ctl(&self, args: &[&str]) -> Result<String, String> {
        self.cli("rabbitmqctl", args)
    }

    /// Runs a RabbitMQ CLI (`rabbitmqctl`, `rabbitmq-queues`) against this node only, bounded by
    /// its own timeout.
    pub(crate) fn cli(&self, program: &str, args: &[&str]) -> Result<String, String> {
        let out = self
            .command(program)
            .args(["-n", &self.node, "--timeout", "60"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .map_err(|e| format!("{program}: {e}"))?;
        let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        if out.status.success() {
            Ok(text)
        } else {
            Err(format!(
                "{program} -n {} {}: {}\n{text}\n{}",
                self.node,
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    /// The last lines of the node's log (its banner on stdout says little), else of its output.
    fn log_tail(&self) -> String {
        let log = self.dir.join("log").join(format!("{}.log", self.node));
        let text = std::fs::read_to_string(&log)
            .or_else(|_| std::fs::read_to_string(self.dir.join("server.out")))
            .unwrap_or_default();
        let mut last: Vec<&str> = text.lines().rev().take(30).collect();
        last.reverse();
        last.join("\n")
    }
}

impl Drop for RabbitNode {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            eprintln!(
                "---- private RabbitMQ node {} ----\n{}",
                self.node,
                self.log_tail()
            );
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
