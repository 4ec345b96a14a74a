//! The set-based write of a batch: one multi-row INSERT per table (orders, order_line,
//! order_version, outbox_event) for all its orders, instead of four statements and a savepoint
//! per order.
//!
//! The rows are the ones an order written alone gets ([`order_row`], [`line_rows`],
//! [`outbox_row`]). Each order's id comes back by its acceptance event id, never from the
//! position of a row or from consecutive auto-increment values: from `RETURNING` where the
//! server has it (PostgreSQL, SQLite, MariaDB 10.5 and later), else from one SELECT by
//! acceptance event id inside the same transaction.

use std::collections::HashMap;

use sea_orm::sea_query::Query;
use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseTransaction, DbBackend, DbErr, EntityTrait, QueryFilter,
    QuerySelect, QueryTrait, Statement,
};
use tokio::sync::OnceCell;

use crate::accepting::{Accepting, line_rows, order_row, outbox_row, submitted_version_row};
use idempost::db::TxFailure;
use idempost::entity::{order_line, order_version, orders, outbox_event};

/// Bound parameters per statement: far below the smallest limit of the three backends
/// (SQLite's 32,766), so that a large batch of long orders splits into a few statements
/// instead of failing.
const PARAMETERS_PER_STATEMENT: usize = 16_000;

/// Rows of `columns` bound values each that one statement takes.
fn rows_per_statement(columns: usize) -> usize {
    (PARAMETERS_PER_STATEMENT / columns.max(1)).max(1)
}

/// Columns bound per row (every column but the ones the database fills).
const ORDER_COLUMNS: usize = 9;
const LINE_COLUMNS: usize = 5;
const VERSION_COLUMNS: usize = 9;
const OUTBOX_COLUMNS: usize = 23;

/// Whether a MySQL-protocol server that reports `version` (`SELECT VERSION()`) takes
/// `INSERT … RETURNING`: MariaDB from 10.5 on; MySQL never.
fn mysql_protocol_has_returning(version: &str) -> bool {
    if !version.contains("MariaDB") {
        return false;
    }
    let mut parts = version.split(['.', '-']).map(str::parse::<u32>);
    match (parts.next(), parts.next()) {
        (Some(Ok(major)), Some(Ok(minor))) => (major, minor) >= (10, 5),
        _ => false,
    }
}

/// How the writers get inserted order ids back; learnt from the server once and shared.
#[derive(Debug, Clone, Default)]
pub(super) struct IdsBack {
    returning: std::sync::Arc<OnceCell<bool>>,
}

impl IdsBack {
    /// Whether `INSERT … RETURNING` works on `txn`'s server.
    async fn returning(&self, txn: &DatabaseTransaction) -> Result<bool, DbErr> {
        let backend = txn.get_database_backend();
        if backend != DbBackend::MySql {
            return Ok(true);
        }
        let found = self
            .returning
            .get_or_try_init(|| async {
                let row = txn
                    .query_one_raw(Statement::from_string(backend, "SELECT VERSION()"))
                    .await?
                    .ok_or_else(|| DbErr::RecordNotFound("the server version".into()))?;
                let version: String = row.try_get_by_index(0)?;
                Ok::<_, DbErr>(mysql_protocol_has_returning(&version))
            })
            .await?;
        Ok(*found)
    }
}

