//! SQL written once with `?` placeholders, run on any backend: PostgreSQL numbers its
//! placeholders (`$1`, `$2`, …), MariaDB and SQLite take `?` as written.

use sea_orm::{ConnectionTrait, DbBackend, Statement, Value};

/// `sql` with its `?` placeholders in `backend`'s dialect. A `?` inside a string literal would be
/// renumbered too: keep literals out of the SQL and bind them.
pub fn positional(backend: DbBackend, sql: &str) -> String {
    if backend != DbBackend::Postgres {
        return sql.to_owned();
    }
    let mut numbered = String::with_capacity(sql.len() + 16);
    let mut n = 0;
    for c in sql.chars() {
        if c == '?' {
            n += 1;
            numbered.push('$');
            numbered.push_str(&n.to_string());
        } else {
            numbered.push(c);
        }
    }
    numbered
}

/// The `n`th placeholder (from 1) in `backend`'s dialect, for SQL built piece by piece.
pub fn placeholder(backend: DbBackend, n: usize) -> String {
    if backend == DbBackend::Postgres { format!("${n}") } else { "?".to_owned() }
}

/// `sql` (with `?` placeholders) bound to `values`, in `backend`'s dialect.
pub fn statement(backend: DbBackend, sql: &str, values: Vec<Value>) -> Statement {
    Statement::from_sql_and_values(backend, positional(backend, sql), values)
}

/// The one number `sql` (with `?` placeholders, such as a `SELECT COUNT(*)`) answers on `conn`.
pub async fn count(conn: &impl ConnectionTrait, sql: &str, values: Vec<Value>) -> i64 {
    let row = conn.query_one_raw(statement(conn.get_database_backend(), sql, values)).await.unwrap();
    row.unwrap_or_else(|| panic!("no row for {sql}")).try_get_by_index::<i64>(0).unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postgres_placeholders_are_numbered_in_order_and_others_stay_as_written() {
        let sql = "UPDATE t SET a = ? WHERE b = ? AND c = ?";
        assert_eq!(positional(DbBackend::Postgres, sql), "UPDATE t SET a = $1 WHERE b = $2 AND c = $3");
        assert_eq!(positional(DbBackend::MySql, sql), sql);
        assert_eq!(positional(DbBackend::Sqlite, sql), sql);
    }
}
