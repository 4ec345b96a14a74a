//! MariaDB Galera: a MariaDB server with `wsrep_on` is one node of a multi-primary cluster, and
//! three things that hold on one server hold only per node there.
//!
//! - Reads: a node applies the others' commits a moment after they commit, so a read on node B
//!   right after a commit on node A (a Reconcile or a retry that reached another node) could miss
//!   it and settle an UNKNOWN wrongly. Every session therefore waits for causality before it
//!   reads (`wsrep_sync_wait = 1`): a read sees every commit the cluster had made when it began.
//! - Commits: row locks (and `SKIP LOCKED`) are local to a node; two nodes' transactions that
//!   wrote the same rows meet only at commit, where certification refuses the later one with
//!   ER_LOCK_DEADLOCK. That answer is exact: the transaction was rolled back, and may run again
//!   ([`super::commit_refused`]).
//! - `GET_LOCK` is local to a node too: the consumer's instance lock takes a lease row on Galera
//!   instead (the consumer's `instance` module).
//!
//! A node must also be set up as Galera requires: `binlog_format=ROW` (statement replication
//! would apply writes differently on each node) and `innodb_autoinc_lock_mode=2` (the interleaved
//! auto-increment locks the appliers need), and be in the primary component. A server that has
//! wsrep on without them is refused when a pool is opened (at start-up), with what to change.

use std::collections::HashMap;
use std::sync::Arc;

use sea_orm::sqlx::{self, Connection as _, MySqlConnection};
use sea_orm::{DbErr, RuntimeErr};

/// How long a session waits for causality: 1 is reads (SELECT, SHOW, BEGIN).
pub(super) const SYNC_WAIT: &str = "SET SESSION wsrep_sync_wait = 1";

/// Whether the server behind `conn` is a Galera node (`wsrep_on` is ON). MySQL and MariaDB
/// builds without wsrep have no such variable: not Galera.
pub async fn wsrep_on(conn: &mut MySqlConnection) -> Result<bool, sqlx::Error> {
    let row: Option<(String, String)> =
        sqlx::query_as("SHOW VARIABLES LIKE 'wsrep_on'").fetch_optional(&mut *conn).await?;
    Ok(row.is_some_and(|(_, value)| value.eq_ignore_ascii_case("ON")))
}

/// Whether `url` is a Galera node that Idempost can run on (its sessions are then set up with
/// [`SYNC_WAIT`]); an error naming what to change when it is a Galera node set up in a way
/// Idempost cannot be correct on. Any other database answers `false`.
pub(super) async fn probe(url: &str) -> Result<bool, DbErr> {
    if !(url.starts_with("mysql:") || url.starts_with("mariadb:")) {
        return Ok(false);
    }
    let failed = |e: sqlx::Error| DbErr::Conn(RuntimeErr::SqlxError(Arc::new(e)));
    let mut conn = MySqlConnection::connect(url).await.map_err(failed)?;
    let asked = ask(&mut conn).await.map_err(failed);
    let _ = conn.close().await;
    let Some((variables, status)) = asked? else { return Ok(false) };
    let refusals = refusals(&variables, &status);
    if !refusals.is_empty() {
        return Err(DbErr::Custom(format!("refusing this Galera node: {}", refusals.join("; "))));
    }
    tracing::debug!(
        cluster_size = status.get("wsrep_cluster_size").map(String::as_str).unwrap_or("?"),
        "the database is a Galera node; sessions read causally (wsrep_sync_wait = 1)"
    );
    Ok(true)
}

type Values = HashMap<String, String>;

/// The settings and state of a Galera node; `None` when wsrep is off.
async fn ask(conn: &mut MySqlConnection) -> Result<Option<(Values, Values)>, sqlx::Error> {
    if !wsrep_on(conn).await? {
        return Ok(None);
    }
    let variables =
        values(conn, "SHOW VARIABLES WHERE Variable_name IN ('binlog_format', 'innodb_autoinc_lock_mode')")
            .await?;
    let status = values(
        conn,
        "SHOW STATUS WHERE Variable_name IN ('wsrep_ready', 'wsrep_cluster_status', 'wsrep_cluster_size')",
    )
    .await?;
    Ok(Some((variables, status)))
}

/// What is wrong with a Galera node's settings (`variables`) and state (`status`), each with
/// what to change; empty when nothing is.
fn refusals(variables: &Values, status: &Values) -> Vec<String> {
    let is =
        |map: &Values, name: &str, want: &str| map.get(name).is_some_and(|v| v.eq_ignore_ascii_case(want));
    let shown = |map: &Values, name: &str| map.get(name).cloned().unwrap_or_else(|| "unset".to_owned());
    let mut refusals = Vec::new();
    if !is(variables, "binlog_format", "ROW") {
        refusals.push(format!("binlog_format is {}, Galera needs ROW", shown(variables, "binlog_format")));
    }
    if !is(variables, "innodb_autoinc_lock_mode", "2") {
        refusals.push(format!(
            "innodb_autoinc_lock_mode is {}, Galera needs 2",
            shown(variables, "innodb_autoinc_lock_mode")
        ));
    }
    if !is(status, "wsrep_ready", "ON") || !is(status, "wsrep_cluster_status", "Primary") {
        refusals.push(format!(
            "the node is not ready in the primary component (wsrep_ready {}, wsrep_cluster_status {}): \
             connect to a node of the primary component",
            shown(status, "wsrep_ready"),
            shown(status, "wsrep_cluster_status")
        ));
    }
    refusals
}

/// The `Variable_name`/`Value` pairs a SHOW statement answers.
async fn values(conn: &mut MySqlConnection, sql: &'static str) -> Result<Values, sqlx::Error> {
    let rows: Vec<(String, String)> = sqlx::query_as(sql).fetch_all(&mut *conn).await?;
    Ok(rows.into_iter().collect())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> Values {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn a_node_set_up_as_galera_requires_is_accepted() {
        let variables =
            map(&[("wsrep_on", "ON"), ("binlog_format", "ROW"), ("innodb_autoinc_lock_mode", "2")]);
        let status =
            map(&[("wsrep_ready", "ON"), ("wsrep_cluster_status", "Primary"), ("wsrep_cluster_size", "3")]);
        assert!(refusals(&variables, &status).is_empty());
    }

    #[test]
    fn each_missing_setting_is_named_with_what_to_change() {
        let variables =
            map(&[("wsrep_on", "ON"), ("binlog_format", "STATEMENT"), ("innodb_autoinc_lock_mode", "1")]);
        let status = map(&[("wsrep_ready", "OFF"), ("wsrep_cluster_status", "non-Primary")]);
        let refusals = refusals(&variables, &status);
        assert_eq!(refusals.len(), 3, "{refusals:?}");
        assert!(refusals[0].contains("binlog_format is STATEMENT, Galera needs ROW"), "{refusals:?}");
        assert!(refusals[1].contains("innodb_autoinc_lock_mode is 1, Galera needs 2"), "{refusals:?}");
        assert!(refusals[2].contains("non-Primary"), "{refusals:?}");
    }
}
