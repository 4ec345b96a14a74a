//! The outbox as an operator sees it, read and seeded with plain SQL.

use sea_orm::{ConnectionTrait, DatabaseConnection, Statement};

/// One outbox row as the relay left it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxState {
    pub status: String,
    pub attempts: i32,
    pub lease_owner: Option<String>,
    pub last_error: Option<String>,
    pub published: bool,
    pub partition: Option<i32>,
    pub offset: Option<i64>,
}

/// Reads outbox rows and seeds backlogs with plain SQL, as an operator would see them.
#[derive(Debug)]
pub struct OutboxProbe<'a> {
    pub conn: &'a DatabaseConnection,
}

impl OutboxProbe<'_> {
    fn placeholder(&self, n: usize) -> String {
        crate::sql::placeholder(self.conn.get_database_backend(), n)
    }

    pub async fn state(&self, event_id: &str) -> OutboxState {
        let sql = format!(
            "SELECT status, attempts, lease_owner, last_error, published_at IS NOT NULL, published_partition, \
             published_offset FROM outbox_event WHERE event_id = {}",
            self.placeholder(1)
        );
        let backend = self.conn.get_database_backend();
        let row = self
            .conn
            .query_one_raw(Statement::from_sql_and_values(backend, sql, [event_id.into()]))
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("no outbox row {event_id}"));
        OutboxState {
            status: row.try_get_by_index(0).unwrap(),
            attempts: row.try_get_by_index(1).unwrap(),
            lease_owner: row.try_get_by_index(2).unwrap(),
            last_error: row.try_get_by_index(3).unwrap(),
            published: row.try_get_by_index::<bool>(4).unwrap(),
            partition: row.try_get_by_index(5).unwrap(),
            offset: row.try_get_by_index(6).unwrap(),
        }
    }

    /// How many rows have `status`.
    pub async fn count_with_status(&self, status: &str) -> i64 {
        crate::sql::count(
            self.conn,
            "SELECT COUNT(*) FROM outbox_event WHERE status = ?",
            vec![status.into()],
        )
        .await
    }

    /// Writes `count` PENDING events directly (the relay publishes payloads verbatim, so any
    /// bytes do) and returns their ids, oldest first.
    pub async fn seed(&self, count: usize) -> Vec<String> {
        let backend = self.conn.get_database_backend();
        let mut ids = Vec::with_capacity(count);
        let created = chrono::Utc::now();
        for chunk_start in (0..count).step_by(100) {
            let chunk = (chunk_start..count.min(chunk_start + 100)).collect::<Vec<_>>();
            let mut values = Vec::new();
            let mut rows = Vec::new();
            for i in chunk {
                let id = uuid::Uuid::now_v7().to_string();
                let n = values.len();
                rows.push(format!(
                    "({}, 'order', {}, 'idempost.v1.OrderAccepted', 1, {}, 'PENDING', 0, {})",
                    self.placeholder(n + 1),
                    self.placeholder(n + 2),
                    self.placeholder(n + 3),
                    self.placeholder(n + 4)
                ));
                values.push(id.clone().into());
                values.push(format!("{}", 100_000 + i).into());
                values.push(format!("payload-{i}").into_bytes().into());
                values.push((created + chrono::Duration::microseconds(i as i64)).into());
                ids.push(id);
            }
            let sql = format!(
                "INSERT INTO outbox_event (event_id, aggregate_type, aggregate_id, event_type, event_version, \
                 payload, status, attempts, created_at) VALUES {}",
                rows.join(", ")
            );
            self.conn.execute_raw(Statement::from_sql_and_values(backend, sql, values)).await.unwrap();
        }
        ids
    }
}
