//! Replies as tables for people or JSON for scripts. Field names in JSON follow the proto's
//! JSON mapping (lowerCamelCase), timestamps are RFC 3339, durations in seconds.

use base64::Engine as _;
use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};
use idempost_client::Confirmation;
use idempost_proto::v1 as pb;
use serde_json::{Value, json};

use crate::shown::shown;

pub(crate) fn time(t: Option<&prost_types::Timestamp>) -> Option<String> {
    t.and_then(|t| u32::try_from(t.nanos).ok().and_then(|n| chrono::DateTime::from_timestamp(t.seconds, n)))
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true))
}

fn seconds(d: Option<&prost_types::Duration>) -> Option<f64> {
    d.map(|d| d.seconds as f64 + f64::from(d.nanos) / 1e9)
}

pub(crate) fn text(value: Option<String>) -> String {
    value.unwrap_or_else(|| "-".to_owned())
}

fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_owned())
}

pub(crate) fn table(header: &[&str]) -> Table {
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED).set_header(header.to_vec());
    table
}

pub(crate) fn pretty(value: &Value) -> String {
    serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
}

fn outbox_json(o: &pb::OutboxRecord) -> Value {
    json!({
        "status": o.status,
        "attempts": o.attempts,
        "lastError": non_empty(&o.last_error),
        "leaseOwner": non_empty(&o.lease_owner),
        "leaseUntil": time(o.lease_until.as_ref()),
        "createdAt": time(o.created_at.as_ref()),
        "publishedAt": time(o.published_at.as_ref()),
        "publishedTo": o.published_to.as_ref().map(|c| json!({"topic": c.topic, "partition": c.partition, "offset": c.offset})),
        "redriveCount": o.redrive_count,
        "lastRedrivenAt": time(o.last_redriven_at.as_ref()),
        "lastRedrivenBy": non_empty(&o.last_redriven_by),
        "lastRedriveReason": non_empty(&o.last_redrive_reason),
    })
}

fn job_json(j: &pb::NotificationJobRecord) -> Value {
    json!({
        "consumerName": j.consumer_name,
        "orderId": j.order_id,
        "sourceVersion": j.source_version,
        "status": j.status,
        "createdAt": time(j.created_at.as_ref()),
    })
}

fn timeline_json(t: &pb::EventTimeline, consumer_states: &[String], older: i64) -> Value {
    json!({
        "eventId": t.event_id,
        "order": t.order.as_ref().map(|o| json!({
            "orderId": o.order_id,
            "tenantId": o.tenant_id,
            "requestId": o.request_id,
            "version": o.version,
            "status": o.status,
            "totalMinor": o.total_minor,
            "currency": o.currency,
            "createdAt": time(o.created_at.as_ref()),
        })),
        "outbox": t.outbox.as_ref().map(outbox_json),
        "consumers": t.consumers.iter().map(|c| json!({
            "consumerName": c.consumer_name,
            "consumedAt": time(c.consumed_at.as_ref()),
        })).collect::<Vec<_>>(),
        "notificationJob": t.notification_job.as_ref().map(job_json),
        "notificationJobs": t.notification_jobs.iter().map(job_json).collect::<Vec<_>>(),
        "deadLetters": t.dead_letters.iter().map(dead_letter_json).collect::<Vec<_>>(),
        "orderEvents": t.order_events.iter().enumerate().map(|(i, e)| json!({
            "eventId": e.event_id,
            "version": e.version,
            "eventType": e.event_type,
            "operation": e.operation,
            "requestId": e.request_id,
            "committedAt": time(e.committed_at.as_ref()),
            "outboxStatus": non_empty(&e.outbox_status),
            "consumerState": consumer_states.get(i),
        })).collect::<Vec<_>>(),
        "orderEventsTotal": t.order_events_total,
        "olderVersionsBefore": (older > 0).then_some(older),
    })
}

fn dead_letter_json(d: &pb::DeadLetterRecord) -> Value {
    json!({
        "consumerName": d.consumer_name,
        "eventId": non_empty(&d.event_id),
        "coordinates": d.coordinates.as_ref().map(|c| json!({"topic": c.topic, "partition": c.partition, "offset": c.offset})),
        "error": d.error,
        "createdAt": time(d.created_at.as_ref()),
        "payloadBase64": payload_json(&d.payload),
    })
}

/// A payload the listing was asked to include, as base64; absent when it was not.
fn payload_json(payload: &[u8]) -> Option<String> {
    (!payload.is_empty()).then(|| base64::engine::general_purpose::STANDARD.encode(payload))
}

