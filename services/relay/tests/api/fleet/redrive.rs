//! `idempost-relay redrive` over a shard map (`--shard-map-file`): the operator names the event,
//! the command finds the shard that holds it and redrives it there, audited there; an event no
//! shard holds, or more than one, is refused (exit status 1) with nothing changed. Real processes
//! over two PostgreSQL databases, as the fleet's shards.

use std::process::ExitStatus;

use sea_orm::{ConnectionTrait as _, DatabaseConnection};

use super::kit::Shards;
use crate::helpers::{OutboxProbe, TestService};
use idempost_testkit::sql;
use idempost_testkit::wait::WAIT;

/// Runs the operator's command over the map; its exit status and what it wrote.
async fn redrive(shards: &Shards, event_id: &str) -> (ExitStatus, String) {
    let args = [
        format!("--shard-map-file={}", shards.map().display()),
        "redrive".to_owned(),
        event_id.to_owned(),
        "--reason=broker fixed".to_owned(),
        "--requested-by=oncall".to_owned(),
    ];
    let log = shards.dir.path().join(format!("redrive-{}.log", uuid::Uuid::now_v7()));
    let mut command = TestService::spawn_logged("idempost-relay", &args, &[], log);
    let status = command.wait(WAIT).await;
    (status, command.log())
}

/// Moves `event_id` to FAILED after its last attempt, as the relay would.
async fn fail(conn: &DatabaseConnection, event_id: &str) {
    let update = "UPDATE outbox_event SET status = 'FAILED', attempts = 12 WHERE event_id = ?";
    let statement = sql::statement(conn.get_database_backend(), update, vec![event_id.into()]);
    assert_eq!(conn.execute_raw(statement).await.unwrap().rows_affected(), 1);
}

/// REDRIVE rows of the audit on `conn`.
async fn redrives_audited(conn: &DatabaseConnection) -> i64 {
    let audited = "SELECT COUNT(*) FROM admin_audit WHERE action = 'REDRIVE' AND actor = 'oncall' \
                   AND reason = 'broker fixed'";
    sql::count(conn, audited, vec![]).await
}

#[tokio::test]
async fn redrive_over_a_shard_map_redrives_on_the_one_shard_holding_the_event_and_refuses_none_or_two() {
    let shards = Shards::new(2, 2).await;
    let (s0, s1) = (&shards.conns[0], &shards.conns[1]);
    let on_s1 = shards.seed(1, 1).await.remove(0);
    let on_s0 = shards.seed(0, 1).await.remove(0);
    fail(s1, &on_s1).await;
    fail(s0, &on_s0).await;

    let (status, said) = redrive(&shards, &on_s1).await;
    assert!(status.success(), "{status}: {said}");
    assert!(said.contains(&format!("{on_s1}: FAILED -> PENDING (shard s1)")), "{said}");
    let redriven = OutboxProbe { conn: s1 }.state(&on_s1).await;
    assert_eq!((redriven.status.as_str(), redriven.attempts), ("PENDING", 0));
    assert_eq!(OutboxProbe { conn: s0 }.state(&on_s0).await.status, "FAILED", "s0's event is left alone");
    assert_eq!((redrives_audited(s1).await, redrives_audited(s0).await), (1, 0), "audited on s1 only");

    // No shard holds it: refused as without a map (exit status 1).
    let unknown = uuid::Uuid::now_v7().to_string();
    let (status, said) = redrive(&shards, &unknown).await;
    assert_eq!(status.code(), Some(1), "{said}");
    assert!(said.contains(&format!("no outbox event {unknown} on any shard of the map")), "{said}");

    // The same id on both shards (a database restored into another): redriven on neither.
    fail(s1, &on_s1).await;
    let copy = "INSERT INTO outbox_event (event_id, aggregate_type, aggregate_id, event_type, event_version, \
                payload, status, attempts, created_at) \
                SELECT ?, aggregate_type, aggregate_id, event_type, event_version, payload, status, attempts, \
                created_at FROM outbox_event WHERE event_id = ?";
    let statement =
        sql::statement(s0.get_database_backend(), copy, vec![on_s1.clone().into(), on_s0.clone().into()]);
    s0.execute_raw(statement).await.unwrap();
    let (status, said) = redrive(&shards, &on_s1).await;
    assert_eq!(status.code(), Some(1), "{said}");
    assert!(said.contains(&format!("{on_s1} is on shards s0, s1: nothing was redriven")), "{said}");
    for conn in [s0, s1] {
        assert_eq!(OutboxProbe { conn }.state(&on_s1).await.status, "FAILED");
    }
    assert_eq!((redrives_audited(s1).await, redrives_audited(s0).await), (1, 0), "no redrive audited");
}
