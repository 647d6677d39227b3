//! A private three-node RabbitMQ cluster for the broker game day: each node a private node
//! (`rabbit_node.rs`) with its own node name, AMQP and distribution ports, database and logs
//! under one temporary directory, the same Erlang cookie (written into each node's `HOME`
//! before it starts), no plugins (the management plugin off), started in the foreground as
//! children of the test and joined with `rabbitmqctl join_cluster`. Quorum queues declared once the cluster is joined get a member
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
use std::time::Duration;

use fleet_budget::testing::free_port;

use super::rabbit_node::RabbitNode;

/// How long a node may take to start: a bound against a node that never comes up, not a
/// measure (on this shared 2-core machine under a load of 20, one node took over two minutes).
const START_WITHIN: Duration = Duration::from_secs(600);

/// Node `index` of a cluster whose files are under `base`, with the cluster's Erlang cookie
/// (readable by its owner only: Erlang refuses it otherwise); not started.
fn cluster_node(base: &Path, index: usize, cookie: &str) -> Result<RabbitNode, String> {
    let port = free_port();
    let node = RabbitNode::prepare(
        base.join(format!("n{index}")),
        format!("fbcluster{}x{port}n{index}@localhost", std::process::id()),
        port,
        "cluster_partition_handling = pause_minority\n",
        START_WITHIN,
    )?;
    let cookie_path = node.dir.join("home").join(".erlang.cookie");
    std::fs::write(&cookie_path, cookie).map_err(|e| format!(".erlang.cookie: {e}"))?;
    std::fs::set_permissions(&cookie_path, std::fs::Permissions::from_mode(0o400))
        .map_err(|e| format!(".erlang.cookie: {e}"))?;
    Ok(node)
}

/// Three nodes, joined.
#[derive(Debug)]
pub(crate) struct RabbitCluster {
    pub(crate) nodes: Vec<RabbitNode>,
    dir: PathBuf,
}

impl RabbitCluster {
    /// Starts three nodes (at once: each takes seconds), joins the second and third to the
    /// first, and checks that all three see the cluster; or says why it could not.
    pub(crate) async fn start() -> Result<Self, String> {
        RabbitNode::installed()?;
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
            cluster.nodes.push(cluster_node(&dir, i, &cookie)?);
        }
        for n in &mut cluster.nodes {
            n.spawn()?;
        }
        for n in &mut cluster.nodes {
            n.wait_ready().await?;
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
            n.wait_ready().await?;
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
        self.nodes.iter().map(RabbitNode::url).collect()
    }

