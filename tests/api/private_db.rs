//! A database server of the test's own (own data directory under a tempdir, free port), for
//! tests that stop and start the database. The machine's shared MariaDB and PostgreSQL serve
//! every other test at the same time and are never stopped.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::broker::free_port;
use crate::helpers::{Backend, TestDb, assert_eventually};

/// Where PostgreSQL's server programs (initdb, pg_ctl) are: `OUTPOST_TEST_POSTGRES_BIN`, or the
/// newest major version Debian's packages installed under /usr/lib/postgresql.
fn postgres_bin() -> std::path::PathBuf {
    if let Some(dir) = std::env::var_os("OUTPOST_TEST_POSTGRES_BIN") {
        return dir.into();
    }
    let mut installed: Vec<(u32, std::path::PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .expect(
            "PostgreSQL's server is installed under /usr/lib/postgresql (or set OUTPOST_TEST_POSTGRES_BIN)",
        )
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let major = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").exists().then_some((major, bin))
        })
        .collect();
    installed.sort();
    installed.pop().map(|(_, bin)| bin).expect("no initdb under /usr/lib/postgresql/*/bin")
}

/// A private MariaDB or PostgreSQL server, stopped for good when dropped.
pub struct PrivateServer {
    backend: Backend,
    dir: tempfile::TempDir,
    port: u16,
    mariadbd: Option<Child>,
    running: bool,
}

impl PrivateServer {
    /// Initialises a data directory and starts the server on a free port.
    pub async fn start(backend: Backend) -> Self {
        let dir = tempfile::tempdir().unwrap();
        match backend {
            Backend::MariaDb => run(Command::new("mariadb-install-db").args([
                "--no-defaults",
                &format!("--datadir={}", dir.path().join("data").display()),
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
                "--user=root",
            ])),
            Backend::Postgres => {
                // initdb and pg_ctl refuse to run as root: the data belongs to postgres.
                run(Command::new("chown").arg("postgres:").arg(dir.path()));
                run(as_postgres("initdb")
                    .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync", "-D"])
                    .arg(dir.path().join("data")));
            }
            Backend::Sqlite => panic!("SQLite has no server to stop"),
        }
        let mut server = Self { backend, dir, port: free_port(), mariadbd: None, running: false };
        server.resume().await;
        server
    }

    /// A fresh, migrated database on this server.
    pub async fn migrated_database(&self) -> TestDb {
        let name = format!("outpost_p_{}", uuid::Uuid::new_v4().simple());
        let admin = outpost::db::connect(&self.url(self.admin_database()), 1).await.unwrap();
        sea_orm::ConnectionTrait::execute_unprepared(&admin, &format!("CREATE DATABASE {name}"))
            .await
            .unwrap();
        admin.close().await.unwrap();
        TestDb::migrated_at(self.url(&name)).await
    }

    fn admin_database(&self) -> &'static str {
        if self.backend == Backend::Postgres { "postgres" } else { "mysql" }
    }

    fn url(&self, database: &str) -> String {
        match self.backend {
            Backend::Postgres => format!("postgres://postgres@127.0.0.1:{}/{database}", self.port),
            _ => format!("mysql://root@127.0.0.1:{}/{database}", self.port),
        }
    }

    /// Stops the server abruptly, as a crash would: no client gets a goodbye.
    pub async fn stop(&mut self) {
        assert!(self.running, "the server is not running");
        match self.backend {
            Backend::Postgres => run(as_postgres("pg_ctl")
                .args(["-m", "immediate", "-w", "stop", "-D"])
                .arg(self.dir.path().join("data"))),
            _ => {
                if let Some(mut child) = self.mariadbd.take() {
                    let _ = child.kill();
                    let _ = child.wait();
                }
            }
        }
        self.running = false;
    }

    /// Starts the server (again) on its port and data, and waits until it accepts queries.
    pub async fn resume(&mut self) {
        assert!(!self.running, "the server is already running");
        let data = self.dir.path().join("data");
        match self.backend {
            Backend::Postgres => {
                let options = format!(
                    "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off",
                    self.port,
                    self.dir.path().display()
                );
                run(as_postgres("pg_ctl")
                    .args(["-w", "-l"])
                    .arg(self.dir.path().join("server.log"))
                    .args(["-o", &options, "start", "-D"])
                    .arg(&data));
            }
            _ => {
                let child = Command::new("mariadbd")
                    .arg("--no-defaults")
                    .arg(format!("--datadir={}", data.display()))
                    .arg(format!("--port={}", self.port))
                    .arg(format!("--socket={}", self.dir.path().join("mariadb.sock").display()))
                    .arg(format!("--pid-file={}", self.dir.path().join("mariadb.pid").display()))
                    .arg(format!("--log-error={}", self.dir.path().join("server.log").display()))
                    .args(["--bind-address=127.0.0.1", "--user=root", "--skip-grant-tables"])
                    .args(["--innodb-buffer-pool-size=32M", "--skip-log-bin"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("cannot start mariadbd");
                self.mariadbd = Some(child);
            }
        }
        self.running = true;
        let url = self.url(self.admin_database());
        assert_eventually("the private database server accepts connections", Duration::from_secs(60), || {
            let url = url.clone();
            async move {
                match outpost::db::connect(&url, 1).await {
                    Ok(conn) => conn.ping().await.is_ok(),
                    Err(_) => false,
                }
            }
        })
        .await;
    }
}

impl Drop for PrivateServer {
    fn drop(&mut self) {
        if !self.running {
            return;
        }
        match self.backend {
            Backend::Postgres => {
                let _ = as_postgres("pg_ctl")
                    .args(["-m", "immediate", "stop", "-D"])
                    .arg(self.dir.path().join("data"))
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status();
            }
            _ => {
                if let Some(mut child) = self.mariadbd.take() {
                    let _ = child.kill();
                    let _ = child.wait();
                }
            }
        }
    }
}

fn as_postgres(program: &str) -> Command {
    let mut command = Command::new("runuser");
    command.args(["-u", "postgres", "--"]).arg(postgres_bin().join(program));
    command
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
