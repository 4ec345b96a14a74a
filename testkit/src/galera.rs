//! A three-node MariaDB Galera cluster of the test's own, on loopback: Debian's `galera-4`
//! provider under the installed `mariadbd`, each node with its own data directory and ports (SQL,
//! group communication, incremental and full state transfer). Nodes are killed with SIGKILL and
//! started again (they rejoin by IST or rsync SST), or cut off from the others.
//!
//! Why the nodes run as the `mysql` user: a full state transfer (rsync SST) starts an rsync
//! daemon on the joiner, and an rsync daemon started by root drops to `nobody`, which cannot
//! write the node's data directory.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use sea_orm::{ConnectOptions, ConnectionTrait, Database, DatabaseConnection};

use crate::ports::free_port;
use crate::process::Guard;
use crate::wait::eventually;

/// Where Debian's `galera-4` puts the provider.
const PROVIDER: &str = "/usr/lib/galera/libgalera_smm.so";

/// How many nodes a cluster has: the smallest that keeps a quorum when one is lost.
pub const NODES: usize = 3;

/// How long a cluster (or a node rejoining it) may take to be Synced on a loaded machine: the
/// cluster forms in seconds, a state transfer of a test's data in a few more.
const SYNCED_WITHIN: Duration = Duration::from_secs(120);

/// One node: its ports and data, and its server while it runs.
#[derive(Debug)]
struct Node {
    // First, so it is killed before its data directory goes.
    server: Option<Guard>,
    sql: u16,
    group: u16,
    ist: u16,
    sst: u16,
    dir: PathBuf,
}

/// A running three-node Galera cluster, every node SIGKILLed when dropped.
#[derive(Debug)]
pub struct GaleraCluster {
    nodes: Vec<Node>,
    // Last, so the servers are gone before their data directories.
    _dir: tempfile::TempDir,
}

impl GaleraCluster {
    /// Initialises three data directories, bootstraps the first node (`--wsrep-new-cluster`),
    /// joins the other two, and waits until all three are Synced in one cluster of three.
    pub async fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        run(Command::new("chown").arg("mysql:mysql").arg(dir.path()));
        let mut nodes = Vec::with_capacity(NODES);
        for n in 0..NODES {
            let node_dir = dir.path().join(format!("node{}", n + 1));
            std::fs::create_dir(&node_dir).unwrap();
            run(Command::new("chown").arg("mysql:mysql").arg(&node_dir));
            run(Command::new("mariadb-install-db").args([
                "--no-defaults",
                &format!("--datadir={}", node_dir.join("data").display()),
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
                "--user=mysql",
            ]));
            let (sql, group, ist, sst) = (free_port(), free_port(), free_port(), free_port());
            nodes.push(Node { server: None, sql, group, ist, sst, dir: node_dir });
        }
        let mut cluster = Self { nodes, _dir: dir };
        cluster.launch(0, true);
        cluster.wait_node_synced(0).await;
        for n in 1..NODES {
            cluster.launch(n, false);
        }
        cluster.wait_synced().await;
        cluster
    }

    /// The URL of `database` on node `node` (0-based).
    pub fn url(&self, node: usize, database: &str) -> String {
        format!("mysql://root@127.0.0.1:{}/{database}", self.nodes[node].sql)
    }

    /// Node `node`'s SQL address (for a proxy in front of it).
    pub fn address(&self, node: usize) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], self.nodes[node].sql))
    }

    /// The URLs of `database` on every node, node 0 first.
    pub fn urls(&self, database: &str) -> Vec<String> {
        (0..NODES).map(|n| self.url(n, database)).collect()
    }

    /// Creates a fresh, empty database (through node 0; the cluster replicates it) and answers
    /// its name.
    pub async fn create_database(&self) -> String {
        let name = format!("idempost_g_{}", uuid::Uuid::new_v4().simple());
        let admin = connect(&self.url(0, "mysql")).await.unwrap();
        admin.execute_unprepared(&format!("CREATE DATABASE {name}")).await.unwrap();
        admin.close().await.unwrap();
        name
    }

    /// Kills node `node` with SIGKILL, as a crash would: no client and no peer gets a goodbye.
    pub fn kill(&mut self, node: usize) {
        let mut server = self.nodes[node].server.take().expect("the node is running");
        server.kill();
    }

    /// Starts a killed node again on its ports and data; it rejoins the cluster (by IST from a
    /// peer's cache, or a full rsync SST) and this waits until every node is Synced again.
    pub async fn restart(&mut self, node: usize) {
        assert!(self.nodes[node].server.is_none(), "node {node} is already running");
        self.launch(node, false);
        self.wait_synced().await;
    }

    /// Cuts node `node` off from its peers (`gmcast.isolate=1`): it leaves the primary
    /// component and refuses queries (error 1047) until [`GaleraCluster::rejoin`], while its
    /// process and port stay up, as behind a network partition.
    pub async fn isolate(&self, node: usize) {
        self.provider_option(node, "gmcast.isolate=1").await;
        let others = (0..NODES).find(|&n| n != node).unwrap();
        let shrunk = eventually(SYNCED_WITHIN, || self.cluster_size_is(others, NODES - 1)).await;
        assert!(shrunk, "the cluster did not drop isolated node {node} within {SYNCED_WITHIN:?}");
        // The others may form their component before the isolated node has noticed that it is
        // alone: wait until the node itself no longer counts itself in a primary component.
        let alone = eventually(SYNCED_WITHIN, || async {
            self.status(node, "wsrep_cluster_status").await.is_some_and(|status| status != "Primary")
        })
        .await;
        assert!(alone, "isolated node {node} still counted itself primary after {SYNCED_WITHIN:?}");
    }

    /// Ends [`GaleraCluster::isolate`]: the node rejoins and catches up; this waits until every
    /// node is Synced again.
    pub async fn rejoin(&self, node: usize) {
        self.provider_option(node, "gmcast.isolate=0").await;
        self.wait_synced().await;
    }

    /// Waits until every node runs, is Synced, and sees a cluster of three.
    pub async fn wait_synced(&self) {
        for n in 0..NODES {
            self.wait_node_synced(n).await;
        }
        let whole = eventually(SYNCED_WITHIN, || self.cluster_size_is(0, NODES)).await;
        assert!(whole, "the cluster did not reach {NODES} nodes within {SYNCED_WITHIN:?}");
    }

    /// A status variable of node `node` (`wsrep_cluster_size`, `wsrep_local_state_comment`).
    pub async fn status(&self, node: usize, name: &str) -> Option<String> {
        let conn = connect(&self.url(node, "mysql")).await.ok()?;
        let row = conn
            .query_one_raw(sea_orm::Statement::from_string(
                sea_orm::DbBackend::MySql,
                format!("SHOW GLOBAL STATUS LIKE '{name}'"),
            ))
            .await
            .ok()
            .flatten();
        let _ = conn.close().await;
        row?.try_get_by_index::<String>(1).ok()
    }

    async fn wait_node_synced(&self, node: usize) {
        let synced = eventually(SYNCED_WITHIN, || async {
            self.status(node, "wsrep_local_state_comment").await.as_deref() == Some("Synced")
        })
        .await;
        assert!(
            synced,
            "node {node} was not Synced within {SYNCED_WITHIN:?}; its log: {}",
            self.nodes[node].dir.join("server.log").display()
        );
    }

    async fn cluster_size_is(&self, node: usize, size: usize) -> bool {
        self.status(node, "wsrep_cluster_size").await == Some(size.to_string())
    }

    async fn provider_option(&self, node: usize, option: &str) {
        let conn = connect(&self.url(node, "mysql")).await.unwrap();
        conn.execute_unprepared(&format!("SET GLOBAL wsrep_provider_options = '{option}'")).await.unwrap();
        conn.close().await.unwrap();
    }

    /// Starts node `node`'s server; the first start of the first node bootstraps the cluster.
    fn launch(&mut self, node: usize, bootstrap: bool) {
        let peers: Vec<String> = self.nodes.iter().map(|n| format!("127.0.0.1:{}", n.group)).collect();
        let mut command = mariadbd(&self.nodes[node], &peers.join(","));
        if bootstrap {
            command.arg("--wsrep-new-cluster");
        }
        self.nodes[node].server = Some(Guard::spawn(&mut command).expect("cannot start mariadbd"));
    }
}

