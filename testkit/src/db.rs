//! A fresh database per test on each of the three backends, migrated to the newest schema, and
//! the macro that runs one test body on every backend.

use std::sync::LazyLock;

use idempost_migration::{Migrator, MigratorTrait};
use sea_orm::{ConnectionTrait, DatabaseConnection};
use uuid::Uuid;

/// The three databases every service runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    MariaDb,
    Postgres,
    Sqlite,
}

/// Generates one `#[tokio::test]` per backend for each named `async fn(Backend)`.
#[macro_export]
macro_rules! on_every_backend {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            use $crate::db::Backend;

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn mariadb() {
                super::$name(Backend::MariaDb).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn postgres() {
                super::$name(Backend::Postgres).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn sqlite() {
                super::$name(Backend::Sqlite).await;
            }
        }
    )*};
}

/// Logs stay silent unless `TEST_LOG` is set.
static TRACING: LazyLock<()> = LazyLock::new(|| {
    if std::env::var_os("TEST_LOG").is_some() {
        let filter = "info,idempost=debug,idempost_order=debug,idempost_relay=debug,idempost_consumer=debug";
        let _ = tracing_subscriber::fmt().with_env_filter(filter).with_test_writer().try_init();
    }
});

fn server_url(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_owned())
}

/// A database made for one test (`idempost_t_<uuid>`), dropped by the test script's clean-up.
#[derive(Debug)]
pub struct TestDb {
    pub url: String,
    _dir: Option<tempfile::TempDir>,
}

impl TestDb {
    /// An empty, unmigrated database.
    pub async fn empty(backend: Backend) -> Self {
        LazyLock::force(&TRACING);
        let name = format!("idempost_t_{}", Uuid::new_v4().simple());
        match backend {
            Backend::MariaDb => {
                let server = server_url("IDEMPOST_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306");
                admin(&format!("{server}/mysql"), &format!("CREATE DATABASE {name}")).await;
                Self { url: format!("{server}/{name}"), _dir: None }
            }
            Backend::Postgres => {
                let server = server_url("IDEMPOST_TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432");
                admin(&format!("{server}/postgres"), &format!("CREATE DATABASE {name}")).await;
                Self { url: format!("{server}/{name}"), _dir: None }
            }
            Backend::Sqlite => {
                let dir = tempfile::tempdir().unwrap();
                let url = format!("sqlite://{}/idempost.db?mode=rwc", dir.path().display());
                Self { url, _dir: Some(dir) }
            }
        }
    }

    /// A fresh database with every migration applied.
    pub async fn migrated(backend: Backend) -> Self {
        let db = Self::empty(backend).await;
        db.migrate().await;
        db
    }

    /// The database at `url` (on a server a test started itself), migrated.
    pub async fn migrated_at(url: String) -> Self {
        LazyLock::force(&TRACING);
        let db = Self { url, _dir: None };
        db.migrate().await;
        db
    }

    async fn migrate(&self) {
        let conn = self.connect().await;
        Migrator::up(&conn, None).await.unwrap();
        conn.close().await.unwrap();
    }

    /// A pool of four connections, set up as the services set up theirs.
    pub async fn connect(&self) -> DatabaseConnection {
        idempost::db::connect(&self.url, 4).await.unwrap()
    }
}

/// Takes the schema on `conn` back to just before migration `name`, whatever came after it: the
/// database as a deployment that had not run it yet left it.
pub async fn migrate_back_before(conn: &DatabaseConnection, name: &str) {
    let migrations = Migrator::migrations();
    let at =
        migrations.iter().position(|m| m.name() == name).unwrap_or_else(|| panic!("no migration {name}"));
    Migrator::down(conn, Some(u32::try_from(migrations.len() - at).unwrap())).await.unwrap();
}

/// The server's account of the last deadlock InnoDB found (the `LATEST DETECTED DEADLOCK`
/// section of `SHOW ENGINE INNODB STATUS`), on MariaDB/MySQL; an empty string elsewhere or when
/// it found none. It is the whole server's, so it may be another test's: a test that fails on a
/// deadlock prints it to say which statements met, since the relay's log names only its own.
pub async fn latest_deadlock(conn: &DatabaseConnection) -> String {
    if conn.get_database_backend() != sea_orm::DbBackend::MySql {
        return String::new();
    }
    let status = conn
        .query_one_raw(sea_orm::Statement::from_string(
            sea_orm::DbBackend::MySql,
            "SHOW ENGINE INNODB STATUS",
        ))
        .await
        .ok()
        .flatten()
        .and_then(|row| row.try_get::<String>("", "Status").ok())
        .unwrap_or_default();
    let Some(start) = status.find("LATEST DETECTED DEADLOCK") else { return String::new() };
    let section = &status[start..];
    // The next section starts with its own dashed header, "TRANSACTIONS".
    let end = section.find("\nTRANSACTIONS\n").unwrap_or(section.len());
    section[..end].to_owned()
}

async fn admin(url: &str, sql: &str) {
    let conn = idempost::db::connect(url, 1).await.unwrap();
    conn.execute_unprepared(sql).await.unwrap();
    conn.close().await.unwrap();
}

/// `idempost-migrate --shard-map-file <map> up`, which must succeed; what it printed.
pub fn migrate_shards(map: &std::path::Path) -> String {
    let output = std::process::Command::new(crate::service::binary("idempost-migrate"))
        .arg("--shard-map-file")
        .arg(map)
        .arg("up")
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "{printed}{}", String::from_utf8_lossy(&output.stderr));
    printed
}
