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
//! second live instance under the same name stops at start-up. An instance without a name of
//! its own takes the lowest numbered slot of its group whose lock no live process holds, and runs
//! under that slot's name: its restart after a crash takes the same slot.
//!
//! On a MariaDB Galera cluster `GET_LOCK` holds only on the node that granted it, so the lock is
//! a leased row instead ([`lease`]): a killed instance's name is free again when its lease runs
//! out (within the starting wait), not at once, and an unnamed instance restarted before that
//! takes the next free slot.

mod lease;

use std::path::PathBuf;
use std::time::Duration;

use sea_orm::sqlx::{self, Connection as _, MySqlConnection, PgConnection};

use lease::Lease;

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
    /// Every numbered slot of the group is held by a live instance.
    #[error(
        "all {slots} instance slots of group `{group}` are held by live consumers: give this one an \
         --instance-name"
    )]
    NoFreeSlot {
        /// The consumer group.
        group: String,
        /// How many slots there are.
        slots: u32,
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
        fnv1a(self.group.bytes().chain([0]).chain(self.id.bytes()))
    }
}

fn fnv1a(bytes: impl Iterator<Item = u8>) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in bytes {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// The MariaDB/MySQL lock name of `key` in `database`. `GET_LOCK` names are server-wide, unlike
/// PostgreSQL's advisory locks (per database) and SQLite's lock file (per database file): without
/// the database in the name, two deployments in two schemas of one server would take each
/// other's instances for duplicates.
fn mysql_lock_name(database: Option<&str>, key: u64) -> String {
    let schema = fnv1a(database.unwrap_or_default().bytes());
    format!("idempost.consumer.{schema:016x}.{key:016x}")
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
    /// On a Galera cluster: a leased row, renewed over this connection at every check.
    Lease(Option<MySqlConnection>, Lease),
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
            lock_mysql(url, &identity, wait).await?
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

    /// Takes the lowest numbered slot no live process holds, `identity(n)` naming slot `n`, each
    /// tried once without waiting; `None` when `url` is an in-memory database (nothing to lock,
    /// so no stable name either). Why slots: a consumer without a name of its own still gets one
    /// that is stable across its restarts, because its dead predecessor's lock ends with its
    /// process, so a restarted instance takes the same slot and, as a static member, its
    /// partitions back at once.
    pub(crate) async fn first_free_slot(
        url: &str,
        group: &str,
        identity: impl Fn(u32) -> Identity,
    ) -> Result<Option<(Identity, Self)>, InstanceError> {
        for slot in 0..SLOTS {
            match Self::acquire(url, identity(slot), Duration::ZERO).await {
                Ok(Self { held: Held::Nothing, .. }) => return Ok(None),
                Ok(lock) => return Ok(Some((lock.identity.clone(), lock))),
                Err(InstanceError::Duplicate { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Err(InstanceError::NoFreeSlot { group: group.to_owned(), slots: SLOTS })
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
                self.held = lock_mysql(&self.url, &self.identity, self.wait).await?;
            }
            Held::Lease(conn, lease) => {
                if conn.is_none() {
                    let mut fresh = MySqlConnection::connect(&self.url).await?;
                    Lease::set_up(&mut fresh).await?;
                    *conn = Some(fresh);
                }
                let Some(open) = conn.as_mut() else { return Ok(()) };
                match lease.take(open).await {
                    Ok(true) => {}
                    Ok(false) => return Err(self.identity.duplicate()),
                    Err(e) => {
                        // Renewed over a new connection at the next check.
                        *conn = None;
                        return Err(e.into());
                    }
                }
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

/// How many numbered slots a group's unnamed instances may take: more live instances than a
/// topic has partitions would hold nothing anyway.
const SLOTS: u32 = 256;

/// How often a lock held by another process is tried again while waiting.
const RETRY: Duration = Duration::from_millis(100);

async fn lock_mysql(url: &str, identity: &Identity, wait: Duration) -> Result<Held, InstanceError> {
    let mut conn = MySqlConnection::connect(url).await?;
    let database: Option<String> = sqlx::query_scalar("SELECT DATABASE()").fetch_one(&mut conn).await?;
    let name = mysql_lock_name(database.as_deref(), identity.key());
    if idempost::db::galera::wsrep_on(&mut conn).await? {
        return lock_lease(conn, name, identity, wait).await;
    }
    // 1: taken; 0: another session held it for the whole wait; NULL (-1 here): an error.
    let taken: i64 = sqlx::query_scalar("SELECT CAST(COALESCE(GET_LOCK(?, ?), -1) AS SIGNED)")
        .bind(name)
        .bind(wait.as_secs_f64())
        .fetch_one(&mut conn)
        .await?;
    match taken {
        1 => Ok(Held::MySql(Some(conn))),
        0 => Err(identity.duplicate()),
        _ => Err(InstanceError::Database(sqlx::Error::Protocol("GET_LOCK answered NULL".into()))),
    }
}

/// Takes the leased row named `name` on a Galera cluster, trying again until `wait` has passed.
async fn lock_lease(
    mut conn: MySqlConnection,
    name: String,
    identity: &Identity,
    wait: Duration,
) -> Result<Held, InstanceError> {
    let lease = Lease::new(&mut conn, name).await?;
    let until = tokio::time::Instant::now() + wait;
    loop {
        if lease.take(&mut conn).await? {
            return Ok(Held::Lease(Some(conn), lease));
        }
        if tokio::time::Instant::now() >= until {
            return Err(identity.duplicate());
        }
        tokio::time::sleep(RETRY).await;
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
    fn a_mysql_lock_name_differs_per_database_and_fits_get_lock() {
        let key = identity("pod-0").key();
        let (one, other) = (mysql_lock_name(Some("shop_eu"), key), mysql_lock_name(Some("shop_us"), key));
        assert_ne!(one, other);
        assert_eq!(one, mysql_lock_name(Some("shop_eu"), key));
        assert!(one.len() <= 64, "GET_LOCK takes at most 64 characters: {one}");
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

    #[tokio::test]
    async fn an_unnamed_instance_takes_the_lowest_slot_no_live_process_holds() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/c.db?mode=rwc", dir.path().display());
        let slot = |n: u32| identity(&format!("slot-{n}"));
        let take = || InstanceLock::first_free_slot(&url, "g", slot);
        let (zero, zero_lock) = take().await.unwrap().unwrap();
        let (one, _one_lock) = take().await.unwrap().unwrap();
        assert_eq!((zero.instance.as_str(), one.instance.as_str()), ("slot-0", "slot-1"));
        drop(zero_lock);
        let (again, _) = take().await.unwrap().unwrap();
        assert_eq!(again.instance, "slot-0", "a restarted instance takes its dead predecessor's slot");
        assert!(InstanceLock::first_free_slot("sqlite::memory:", "g", slot).await.unwrap().is_none());
    }
}
