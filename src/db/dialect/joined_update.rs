//! An update of many rows in one statement, each row with values of its own: the rows join a
//! derived table `v` of per-row values on their key, written as each backend can.
//!
//! PostgreSQL joins a `VALUES` list (each value cast to its column's type: a `VALUES` list has no
//! other) or, when every value can be bound as an array, an `unnest` of one array per column
//! ([`JoinedUpdate::arrays`]); SQLite joins a `VALUES` common table expression
//! (`WITH v AS (VALUES …) UPDATE … FROM v`); both return the changed keys. MariaDB/MySQL joins a
//! `SELECT … UNION ALL …` derived table and returns nothing ([`super::has_update_returning`]).

use sea_orm::sea_query::ArrayType;
use sea_orm::{DbBackend, Statement, Value};

/// A column of the per-row values: its name in `v`, and its PostgreSQL type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ValueColumn {
    /// The column's name in `v`.
    pub name: &'static str,
    /// Its PostgreSQL type, which the values are cast to.
    pub pg_type: &'static str,
}

/// `UPDATE {table} AS o SET {assignments}` of the rows whose `key` equals the first value of a
/// row of `v`, and for which `condition` holds.
///
/// The key is an event id: ASCII (`CHAR(36)` in `ascii_bin` on MariaDB/MySQL, where the bound
/// value is converted to that character set so that the join can use the key).
#[derive(Debug, Clone, Copy)]
pub struct JoinedUpdate<'a> {
    /// The table, aliased `o`.
    pub table: &'a str,
    /// The key column the first value of each row is matched with.
    pub key: &'a str,
    /// The per-row columns, the key's value first.
    pub columns: &'a [ValueColumn],
    /// The `SET` list, SQL over `o`'s columns and `v.<column>`.
    pub assignments: &'a str,
    /// A further condition, SQL over `o` and `v`; empty for none.
    pub condition: &'a str,
}

