//! A private three-node RabbitMQ cluster for the broker game day: each node with its own node
//! name, AMQP and distribution ports, database and logs under one temporary directory, the
//! same Erlang cookie (written into each node's `HOME` before it starts), no plugins (the
//! management plugin off), started in the foreground as children of the test and joined with
//! `rabbitmqctl join_cluster`. Quorum queues declared once the cluster is joined get a member
//! on every node (RabbitMQ's default initial group size is the cluster's size).
//!
//! The shared node `rabbit@localhost` is never touched: every `rabbitmqctl` call names one of
//! these nodes (`-n`), and the processes stopped are only the children started here. Dropping
//! the cluster (a panic included) stops every node and removes the directory.
//!
//! A node stops gracefully (SIGTERM to its script, `rabbitmqctl stop` of that node) and
//! restarts with the same name, ports and database: it rejoins the cluster by itself, and its
//! quorum queue members catch up from the log of the leader.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fleet_budget::testing::free_port;

const SCRIPTS: &str = "/usr/lib/rabbitmq/bin";
/// How long a node may take to start: a bound against a node that never comes up, not a
/// measure (on this shared 2-core machine under a load of 20, one node took over two minutes).
const START_WITHIN: Duration = Duration::from_secs(600);

/// One node of the cluster.
#[derive(Debug)]
pub(crate) struct ClusterNode {
    pub(crate) node: String,
    pub(crate) port: u16,
    dist_port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl ClusterNode {
    fn new(base: &Path, index: usize, cookie: &str) -> Result<Self, String> {
        let port = free_port();
        let dist_port = free_port();
        let node = format!("fbcluster{}x{port}n{index}@localhost", std::process::id());
        let dir = base.join(format!("n{index}"));
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
                "listeners.tcp.default = 127.0.0.1:{port}\nloopback_users = none\ncluster_partition_handling = pause_minority\n"
            ),
        )?;
        write("env.conf", "ERL_EPMD_ADDRESS=127.0.0.1\n")?;
        // The cluster's cookie, readable by its owner only (Erlang refuses it otherwise).
        let cookie_path = dir.join("home").join(".erlang.cookie");
        std::fs::write(&cookie_path, cookie).map_err(|e| format!(".erlang.cookie: {e}"))?;
        std::fs::set_permissions(&cookie_path, std::fs::Permissions::from_mode(0o400))
            .map_err(|e| format!(".erlang.cookie: {e}"))?;
        Ok(Self {
            node,
            port,
            dist_port,
            dir,
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

    fn spawn(&mut self) -> Result<(), String> {
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
    async fn wait_ready(&mut self, within: Duration) -> Result<(), String> {
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
                fleet_budget_amqp::connect(&self.url(), "cluster readiness"),
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
        // The VM is killed by its pid only while that pid is still this node's VM (its command
        // line names this node's directory).
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

    /// Starts the stopped node again with the same name, ports and database.
    pub(crate) async fn restart(&mut self) -> Result<(), String> {
        self.stop();
        self.spawn()?;
        self.wait_ready(START_WITHIN).await
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

    /// The last lines of the node's log (its banner on stdout says little).
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

/// Three nodes, joined.
#[derive(Debug)]
pub(crate) struct RabbitCluster {
    pub(crate) nodes: Vec<ClusterNode>,
    dir: PathBuf,
}

impl RabbitCluster {
    /// Starts three nodes (at once: each takes seconds), joins the second and third to the
    /// first, and checks that all three see the cluster; or says why it could not.
    pub(crate) async fn start() -> Result<Self, String> {
        if !Path::new(SCRIPTS).join("rabbitmq-server").exists() {
            return Err(format!("{SCRIPTS}/rabbitmq-server is not installed"));
        }
        let dir = std::env::temp_dir().join(format!(
            "fleet-budget-cluster-{}-{}",
            std::process::id(),
            free_port()
        ));
        let cookie = format!("FBCLUSTER{}X{}", std::process::id(), free_port());
        let mut cluster = Self {
            nodes: Vec::new(),
            dir: dir.clone(),
        };
        for i in 0..3 {
            cluster.nodes.push(ClusterNode::new(&dir, i, &cookie)?);
        }
        for n in &mut cluster.nodes {
            n.spawn()?;
        }
        for n in &mut cluster.nodes {
            n.wait_ready(START_WITHIN).await?;
        }
        let first = cluster
            .nodes
            .first()
            .map(|n| n.node.clone())
            .ok_or("no node")?;
        for n in cluster.nodes.iter().skip(1) {
            n.cli("rabbitmqctl", &["stop_app"])?;
            n.cli("rabbitmqctl", &["join_cluster", &first])?;
            n.cli("rabbitmqctl", &["start_app"])?;
        }
        for n in &mut cluster.nodes {
            n.wait_ready(START_WITHIN).await?;
        }
        let status =
            cluster.nodes[0].cli("rabbitmqctl", &["cluster_status", "--formatter", "json"])?;
        let running = serde_json::from_str::<serde_json::Value>(&status)
            .ok()
            .and_then(|v| v["running_nodes"].as_array().map(Vec::len))
            .unwrap_or(0);
        if running != 3 {
            return Err(format!(
                "the cluster has {running} running nodes, not 3:\n{status}"
            ));
        }
        Ok(cluster)
    }

    /// Every node's URL, for `[amqp] urls`.
    pub(crate) fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(ClusterNode::url).collect()
    }

    /// The index of the node whose Erlang name is `name`.
    pub(crate) fn index_of(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.node == name)
    }

    /// A running node to ask.
    fn any_running(&self) -> Result<&ClusterNode, String> {
        self.nodes
            .iter()
            .find(|n| n.is_running())
            .ok_or_else(|| "no node is running".to_owned())
    }

    /// The node that leads `queue` (`rabbitmqctl list_queues name leader`), by index.
    pub(crate) fn leader_of(&self, queue: &str) -> Result<usize, String> {
        let text = self.any_running()?.cli(
            "rabbitmqctl",
            &["list_queues", "name", "leader", "--formatter", "json"],
        )?;
        let rows: Vec<serde_json::Value> =
            serde_json::from_str(&text).map_err(|e| format!("list_queues: {e}: {text}"))?;
        let leader = rows
            .iter()
            .find(|r| r["name"] == queue)
            .and_then(|r| r["leader"].as_str())
            .ok_or_else(|| format!("{queue} has no leader in {text}"))?;
        self.index_of(leader)
            .ok_or_else(|| format!("{queue} is led by {leader}, not a node of this cluster"))
    }

    /// The members of quorum queue `queue` (`rabbitmq-queues quorum_status`), by node name.
    pub(crate) fn members_of(&self, queue: &str) -> Result<Vec<String>, String> {
        let text = self.any_running()?.cli(
            "rabbitmq-queues",
            &["quorum_status", queue, "--formatter", "json"],
        )?;
        let rows: Vec<serde_json::Value> =
            serde_json::from_str(&text).map_err(|e| format!("quorum_status: {e}: {text}"))?;
        Ok(rows
            .iter()
            .filter_map(|r| r["Node Name"].as_str().map(str::to_owned))
            .collect())
    }
}

impl Drop for RabbitCluster {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            n.stop();
        }
        if std::thread::panicking() {
            for n in &self.nodes {
                eprintln!("---- cluster node {} ----\n{}", n.node, n.log_tail());
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