/// Where the order's versions older than those `t` holds start (the `--before-version` that
/// shows them); 0 when it holds the oldest.
pub(crate) fn older_than_shown(t: &pb::EventTimeline) -> i64 {
    let shown = t.order_events.len() as u64;
    match t.order_events.first() {
        Some(first) if t.order_events_total > shown => first.version,
        _ => 0,
    }
}

/// One event's timeline: a table of what happened when, in time order, then a page of the
/// versions of its order with each event's outbox status and `consumer_states` (aligned with
/// `order_events`; empty when the consumer side could not be asked), and where older versions
/// start (`older`, 0 when none are older). `consumer_unavailable` says why the consumer side's
/// part is missing, when it could not be asked.
pub(crate) fn timeline(
    t: pb::EventTimeline,
    consumer_states: &[String],
    consumer_unavailable: Option<&str>,
    older: i64,
    as_json: bool,
) -> String {
    if as_json {
        let mut value = timeline_json(&t, consumer_states, older);
        value["consumerSideUnavailable"] = json!(consumer_unavailable);
        return pretty(&value);
    }
    let mut rows = order_rows(&t);
    rows.extend(outbox_rows(t.outbox.as_ref()));
    rows.extend(consumer_rows(&t));
    if let Some(why) = consumer_unavailable {
        rows.push((None, "consumer side".into(), format!("not shown: {why}")));
    }
    let mut out = table(&["when", "what", "details"]);
    for (when, what, details) in rows {
        out.add_row(vec![text(when), what, details]);
    }
    if t.order_events.is_empty() {
        return format!("event {}\n{out}", t.event_id);
    }
    let (shown, total) = (t.order_events.len() as u64, t.order_events_total);
    let mut heading = if shown >= total {
        "every version of the order:".to_owned()
    } else {
        format!("{shown} of the order's {total} versions:")
    };
    if older > 0 {
        heading.push_str(&format!(" (older ones: --before-version {older})"));
    }
    format!("event {}\n{out}\n{heading}\n{}", t.event_id, versions(&t, consumer_states))
}

/// One row of the timeline table: when (if known), what, details.
type TimelineRow = (Option<String>, String, String);

/// The order side's order row of the timeline, if the order is known.
fn order_rows(t: &pb::EventTimeline) -> Vec<TimelineRow> {
    let mut rows = Vec::new();
    if let Some(o) = &t.order {
        rows.push((
            time(o.created_at.as_ref()),
            "order".into(),
            format!(
                "order {} tenant {} request {} v{} {} total {} {}",
                o.order_id, o.tenant_id, o.request_id, o.version, o.status, o.total_minor, o.currency
            ),
        ));
    }
    rows
}

/// The outbox row's history: written, its state now (lease, last error, where it was
/// published) and its last redrive; one row saying so when the row is gone.
fn outbox_rows(outbox: Option<&pb::OutboxRecord>) -> Vec<TimelineRow> {
    let mut rows = Vec::new();
    if let Some(o) = outbox {
        rows.push((time(o.created_at.as_ref()), "outbox".into(), "written PENDING with the order".into()));
        let mut now = format!("{} after {} attempt(s)", o.status, o.attempts);
        if !o.lease_owner.is_empty() {
            now.push_str(&format!(
                ", leased by {} until {}",
                o.lease_owner,
                text(time(o.lease_until.as_ref()))
            ));
        }
        if !o.last_error.is_empty() {
            now.push_str(&format!(", last error: {}", shown(&o.last_error)));
        }
        if let Some(c) = &o.published_to {
            now.push_str(&format!(", at {}/{}/{}", c.topic, c.partition, c.offset));
        }
        rows.push((time(o.published_at.as_ref()), "outbox".into(), now));
        if o.redrive_count > 0 {
            rows.push((
                time(o.last_redriven_at.as_ref()),
                "redrive".into(),
                format!(
                    "#{} by {}: {}",
                    o.redrive_count,
                    shown(&o.last_redriven_by),
                    shown(&o.last_redrive_reason)
                ),
            ));
        }
    } else {
        rows.push((None, "outbox".into(), "no row (purged after publication, or never written)".into()));
    }
    rows
}

