//! Fenced updates of a whole batch in one statement: every row joins its own values (event id,
//! claim token, outcome) from a derived table, and changes only while it is still PUBLISHING
//! under that token.
//!
//! PostgreSQL joins an `unnest` of one array per column (a `VALUES` list where a value is NULL),
//! SQLite a `VALUES` common table expression (`WITH v AS (VALUES …) UPDATE … FROM v`); both
//! return the changed ids.
//! MariaDB/MySQL joins a `SELECT … UNION ALL …` derived table and has no `UPDATE … RETURNING`:
//! when fewer rows changed than were asked, either the statement is rolled back and run again on
//! the rows found still fenced under a row lock ([`FencedUpdate::run`]), or, run on its own
//! ([`FencedUpdate::run_alone`]), the caller reads back which rows show its change.

use std::collections::HashSet;

use sea_orm::sea_query::{ArrayType, LockType};
use sea_orm::{
    ColumnTrait as _, ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbBackend, DbErr,
    EntityTrait as _, IsolationLevel, QueryFilter, QuerySelect, Statement, TransactionTrait, Value,
};

use idempost::domain::OutboxStatus;
use idempost::entity::outbox_event::{self, Column};

/// A column of the per-row values, and its PostgreSQL type (a `VALUES` list has no other).
#[derive(Debug, Clone, Copy)]
pub(super) struct ValueColumn {
    pub(super) name: &'static str,
    pub(super) pg_type: &'static str,
}

/// Every row's first two values: the event id and the claim token that fences it.
pub(super) const FENCE_COLUMNS: [ValueColumn; 2] =
    [ValueColumn { name: "v_id", pg_type: "char(36)" }, ValueColumn { name: "v_token", pg_type: "text" }];

