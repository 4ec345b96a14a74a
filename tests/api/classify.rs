//! Duplicate classification against each real database: only the named key counts.

use idempost::db::{UniqueKey, violated_unique_key};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr};

use crate::helpers::{Backend, TestDb, on_every_backend};

on_every_backend!(
    each_named_unique_key_is_recognised_by_name,
    other_constraint_and_data_errors_are_not_taken_for_a_named_key,
    caller_data_that_mimics_a_key_name_does_not_fool_the_classifier,
);

const ORDER: &str = "INSERT INTO orders (id, tenant_id, request_id, acceptance_event_id, customer_id, currency, total, version, status, created_at) VALUES";

fn ts(backend: Backend) -> &'static str {
    match backend {
        Backend::MariaDb => "'2026-01-01 00:00:00.000001'",
        _ => "'2026-01-01 00:00:00.000001+00:00'",
    }
}

async fn exec(db: &DatabaseConnection, sql: &str) -> Result<(), DbErr> {
    db.execute_unprepared(sql).await.map(|_| ())
}

async fn each_named_unique_key_is_recognised_by_name(backend: Backend) {
    let db = TestDb::migrated(backend).await;
    let conn = db.connect().await;
    let t = ts(backend);
    let e1 = "00000000-0000-7000-8000-000000000001";
    let e2 = "00000000-0000-7000-8000-000000000002";
    exec(&conn, &format!("{ORDER} (1, 1, 'r1', '{e1}', 'c', 'EUR', 1, 1, 'ACCEPTED', {t})")).await.unwrap();

    let same_key = exec(&conn, &format!("{ORDER} (2, 1, 'r1', '{e2}', 'c', 'EUR', 1, 1, 'ACCEPTED', {t})"))
        .await
        .unwrap_err();
    assert_eq!(violated_unique_key(&same_key), Some(UniqueKey::OrdersTenantRequest), "{same_key}");

    let same_event = exec(&conn, &format!("{ORDER} (3, 1, 'r2', '{e1}', 'c', 'EUR', 1, 1, 'ACCEPTED', {t})"))
        .await
        .unwrap_err();
    assert_eq!(violated_unique_key(&same_event), Some(UniqueKey::OrdersAcceptanceEvent), "{same_event}");

    let consumed = format!(
        "INSERT INTO consumed_event (consumer_name, event_id, consumed_at) VALUES ('planner', '{e1}', {t})"
    );
    exec(&conn, &consumed).await.unwrap();
    let again = exec(&conn, &consumed).await.unwrap_err();
    assert_eq!(violated_unique_key(&again), Some(UniqueKey::ConsumedEventIdentity), "{again}");

    let bytes = if backend == Backend::Postgres { "'\\x00'" } else { "X'00'" };
    let dead_letter = format!(
        "INSERT INTO dead_letter (consumer_name, topic, partition_id, offset_id, payload, error, created_at) \
         VALUES ('planner', 't', 0, 7, {bytes}, 'undecodable', {t})"
    );
    exec(&conn, &dead_letter).await.unwrap();
    let redelivered = exec(&conn, &dead_letter).await.unwrap_err();
    assert_eq!(violated_unique_key(&redelivered), Some(UniqueKey::DeadLetterCoordinates), "{redelivered}");
}

async fn other_constraint_and_data_errors_are_not_taken_for_a_named_key(backend: Backend) {
    let db = TestDb::migrated(backend).await;
    let conn = db.connect().await;
    let t = ts(backend);
    let e1 = "00000000-0000-7000-8000-000000000001";
    exec(&conn, &format!("{ORDER} (1, 1, 'r1', '{e1}', 'c', 'EUR', 1, 1, 'ACCEPTED', {t})")).await.unwrap();

    // Another unique key: the primary key of orders.
    let primary = exec(
        &conn,
        &format!(
            "{ORDER} (1, 1, 'r9', '00000000-0000-7000-8000-000000000009', 'c', 'EUR', 1, 1, 'ACCEPTED', {t})"
        ),
    )
    .await
    .unwrap_err();
    assert_eq!(violated_unique_key(&primary), None, "{primary}");

    // A foreign key: a line for an order that does not exist.
    let orphan = exec(&conn, "INSERT INTO order_line (order_id, line_no, sku, quantity, unit_price_minor) VALUES (999, 1, 'A', 1, 1)")
        .await
        .unwrap_err();
    assert_eq!(violated_unique_key(&orphan), None, "{orphan}");

    // A NOT NULL violation.
    let null = exec(
        &conn,
        "INSERT INTO consumed_event (consumer_name, event_id, consumed_at) VALUES (NULL, 'x', NULL)",
    )
    .await
    .unwrap_err();
    assert_eq!(violated_unique_key(&null), None, "{null}");

    // Data too long (SQLite does not enforce VARCHAR lengths, so only the servers are asked).
    if backend != Backend::Sqlite {
        let long = format!(
            "INSERT INTO consumed_event (consumer_name, event_id, consumed_at) VALUES ('{}', '{e1}', {t})",
            "n".repeat(200)
        );
        let too_long = exec(&conn, &long).await.unwrap_err();
        assert_eq!(violated_unique_key(&too_long), None, "{too_long}");
    }

    // A lost connection is no violation either.
    conn.close().await.unwrap();
    let unreachable = idempost::db::connect(&db.url.replace("127.0.0.1:", "127.0.0.1:1"), 1).await;
    if let Err(lost) = unreachable {
        assert_eq!(violated_unique_key(&lost), None, "{lost}");
    }
}

async fn caller_data_that_mimics_a_key_name_does_not_fool_the_classifier(backend: Backend) {
    let db = TestDb::migrated(backend).await;
    let conn = db.connect().await;
    let t = ts(backend);
    // MySQL echoes the duplicate entry in its message; this entry ends like a key clause.
    let request_id = "x'' for key ''uq_consumed_event_identity";
    let e1 = "00000000-0000-7000-8000-000000000001";
    let e2 = "00000000-0000-7000-8000-000000000002";
    exec(&conn, &format!("{ORDER} (1, 1, '{request_id}', '{e1}', 'c', 'EUR', 1, 1, 'ACCEPTED', {t})"))
        .await
        .unwrap();

    let duplicate =
        exec(&conn, &format!("{ORDER} (2, 1, '{request_id}', '{e2}', 'c', 'EUR', 1, 1, 'ACCEPTED', {t})"))
            .await
            .unwrap_err();

    assert_eq!(violated_unique_key(&duplicate), Some(UniqueKey::OrdersTenantRequest), "{duplicate}");
}