/// Writes `orders` (distinct keys and event ids) in `txn` with one multi-row INSERT per table
/// and returns their order ids, in the same order. Any error leaves the transaction to be rolled
/// back by the caller: a statement may have written part of the batch.
pub(super) async fn write(
    txn: &DatabaseTransaction,
    orders: &[&Accepting],
    ids_back: &IdsBack,
) -> Result<Vec<i64>, TxFailure> {
    let returning = ids_back.returning(txn).await?;
    let mut order_ids = Vec::with_capacity(orders.len());
    for chunk in orders.chunks(rows_per_statement(ORDER_COLUMNS)) {
        order_ids.extend(insert_orders(txn, chunk, returning).await?);
    }
    let lines: Vec<order_line::ActiveModel> = orders
        .iter()
        .zip(&order_ids)
        .flat_map(|(a, &order_id)| line_rows(a.submit.order.lines(), order_id))
        .collect();
    for chunk in lines.chunks(rows_per_statement(LINE_COLUMNS)) {
        order_line::Entity::insert_many(chunk.iter().cloned()).exec_without_returning(txn).await?;
    }
    for (chunk, ids) in orders
        .chunks(rows_per_statement(VERSION_COLUMNS))
        .zip(order_ids.chunks(rows_per_statement(VERSION_COLUMNS)))
    {
        let rows = chunk
            .iter()
            .zip(ids)
            .map(|(a, &order_id)| submitted_version_row(&a.submit, a.event_id, a.accepted_at, order_id));
        order_version::Entity::insert_many(rows).exec_without_returning(txn).await?;
    }
    for (chunk, ids) in orders
        .chunks(rows_per_statement(OUTBOX_COLUMNS))
        .zip(order_ids.chunks(rows_per_statement(OUTBOX_COLUMNS)))
    {
        let rows = chunk
            .iter()
            .zip(ids)
            .map(|(a, &order_id)| outbox_row(&a.submit, a.event_id, a.accepted_at, &a.trace, order_id));
        outbox_event::Entity::insert_many(rows).exec_without_returning(txn).await?;
    }
    Ok(order_ids)
}

/// Inserts one statement's worth of order rows and returns their ids, in `chunk`'s order.
async fn insert_orders(
    txn: &DatabaseTransaction,
    chunk: &[&Accepting],
    returning: bool,
) -> Result<Vec<i64>, DbErr> {
    let backend = txn.get_database_backend();
    let mut insert =
        orders::Entity::insert_many(chunk.iter().map(|a| order_row(&a.submit, a.event_id, a.accepted_at)));
    let mut by_event_id: HashMap<String, i64> = HashMap::with_capacity(chunk.len());
    if returning {
        insert
            .query()
            .returning(Query::returning().columns([orders::Column::Id, orders::Column::AcceptanceEventId]));
        let mut statement = insert.build(backend);
        if backend == DbBackend::MySql {
            // SeaQuery's MySQL dialect has no RETURNING (MySQL lacks it); MariaDB takes it.
            statement.sql.push_str(" RETURNING `id`, `acceptance_event_id`");
        }
        for row in txn.query_all_raw(statement).await? {
            by_event_id.insert(row.try_get("", "acceptance_event_id")?, row.try_get("", "id")?);
        }
    } else {
        txn.execute_raw(insert.build(backend)).await?;
        let event_ids: Vec<String> = chunk.iter().map(|a| a.event_id.to_string()).collect();
        let found: Vec<(i64, String)> = orders::Entity::find()
            .select_only()
            .column(orders::Column::Id)
            .column(orders::Column::AcceptanceEventId)
            .filter(orders::Column::AcceptanceEventId.is_in(event_ids))
            .into_tuple()
            .all(txn)
            .await?;
        by_event_id.extend(found.into_iter().map(|(id, event_id)| (event_id, id)));
    }
    chunk
        .iter()
        .map(|a| {
            by_event_id
                .get(&a.event_id.to_string())
                .copied()
                .ok_or_else(|| DbErr::RecordNotFound(format!("the id of order {} just inserted", a.event_id)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_mariadb_from_10_5_takes_insert_returning() {
        assert!(mysql_protocol_has_returning("10.11.19-MariaDB-0+deb12u1"));
        assert!(mysql_protocol_has_returning("10.5.0-MariaDB"));
        assert!(mysql_protocol_has_returning("11.4.2-MariaDB-ubu2404"));
        assert!(!mysql_protocol_has_returning("10.4.34-MariaDB"));
        assert!(!mysql_protocol_has_returning("8.0.36"));
        assert!(!mysql_protocol_has_returning("8.4.0-log"));
        assert!(!mysql_protocol_has_returning("MariaDB"));
    }

    #[test]
    fn statements_stay_below_every_backends_parameter_limit() {
        for columns in [ORDER_COLUMNS, LINE_COLUMNS, VERSION_COLUMNS, OUTBOX_COLUMNS] {
            let rows = rows_per_statement(columns);
            assert!(rows >= 64, "{columns} columns: {rows} rows");
            assert!(rows * columns <= 32_766, "{columns} columns: {rows} rows");
        }
        assert_eq!(rows_per_statement(0), PARAMETERS_PER_STATEMENT);
    }
}