/// The command line of one node: a private server (as `private_db`'s) with wsrep on, the
/// settings Galera requires (row-based replication, interleaved auto-increment locks), and
/// every address on loopback.
fn mariadbd(node: &Node, peers: &str) -> Command {
    let path = |name: &str| node.dir.join(name).display().to_string();
    let provider_options = format!(
        "gmcast.listen_addr=tcp://127.0.0.1:{};ist.recv_addr=127.0.0.1:{};gcache.size=64M",
        node.group, node.ist
    );
    let mut command = Command::new("mariadbd");
    command
        .arg("--no-defaults")
        .arg(format!("--datadir={}", path("data")))
        .arg(format!("--port={}", node.sql))
        .arg(format!("--socket={}", path("mariadb.sock")))
        .arg(format!("--pid-file={}", path("mariadb.pid")))
        .arg(format!("--log-error={}", path("server.log")))
        .args(["--bind-address=127.0.0.1", "--user=mysql", "--skip-grant-tables"])
        .args(["--innodb-buffer-pool-size=32M", "--skip-log-bin"])
        .args(["--binlog-format=ROW", "--innodb-autoinc-lock-mode=2"])
        .args(["--wsrep-on=ON", &format!("--wsrep-provider={PROVIDER}")])
        .args(["--wsrep-cluster-name=idempost-test", "--wsrep-sst-method=rsync"])
        .arg(format!("--wsrep-cluster-address=gcomm://{peers}"))
        .arg(format!("--wsrep-node-address=127.0.0.1:{}", node.group))
        .arg(format!("--wsrep-provider-options={provider_options}"))
        .arg(format!("--wsrep-sst-receive-address=127.0.0.1:{}", node.sst))
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    command
}

/// One connection to `url`.
async fn connect(url: &str) -> Result<DatabaseConnection, sea_orm::DbErr> {
    let mut options = ConnectOptions::new(url);
    options.max_connections(1).connect_timeout(Duration::from_secs(5)).sqlx_logging(false);
    Database::connect(options).await
}

/// Runs a set-up command to completion; its output is shown only when it fails.
fn run(command: &mut Command) {
    let output = command.output().unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    assert!(
        output.status.success(),
        "{command:?} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
