//! The bounds of the admin service's answers: an order's versions come a page at a time (a
//! timeline carries the latest 100 and the total; ListOrderEvents pages back to version 1), and
//! the backlog stops at its byte budget with a token that reaches every row, payloads only when
//! asked for.

use idempost_proto::v1 as pb;
use prost::Message as _;
use sea_orm::{ConnectionTrait as _, Value};
use tonic::Code;

use crate::helpers::{Backend, TestOrder, on_every_backend, order, reason, service_binary, violated_fields};

on_every_backend!(
    an_order_amended_thousands_of_times_answers_its_versions_a_bounded_page_at_a_time,
    the_backlog_answers_within_its_byte_budget_and_its_token_reaches_every_row,
);

/// The amendments written straight into the order's tables: 3,000 AmendOrder calls would take
/// minutes here, and what is under test is reading them back.
const AMENDMENTS: i64 = 3_000;

/// Writes versions `versions` of `order_id` as AmendOrder would (an `order_version` row and an
/// outbox row, PUBLISHED so that nothing publishes them), 500 a statement; answers their event
/// ids in version order.
async fn seed_versions(
    app: &TestOrder,
    order_id: i64,
    versions: std::ops::RangeInclusive<i64>,
) -> Vec<String> {
    let backend = app.conn.get_database_backend();
    let now = chrono::Utc::now();
    let mut ids = Vec::new();
    let all: Vec<i64> = versions.collect();
    for chunk in all.chunks(500) {
        let (mut versions, mut outbox) = (Vec::<Value>::new(), Vec::<Value>::new());
        for &version in chunk {
            let event_id = uuid::Uuid::now_v7().to_string();
            versions.extend([
                order_id.into(),
                version.into(),
                21i64.into(),
                format!("many-{version}").into(),
                event_id.clone().into(),
                "AMEND".into(),
                1000i64.into(),
                now.into(),
            ]);
            outbox.extend([
                event_id.clone().into(),
                order_id.to_string().into(),
                version.into(),
                vec![version as u8].into(),
                now.into(),
            ]);
            ids.push(event_id);
        }
        let rows = |row: &str| vec![row; chunk.len()].join(", ");
        let sql = format!(
            "INSERT INTO order_version (order_id, version, tenant_id, request_id, event_id, operation, total, \
             committed_at) VALUES {}",
            rows("(?, ?, ?, ?, ?, ?, ?, ?)")
        );
        app.conn.execute_raw(idempost_testkit::sql::statement(backend, &sql, versions)).await.unwrap();
        let sql = format!(
            "INSERT INTO outbox_event (event_id, aggregate_type, aggregate_id, event_type, event_version, payload, \
             status, attempts, created_at) VALUES {}",
            rows("(?, 'order', ?, 'idempost.v1.OrderAmended', ?, ?, 'PUBLISHED', 0, ?)")
        );
        app.conn.execute_raw(idempost_testkit::sql::statement(backend, &sql, outbox)).await.unwrap();
    }
    ids
}

/// `idempostctl --json` against `app`'s admin listener (and no consumer): its answer, parsed.
async fn ctl_json(app: &TestOrder, args: &[&str]) -> serde_json::Value {
    let urls = [
        format!("--admin-url=http://127.0.0.1:{}", app.admin_port),
        "--consumer-admin-url=http://127.0.0.1:1".into(),
    ];
    let output = tokio::process::Command::new(service_binary("idempostctl"))
        .args(urls)
        .arg("--json")
        .args(args)
        .output()
        .await
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).unwrap()
}

async fn order_events(
    app: &TestOrder,
    request: pb::ListOrderEventsRequest,
) -> Result<pb::ListOrderEventsResponse, tonic::Status> {
    app.admin.clone().list_order_events(request).await.map(tonic::Response::into_inner)
}