/// The consumer side's rows: who consumed the event, the effects it made and its dead letters.
fn consumer_rows(t: &pb::EventTimeline) -> Vec<TimelineRow> {
    let mut rows = Vec::new();
    for c in &t.consumers {
        rows.push((time(c.consumed_at.as_ref()), "consumed".into(), format!("by {}", c.consumer_name)));
    }
    for j in &t.notification_jobs {
        rows.push((
            time(j.created_at.as_ref()),
            "effect".into(),
            format!(
                "notification job {} for order {} v{} by {}",
                j.status, j.order_id, j.source_version, j.consumer_name
            ),
        ));
    }
    for d in &t.dead_letters {
        let at = d.coordinates.as_ref().map(|c| format!("{}/{}/{}", c.topic, c.partition, c.offset));
        rows.push((
            time(d.created_at.as_ref()),
            "dead letter".into(),
            format!("{} at {}: {}", d.consumer_name, text(at), shown(&d.error)),
        ));
    }
    rows
}

/// The table of a page of the event's order's versions: each event's outbox status and consumer
/// state.
fn versions(t: &pb::EventTimeline, consumer_states: &[String]) -> Table {
    let header = ["version", "committed", "operation", "request id", "event id", "outbox", "consumer"];
    let mut versions = table(&header);
    for (i, e) in t.order_events.iter().enumerate() {
        let marker = if e.event_id == t.event_id { " (this event)" } else { "" };
        versions.add_row(vec![
            format!("v{}", e.version),
            text(time(e.committed_at.as_ref())),
            e.operation.clone(),
            e.request_id.clone(),
            format!("{}{marker}", e.event_id),
            non_empty(&e.outbox_status).unwrap_or_else(|| "purged".to_owned()),
            consumer_states.get(i).cloned().unwrap_or_else(|| "-".to_owned()),
        ]);
    }
    versions
}

/// A committed change of an order.
pub(crate) fn changed(verb: &str, confirmed: &idempost_client::ConfirmedOrder, as_json: bool) -> String {
    let how = match confirmed.confirmation {
        Confirmation::Committed => "committed",
        Confirmation::Replayed => "replayed",
        Confirmation::Reconciled => "reconciled",
    };
    if as_json {
        return pretty(&json!({
            "orderId": confirmed.order_id,
            "version": confirmed.version,
            "eventId": confirmed.event_id,
            "confirmation": how,
            "calls": confirmed.calls,
        }));
    }
    format!(
        "order {} {verb}: now version {}, event {} ({how} after {} call(s))",
        confirmed.order_id, confirmed.version, confirmed.event_id, confirmed.calls
    )
}

/// Dead letters, oldest first, and the token of the next page when there is one.
pub(crate) fn dead_letters(reply: &pb::ListDeadLettersResponse, as_json: bool) -> String {
    let letters = &reply.dead_letters;
    if as_json {
        return pretty(&json!({
            "deadLetters": letters.iter().map(dead_letter_json).collect::<Vec<_>>(),
            "nextPageToken": non_empty(&reply.next_page_token),
        }));
    }
    let mut out = table(&["when", "consumer", "event id", "at", "error"]);
    for d in letters {
        let at = d.coordinates.as_ref().map(|c| format!("{}/{}/{}", c.topic, c.partition, c.offset));
        out.add_row(vec![
            text(time(d.created_at.as_ref())),
            d.consumer_name.clone(),
            text(non_empty(&d.event_id)),
            text(at),
            shown(&d.error),
        ]);
    }
    format!("{out}{}", more(&reply.next_page_token))
}

/// The line saying how to list the next page, when there is one.
fn more(next_page_token: &str) -> String {
    if next_page_token.is_empty() {
        return String::new();
    }
    format!("\nmore follow: --page-token {next_page_token}")
}

/// Parked events, by order and version, and the token of the next page when there is one.
pub(crate) fn parked(reply: &pb::ListParkedEventsResponse, as_json: bool) -> String {
    let events = &reply.parked_events;
    if as_json {
        let events: Vec<Value> = events
            .iter()
            .map(|p| {
                json!({
                    "consumerName": p.consumer_name,
                    "eventId": p.event_id,
                    "orderId": p.order_id,
                    "eventVersion": p.event_version,
                    "eventType": p.event_type,
                    "reason": p.reason,
                    "parkedAt": time(p.parked_at.as_ref()),
                    "readModelVersion": p.read_model_version,
                })
            })
            .collect();
        return pretty(
            &json!({ "parkedEvents": events, "nextPageToken": non_empty(&reply.next_page_token) }),
        );
    }
    let mut out = table(&["order", "version", "model at", "event type", "event id", "parked", "reason"]);
    for p in events {
        out.add_row(vec![
            p.order_id.to_string(),
            p.event_version.to_string(),
            p.read_model_version.to_string(),
            shown(&p.event_type),
            p.event_id.clone(),
            text(time(p.parked_at.as_ref())),
            shown(&p.reason),
        ]);
    }
    format!("{out}{}", more(&reply.next_page_token))
}

