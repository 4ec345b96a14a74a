//! Events set aside, written straight into the tables as the services would have left them: an
//! outbox row given up (FAILED) and a consumer's dead letter. For tests of what reports them
//! (the await hooks, listings), without driving a relay or a consumer into the fault.

use chrono::Utc;
use sea_orm::{ConnectionTrait as _, DatabaseConnection, Value};

/// Runs `sql`, written with `?` placeholders, on the database `conn` is connected to.
async fn exec(conn: &DatabaseConnection, sql: &str, values: Vec<Value>) {
    let statement = crate::sql::statement(conn.get_database_backend(), sql, values);
    conn.execute_raw(statement).await.unwrap();
}

/// Marks `event_id`'s outbox row FAILED, as a relay does once its attempts are spent.
pub async fn fail_event(conn: &DatabaseConnection, event_id: &str) {
    exec(
        conn,
        "UPDATE outbox_event SET status = 'FAILED' WHERE event_id = ?",
        vec![event_id.to_owned().into()],
    )
    .await;
}

/// A dead letter of `consumer_name` for a new event id read from `topic` (undecodable bytes,
/// error `cannot decode`); returns that event id.
pub async fn dead_letter(conn: &DatabaseConnection, consumer_name: &str, topic: &str) -> String {
    let event_id = uuid::Uuid::now_v7().to_string();
    exec(
        conn,
        "INSERT INTO dead_letter (consumer_name, topic, partition_id, offset_id, payload, event_id, error, created_at) \
         VALUES (?, ?, 0, 7, ?, ?, 'cannot decode', ?)",
        vec![
            consumer_name.into(),
            topic.into(),
            b"junk".to_vec().into(),
            event_id.clone().into(),
            Utc::now().into(),
        ],
    )
    .await;
    event_id
}
