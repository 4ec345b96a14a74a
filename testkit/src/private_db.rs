//! A database server of the test's own (own data directory under a tempdir, free port), for
//! tests that stop and start the database. The machine's shared MariaDB and PostgreSQL serve
//! every other test at the same time and are never stopped.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sea_orm::{ConnectOptions, ConnectionTrait, Database};

use crate::ports::free_port;
use crate::process::Guard;

/// Which server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// `mariadbd`, started as a child of the test.
    MariaDb,
    /// PostgreSQL under `pg_ctl`, as the `postgres` user.
    Postgres,
}

/// Where PostgreSQL's server programs (initdb, pg_ctl) are: `IDEMPOST_TEST_POSTGRES_BIN`, or the
/// newest major version Debian's packages installed under /usr/lib/postgresql.
fn postgres_bin() -> std::path::PathBuf {
    if let Some(dir) = std::env::var_os("IDEMPOST_TEST_POSTGRES_BIN") {
        return dir.into();
    }
    let mut installed: Vec<(u32, std::path::PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .expect(
            "PostgreSQL's server is installed under /usr/lib/postgresql (or set IDEMPOST_TEST_POSTGRES_BIN)",
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
#[derive(Debug)]
pub struct PrivateServer {
    // First, so it is killed before its data directory goes.
    mariadbd: Option<Guard>,
    engine: Engine,
    dir: tempfile::TempDir,
    port: u16,
    running: bool,
    /// The server's own defaults, none of the kit's speed-ups (see [`PrivateServer::start_stock`]).
    stock: bool,
}

impl PrivateServer {
    /// Initialises a data directory and starts the server on a free port, made quick for
    /// tests: PostgreSQL with `fsync=off`, MariaDB with a 32 MiB buffer pool and no binary log.
    pub async fn start(engine: Engine) -> Self {
        Self::start_as(engine, false).await
    }

    /// [`PrivateServer::start`] with the server's stock settings (PostgreSQL as `initdb` made it,
    /// autovacuum on and durable commits; MariaDB with its default buffer pool, binary log off as
    /// it is by default): what the bench's soak measures, where cleanup and purge behave as in a
    /// production database. [`PrivateServer::settings`] says which settings were in force.
    pub async fn start_stock(engine: Engine) -> Self {
        Self::start_as(engine, true).await
    }

    async fn start_as(engine: Engine, stock: bool) -> Self {
        let dir = tempfile::tempdir().unwrap();
        match engine {
            Engine::MariaDb => run(Command::new("mariadb-install-db").args([
                "--no-defaults",
                &format!("--datadir={}", dir.path().join("data").display()),
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
                "--user=root",
            ])),
            Engine::Postgres => {
                // initdb and pg_ctl refuse to run as root: the data belongs to postgres.
                run(Command::new("chown").arg("postgres:").arg(dir.path()));
                run(as_postgres("initdb")
                    .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync", "-D"])
                    .arg(dir.path().join("data")));
            }
        }
        // mariadbd and pg_ctl cannot bind port 0 and say which port they got.
        let mut server = Self { engine, dir, port: free_port(), mariadbd: None, running: false, stock };
        server.resume().await;
        server
    }

    /// Creates a fresh, empty database on this server and answers its URL.
    pub async fn create_database(&self) -> String {
        let name = format!("idempost_p_{}", uuid::Uuid::new_v4().simple());
        let admin = connect(&self.url(self.admin_database())).await.unwrap();
        admin.execute_unprepared(&format!("CREATE DATABASE {name}")).await.unwrap();
        admin.close().await.unwrap();
        self.url(&name)
    }

    fn admin_database(&self) -> &'static str {
        if self.engine == Engine::Postgres { "postgres" } else { "mysql" }
    }

    /// The URL of `database` on this server.
    pub fn url(&self, database: &str) -> String {
        match self.engine {
            Engine::Postgres => format!("postgres://postgres@127.0.0.1:{}/{database}", self.port),
            Engine::MariaDb => format!("mysql://root@127.0.0.1:{}/{database}", self.port),
        }
    }

    /// The server's process id: `mariadbd`'s, or PostgreSQL's postmaster (from its pid file),
    /// whose children are the backends, autovacuum and the other workers.
    pub fn pid(&self) -> Option<u32> {
        match self.engine {
            Engine::MariaDb => self.mariadbd.as_ref().and_then(Guard::pid),
            Engine::Postgres => std::fs::read_to_string(self.dir.path().join("data/postmaster.pid"))
                .ok()?
                .lines()
                .next()?
                .trim()
                .parse()
                .ok(),
        }
    }

    /// The command-line settings the server was started with beyond its data directory, port
    /// and socket, as a line for a report.
    pub fn settings(&self) -> String {
        let base = match self.engine {
            Engine::Postgres => "initdb defaults, listen_addresses=127.0.0.1",
            Engine::MariaDb => "mariadbd --no-defaults, --skip-log-bin, --skip-grant-tables",
        };
        match (self.engine, self.stock) {
            (_, true) => base.to_owned(),
            (Engine::Postgres, false) => format!("{base}, fsync=off"),
            (Engine::MariaDb, false) => format!("{base}, --innodb-buffer-pool-size=32M"),
        }
    }

    /// Stops the server abruptly, as a crash would: no client gets a goodbye.
    pub async fn stop(&mut self) {
        assert!(self.running, "the server is not running");
        match self.engine {
            Engine::Postgres => run(as_postgres("pg_ctl")
                .args(["-m", "immediate", "-w", "stop", "-D"])
                .arg(self.dir.path().join("data"))),
            Engine::MariaDb => {
                if let Some(mut child) = self.mariadbd.take() {
                    child.kill();
                }
            }
        }
        self.running = false;
    }

    /// Starts the server (again) on its port and data, and waits until it accepts queries.
    pub async fn resume(&mut self) {
        assert!(!self.running, "the server is already running");
        let data = self.dir.path().join("data");
        match self.engine {
            Engine::Postgres => {
                let mut options = format!(
                    "-p {} -k {} -c listen_addresses=127.0.0.1",
                    self.port,
                    self.dir.path().display()
                );
                if !self.stock {
                    options.push_str(" -c fsync=off");
                }
                run(as_postgres("pg_ctl")
                    .args(["-w", "-l"])
                    .arg(self.dir.path().join("server.log"))
                    .args(["-o", &options, "start", "-D"])
                    .arg(&data));
            }
            Engine::MariaDb => {
                let mut command = Command::new("mariadbd");
                command
                    .arg("--no-defaults")
                    .arg(format!("--datadir={}", data.display()))
                    .arg(format!("--port={}", self.port))
                    .arg(format!("--socket={}", self.dir.path().join("mariadb.sock").display()))
                    .arg(format!("--pid-file={}", self.dir.path().join("mariadb.pid").display()))
                    .arg(format!("--log-error={}", self.dir.path().join("server.log").display()))
                    .args(["--bind-address=127.0.0.1", "--user=root", "--skip-grant-tables"])
                    .arg("--skip-log-bin");
                if !self.stock {
                    command.arg("--innodb-buffer-pool-size=32M");
                }
                command.stdout(Stdio::null()).stderr(Stdio::null());
                self.mariadbd = Some(Guard::spawn(&mut command).expect("cannot start mariadbd"));
            }
        }
        self.running = true;
        let url = self.url(self.admin_database());
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(conn) = connect(&url).await {
                let answered = conn.ping().await.is_ok();
                let _ = conn.close().await;
                if answered {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "the private database server did not accept connections in 60s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for PrivateServer {
    fn drop(&mut self) {
        if !self.running {
            return;
        }
        match self.engine {
            Engine::Postgres => {
                let _ = as_postgres("pg_ctl")
                    .args(["-m", "immediate", "stop", "-D"])
                    .arg(self.dir.path().join("data"))
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status();
            }
            Engine::MariaDb => {
                if let Some(mut child) = self.mariadbd.take() {
                    child.kill();
                }
            }
        }
    }
}

/// One connection to `url`, with sessions as the driver makes them.
async fn connect(url: &str) -> Result<sea_orm::DatabaseConnection, sea_orm::DbErr> {
    let mut options = ConnectOptions::new(url);
    options.max_connections(1).connect_timeout(Duration::from_secs(5)).sqlx_logging(false);
    Database::connect(options).await
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
