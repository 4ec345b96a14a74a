//! `idempostctl replay`: publish PUBLISHED events again (AdminService.Replay), by order, by
//! creation time and by event type, with a dry run that counts and lists first.

use std::time::{Duration, SystemTime};

use idempost_proto::v1 as pb;
use serde_json::json;

use crate::render;

/// `replay`'s flags: the filter, the dry run, and why.
#[derive(Debug, clap::Args)]
pub(crate) struct ReplayArgs {
    /// Only this order's events.
    #[arg(long = "order")]
    order_id: Option<i64>,
    /// Only events created at or after this: an RFC 3339 time ("2026-12-06T09:00:00Z") or an
    /// age ("2h" is two hours ago). Required without --order.
    #[arg(long, value_parser = instant, required_unless_present = "order_id")]
    from: Option<SystemTime>,
    /// Only events created before this: an RFC 3339 time or an age, as --from.
    #[arg(long, value_parser = instant)]
    to: Option<SystemTime>,
    /// Only events of this type: idempost.v1.OrderAccepted, idempost.v1.OrderAmended or
    /// idempost.v1.OrderCancelled.
    #[arg(long, default_value = "")]
    event_type: String,
    /// Count and list what would be replayed; change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Why the events must be seen again: recorded in the audit row (required for a dry run too).
    #[arg(long)]
    reason: String,
    /// Who asks. With a token the server records the token's subject and keeps this only as a
    /// note in the reason.
    #[arg(long, env = "USER", default_value = "operator")]
    by: String,
    /// The shard to replay on (its name in the order service's shard map); unset: the shard of
    /// --order, else the default shard.
    #[arg(long, default_value = "")]
    shard: String,
    /// List at most this many of the events (1 to 1000).
    #[arg(long, default_value_t = 20)]
    limit: u32,
}

/// An RFC 3339 time, or an age such as "90m" (that long before now).
fn instant(text: &str) -> Result<SystemTime, String> {
    if let Ok(at) = humantime::parse_rfc3339_weak(text) {
        return Ok(at);
    }
    let age: Duration = humantime::parse_duration(text)
        .map_err(|_| format!("{text:?} is neither an RFC 3339 time nor an age such as 2h"))?;
    SystemTime::now().checked_sub(age).ok_or_else(|| format!("{text:?} is too long ago"))
}

impl ReplayArgs {
    /// The Replay request these flags ask for.
    pub(crate) fn request(&self) -> pb::ReplayRequest {
        pb::ReplayRequest {
            order_id: self.order_id.unwrap_or(0),
            created_from: self.from.map(Into::into),
            created_to: self.to.map(Into::into),
            event_type: self.event_type.clone(),
            dry_run: self.dry_run,
            reason: self.reason.clone(),
            requested_by: self.by.clone(),
            list_limit: self.limit,
            shard: self.shard.clone(),
        }
    }
}

/// The answer: the counts, then the events listed, oldest first.
pub(crate) fn render(reply: &pb::ReplayResponse, as_json: bool) -> String {
    if as_json {
        let events: Vec<_> = reply
            .events
            .iter()
            .map(|e| {
                json!({
                    "eventId": e.event_id,
                    "orderId": e.order_id,
                    "version": e.version,
                    "eventType": e.event_type,
                    "createdAt": render::time(e.created_at.as_ref()),
                })
            })
            .collect();
        return render::pretty(&json!({
            "dryRun": reply.dry_run,
            "replayed": reply.replayed,
            "notPublished": reply.not_published,
            "purged": reply.purged,
            "auditId": (reply.audit_id != 0).then_some(reply.audit_id),
            "replayedAt": render::time(reply.replayed_at.as_ref()),
            "events": events,
        }));
    }
    let verb = if reply.dry_run { "would replay (dry run: nothing changed)" } else { "replayed" };
    let mut out = format!(
        "{verb}: {}\nnot published yet (left alone): {}\npurged by retention (cannot be replayed): {}\n",
        reply.replayed, reply.not_published, reply.purged
    );
    if reply.audit_id != 0 {
        out.push_str(&format!("audit row: admin_audit.id = {}\n", reply.audit_id));
    }
    let mut table = render::table(&["event id", "order", "version", "type", "created at"]);
    for e in &reply.events {
        table.add_row(vec![
            e.event_id.clone(),
            e.order_id.to_string(),
            e.version.to_string(),
            e.event_type.clone(),
            render::text(render::time(e.created_at.as_ref())),
        ]);
    }
    if reply.events.len() as u64 != reply.replayed {
        out.push_str(&format!("the first {} of them:\n", reply.events.len()));
    }
    out.push_str(&table.to_string());
    out
}
