//! One live process per static instance name.
//!
//! Two consumers started under the same `group.instance.id` should fence each other at the
//! broker, and a fenced one must stop rather than rejoin (each rejoin fences the other, forever).
//! Tansu 0.6 never answers FENCED_INSTANCE_ID: a second member joining under a known instance id
//! is handed the first one's member id, and both then consume the same partitions. So the
//! consumer does not rely on the broker alone: before it joins, it takes a lock named after its
//! group and instance id that lives exactly as long as the process holds it, in its own
//! database (MariaDB/MySQL `GET_LOCK`, a PostgreSQL session advisory lock) or, on SQLite, on a
//! lock file beside the database. The server or the OS releases it when the process dies, even
//! by SIGKILL, so a restarted instance takes its name (and its partitions) back at once, and a
//! second live instance under the same name stops at start-up.

use std::path::PathBuf;
use std::time::Duration;

use sea_orm::sqlx::{self, Connection as _, MySqlConnection, PgConnection};

/// Another live process holds this instance's name, or the lock cannot be taken.
#[derive(Debug, thiserror::Error)]
pub enum InstanceError {
    /// Another live consumer runs under the same instance name in the same group.
    #[error(
        "another consumer instance is running as instance `{instance}` of group `{group}` \
         (group.instance.id {id}): give every instance its own --instance-name (under Kubernetes, \
         the StatefulSet pod name, such as notification-planner-0)"
    )]
    Duplicate {
        /// The consumer group.
        group: String,
        /// The instance name.
        instance: String,
        /// The static membership id.
        id: String,
    },
    /// The database could not be asked.
    #[error("cannot take the instance lock: {0}")]
    Database(#[from] sqlx::Error),
    /// The lock file could not be opened.
    #[error("cannot take the instance lock {path}: {source}")]
    File {
        /// The lock file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// Who this instance is, for the lock's name and the error.
#[derive(Debug, Clone)]
pub(crate) struct Identity {
    pub(crate) group: String,
    pub(crate) instance: String,
    pub(crate) id: String,
}

impl Identity {
    /// The error naming this instance as running twice.
    pub(crate) fn duplicate(&self) -> InstanceError {
        InstanceError::Duplicate {
            group: self.group.clone(),
            instance: self.instance.clone(),
            id: self.id.clone(),
        }
    }

    /// A stable 64-bit name for the lock (FNV-1a of group and id): MariaDB lock names are at
    /// most 64 characters and PostgreSQL advisory locks are numbers.
    fn key(&self) -> u64 {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in self.group.bytes().chain([0]).chain(self.id.bytes()) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
        hash
    }
}

/// The held lock; dropping it (or the process ending) releases it.
#[allow(missing_debug_implementations)] // the database connections have no useful Debug
pub(crate) struct InstanceLock {
    identity: Identity,
    url: String,
    held: Held,
    wait: Duration,
}

enum Held {
    MySql(Option<MySqlConnection>),
    Postgres(Option<PgConnection>),
    File(#[allow(dead_code)] std::fs::File),
    /// An in-memory SQLite database: nothing else can share it, so nothing to lock.
    Nothing,
}

impl InstanceLock {
    /// Takes the lock for `identity` in the database at `url`, or fails with
    /// [`InstanceError::Duplicate`] when another process still holds it after `wait`. The wait
    /// covers a predecessor killed an instant ago, whose session the server has not closed yet.
    pub(crate) async fn acquire(
        url: &str,
        identity: Identity,
        wait: Duration,
    ) -> Result<Self, InstanceError> {
        let held = if url.starts_with("mysql:") || url.starts_with("mariadb:") {
            Held::MySql(Some(lock_mysql(url, &identity, wait).await?))
        } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
            Held::Postgres(Some(lock_postgres(url, &identity, wait).await?))
        } else {
            match sqlite_path(url) {
                Some(path) => Held::File(lock_file(path, &identity, wait).await?),
                None => Held::Nothing,
            }
        };
        Ok(Self { identity, url: url.to_owned(), held, wait })
    }

    /// Checks that the lock is still held: a database connection that broke (the server
    /// restarted) loses its lock, so it is taken again on a new connection, and
    /// [`InstanceError::Duplicate`] means another process took it meanwhile. Other errors are
    /// passing (the database is away): the next check tries again.
    pub(crate) async fn check(&mut self) -> Result<(), InstanceError> {
        match &mut self.held {
            Held::MySql(conn) => {
                if let Some(alive) = conn.as_mut()
                    && alive.ping().await.is_ok()
                {
                    return Ok(());
                }
                *conn = None;
                *conn = Some(lock_mysql(&self.url, &self.identity, self.wait).await?);
            }
            Held::Postgres(conn) => {
                if let Some(alive) = conn.as_mut()
                    && alive.ping().await.is_ok()
                {
                    return Ok(());
                }
                *conn = None;
                *conn = Some(lock_postgres(&self.url, &self.identity, self.wait).await?);
            }
            Held::File(_) | Held::Nothing => {}
        }
        Ok(())
    }
}

/// How often a lock held by another process is tried again while waiting.
const RETRY: Duration = Duration::from_millis(100);

async fn lock_mysql(
    url: &str,
    identity: &Identity,
    wait: Duration,
) -> Result<MySqlConnection, InstanceError> {
    let mut conn = MySqlConnection::connect(url).await?;
    let name = format!("idempost.consumer.{:016x}", identity.key());
    // 1: taken; 0: another session held it for the whole wait; NULL (-1 here): an error.
    let taken: i64 = sqlx::query_scalar("SELECT CAST(COALESCE(GET_LOCK(?, ?), -1) AS SIGNED)")
        .bind(name)
        .bind(wait.as_secs_f64())
        .fetch_one(&mut conn)
        .await?;
    match taken {
        1 => Ok(conn),
        0 => Err(identity.duplicate()),
        _ => Err(InstanceError::Database(sqlx::Error::Protocol("GET_LOCK answered NULL".into()))),
    }
}

async fn lock_postgres(
    url: &str,
    identity: &Identity,
    wait: Duration,
) -> Result<PgConnection, InstanceError> {
    let mut conn = PgConnection::connect(url).await?;
    // The same 64 bits as a signed key.
    let key = i64::from_ne_bytes(identity.key().to_ne_bytes());
    let until = tokio::time::Instant::now() + wait;
    loop {
        let taken: bool =
            sqlx::query_scalar("SELECT pg_try_advisory_lock($1)").bind(key).fetch_one(&mut conn).await?;
        if taken {
            return Ok(conn);
        }
        if tokio::time::Instant::now() >= until {
            return Err(identity.duplicate());
        }
        tokio::time::sleep(RETRY).await;
    }
}

/// The database file of a SQLite URL; `None` for an in-memory database.
fn sqlite_path(url: &str) -> Option<PathBuf> {
    let rest = url.strip_prefix("sqlite://").or_else(|| url.strip_prefix("sqlite:"))?;
    let path = rest.split('?').next().unwrap_or_default();
    (!path.is_empty() && !path.contains(":memory:")).then(|| PathBuf::from(path))
}

async fn lock_file(
    database: PathBuf,
    identity: &Identity,
    wait: Duration,
) -> Result<std::fs::File, InstanceError> {
    let mut name = database.into_os_string();
    name.push(format!(".consumer-{:016x}.lock", identity.key()));
    let path = PathBuf::from(name);
    let failed = |source| InstanceError::File { path: path.clone(), source };
    let file =
        std::fs::File::options().create(true).truncate(false).write(true).open(&path).map_err(failed)?;
    let until = tokio::time::Instant::now() + wait;
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(file),
            Err(std::fs::TryLockError::WouldBlock) if tokio::time::Instant::now() >= until => {
                return Err(identity.duplicate());
            }
            Err(std::fs::TryLockError::WouldBlock) => tokio::time::sleep(RETRY).await,
            Err(std::fs::TryLockError::Error(e)) => return Err(failed(e)),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn identity(instance: &str) -> Identity {
        Identity { group: "g".into(), instance: instance.into(), id: format!("c.{instance}") }
    }

    #[test]
    fn the_lock_name_is_stable_and_differs_per_instance() {
        assert_eq!(identity("pod-0").key(), identity("pod-0").key());
        assert_ne!(identity("pod-0").key(), identity("pod-1").key());
    }

    #[test]
    fn a_sqlite_url_names_its_file_and_memory_names_none() {
        assert_eq!(
            sqlite_path("sqlite:///tmp/x/idempost.db?mode=rwc"),
            Some(PathBuf::from("/tmp/x/idempost.db"))
        );
        assert_eq!(sqlite_path("sqlite::memory:"), None);
    }

    #[tokio::test]
    async fn a_second_holder_of_one_name_is_refused_until_the_first_lets_go() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/c.db?mode=rwc", dir.path().display());
        let acquire = |name| InstanceLock::acquire(&url, identity(name), Duration::ZERO);
        let first = acquire("pod-0").await.unwrap();
        let refused = acquire("pod-0").await.map(|_| ()).unwrap_err();
        assert!(matches!(refused, InstanceError::Duplicate { .. }), "{refused}");
        assert!(refused.to_string().contains("`pod-0`"), "the error names the instance: {refused}");
        let _other = acquire("pod-1").await.unwrap();
        drop(first);
        acquire("pod-0").await.unwrap();
    }
}