impl JoinedUpdate<'_> {
    /// The statement for `rows` (each in `columns` order), its values bound one by one.
    pub fn statement(&self, backend: DbBackend, rows: &[Vec<Value>]) -> Statement {
        let (table, key, assignments) = (self.table, self.key, self.assignments);
        let width = self.columns.len();
        let condition = self.and_condition();
        let names = self.names();
        let placeholder =
            |n: usize| if backend == DbBackend::Postgres { format!("${n}") } else { "?".into() };
        let value = |row: usize, col: usize| {
            let p = placeholder(row * width + col + 1);
            match backend {
                DbBackend::Postgres => format!("{p}::{}", self.columns[col].pg_type),
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
        let first = self.columns.first().map_or("", |c| c.name);
        let sql = match backend {
            DbBackend::Postgres => format!(
                "UPDATE {table} AS o SET {assignments} FROM (VALUES {}) AS v({names}) \
                 WHERE o.{key} = v.{first}{condition} RETURNING o.{key}",
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
                    "UPDATE {table} AS o JOIN ({selects}) AS v ON o.{key} = v.{first} SET {assignments} WHERE TRUE{condition}"
                )
            }
            _ => format!(
                "WITH v({names}) AS (VALUES {}) UPDATE {table} AS o SET {assignments} FROM v \
                 WHERE o.{key} = v.{first}{condition} RETURNING {key}",
                tuples()
            ),
        };
        Statement::from_sql_and_values(backend, sql, rows.iter().flatten().cloned())
    }

    /// The statement for `rows` with one array parameter per column, joined with `unnest`, so that
    /// its text and its parameters are the same whatever the number of rows: on PostgreSQL, when
    /// every value is present and of a type bound as an array here (text, integer, bigint).
    /// `None` otherwise (use [`Self::statement`]): the arrays are bound as they are, and an array
    /// of one type has no NULLs.
    pub fn arrays(&self, backend: DbBackend, rows: &[Vec<Value>]) -> Option<Statement> {
        if backend != DbBackend::Postgres {
            return None;
        }
        let arrays = (0..self.columns.len())
            .map(|col| {
                let values: Vec<Value> =
                    rows.iter().map(|row| row.get(col).cloned()).collect::<Option<_>>()?;
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
        let (table, key, assignments) = (self.table, self.key, self.assignments);
        let condition = self.and_condition();
        let names = self.names();
        let first = self.columns.first().map_or("", |c| c.name);
        let parameters = self
            .columns
            .iter()
            .enumerate()
            .map(|(i, column)| format!("${}::{}[]", i + 1, column.pg_type))
            .collect::<Vec<_>>()
            .join(", ");
        let sql = format!(
            "UPDATE {table} AS o SET {assignments} FROM unnest({parameters}) AS v({names}) \
             WHERE o.{key} = v.{first}{condition} RETURNING o.{key}",
        );
        Some(Statement::from_sql_and_values(DbBackend::Postgres, sql, arrays))
    }

    fn and_condition(&self) -> String {
        if self.condition.is_empty() { String::new() } else { format!(" AND {}", self.condition) }
    }

    fn names(&self) -> String {
        self.columns.iter().map(|c| c.name).collect::<Vec<_>>().join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const COLUMNS: [ValueColumn; 3] = [
        ValueColumn { name: "v_id", pg_type: "char(36)" },
        ValueColumn { name: "v_token", pg_type: "text" },
        ValueColumn { name: "v_offset", pg_type: "bigint" },
    ];

    const UPDATE: JoinedUpdate<'static> = JoinedUpdate {
        table: "outbox_event",
        key: "event_id",
        columns: &COLUMNS,
        assignments: "published_offset = v.v_offset",
        condition: "o.lease_owner = v.v_token",
    };

    fn row(i: i64) -> Vec<Value> {
        vec![Value::from(format!("id-{i}")), Value::from("token"), Value::from(i)]
    }

    #[test]
    fn each_backend_joins_the_rows_values_in_its_own_form() {
        let rows = [row(1), row(2)];
        let sql = |backend| UPDATE.statement(backend, &rows).sql;
        assert_eq!(
            sql(DbBackend::Postgres),
            "UPDATE outbox_event AS o SET published_offset = v.v_offset FROM (VALUES ($1::char(36), $2::text, \
             $3::bigint), ($4::char(36), $5::text, $6::bigint)) AS v(v_id, v_token, v_offset) WHERE o.event_id = \
             v.v_id AND o.lease_owner = v.v_token RETURNING o.event_id"
        );
        assert_eq!(
            sql(DbBackend::MySql),
            "UPDATE outbox_event AS o JOIN (SELECT CONVERT(? USING ascii) COLLATE ascii_bin AS v_id, ? AS v_token, \
             ? AS v_offset UNION ALL SELECT CONVERT(? USING ascii) COLLATE ascii_bin, ?, ?) AS v ON o.event_id = \
             v.v_id SET published_offset = v.v_offset WHERE TRUE AND o.lease_owner = v.v_token"
        );
        assert_eq!(
            sql(DbBackend::Sqlite),
            "WITH v(v_id, v_token, v_offset) AS (VALUES (?, ?, ?), (?, ?, ?)) UPDATE outbox_event AS o SET \
             published_offset = v.v_offset FROM v WHERE o.event_id = v.v_id AND o.lease_owner = v.v_token \
             RETURNING event_id"
        );
        let values = UPDATE.statement(DbBackend::Sqlite, &rows).values.map(|v| v.0.len());
        assert_eq!(values, Some(6));
    }

    #[test]
    fn arrays_are_postgresql_s_and_only_for_values_present_and_of_one_type() {
        let rows: Vec<_> = (0..500).map(row).collect();
        let statement = UPDATE.arrays(DbBackend::Postgres, &rows);
        let (sql, parameters) = statement.map(|s| (s.sql, s.values.map(|v| v.0.len()))).unwrap_or_default();
        assert_eq!(parameters, Some(3));
        assert!(
            sql.contains(
                "FROM unnest($1::char(36)[], $2::text[], $3::bigint[]) AS v(v_id, v_token, v_offset)"
            ),
            "{sql}"
        );
        assert_eq!(UPDATE.arrays(DbBackend::MySql, &rows).map(|s| s.sql), None);
        assert_eq!(UPDATE.arrays(DbBackend::Sqlite, &rows).map(|s| s.sql), None);
        let with_null = [vec![Value::from("a"), Value::from("t"), Value::BigInt(None)]];
        assert!(UPDATE.arrays(DbBackend::Postgres, &with_null).is_none());
        let mixed = [row(1), vec![Value::from("b"), Value::from("t"), Value::from(1i32)]];
        assert!(UPDATE.arrays(DbBackend::Postgres, &mixed).is_none());
    }
}