/// PostgreSQL's `unnest` statement binds the status a fenced row must still have (see
/// [`FencedUpdate::pg_unnest`]).
const FENCED_STATUS: ValueColumn = ValueColumn { name: "v_fenced_status", pg_type: "text" };

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
    /// Runs the update; says for each row (in order) whether it changed. On MariaDB/MySQL it
    /// runs in a transaction at `isolation` (`None`: the session's), so that it can be undone
    /// and redone when the answer is not exact.
    pub(super) async fn run(
        &self,
        db: &DatabaseConnection,
        isolation: Option<IsolationLevel>,
    ) -> Result<Vec<bool>, DbErr> {
        if db.get_database_backend() != DbBackend::MySql {
            return self.run_alone(db).await.map(|changed| changed.unwrap_or_default());
        }
        if self.rows.is_empty() {
            return Ok(Vec::new());
        }
        let ids = self.ids();
        let txn = db.begin_with_config(isolation, None).await?;
        let changed = txn.execute_raw(self.statement(DbBackend::MySql, &self.rows)).await?.rows_affected();
        if changed == self.rows.len() as u64 {
            txn.commit().await?;
            return Ok(vec![true; ids.len()]);
        }
        // Some row lost its fence, and MariaDB cannot say which. Undo, lock the rows that are
        // still fenced, and update exactly those: nobody can change them before the commit.
        txn.rollback().await?;
        let txn = db.begin_with_config(isolation, None).await?;
        let still = self.still_fenced(&txn, &ids).await?;
        let rows: Vec<Vec<Value>> =
            self.rows.iter().zip(&still).filter(|(_, still)| **still).map(|(row, _)| row.clone()).collect();
        if !rows.is_empty() {
            txn.execute_raw(self.statement(DbBackend::MySql, &rows)).await?;
        }
        txn.commit().await?;
        Ok(still)
    }

    /// Runs the update as one statement (on a connection, no transaction around it: one round
    /// trip) and says for each row (in order) whether it changed, or `None` when that is not known:
    /// on MariaDB/MySQL, which has no `UPDATE … RETURNING`, when fewer rows changed than were
    /// asked. The changes are committed either way; the caller finds out which rows they were.
    pub(super) async fn run_alone(&self, db: &impl ConnectionTrait) -> Result<Option<Vec<bool>>, DbErr> {
        if self.rows.is_empty() {
            return Ok(Some(Vec::new()));
        }
        let backend = db.get_database_backend();
        if backend == DbBackend::MySql {
            let changed = db.execute_raw(self.statement(backend, &self.rows)).await?.rows_affected();
            return Ok((changed == self.rows.len() as u64).then(|| vec![true; self.rows.len()]));
        }
        let statement = match backend {
            DbBackend::Postgres => self.pg_unnest().unwrap_or_else(|| self.statement(backend, &self.rows)),
            _ => self.statement(backend, &self.rows),
        };
        let changed: HashSet<String> = db
            .query_all_raw(statement)
            .await?
            .iter()
            .map(|row| row.try_get_by_index::<String>(0))
            .collect::<Result<_, _>>()?;
        Ok(Some(self.ids().iter().map(|id| changed.contains(id)).collect()))
    }

    /// The rows' event ids, in order.
    pub(super) fn ids(&self) -> Vec<String> {
        self.rows.iter().map(|row| text(&row[0])).collect()
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

    /// PostgreSQL's statement when every value is present (a mark's are): one array parameter
    /// per column, joined with `unnest`, so the text and the parameters are the same whatever
    /// the batch size. The relay's pool plans every run ([`idempost::db::Pool::Relay`]), and a
    /// `VALUES` list of 500 rows (2,500 parameters) took 12 ms to plan for each mark, the
    /// `unnest` under 1 ms. `None` (use [`Self::statement`]) if a value is NULL or of a type with
    /// no array here: the arrays are bound as they are, and an array of one type has no NULLs.
    ///
    /// The fence's status is bound as one more array rather than written as a constant: with
    /// `o.status = 'PUBLISHING'` the planner scans `idx_outbox_retention`'s PUBLISHING range and
    /// hash-joins, and between vacuums that range holds an entry for every row ever claimed
    /// (a bitmap scan never prunes dead entries): 18-26 ms for 351 rows among 295,000 dead
    /// entries, against 4 ms by primary key, which is what it takes when the only constant-free
    /// path to a row is its event id.
    fn pg_unnest(&self) -> Option<Statement> {
        let mut arrays = (0..self.columns.len())
            .map(|col| {
                let values: Vec<Value> =
                    self.rows.iter().map(|row| row.get(col).cloned()).collect::<Option<_>>()?;
                let kind = match values.first()? {
                    Value::String(_) => ArrayType::String,
                    Value::Int(_) => ArrayType::Int,
                    Value::BigInt(_) => ArrayType::BigInt,
                    _ => return None,
                };
                let uniform = values.iter().all(|value| match value {
                    Value::String(v) => kind == ArrayType::String && v.is_some(),
                    Value::Int(v) => kind == ArrayType::Int && v.is_some(),
                    Value::BigInt(v) => kind == ArrayType::BigInt && v.is_some(),
                    _ => false,
                });
                uniform.then(|| Value::Array(kind, Some(Box::new(values))))
            })
            .collect::<Option<Vec<Value>>>()?;
        let mut columns = self.columns.to_vec();
        let fence = if self.fenced {
            let status = Value::from(OutboxStatus::Publishing.as_str());
            arrays.push(Value::Array(ArrayType::String, Some(Box::new(vec![status; self.rows.len()]))));
            columns.push(FENCED_STATUS);
            self.fence(&format!("v.{}", FENCED_STATUS.name))
        } else {
            String::new()
        };
        let names = columns.iter().map(|c| c.name).collect::<Vec<_>>().join(", ");
        let parameters = columns
            .iter()
            .enumerate()
            .map(|(i, column)| format!("${}::{}[]", i + 1, column.pg_type))
            .collect::<Vec<_>>()
            .join(", ");
        let sql = format!(
            "UPDATE outbox_event AS o SET {} FROM unnest({parameters}) AS v({names}) \
             WHERE o.event_id = v.v_id{fence} RETURNING o.event_id",
            self.assignments,
        );
        Some(Statement::from_sql_and_values(DbBackend::Postgres, sql, arrays))
    }

    /// The condition that keeps every row to its own claim, the row's status being compared with
    /// `status` (SQL); empty if a failpoint broke the fence.
    fn fence(&self, status: &str) -> String {
        if self.fenced {
            format!(" AND o.status = {status} AND o.lease_owner = v.v_token")
        } else {
            String::new()
        }
    }

    fn statement(&self, backend: DbBackend, rows: &[Vec<Value>]) -> Statement {
        let width = self.columns.len();
        let placeholder =
            |n: usize| if backend == DbBackend::Postgres { format!("${n}") } else { "?".into() };
        let assignments = self.assignments;
        let fence = self.fence(&format!("'{}'", OutboxStatus::Publishing.as_str()));
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

/// Sorts `rows` (tagged with their call position) by event id, the order every set-based
/// update locks rows in, so two of them never wait on each other in a cycle; returns the values.
pub(super) fn in_lock_order(rows: &mut [(usize, Vec<Value>)]) -> Vec<Vec<Value>> {
    rows.sort_by(|(_, a), (_, b)| id_of(a).cmp(id_of(b)));
    rows.iter().map(|(_, row)| row.clone()).collect()
}

/// `changed` (in lock order) mapped back to the call's order.
pub(super) fn in_call_order<T: Copy>(
    rows: &[(usize, Vec<Value>)],
    changed: &[bool],
    f: impl Fn(bool) -> T,
) -> Vec<T> {
    let mut out: Vec<Option<T>> = vec![None; rows.len()];
    for ((i, _), changed) in rows.iter().zip(changed) {
        out[*i] = Some(f(*changed));
    }
    out.into_iter().map(|o| o.unwrap_or_else(|| f(false))).collect()
}

fn id_of(row: &[Value]) -> &str {
    match row.first() {
        Some(Value::String(Some(id))) => id,
        _ => "",
    }
}

fn text(value: &Value) -> String {
    match value {
        Value::String(Some(s)) => s.clone(),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const COLUMNS: [ValueColumn; 3] =
        [FENCE_COLUMNS[0], FENCE_COLUMNS[1], ValueColumn { name: "v_offset", pg_type: "bigint" }];

    fn update(rows: Vec<Vec<Value>>) -> FencedUpdate<'static> {
        FencedUpdate { columns: &COLUMNS, rows, assignments: "published_offset = v.v_offset", fenced: true }
    }

    #[test]
    fn a_postgresql_update_with_every_value_present_binds_one_array_per_column_whatever_the_batch_size() {
        let row = |i: i64| vec![Value::from(format!("id-{i}")), Value::from("token"), Value::from(i)];
        let small = update(vec![row(1)]).pg_unnest().map(|s| (s.sql, s.values.map(|v| v.0.len())));
        let large =
            update((0..500).map(row).collect()).pg_unnest().map(|s| (s.sql, s.values.map(|v| v.0.len())));
        let (sql, parameters) = large.clone().unwrap_or_default();
        assert_eq!(parameters, Some(4));
        assert!(
            sql.contains(
                "unnest($1::char(36)[], $2::text[], $3::bigint[], $4::text[]) AS v(v_id, v_token, v_offset, v_fenced_status)"
            ),
            "{sql}"
        );
        assert!(sql.contains("o.status = v.v_fenced_status AND o.lease_owner = v.v_token"), "{sql}");
        assert!(
            !sql.contains("'PUBLISHING'"),
            "no status constant for the planner to scan an index by: {sql}"
        );
        assert_eq!(small, large, "one statement text for every batch size");
    }

    #[test]
    fn a_null_or_a_value_of_another_type_leaves_the_values_list() {
        let with_null = update(vec![vec![Value::from("a"), Value::from("t"), Value::BigInt(None)]]);
        assert!(with_null.pg_unnest().is_none());
        let mixed = update(vec![
            vec![Value::from("a"), Value::from("t"), Value::from(1i64)],
            vec![Value::from("b"), Value::from("t"), Value::from(1i32)],
        ]);
        assert!(mixed.pg_unnest().is_none());
    }
}