async fn an_order_amended_thousands_of_times_answers_its_versions_a_bounded_page_at_a_time(backend: Backend) {
    let app = TestOrder::spawn(backend).await;
    let accepted = app.submit(order(21, "many-versions")).await.unwrap();
    let amended = seed_versions(&app, accepted.order_id, 2..=AMENDMENTS + 1).await;
    let total = (AMENDMENTS + 1) as u64;

    // The timeline carries the latest 100 versions and says how many there are.
    let request = pb::GetEventTimelineRequest { event_id: accepted.event_id.clone() };
    let timeline =
        app.admin.clone().get_event_timeline(request).await.unwrap().into_inner().timeline.unwrap();
    assert_eq!(timeline.order_events_total, total);
    let versions: Vec<i64> = timeline.order_events.iter().map(|e| e.version).collect();
    assert_eq!(versions, (AMENDMENTS + 1 - 99..=AMENDMENTS + 1).collect::<Vec<_>>());
    assert_eq!(timeline.order_events.last().unwrap().event_id, *amended.last().unwrap());
    assert_eq!(timeline.order_events[0].outbox_status, "PUBLISHED");
    assert!(timeline.encoded_len() < 64 * 1024, "{} bytes", timeline.encoded_len());

    // Paging backwards, 1000 at a time, reaches version 1: every version once, in order.
    let (mut seen, mut before, mut pages) = (Vec::new(), 0, 0);
    loop {
        let ask =
            pb::ListOrderEventsRequest { order_id: accepted.order_id, before_version: before, limit: 1000 };
        let page = order_events(&app, ask).await.unwrap();
        assert_eq!(page.total, total);
        assert!(page.order_events.len() <= 1000);
        let mut versions: Vec<i64> = page.order_events.iter().map(|e| e.version).collect();
        assert!(versions.is_sorted(), "a page is oldest first");
        pages += 1;
        versions.extend(seen);
        seen = versions;
        before = page.next_before_version;
        if before == 0 {
            assert_eq!(page.order_events[0].event_id, accepted.event_id);
            assert_eq!(page.order_events[0].operation, "SUBMIT");
            break;
        }
        assert_eq!(before, page.order_events[0].version);
    }
    assert_eq!(pages, 4);
    assert_eq!(seen, (1..=AMENDMENTS + 1).collect::<Vec<_>>());

    // 0 means 100; an unknown order and invalid fields get their own answers.
    let ask = pb::ListOrderEventsRequest { order_id: accepted.order_id, before_version: 101, limit: 0 };
    let page = order_events(&app, ask).await.unwrap();
    assert_eq!((page.order_events.len(), page.next_before_version), (100, 0));
    let ask = pb::ListOrderEventsRequest { order_id: accepted.order_id + 1_000, ..Default::default() };
    let unknown = order_events(&app, ask).await.unwrap_err();
    assert_eq!((unknown.code(), reason(&unknown).as_str()), (Code::NotFound, "ORDER_NOT_FOUND"));
    let ask = pb::ListOrderEventsRequest { order_id: 0, before_version: -1, limit: 1001 };
    let invalid = order_events(&app, ask).await.unwrap_err();
    assert_eq!(violated_fields(&invalid), ["order_id", "before_version", "limit"]);

    // idempostctl says where the older versions start, and shows them.
    let latest = ctl_json(&app, &["timeline", &accepted.event_id]).await;
    assert_eq!(
        (latest["orderEventsTotal"].as_u64(), latest["olderVersionsBefore"].as_i64()),
        (Some(total), Some(2902))
    );
    let older = ctl_json(&app, &["timeline", &accepted.event_id, "--before-version=51", "--limit=50"]).await;
    let versions: Vec<_> =
        older["orderEvents"].as_array().unwrap().iter().map(|e| e["version"].as_i64()).collect();
    assert_eq!(versions, (1..=50).map(Some).collect::<Vec<_>>());
    assert!(older["olderVersionsBefore"].is_null(), "version 1 is the oldest");
    app.stop().await;
}

/// A FAILED row with a payload of `bytes` bytes, created `i` microseconds after `at`.
async fn seed_failed(app: &TestOrder, i: i64, bytes: usize, at: chrono::DateTime<chrono::Utc>) -> String {
    let event_id = uuid::Uuid::now_v7().to_string();
    let sql = "INSERT INTO outbox_event (event_id, aggregate_type, aggregate_id, event_type, event_version, payload, \
               status, attempts, created_at) VALUES (?, 'order', ?, 'idempost.v1.OrderAccepted', 1, ?, 'FAILED', 10, ?)";
    let values = vec![
        event_id.clone().into(),
        (500_000 + i).to_string().into(),
        vec![i as u8; bytes].into(),
        (at + chrono::Duration::microseconds(i)).into(),
    ];
    let backend = app.conn.get_database_backend();
    app.conn.execute_raw(idempost_testkit::sql::statement(backend, sql, values)).await.unwrap();
    event_id
}

