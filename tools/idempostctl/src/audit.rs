//! `idempostctl audit`: the audit of operators' writes, newest first, a page at a time, from
//! the order side (redrive, purge, replay) or the consumer (release-gap, its purge).

use idempost_proto::v1 as pb;
use serde_json::json;

use crate::render::{pretty, table, text, time};
use crate::shown::shown;

/// `audit`'s flags: which side, which rows, which page.
#[derive(Debug, clap::Args)]
pub(crate) struct AuditArgs {
    /// The consumer's audit (release-gap, its purge of consumed_event) instead of the order
    /// side's (redrive, purge, replay).
    #[arg(long)]
    consumer: bool,
    /// Only this action: REDRIVE, PURGE, REPLAY, RELEASE_GAP or PURGE_CONSUMED.
    #[arg(long, default_value = "")]
    action: String,
    /// Only rows about this order.
    #[arg(long = "order")]
    order_id: Option<i64>,
    /// Only rows about this event.
    #[arg(long, default_value = "")]
    event_id: String,
    /// At most this many rows (1 to 1000).
    #[arg(long, default_value_t = 20)]
    limit: u32,
    /// Rows older than this id: the value an earlier page printed.
    #[arg(long, conflicts_with = "page_token")]
    before_id: Option<i64>,
    /// Where the next page starts, as an earlier page printed it: the order service's listing
    /// over several shards goes on with this instead of `--before-id`.
    #[arg(long, conflicts_with = "consumer")]
    page_token: Option<String>,
}

impl AuditArgs {
    /// Whether the consumer's audit is asked for.
    pub(crate) fn consumer(&self) -> bool {
        self.consumer
    }

    /// The ListAudit request these flags ask for.
    pub(crate) fn request(&self) -> pb::ListAuditRequest {
        pb::ListAuditRequest {
            limit: self.limit,
            before_id: self.before_id.unwrap_or(0),
            action: self.action.clone(),
            order_id: self.order_id.unwrap_or(0),
            event_id: self.event_id.clone(),
            page_token: self.page_token.clone().unwrap_or_default(),
        }
    }
}

/// A page of the audit: a table (every text as the server sent it, escaped) or JSON.
pub(crate) fn render(reply: &pb::ListAuditResponse, as_json: bool) -> String {
    if as_json {
        let records: Vec<_> = reply
            .records
            .iter()
            .map(|r| {
                json!({
                    "id": r.id,
                    "recordedAt": time(r.recorded_at.as_ref()),
                    "actor": r.actor,
                    "action": r.action,
                    "eventId": r.event_id,
                    "orderId": r.order_id,
                    "consumerName": r.consumer_name,
                    "reason": r.reason,
                    "traceId": r.trace_id,
                    "outcome": r.outcome,
                })
            })
            .collect();
        return pretty(&json!({
            "records": records,
            "nextBeforeId": reply.next_before_id,
            "nextPageToken": reply.next_page_token,
        }));
    }
    let mut out = table(&["id", "when", "who", "what", "about", "reason", "outcome"]);
    for r in &reply.records {
        let about = [
            (!r.event_id.is_empty()).then(|| format!("event {}", r.event_id)),
            (r.order_id != 0).then(|| format!("order {}", r.order_id)),
            (!r.consumer_name.is_empty()).then(|| format!("consumer {}", shown(&r.consumer_name))),
        ];
        let about = about.into_iter().flatten().collect::<Vec<_>>().join(", ");
        out.add_row(vec![
            r.id.to_string(),
            text(time(r.recorded_at.as_ref())),
            shown(&r.actor),
            r.action.clone(),
            if about.is_empty() { "-".to_owned() } else { about },
            shown(&r.reason),
            shown(&r.outcome),
        ]);
    }
    if reply.next_before_id == 0 {
        return out.to_string();
    }
    // One database's token is its `before_id`; a listing over several shards has only the token.
    let before_id = reply.next_before_id.to_string();
    match reply.next_page_token.as_str() {
        "" => format!("{out}\nolder rows: --before-id {before_id}"),
        token if token == before_id => format!("{out}\nolder rows: --before-id {before_id}"),
        token => format!("{out}\nolder rows: --page-token {token}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_page_is_named_by_before_id_on_one_database_and_by_the_token_over_several_shards() {
        let page = |next_before_id: i64, token: &str| pb::ListAuditResponse {
            records: Vec::new(),
            next_before_id,
            next_page_token: token.to_owned(),
        };
        assert!(render(&page(41, "41"), false).ends_with("older rows: --before-id 41"));
        assert!(render(&page(41, ""), false).ends_with("older rows: --before-id 41"));
        assert!(render(&page(41, "0:41,1:7"), false).ends_with("older rows: --page-token 0:41,1:7"));
        assert!(!render(&page(0, ""), false).contains("older rows"));
    }
}
