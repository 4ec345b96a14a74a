//! ListAudit over a shard map: without an order or an event it lists every shard's audit,
//! merged newest first, and its page token carries on exactly where the last page stopped.

use chrono::{DateTime, Duration, TimeZone as _, Utc};
use idempost::entity::admin_audit;
use idempost_proto::v1 as pb;
use sea_orm::{ActiveValue::NotSet, ActiveValue::Set, DatabaseConnection, EntityTrait as _};

use super::{TENANT_ON_B, write_map};
use crate::helpers::{Backend, TestDb, TestOrder, on_every_backend, violated_fields};
use idempost_testkit::db::migrate_shards;

on_every_backend!(the_audit_of_every_shard_is_listed_newest_first_and_its_pages_never_repeat_or_skip_a_row);

/// The minute (after a fixed start) each shard's rows were recorded at, in the order they are
/// written (so in their ids' order): a row on "b" at minute 9 is written after its row at 11,
/// as a slow transaction's row may be, and minute 12 is on both shards.
const ON_A: [i64; 7] = [0, 2, 4, 6, 8, 10, 12];
const ON_B: [i64; 5] = [1, 3, 11, 9, 12];

async fn the_audit_of_every_shard_is_listed_newest_first_and_its_pages_never_repeat_or_skip_a_row(
    backend: Backend,
) {
    let (a, b) = (TestDb::empty(backend).await, TestDb::empty(backend).await);
    let dir = tempfile::tempdir().unwrap();
    let map = write_map(dir.path(), &a.url, Some((&b.url, &[TENANT_ON_B])));
    migrate_shards(&map);
    let app = TestOrder::spawn_on(a, |s| s.shard_map_file = Some(map.clone())).await;
    let b_conn = b.connect().await;
    for minute in ON_A {
        record(&app.conn, &format!("a-{minute}"), minute, None).await;
    }
    for minute in ON_B {
        record(&b_conn, &format!("b-{minute}"), minute, Some(1 << 40)).await;
    }

    let mut listed = Vec::new();
    let mut token = String::new();
    for page in 0.. {
        let ask = pb::ListAuditRequest { limit: 5, page_token: token, ..Default::default() };
        let answer = app.admin.clone().list_audit(ask).await.unwrap().into_inner();
        listed.extend(answer.records.iter().map(|r| r.reason.clone()));
        if page == 0 {
            // Rows written after the first page are not in its later pages (as with one
            // database, whose `before_id` leaves them above).
            record(&app.conn, "a-later", 20, None).await;
            record(&b_conn, "b-later", 21, Some(1 << 40)).await;
        }
        assert_eq!(answer.next_page_token.is_empty(), answer.next_before_id == 0, "{answer:?}");
        if answer.next_page_token.is_empty() {
            assert_eq!(page, 2, "5 + 5 + 2 rows");
            break;
        }
        token = answer.next_page_token;
    }
    // Newest first; the tie at minute 12 goes to "a", the first shard of the map; "b"'s own
    // rows in their ids' order, so minute 9 (written later) before 11.
    let expected = ["a-12", "b-12", "a-10", "b-9", "b-11", "a-8", "a-6", "a-4", "b-3", "a-2", "b-1", "a-0"];
    assert_eq!(listed, expected);

    // Another page size, all at once: the same rows, the later ones first.
    let ask = pb::ListAuditRequest { limit: 100, ..Default::default() };
    let all = app.admin.clone().list_audit(ask).await.unwrap().into_inner();
    let reasons: Vec<_> = all.records.iter().map(|r| r.reason.as_str()).collect();
    assert_eq!(reasons[..2], ["b-later", "a-later"]);
    assert_eq!(reasons[2..], expected);
    assert!(all.next_page_token.is_empty() && all.next_before_id == 0);

    // An order's audit is its shard's: one database, whose `before_id` still pages it.
    let ask = pb::ListAuditRequest { order_id: 1 << 40, limit: 2, ..Default::default() };
    let first = app.admin.clone().list_audit(ask.clone()).await.unwrap().into_inner();
    let reasons: Vec<_> = first.records.iter().map(|r| r.reason.as_str()).collect();
    assert_eq!(reasons, ["b-later", "b-12"]);
    assert_eq!(first.next_page_token, first.next_before_id.to_string());
    let next = pb::ListAuditRequest { before_id: first.next_before_id, ..ask };
    let second = app.admin.clone().list_audit(next).await.unwrap().into_inner();
    assert_eq!(second.records.iter().map(|r| r.reason.as_str()).collect::<Vec<_>>(), ["b-9", "b-11"]);

    // An id of one database cannot continue the merged listing, nor can a made-up token.
    for (ask, field) in [
        (pb::ListAuditRequest { before_id: 3, ..Default::default() }, "before_id"),
        (pb::ListAuditRequest { page_token: "7".into(), ..Default::default() }, "page_token"),
        (pb::ListAuditRequest { page_token: "0:4".into(), before_id: 3, ..Default::default() }, "page_token"),
    ] {
        let refused = app.admin.clone().list_audit(ask).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::InvalidArgument);
        assert_eq!(violated_fields(&refused), [field]);
    }
    app.stop().await;
}

/// Adds an audit row to `db`, recorded `minute` minutes after a fixed start, its reason `name`.
async fn record(db: &DatabaseConnection, name: &str, minute: i64, order_id: Option<i64>) {
    let start: DateTime<Utc> = Utc.with_ymd_and_hms(2026, 12, 1, 10, 0, 0).unwrap();
    let row = admin_audit::ActiveModel {
        id: NotSet,
        recorded_at: Set(start + Duration::minutes(minute)),
        actor: Set("test".to_owned()),
        action: Set("PURGE".to_owned()),
        event_id: Set(None),
        order_id: Set(order_id),
        consumer_name: Set(None),
        reason: Set(name.to_owned()),
        trace_id: Set(None),
        outcome: Set(String::new()),
    };
    admin_audit::Entity::insert(row).exec(db).await.unwrap();
}