async fn backlog(app: &TestOrder, request: pb::ListBacklogRequest) -> pb::ListBacklogResponse {
    app.admin.clone().list_backlog(request).await.unwrap().into_inner()
}

async fn the_backlog_answers_within_its_byte_budget_and_its_token_reaches_every_row(backend: Backend) {
    let app = TestOrder::spawn(backend).await;
    let at = chrono::Utc::now() - chrono::Duration::hours(1);
    // 2.4 MB of payloads: twelve of 200 KiB (forty of 60 KiB on MariaDB, whose BLOB column holds
    // 64 KiB).
    let bytes = if backend == Backend::MariaDb { 60 * 1024 } else { 200 * 1024 };
    let count = i64::try_from(12 * 200 * 1024 / bytes).unwrap();
    let mut rows = Vec::new();
    for i in 0..count {
        rows.push(seed_failed(&app, i, bytes, at).await);
    }
    // Two rows created in the same microsecond: the token still tells them apart.
    let same = seed_failed(&app, count - 1, 10, at).await;
    rows.push(same);
    let last = rows.len() - 2;
    rows[last..].sort();
    let failed = |page_token: String, include_payloads| pb::ListBacklogRequest {
        status: "FAILED".into(),
        limit: 1000,
        include_payloads,
        page_token,
        ..Default::default()
    };

    // Without asking, no payloads: every row in one small answer.
    let all = backlog(&app, failed(String::new(), false)).await;
    assert_eq!(all.entries.iter().map(|e| e.event_id.clone()).collect::<Vec<_>>(), rows);
    assert!(all.entries.iter().all(|e| e.outbox.as_ref().unwrap().payload.is_empty()));
    assert!(all.next_page_token.is_empty());
    assert!(all.encoded_len() < 64 * 1024, "{} bytes", all.encoded_len());

    // With payloads, each answer stays within 1 MiB and the tokens reach every row once.
    let (mut seen, mut token, mut pages) = (Vec::new(), String::new(), 0);
    loop {
        let page = backlog(&app, failed(token, true)).await;
        pages += 1;
        assert!(page.encoded_len() <= 1024 * 1024 + 1024, "page {pages}: {} bytes", page.encoded_len());
        for e in &page.entries {
            let outbox = e.outbox.as_ref().unwrap();
            assert!(outbox.payload.len() == bytes || outbox.payload.len() == 10, "payloads are whole");
            seen.push(e.event_id.clone());
        }
        token = page.next_page_token;
        if token.is_empty() {
            break;
        }
    }
    assert_eq!(seen, rows);
    assert!(pages >= 3, "2.4 MB take at least three pages of 1 MiB: {pages}");

    // The limit ends a page too, with a token to go on.
    let first = backlog(&app, pb::ListBacklogRequest { limit: 5, ..failed(String::new(), false) }).await;
    assert_eq!(first.entries.len(), 5);
    let rest = backlog(&app, failed(first.next_page_token.clone(), false)).await;
    assert_eq!(rest.entries.len(), rows.len() - 5);
    assert!(rest.next_page_token.is_empty());

    // idempostctl pages the same way, with payloads when asked for.
    let listed = ctl_json(&app, &["backlog", "--status=FAILED", "--limit=1000", "--payloads"]).await;
    let entries = listed["entries"].as_array().unwrap();
    assert!(entries.len() < rows.len() && entries.iter().all(|e| e["payloadBase64"].is_string()));
    let token = listed["nextPageToken"].as_str().unwrap();
    let next = ctl_json(&app, &["backlog", "--status=FAILED", "--limit=1000", "--page-token", token]).await;
    assert_eq!(next["entries"][0]["eventId"].as_str(), Some(rows[entries.len()].as_str()));
    assert!(next["entries"][0]["payloadBase64"].is_null(), "no payloads unless asked for");

    let bad = app.admin.clone().list_backlog(failed("not-a-token".into(), false)).await.unwrap_err();
    assert_eq!((bad.code(), violated_fields(&bad)), (Code::InvalidArgument, vec!["page_token".to_owned()]));
    app.stop().await;
}
