//! Where a database's order ids run: each shard of a shard map hands out order ids from its own
//! block (`idempost_shard_map::Shard::order_ids`), so no two shards make the same order id, and
//! so the same key on the topic. `idempost-migrate --shard-map-file` starts an empty shard's ids
//! at its block; the order service refuses a shard whose ids are outside it.
//!
//! The ids are the `orders.id` auto-increment key, whose counter each engine keeps in its own
//! place: the table's AUTO_INCREMENT (MariaDB/MySQL), the column's sequence (PostgreSQL),
//! `sqlite_sequence` (SQLite, as the column is declared AUTOINCREMENT).

use std::ops::Range;

use sea_orm_migration::sea_orm::{ConnectionTrait, DatabaseBackend, DbErr, Statement};

/// What a database's orders say about its ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OrderIds {
    /// The smallest and largest id of a stored order; `None` while there is none.
    pub stored: Option<(i64, i64)>,
    /// The id the next order will get.
    pub next: i64,
}

impl OrderIds {
    /// Reads them.
    pub async fn read(db: &impl ConnectionTrait) -> Result<Self, DbErr> {
        let stored = stored(db).await?;
        let counter = counter(db).await?;
        let after_stored = stored.map_or(1, |(_, max)| max + 1);
        Ok(Self { stored, next: counter.max(after_stored) })
    }

    /// Why these ids do not fit `block`, if they do not.
    pub fn outside(&self, block: &Range<i64>) -> Option<String> {
        if let Some((min, max)) =
            self.stored.filter(|(min, max)| !block.contains(min) || !block.contains(max))
        {
            return Some(format!(
                "its orders have ids {min} to {max}, outside its block {}..{}: the shard's number in the map \
                 is not the one its orders were made under",
                block.start, block.end
            ));
        }
        (!block.contains(&self.next)).then(|| {
            format!(
                "its next order id is {}, outside its block {}..{}: run `idempost-migrate --shard-map-file` \
                 (it starts an empty shard's ids at its block)",
                self.next, block.start, block.end
            )
        })
    }
}

/// Makes the next order id `start` when it is lower, which only an empty shard's is (a shard's
/// stored ids are checked to be in its block first). Never lowers it: an id handed out before,
/// even to an order since deleted, is never handed out again.
pub async fn start_at(db: &impl ConnectionTrait, start: i64) -> Result<(), DbErr> {
    if OrderIds::read(db).await?.next >= start {
        return Ok(());
    }
    let backend = db.get_database_backend();
    match backend {
        // DDL binds no values; `start` is an integer.
        DatabaseBackend::MySql => {
            db.execute_unprepared(&format!("ALTER TABLE orders AUTO_INCREMENT = {start}")).await
        }
        DatabaseBackend::Postgres => {
            let sql = "SELECT setval(pg_get_serial_sequence('orders', 'id'), $1, false)";
            db.execute_raw(Statement::from_sql_and_values(backend, sql, [start.into()])).await
        }
        _ => {
            let sql = "INSERT INTO sqlite_sequence (name, seq) SELECT 'orders', 0 \
                       WHERE NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'orders')";
            db.execute_unprepared(sql).await?;
            let sql = "UPDATE sqlite_sequence SET seq = ? WHERE name = 'orders'";
            db.execute_raw(Statement::from_sql_and_values(backend, sql, [(start - 1).into()])).await
        }
    }?;
    Ok(())
}

async fn stored(db: &impl ConnectionTrait) -> Result<Option<(i64, i64)>, DbErr> {
    let sql = "SELECT MIN(id) AS low, MAX(id) AS high FROM orders";
    let row = db.query_one_raw(Statement::from_string(db.get_database_backend(), sql)).await?;
    let Some(row) = row else { return Ok(None) };
    let low: Option<i64> = row.try_get("", "low")?;
    let high: Option<i64> = row.try_get("", "high")?;
    Ok(low.zip(high))
}

/// The engine's counter: the id it would hand out next if no order were stored.
async fn counter(db: &impl ConnectionTrait) -> Result<i64, DbErr> {
    let backend = db.get_database_backend();
    let sql = match backend {
        DatabaseBackend::MySql => {
            "SELECT CAST(COALESCE(AUTO_INCREMENT, 1) AS SIGNED) AS next FROM information_schema.TABLES \
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'orders'"
        }
        DatabaseBackend::Postgres => {
            "SELECT CASE WHEN is_called THEN last_value + 1 ELSE last_value END AS next \
             FROM orders_id_seq"
        }
        _ => "SELECT COALESCE(MAX(seq), 0) + 1 AS next FROM sqlite_sequence WHERE name = 'orders'",
    };
    let row = db.query_one_raw(Statement::from_string(backend, sql)).await?;
    let next: Option<i64> = row.map(|row| row.try_get("", "next")).transpose()?;
    Ok(next.unwrap_or(1))
}
