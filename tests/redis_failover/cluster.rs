//! A Redis Cluster of three masters, each with one replica: six private `redis-server`s on free
//! ports (the harness's [`RedisCluster`] of [`RedisServer`]s, killed when dropped, so even a
//! failing test stops them all), waited for until every node says `cluster_state:ok` and every
//! replica is in sync with its master.

use std::time::{Duration, Instant};

use fleet_budget::testing::{RedisCluster, RedisServer};

/// `cluster-node-timeout`: a master that has not answered for this long is flagged as failing,
/// and its replica is promoted shortly after. No failover can start earlier, which the test
/// relies on to tell the old master's replies from the new one's.
pub(crate) const NODE_TIMEOUT: Duration = Duration::from_millis(1000);

/// How long the harness waits for something Redis does by itself (a guard against a hang, not
/// a measurement).
const PATIENCE: Duration = Duration::from_secs(30);

/// Six nodes: three masters, three replicas.
pub(crate) struct ReplicatedCluster {
    pub(crate) nodes: Vec<RedisServer>,
}

/// One line of `CLUSTER NODES`.
#[derive(Debug, Clone)]
pub(crate) struct NodeLine {
    pub(crate) id: String,
    pub(crate) port: u16,
    pub(crate) flags: String,
    /// The master's id for a replica, `-` for a master.
    pub(crate) master_id: String,
    /// Slot ranges a master serves (`0-5460`), empty for a replica.
    pub(crate) slots: Vec<(u16, u16)>,
}

impl NodeLine {
    pub(crate) fn is_master(&self) -> bool {
        self.flags.split(',').any(|f| f == "master")
    }

    fn failing(&self) -> bool {
        self.flags.split(',').any(|f| f == "fail" || f == "fail?")
    }
}

fn parse_nodes(text: &str) -> Vec<NodeLine> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let address = fields.get(1)?;
            // 127.0.0.1:7000@17000
            let port = address
                .split('@')
                .next()?
                .rsplit(':')
                .next()?
                .parse()
                .ok()?;
            let slots = fields
                .iter()
                .skip(8)
                .filter(|s| !s.starts_with('['))
                .filter_map(|s| match s.split_once('-') {
                    Some((lo, hi)) => Some((lo.parse().ok()?, hi.parse().ok()?)),
                    None => s.parse().ok().map(|n| (n, n)),
                })
                .collect();
            Some(NodeLine {
                id: (*fields.first()?).to_owned(),
                port,
                flags: (*fields.get(2)?).to_owned(),
                master_id: (*fields.get(3)?).to_owned(),
                slots,
            })
        })
        .collect()
}

impl ReplicatedCluster {
    /// Starts six cluster-enabled servers, makes three masters with one replica each, and waits
    /// until the cluster is ok and the replicas are in sync. `full_coverage` is
    /// `cluster-require-full-coverage`: `yes` (Redis's default) makes every master answer
    /// `CLUSTERDOWN` from the moment a master is marked failed until its replica is promoted.
    pub(crate) fn start(full_coverage: &'static str) -> Self {
        let timeout = NODE_TIMEOUT.as_millis().to_string();
        let nodes = RedisCluster::start_with_replicas(
            3,
            1,
            &[
                "--cluster-node-timeout",
                &timeout,
                // A replica that lost its master long ago may still be promoted: the test is
                // about what it lacks, not about refusing the failover.
                "--cluster-require-full-coverage",
                full_coverage,
                "--cluster-replica-validity-factor",
                "0",
            ],
        )
        .nodes;
        let cluster = Self { nodes };
        cluster.wait_healthy();
        cluster
    }

    /// The seed URLs of every node.
    pub(crate) fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The node listening on `port`.
    pub(crate) fn node(&self, port: u16) -> &RedisServer {
        self.nodes
            .iter()
            .find(|n| n.port() == port)
            .unwrap_or_else(|| panic!("no node on port {port}"))
    }

