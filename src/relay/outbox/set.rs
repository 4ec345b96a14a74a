//! Fenced updates of a whole batch in one statement: every row joins its own values (event id,
//! claim token, outcome) from a derived table, and changes only while it is still PUBLISHING
//! under that token.
//!
//! PostgreSQL joins a `VALUES` list (`UPDATE … FROM (VALUES …)`), SQLite a `VALUES` common
//! table expression (`WITH v AS (VALUES …) UPDATE … FROM v`); both return the changed ids.
//! MariaDB/MySQL joins a `SELECT … UNION ALL …` derived table and has no `UPDATE … RETURNING`:
//! when fewer rows changed than were asked, the statement is rolled back and run again on the
//! rows found still fenced under a row lock, so the answer is exact there too.

use std::collections::HashSet;

use sea_orm::sea_query::LockType;
use sea_orm::{
    ColumnTrait as _, ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbBackend, DbErr,
    EntityTrait as _, QueryFilter, QuerySelect, Statement, TransactionTrait, Value,
};

use crate::db;
use crate::domain::OutboxStatus;
use crate::entity::outbox_event::{self, Column};

/// A column of the per-row values, and its PostgreSQL type (a `VALUES` list has no other).
#[derive(Debug, Clone, Copy)]
pub(super) struct ValueColumn {
    pub(super) name: &'static str,
    pub(super) pg_type: &'static str,
}

/// Every row's first two values: the event id and the claim token that fences it.
pub(super) const FENCE_COLUMNS: [ValueColumn; 2] =
    [ValueColumn { name: "v_id", pg_type: "char(36)" }, ValueColumn { name: "v_token", pg_type: "text" }];

/// One set-based update: `assignments` (SQL over `v.<column>`) applied to every row of `rows`
/// still fenced by its own token.
pub(super) struct FencedUpdate<'a> {
    /// The per-row columns, [`FENCE_COLUMNS`] first.
    pub(super) columns: &'a [ValueColumn],
    /// The rows' values, in `columns` order, event ids unique.
    pub(super) rows: Vec<Vec<Value>>,
    /// The `SET` list.
    pub(super) assignments: &'a str,
    /// Whether the claim fence applies (only a test failpoint turns it off).
    pub(super) fenced: bool,
}

impl FencedUpdate<'_> {
    /// Runs the update; says for each row (in order) whether it changed.
    pub(super) async fn run(&self, db: &DatabaseConnection) -> Result<Vec<bool>, DbErr> {
        if self.rows.is_empty() {
            return Ok(Vec::new());
        }
        let backend = db.get_database_backend();
        let ids: Vec<String> = self.rows.iter().map(|row| text(&row[0])).collect();
        if backend != DbBackend::MySql {
            let changed: HashSet<String> = db
                .query_all_raw(self.statement(backend, &self.rows))
                .await?
                .iter()
                .map(|row| row.try_get_by_index::<String>(0))
                .collect::<Result<_, _>>()?;
            return Ok(ids.iter().map(|id| changed.contains(id)).collect());
        }
        let txn = db.begin_with_config(db::relay_isolation(db), None).await?;
        let changed = txn.execute_raw(self.statement(backend, &self.rows)).await?.rows_affected();
        if changed == self.rows.len() as u64 {
            txn.commit().await?;
            return Ok(vec![true; ids.len()]);
        }
        // Some row lost its fence, and MariaDB cannot say which. Undo, lock the rows that are
        // still fenced, and update exactly those: nobody can change them before the commit.
        txn.rollback().await?;
        let txn = db.begin_with_config(db::relay_isolation(db), None).await?;
        let still = self.still_fenced(&txn, &ids).await?;
        let rows: Vec<Vec<Value>> =
            self.rows.iter().zip(&still).filter(|(_, still)| **still).map(|(row, _)| row.clone()).collect();
        if !rows.is_empty() {
            txn.execute_raw(self.statement(backend, &rows)).await?;
        }
        txn.commit().await?;
        Ok(still)
    }

    /// Which rows are PUBLISHING under their own token, each locked until the transaction ends.
    async fn still_fenced(&self, txn: &DatabaseTransaction, ids: &[String]) -> Result<Vec<bool>, DbErr> {
        let mut query = outbox_event::Entity::find()
            .select_only()
            .column(Column::EventId)
            .column(Column::LeaseOwner)
            .filter(Column::EventId.is_in(ids.iter().cloned()));
        if self.fenced {
            query = query.filter(Column::Status.eq(OutboxStatus::Publishing.as_str()));
        }
        let held: Vec<(String, Option<String>)> = query.lock(LockType::Update).into_tuple().all(txn).await?;
        Ok(self
            .rows
            .iter()
            .map(|row| {
                let (id, token) = (text(&row[0]), text(&row[1]));
                held.iter().any(|(held_id, owner)| {
                    *held_id == id && (!self.fenced || owner.as_deref() == Some(token.as_str()))
                })
            })
            .collect())
    }

    fn statement(&self, backend: DbBackend, rows: &[Vec<Value>]) -> Statement {
        let width = self.columns.len();
        let placeholder =
            |n: usize| if backend == DbBackend::Postgres { format!("${n}") } else { "?".into() };
        let assignments = self.assignments;
        let fence = if self.fenced {
            format!(" AND o.status = '{}' AND o.lease_owner = v.v_token", OutboxStatus::Publishing.as_str())
        } else {
            String::new()
        };
        let names = self.columns.iter().map(|c| c.name).collect::<Vec<_>>().join(", ");
        let value = |row: usize, col: usize| {
            let p = placeholder(row * width + col + 1);
            match backend {
                DbBackend::Postgres => format!("{p}::{}", self.columns[col].pg_type),
                // The id converted to the key's character set, so the join can use the key.
                DbBackend::MySql if col == 0 => format!("CONVERT({p} USING ascii) COLLATE ascii_bin"),
                _ => p,
            }
        };
        let tuples = || {
            (0..rows.len())
                .map(|r| format!("({})", (0..width).map(|c| value(r, c)).collect::<Vec<_>>().join(", ")))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let sql = match backend {
            DbBackend::Postgres => format!(
                "UPDATE outbox_event AS o SET {assignments} FROM (VALUES {}) AS v({names}) \
                 WHERE o.event_id = v.v_id{fence} RETURNING o.event_id",
                tuples()
            ),
            DbBackend::MySql => {
                let selects = (0..rows.len())
                    .map(|r| {
                        let cols = (0..width)
                            .map(|c| {
                                if r == 0 {
                                    format!("{} AS {}", value(r, c), self.columns[c].name)
                                } else {
                                    value(r, c)
                                }
                            })
                            .collect::<Vec<_>>()
                            .join(", ");
                        format!("SELECT {cols}")
                    })
                    .collect::<Vec<_>>()
                    .join(" UNION ALL ");
                format!(
                    "UPDATE outbox_event AS o JOIN ({selects}) AS v ON o.event_id = v.v_id SET {assignments} WHERE TRUE{fence}"
                )
            }
            _ => format!(
                "WITH v({names}) AS (VALUES {}) UPDATE outbox_event AS o SET {assignments} FROM v \
                 WHERE o.event_id = v.v_id{fence} RETURNING event_id",
                tuples()
            ),
        };
        let values = rows.iter().flatten().cloned();
        Statement::from_sql_and_values(backend, sql, values)
    }
}

fn text(value: &Value) -> String {
    match value {
        Value::String(Some(s)) => s.clone(),
        _ => String::new(),
    }
}