    /// The index of the node whose Erlang name is `name`.
    pub(crate) fn index_of(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.node == name)
    }

    /// A running node to ask.
    fn any_running(&self) -> Result<&RabbitNode, String> {
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

    /// Every queue's counts as its leader keeps them (a follower's may lag): ready,
    /// unacknowledged, and `messages_dlx`, the messages a quorum queue dead-lettered at least
    /// once and holds until the target confirms them (a basic.get of either queue cannot see
    /// them; `list_queues` does not show them).
    pub(crate) fn queue_counts(&self) -> Result<String, String> {
        const EXPR: &str = "[begin {resource,_,queue,N} = amqqueue:get_name(Q), \
            {_, L} = amqqueue:get_pid(Q), {N, L, rpc:call(L, rabbit_amqqueue, info, \
            [Q, [messages_ready, messages_unacknowledged, messages_dlx]])} end \
            || Q <- rabbit_amqqueue:list()].";
        self.any_running()?.cli("rabbitmqctl", &["eval", EXPR])
    }

    /// Restarts the node that leads `queue` (leadership moves to another node meanwhile); the
    /// node's name.
    pub(crate) async fn restart_leader_of(&mut self, queue: &str) -> Result<String, String> {
        let leader = self.leader_of(queue)?;
        let node = self.nodes[leader].node.clone();
        self.nodes[leader]
            .restart()
            .await
            .map_err(|e| format!("restart {node}: {e}"))?;
        Ok(node)
    }

    /// The queues whose leaders hold messages for at-least-once dead-lettering (`messages_dlx`:
    /// dead-lettered, not yet confirmed by the target queue), each with how many.
    pub(crate) fn dead_letters_held(&self) -> Result<Vec<(String, u64)>, String> {
        const EXPR: &str = "lists:flatten([begin {resource,_,queue,N} = amqqueue:get_name(Q), \
            case amqqueue:get_pid(Q) of {_, L} -> \
            case rpc:call(L, rabbit_amqqueue, info, [Q, [messages_dlx]]) of \
            [{messages_dlx, D}] when is_integer(D), D > 0 -> [{N, D}]; _ -> [] end; \
            _ -> [] end end || Q <- rabbit_amqqueue:list()]).";
        let text = self.any_running()?.cli("rabbitmqctl", &["eval", EXPR])?;
        held_from(&text)
    }

    /// How many messages the queues' leaders hold for at-least-once dead-lettering, in all.
    pub(crate) fn messages_dlx(&self) -> Result<u64, String> {
        Ok(self.dead_letters_held()?.iter().map(|(_, n)| n).sum())
    }

    /// How long a quorum queue's dead-letter worker waits for the target's confirm before it
    /// publishes a dead letter again (`dead_letter_worker_publisher_confirm_timeout`: 180 s
    /// by default on 3.10 through 4.x), to a target that is not a quorum queue or a stream:
    /// for those it leaves that to the queue client (`clients_redeliver` in
    /// `rabbit_fifo_dlx_worker.erl`).
    pub(crate) fn dead_letter_resend_after(&self) -> Result<Duration, String> {
        const EXPR: &str =
            "application:get_env(rabbit, dead_letter_worker_publisher_confirm_timeout).";
        let text = self.any_running()?.cli("rabbitmqctl", &["eval", EXPR])?;
        let ms: String = text.chars().filter(char::is_ascii_digit).collect();
        ms.parse()
            .map(Duration::from_millis)
            .map_err(|e| format!("dead_letter_worker_publisher_confirm_timeout: {e}: {text}"))
    }

    /// How many messages every queue holds in all, as its leader counts them: ready,
    /// unacknowledged, and held for at-least-once dead-lettering (see
    /// [`RabbitCluster::queue_counts`]); an error when a leader cannot be asked.
    pub(crate) fn messages_held(&self) -> Result<u64, String> {
        const EXPR: &str = "lists:sum([begin {_, L} = amqqueue:get_pid(Q), \
            lists:sum([V || {_, V} <- rpc:call(L, rabbit_amqqueue, info, \
            [Q, [messages_ready, messages_unacknowledged, messages_dlx]])]) end \
            || Q <- rabbit_amqqueue:list()]).";
        let text = self.any_running()?.cli("rabbitmqctl", &["eval", EXPR])?;
        text.trim()
            .parse()
            .map_err(|e| format!("messages held: {e}: {text}"))
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

/// `rabbitmqctl eval`'s printing of an Erlang list of pairs, `[{<<"name">>,5}, ...]` (over
/// lines when long).
fn held_from(text: &str) -> Result<Vec<(String, u64)>, String> {
    text.split("{<<\"")
        .skip(1)
        .map(|part| {
            let (name, rest) = part
                .split_once("\">>,")
                .ok_or_else(|| format!("messages_dlx: {text}"))?;
            let count: String = rest
                .trim_start()
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            let count = count
                .parse()
                .map_err(|e| format!("messages_dlx: {e}: {text}"))?;
            Ok((name.to_owned(), count))
        })
        .collect()
}

#[test]
fn dead_letters_held_are_read_from_rabbitmqctl_s_printing() {
    assert_eq!(
        held_from("[{<<\"fbt.x.retry.250ms\">>,5},{<<\"b\">>,12}]\n"),
        Ok(vec![
            ("fbt.x.retry.250ms".to_owned(), 5),
            ("b".to_owned(), 12)
        ])
    );
    // A long list is printed over lines, a long pair too.
    assert_eq!(
        held_from("[{<<\"a\">>,1},\n {<<\"a-very-long-queue-name\">>,\n  23}]\n"),
        Ok(vec![
            ("a".to_owned(), 1),
            ("a-very-long-queue-name".to_owned(), 23)
        ])
    );
    assert_eq!(held_from("[]\n"), Ok(Vec::new()));
    assert!(held_from("[{<<\"a\">>,x}]").is_err());
}

impl Drop for RabbitCluster {
    fn drop(&mut self) {
        // All stopped first (each prints its log if the test panicked), then their directories.
        for n in &mut self.nodes {
            n.stop();
        }
        self.nodes.clear();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