    fn node_mut(&mut self, port: u16) -> &mut RedisServer {
        self.nodes
            .iter_mut()
            .find(|n| n.port() == port)
            .unwrap_or_else(|| panic!("no node on port {port}"))
    }

    /// `CLUSTER NODES` as seen by the node on `port`.
    pub(crate) fn view_of(&self, port: u16) -> Vec<NodeLine> {
        let text: String = self.node(port).cmd(&["CLUSTER", "NODES"]);
        parse_nodes(&text)
    }

    /// The slot of `key`.
    pub(crate) fn slot_of(&self, key: &str) -> u16 {
        let first = self.nodes.first().expect("a node");
        let slot: i64 = first.cmd(&["CLUSTER", "KEYSLOT", key]);
        u16::try_from(slot).expect("a slot fits in u16")
    }

    /// The port of the master serving `slot` and of its replica, as the node on `observer` sees
    /// them.
    pub(crate) fn master_and_replica_of(&self, observer: u16, slot: u16) -> (u16, u16) {
        let view = self.view_of(observer);
        let master = view
            .iter()
            .find(|n| n.is_master() && n.slots.iter().any(|(lo, hi)| (*lo..=*hi).contains(&slot)))
            .unwrap_or_else(|| panic!("no master serves slot {slot}: {view:?}"));
        let replica = view
            .iter()
            .find(|n| n.master_id == master.id && !n.failing())
            .unwrap_or_else(|| panic!("master {} has no replica: {view:?}", master.port));
        (master.port, replica.port)
    }

    /// `INFO replication`'s `role` of the node on `port`.
    pub(crate) fn role(&self, port: u16) -> String {
        let info: String = self.node(port).cmd(&["INFO", "replication"]);
        info.lines()
            .find_map(|l| l.strip_prefix("role:"))
            .unwrap_or("")
            .trim()
            .to_owned()
    }

    /// Kills the node on `port` (SIGKILL): a master dying with whatever it had not yet sent to
    /// its replica.
    pub(crate) fn kill(&mut self, port: u16) {
        self.node_mut(port).stop();
    }

    /// Whether the replica on `port` may start a failover of its own (`cluster-replica-no-failover`):
    /// held back while the test reads what it holds, so that the read comes before the promotion
    /// however slow the machine is; let go at once, which costs nothing in practice (the cluster
    /// marks the master failed only after `cluster-node-timeout`).
    pub(crate) fn allow_failover(&self, port: u16, allowed: bool) {
        let value = if allowed { "no" } else { "yes" };
        let _: () = self
            .node(port)
            .cmd(&["CONFIG", "SET", "cluster-replica-no-failover", value]);
    }

    /// Freezes the node on `port` (SIGSTOP): a replica that stops reading its replication
    /// stream, as an overloaded or partitioned one does.
    pub(crate) fn freeze(&self, port: u16) {
        self.node(port).freeze();
    }

    /// Resumes a frozen node (SIGCONT).
    pub(crate) fn thaw(&self, port: u16) {
        self.node(port).thaw();
    }

    /// Writes `megabytes` of padding on the master on `port` in the slot of `hash_tag`: a
    /// replication stream that no longer fits in the kernel's socket buffers while the replica
    /// is frozen, so that what the master writes next waits in its own output buffer, where a
    /// SIGKILL loses it.
    pub(crate) fn pad(&self, port: u16, hash_tag: &str, megabytes: usize) {
        let value = "x".repeat(1 << 20);
        let mut c = self.node(port).connection().expect("connect to the master");
        for i in 0..megabytes {
            let _: () = redis::cmd("SET")
                .arg(format!("pad:{{{hash_tag}}}:{i}"))
                .arg(&value)
                .query(&mut c)
                .unwrap_or_else(|e| panic!("SET padding on {port}: {e}"));
        }
    }