/// What releasing an order's gap did.
pub(crate) fn released(order_id: i64, r: &pb::ReleaseParkedGapResponse, as_json: bool) -> String {
    if as_json {
        return pretty(&json!({
            "orderId": order_id,
            "releasedFromVersion": r.released_from_version,
            "releasedToVersion": r.released_to_version,
            "appliedVersions": r.applied_versions,
            "readModelVersion": r.read_model_version,
            "stillParked": r.still_parked,
        }));
    }
    let given_up = if r.released_to_version < r.released_from_version {
        "none".to_owned()
    } else {
        format!("{}..={}", r.released_from_version, r.released_to_version)
    };
    format!(
        "order {order_id}: versions given up {given_up}; applied {:?}; read model at version {}; {} still parked",
        r.applied_versions, r.read_model_version, r.still_parked
    )
}

/// The backlog listing and its counts.
pub(crate) fn backlog(reply: pb::ListBacklogResponse, as_json: bool) -> String {
    let stats = reply.stats.unwrap_or_default();
    if as_json {
        return pretty(&json!({
            "entries": reply.entries.iter().map(|e| json!({
                "eventId": e.event_id,
                "aggregateId": e.aggregate_id,
                "outbox": e.outbox.as_ref().map(outbox_json),
                "payloadBase64": e.outbox.as_ref().and_then(|o| payload_json(&o.payload)),
            })).collect::<Vec<_>>(),
            "nextPageToken": non_empty(&reply.next_page_token),
            "stats": {
                "pending": stats.pending,
                "publishing": stats.publishing,
                "failed": stats.failed,
                "oldestPendingAgeSeconds": seconds(stats.oldest_pending_age.as_ref()),
            },
        }));
    }
    let mut out = table(&["event id", "order", "status", "attempts", "created", "lease owner / last error"]);
    for e in &reply.entries {
        let o = e.outbox.clone().unwrap_or_default();
        let note = [o.lease_owner.as_str(), o.last_error.as_str()]
            .into_iter()
            .filter(|s| !s.is_empty())
            .map(shown)
            .collect::<Vec<_>>()
            .join(" / ");
        out.add_row(vec![
            e.event_id.clone(),
            e.aggregate_id.clone(),
            o.status.clone(),
            o.attempts.to_string(),
            text(time(o.created_at.as_ref())),
            note,
        ]);
    }
    let oldest = seconds(stats.oldest_pending_age.as_ref()).map_or("-".to_owned(), |s| format!("{s:.1}s"));
    format!(
        "{out}\npending {}  publishing {}  failed {}  oldest waiting {oldest}{}",
        stats.pending,
        stats.publishing,
        stats.failed,
        more(&reply.next_page_token)
    )
}

/// A redrive's result.
pub(crate) fn redriven(event_id: &str, outbox: pb::OutboxRecord, as_json: bool) -> String {
    if as_json {
        return pretty(&json!({ "eventId": event_id, "outbox": outbox_json(&outbox) }));
    }
    format!(
        "{event_id}: FAILED -> {} (redrive #{} by {}: {})",
        outbox.status,
        outbox.redrive_count,
        shown(&outbox.last_redriven_by),
        shown(&outbox.last_redrive_reason)
    )
}

/// A purge's counts: the order side's, and the consumer side's when it answered.
pub(crate) fn purged(
    outbox: &pb::PurgeResponse,
    consumed: Option<&pb::PurgeConsumedResponse>,
    dry_run: bool,
    as_json: bool,
) -> String {
    if as_json {
        return pretty(&json!({
            "dryRun": dry_run,
            "outboxRows": outbox.outbox_rows,
            "outboxCutoff": time(outbox.outbox_cutoff.as_ref()),
            "consumedRows": consumed.map(|c| c.consumed_rows),
            "consumedCutoff": consumed.and_then(|c| time(c.consumed_cutoff.as_ref())),
            "redeliveryHorizonSeconds": consumed.and_then(|c| seconds(c.redelivery_horizon.as_ref())),
        }));
    }
    let verb = if dry_run { "would delete" } else { "deleted" };
    let mut out = table(&["table", verb, "older than (database clock)"]);
    out.add_row(vec![
        "outbox_event (PUBLISHED)".to_owned(),
        outbox.outbox_rows.to_string(),
        text(time(outbox.outbox_cutoff.as_ref())),
    ]);
    if let Some(consumed) = consumed {
        out.add_row(vec![
            "consumed_event".to_owned(),
            consumed.consumed_rows.to_string(),
            text(time(consumed.consumed_cutoff.as_ref())),
        ]);
    }
    out.to_string()
}
