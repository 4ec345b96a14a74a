//! What the claimable gauges count (`idempost::backlog::claimable`, behind
//! `idempost_outbox_claimable` and `idempost_outbox_oldest_claimable_age_seconds`): exactly what a
//! relay's claim could take now, so that the alert on the oldest claimable event never pages for
//! events waiting out a backoff or held behind an earlier version of their order.

use chrono::{DateTime, Duration, Utc};
use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait as _, DatabaseConnection, EntityTrait as _, QueryFilter as _};

use crate::helpers::{Backend, OutboxProbe, TestDb, on_every_backend};
use idempost::backlog::{Claimable, claimable};
use idempost::entity::outbox_event::{Column, Entity};

/// Sets one seeded event's status, lease or retry time, and whether it was written held back.
async fn set(
    db: &DatabaseConnection,
    event_id: &str,
    status: &str,
    lease_until: Option<DateTime<Utc>>,
    held_back: bool,
) {
    Entity::update_many()
        .col_expr(Column::Status, Expr::value(status))
        .col_expr(Column::LeaseUntil, Expr::value(lease_until))
        .col_expr(Column::HeldBack, Expr::value(held_back))
        .filter(Column::EventId.eq(event_id))
        .exec(db)
        .await
        .unwrap();
}

async fn created_at(db: &DatabaseConnection, event_id: &str) -> DateTime<Utc> {
    Entity::find_by_id(event_id.to_owned()).one(db).await.unwrap().unwrap().created_at
}

async fn only_due_events_and_expired_leases_first_in_their_order_are_claimable(backend: Backend) {
    let test_db = TestDb::migrated(backend).await;
    let db = test_db.connect().await;
    assert_eq!(claimable(&db).await.unwrap(), Claimable::default(), "an empty outbox");
    // Oldest first: each event is one order's version 1 until changed below.
    let ids = OutboxProbe { conn: &db }.seed(7).await;
    let (past, future) = (Utc::now() - Duration::hours(1), Utc::now() + Duration::hours(1));
    set(&db, &ids[0], "PUBLISHED", None, false).await;
    set(&db, &ids[1], "PENDING", Some(future), false).await; // waiting out its retry backoff
    set(&db, &ids[2], "PUBLISHING", Some(future), false).await; // leased by a live relay
    set(&db, &ids[3], "PUBLISHING", Some(past), false).await; // its relay's lease ran out: claimable
    set(&db, &ids[4], "PENDING", Some(past), false).await; // its retry time has come: claimable
    set(&db, &ids[5], "PENDING", None, true).await; // written held back
    // Version 2 of the order whose version 1 waits out its backoff: held behind it.
    let order_of_the_backoff =
        Entity::find_by_id(ids[1].clone()).one(&db).await.unwrap().unwrap().aggregate_id;
    Entity::update_many()
        .col_expr(Column::AggregateId, Expr::value(order_of_the_backoff))
        .col_expr(Column::EventVersion, Expr::value(2))
        .filter(Column::EventId.eq(ids[6].as_str()))
        .exec(&db)
        .await
        .unwrap();

    let found = claimable(&db).await.unwrap();
    assert_eq!(found.count, 2, "the expired lease and the due retry, nothing else: {found:?}");
    assert_eq!(
        found.oldest,
        Some(created_at(&db, &ids[3]).await),
        "the expired lease is the older of the two"
    );

    // Version 1 published: version 2 is its order's next and claimable too.
    set(&db, &ids[1], "PUBLISHED", None, false).await;
    assert_eq!(claimable(&db).await.unwrap().count, 3);
    // A FAILED event needs an operator, not a relay.
    set(&db, &ids[3], "FAILED", None, false).await;
    let found = claimable(&db).await.unwrap();
    assert_eq!((found.count, found.oldest), (2, Some(created_at(&db, &ids[4]).await)));
}

on_every_backend!(only_due_events_and_expired_leases_first_in_their_order_are_claimable);