    /// Waits until the replica on `port` has read everything its dead master sent (its link is
    /// down: it reached the end of the stream).
    pub(crate) fn wait_link_down(&self, port: u16) {
        let started = Instant::now();
        loop {
            let info: String = self.node(port).cmd(&["INFO", "replication"]);
            if info.contains("master_link_status:down") {
                return;
            }
            assert!(
                started.elapsed() < PATIENCE,
                "the replica on {port} still reads its dead master's stream: {info}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Starts the killed node on `port` again with its `nodes.conf`: it rejoins the cluster and
    /// becomes a replica of the master that replaced it (its data is gone: nothing is saved).
    pub(crate) fn rejoin(&mut self, port: u16) {
        self.node_mut(port).restart();
    }

    /// Waits until every node says `cluster_state:ok` with all slots served, sees six nodes
    /// none of which is failing, three of them masters, and every master has one replica in
    /// sync (`state=online`).
    pub(crate) fn wait_healthy(&self) {
        let started = Instant::now();
        loop {
            match self.unhealthy() {
                None => return,
                Some(why) => assert!(
                    started.elapsed() < PATIENCE,
                    "the cluster was not healthy within {PATIENCE:?}: {why}"
                ),
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Why the cluster is not healthy yet, if it is not.
    fn unhealthy(&self) -> Option<String> {
        for node in &self.nodes {
            let Ok(mut c) = node.connection() else {
                return Some(format!("{} does not accept connections", node.port()));
            };
            let info: String = redis::cmd("CLUSTER")
                .arg("INFO")
                .query(&mut c)
                .unwrap_or_default();
            if !info.contains("cluster_state:ok") || !info.contains("cluster_slots_ok:16384") {
                return Some(format!("{}: {info}", node.port()));
            }
            let text: String = redis::cmd("CLUSTER")
                .arg("NODES")
                .query(&mut c)
                .unwrap_or_default();
            let view = parse_nodes(&text);
            let masters = view.iter().filter(|n| n.is_master()).count();
            if view.len() != 6 || masters != 3 || view.iter().any(NodeLine::failing) {
                return Some(format!("{} sees: {text}", node.port()));
            }
            let replication: String = redis::cmd("INFO")
                .arg("replication")
                .query(&mut c)
                .unwrap_or_default();
            if replication.contains("role:master")
                && !(replication.contains("connected_slaves:1")
                    && replication.contains("state=online"))
            {
                return Some(format!("{}: {replication}", node.port()));
            }
            if replication.contains("role:slave") && !replication.contains("master_link_status:up")
            {
                return Some(format!("{}: {replication}", node.port()));
            }
        }
        None
    }

    /// Waits until the node on `port` is a master and serves its slots (`cluster_state:ok`).
    pub(crate) fn wait_promoted(&self, port: u16) {
        let started = Instant::now();
        loop {
            if self.role(port) == "master" {
                let info: String = self.node(port).cmd(&["CLUSTER", "INFO"]);
                if info.contains("cluster_state:ok") {
                    return;
                }
            }
            assert!(
                started.elapsed() < PATIENCE,
                "the replica on {port} was not promoted within {PATIENCE:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The retries a node holds for `key` (`cr + pr`), read on the node itself even if it is
    /// a replica (`READONLY`). Returns `None` if the key does not exist there.
    pub(crate) fn retries_on(&self, port: u16, key: &str) -> Option<u64> {
        let mut c = self.node(port).connection().expect("connect to the node");
        let _: () = redis::cmd("READONLY")
            .query(&mut c)
            .expect("READONLY on a cluster node");
        let (cr, pr): (Option<u64>, Option<u64>) = redis::cmd("HMGET")
            .arg(key)
            .arg("cr")
            .arg("pr")
            .query(&mut c)
            .unwrap_or_else(|e| panic!("HMGET {key} on {port}: {e}"));
        match (cr, pr) {
            (None, None) => None,
            (cr, pr) => Some(cr.unwrap_or(0) + pr.unwrap_or(0)),
        }
    }
}
