//! The gRPC edge of the admin API: requests to queries on the way in, rows to messages and
//! failures to statuses on the way out.

use std::time::Duration;

use idempost_proto::v1::{
    self as pb,
    admin_service_server::{AdminService, AdminServiceServer},
};
use tonic::{Code, Request, Response, Status};

use super::audit::audit_of;
use super::audit_pages;
use super::inspect::{Inspector, OrderEvent, OrderEvents, Timeline};
use super::listing::{self, Cursor, Page};
use super::replay;
use super::retention::{OutboxPurgeReport, OutboxRetention};
use crate::shards::Shards;
use idempost::backlog::{self, Redrive, RedriveAudit};
use idempost::contract::{EVENT_TYPE, ORDER_AMENDED_EVENT_TYPE, ORDER_CANCELLED_EVENT_TYPE};
use idempost::domain::{FieldViolation, InvalidInput, Operation, OutboxStatus, RequestId, TenantId};
use idempost::edge::{self, ByteBudget, CallError, LongPoll, error_status, parse_event_id, timestamp};
use idempost::security::{Authenticator, Caller};
use idempost::telemetry::logged;

const SERVICE: &str = "idempost.v1.AdminService";

/// The largest admin request decoded: the biggest is a Replay's filter and reason, far below it.
/// tonic's default (4 MiB) would let one call make the service reserve that much.
const MAX_REQUEST_BYTES: usize = 64 * 1024;

/// The `AdminService` implementation.
#[derive(Debug, Clone)]
pub(crate) struct AdminGrpc {
    /// Where an order or event is looked up: see [`AdminGrpc::event_shard`] and its neighbours.
    shards: Shards,
    retention: OutboxRetention,
    auth: Authenticator,
    /// The bounds of AwaitPublished's waits on this listener.
    waits: LongPoll,
}

impl AdminGrpc {
    pub(crate) fn server(
        shards: Shards,
        retention: OutboxRetention,
        auth: Authenticator,
        waits: LongPoll,
    ) -> AdminServiceServer<Self> {
        AdminServiceServer::new(Self { shards, retention, auth, waits })
            .max_decoding_message_size(MAX_REQUEST_BYTES)
    }

    /// The methods only operators may call: refused at the listener, before their bodies are
    /// read, as well as in the call (a method added here needs its `require_operator` too).
    pub(crate) const OPERATOR_ONLY: &[&str] = &[
        "/idempost.v1.AdminService/ListBacklog",
        "/idempost.v1.AdminService/Redrive",
        "/idempost.v1.AdminService/Purge",
        "/idempost.v1.AdminService/Replay",
        "/idempost.v1.AdminService/ListAudit",
    ];

    /// Authenticates the caller and runs one call inside its server span, recording its status
    /// there; a refused caller reaches no query.
    async fn traced<R, T, F: Future<Output = Result<T, AdminError>>>(
        &self,
        method: &'static str,
        request: &Request<R>,
        event_id: Option<&str>,
        call: impl FnOnce(Caller) -> F,
    ) -> Result<Response<T>, Status> {
        edge::authenticated(SERVICE, method, &self.auth, request, event_id, call, AdminError::into_status)
            .await
    }
}

#[tonic::async_trait]
impl AdminService for AdminGrpc {
    async fn await_published(
        &self,
        request: Request<pb::AwaitPublishedRequest>,
    ) -> Result<Response<pb::AwaitPublishedResponse>, Status> {
        let ask = request.get_ref().clone();
        self.traced("AwaitPublished", &request, Some(&request.get_ref().event_id), |caller| async move {
            let (shard, waits) = (self.event_shard(&ask.event_id).await?, &self.waits);
            super::wait::await_published(shard.db(), waits, ask, &caller).await.map_err(AdminError::Call)
        })
        .await
    }

    async fn get_event_timeline(
        &self,
        request: Request<pb::GetEventTimelineRequest>,
    ) -> Result<Response<pb::GetEventTimelineResponse>, Status> {
        let event_id = request.get_ref().event_id.clone();
        self.traced("GetEventTimeline", &request, Some(&request.get_ref().event_id), |caller| async move {
            let event_id = parse_event_id(&event_id)?;
            let timeline = self.event_shard(&event_id).await?.timeline(&event_id).await?;
            // Another tenant's event is answered exactly like an unknown one.
            let visible =
                caller.operator || timeline.order.as_ref().is_some_and(|o| caller.may_read(o.tenant_id));
            if timeline.is_empty() || !visible {
                return Err(AdminError::EventNotFound(event_id));
            }
            Ok(pb::GetEventTimelineResponse { timeline: Some(seen_by(timeline.into(), &caller)) })
        })
        .await
    }

    async fn find_by_business_key(
        &self,
        request: Request<pb::FindByBusinessKeyRequest>,
    ) -> Result<Response<pb::FindByBusinessKeyResponse>, Status> {
        let key = request.get_ref().clone();
        self.traced("FindByBusinessKey", &request, None, |caller| async move {
            let tenant_id = caller.tenant_for_read(key.tenant_id)?;
            let (tenant_id, request_id) = parse_key(tenant_id, key.request_id)?;
            let shard = Inspector::new(self.shards.tenant_db(tenant_id.get()));
            match shard.find(tenant_id.get(), request_id.as_str()).await? {
                Some(timeline) => {
                    tracing::Span::current().record("idempost.event_id", timeline.event_id.as_str());
                    Ok(pb::FindByBusinessKeyResponse { timeline: Some(seen_by(timeline.into(), &caller)) })
                }
                None => Err(AdminError::OrderNotFound {
                    tenant_id: tenant_id.get(),
                    request_id: request_id.as_str().to_owned(),
                }),
            }
        })
        .await
    }

    async fn list_order_events(
        &self,
        request: Request<pb::ListOrderEventsRequest>,
    ) -> Result<Response<pb::ListOrderEventsResponse>, Status> {
        let ask = *request.get_ref();
        self.traced("ListOrderEvents", &request, None, |caller| async move {
            let (order_id, before_version, limit) = parse_order_events(ask)?;
            // Another tenant's order is answered exactly like an unknown one.
            let Some(shard) = self.shards.order_db(order_id).map(Inspector::new) else {
                return Err(AdminError::UnknownOrder(order_id));
            };
            match shard.order(order_id).await? {
                Some(order) if caller.operator || caller.may_read(order.tenant_id) => {}
                _ => return Err(AdminError::UnknownOrder(order_id)),
            }
            let page = shard.order_events(order_id, before_version, u64::from(limit)).await?;
            Ok(page.into())
        })
        .await
    }

    async fn list_backlog(
        &self,
        request: Request<pb::ListBacklogRequest>,
    ) -> Result<Response<pb::ListBacklogResponse>, Status> {
        let query = request.get_ref().clone();
        self.traced("ListBacklog", &request, None, |caller| async move {
            // The backlog spans every tenant: operators only.
            caller.require_operator()?;
            let db = self.named_shard(&query.shard)?.unwrap_or_else(|| self.shards.default_db());
            let ask = parse_backlog(query)?;
            let mut budget = ByteBudget::listing();
            let fits = |row: &idempost::entity::outbox_event::Model| budget.take(&entry(row.clone()));
            let page = listing::page(&db, &ask, fits).await?;
            Ok(page.into())
        })
        .await
    }

    async fn redrive(
        &self,
        request: Request<pb::RedriveRequest>,
    ) -> Result<Response<pb::RedriveResponse>, Status> {
        let ask = request.get_ref().clone();
        self.traced("Redrive", &request, Some(&ask.event_id.clone()), |caller| async move {
            caller.require_operator()?;
            let (event_id, audit) = parse_redrive(ask, &caller)?;
            let shard = self.event_shard(&event_id).await?;
            match backlog::redrive(shard.db(), &event_id, &audit).await? {
                Redrive::Redriven => {
                    tracing::info!(
                        idempost.event_id = %event_id,
                        requested_by = %logged(&audit.requested_by),
                        reason = %logged(&audit.reason),
                        "redriven: FAILED -> PENDING"
                    );
                    let row = shard.timeline(&event_id).await?.outbox;
                    Ok(pb::RedriveResponse { outbox: row.map(Into::into) })
                }
                Redrive::NotFailed(status) => Err(AdminError::NotFailed { event_id, status }),
                Redrive::NotFound => Err(AdminError::EventNotFound(event_id)),
            }
        })
        .await
    }

    async fn purge(&self, request: Request<pb::PurgeRequest>) -> Result<Response<pb::PurgeResponse>, Status> {
        #[allow(deprecated)]
        let pb::PurgeRequest { outbox_older_than, consumed_older_than, dry_run, reason } =
            request.get_ref().clone();
        self.traced("Purge", &request, None, |caller| async move {
            caller.require_operator()?;
            let retention = self.retention_for(outbox_older_than, consumed_older_than.is_some(), &reason)?;
            let requested_by = caller.subject.as_deref().unwrap_or(UNAUTHENTICATED);
            let mut report: Option<OutboxPurgeReport> = None;
            // Every shard, each audited on itself; the rows summed, the last shard's cut-off.
            for db in self.shards.dbs() {
                let shard = if dry_run {
                    retention.purge(&db, true).await?
                } else {
                    retention.purge_audited(&db, requested_by, &reason).await?
                };
                let rows = report.map_or(0, |r| r.outbox_rows);
                report = Some(OutboxPurgeReport { outbox_rows: rows + shard.outbox_rows, ..shard });
            }
            // Never: a map has a shard.
            let report = report.ok_or_else(|| sea_orm::DbErr::Custom("no shard to purge".to_owned()))?;
            tracing::info!(
                requested_by = %logged(requested_by),
                reason = %logged(&reason),
                outbox_rows = report.outbox_rows,
                dry_run,
                "purge"
            );
            Ok(purge_response(&report))
        })
        .await
    }

    async fn replay(
        &self,
        request: Request<pb::ReplayRequest>,
    ) -> Result<Response<pb::ReplayResponse>, Status> {
        let ask = request.get_ref().clone();
        self.traced("Replay", &request, None, |caller| async move {
            // A replay republishes every tenant's events: operators only.
            caller.require_operator()?;
            let named = self.named_shard(&ask.shard)?;
            let db = named.unwrap_or_else(|| self.order_shard_or_default(ask.order_id));
            let ask = replay::Ask::parse(ask, &caller)?;
            match replay::replay(&db, &ask).await? {
                replay::Replayed::Done(report) => Ok(report.into()),
                replay::Replayed::TooLarge => Err(AdminError::ReplayTooLarge),
            }
        })
        .await
    }

    async fn list_audit(
        &self,
        request: Request<pb::ListAuditRequest>,
    ) -> Result<Response<pb::ListAuditResponse>, Status> {
        let ask = request.get_ref().clone();
        self.traced("ListAudit", &request, None, |caller| async move {
            // Who did what to every tenant's events: operators only.
            caller.require_operator()?;
            // An order or an event is on one shard; without either, every shard's audit is read
            // and merged. A listing of one database needs no shard number in its token.
            let shards = if ask.order_id <= 0 && !ask.event_id.is_empty() {
                vec![(0, self.event_shard(&ask.event_id).await?.db().clone())]
            } else if ask.order_id != 0 {
                vec![(0, self.order_shard_or_default(ask.order_id))]
            } else {
                self.shards.numbered_dbs()
            };
            audit_pages::list(shards, ask).await.map_err(AdminError::Call)
        })
        .await
    }
}

impl AdminGrpc {
    /// The database of the shard a request's `shard` field names; `None` when it names none.
    fn named_shard(&self, name: &str) -> Result<Option<sea_orm::DatabaseConnection>, AdminError> {
        if name.is_empty() {
            return Ok(None);
        }
        let db = self.shards.named_db(name).ok_or_else(|| InvalidInput {
            violations: vec![FieldViolation::new("shard", "names no shard of the order service's shard map")],
        })?;
        Ok(Some(db))
    }

    /// The database of the shard whose block holds `order_id`; the default shard's for none
    /// (0: the request names no order) or an id no shard's block holds (which then answers as
    /// one database did for an unknown order).
    fn order_shard_or_default(&self, order_id: i64) -> sea_orm::DatabaseConnection {
        self.shards.order_db(order_id).unwrap_or_else(|| self.shards.default_db())
    }

    /// The shard that holds `event_id`: the first, in the map's order, whose order side knows it
    /// (event ids are UUIDv7s made by the service, so at most one shard knows one), else the
    /// default shard, which answers for an unknown event as one database did. Reads every shard
    /// until one knows it: an admin call, not a hot path.
    async fn event_shard(&self, event_id: &str) -> Result<Inspector, AdminError> {
        let dbs = self.shards.dbs();
        if dbs.len() > 1 {
            for db in dbs {
                let shard = Inspector::new(db);
                if !shard.timeline(event_id).await?.is_empty() {
                    return Ok(shard);
                }
            }
        }
        Ok(Inspector::new(self.shards.default_db()))
    }
}

/// Who an operator's write is recorded as when the listener runs with `--auth none` (loopback
/// only) and the request names nobody.
const UNAUTHENTICATED: &str = "unauthenticated (--auth none)";

impl AdminGrpc {
    /// The configured retention with the request's window in place of the default. A
    /// consumed_event window is refused: those rows are the consumer's to purge. A reason is
    /// required: a purge is audited.
    fn retention_for(
        &self,
        outbox_older_than: Option<prost_types::Duration>,
        asks_for_consumed: bool,
        reason: &str,
    ) -> Result<OutboxRetention, AdminError> {
        let mut violations = Vec::new();
        if reason.trim().is_empty() {
            violations.push(FieldViolation::new(
                "reason",
                "is required: say why these rows may go (a purge is audited, with its reason)",
            ));
        }
        let outbox =
            edge::window("outbox_older_than", outbox_older_than, self.retention.outbox, &mut violations);
        if asks_for_consumed {
            violations.push(FieldViolation::new(
                "consumed_older_than",
                "consumed_event rows are the consumer's: use ConsumerAdminService.PurgeConsumed on the consumer",
            ));
        }
        InvalidInput::check(violations)?;
        Ok(OutboxRetention { outbox, ..self.retention.clone() })
    }
}

fn parse_key(tenant_id: i64, request_id: String) -> Result<(TenantId, RequestId), AdminError> {
    let mut violations = Vec::new();
    let tenant =
        TenantId::new(tenant_id).map_err(|e| violations.push(FieldViolation::new("tenant_id", e))).ok();
    let request =
        RequestId::parse(request_id).map_err(|e| violations.push(FieldViolation::new("request_id", e))).ok();
    InvalidInput::check(violations)?;
    tenant.zip(request).ok_or_else(|| InvalidInput { violations: Vec::new() }.into())
}

fn parse_order_events(ask: pb::ListOrderEventsRequest) -> Result<(i64, i64, u32), AdminError> {
    let mut violations = Vec::new();
    if ask.order_id <= 0 {
        violations.push(FieldViolation::new("order_id", "must be positive"));
    }
    if ask.before_version < 0 {
        violations.push(FieldViolation::new("before_version", "must not be negative"));
    }
    let limit = edge::limit(ask.limit, &mut violations);
    InvalidInput::check(violations)?;
    Ok((ask.order_id, ask.before_version, limit))
}

fn parse_backlog(query: pb::ListBacklogRequest) -> Result<listing::Ask, AdminError> {
    let mut violations = Vec::new();
    let status = if query.status.is_empty() {
        Some(OutboxStatus::Pending)
    } else {
        OutboxStatus::from_stored(&query.status.to_ascii_uppercase()).or_else(|| {
            violations
                .push(FieldViolation::new("status", "must be PENDING, PUBLISHING, PUBLISHED or FAILED"));
            None
        })
    };
    let older_than: Option<Duration> = edge::optional_window("older_than", query.older_than, &mut violations);
    let limit = edge::limit(query.limit, &mut violations);
    let after = Cursor::parse(&query.page_token).map_err(|v| violations.push(v)).ok().flatten();
    InvalidInput::check(violations)?;
    Ok(listing::Ask {
        status: status.unwrap_or(OutboxStatus::Pending),
        older_than,
        after,
        limit: u64::from(limit),
        payloads: query.include_payloads,
    })
}

/// The event and the audit record. With a token, the token's subject is who did it and the
/// request's free-text `requested_by` is kept only as a note in the reason; without
/// authentication (`--auth none`, loopback) `requested_by` is required and recorded as given.
fn parse_redrive(ask: pb::RedriveRequest, caller: &Caller) -> Result<(String, RedriveAudit), AdminError> {
    let mut violations = Vec::new();
    let event_id = parse_event_id(&ask.event_id).map_err(|e| violations.extend(e.violations)).ok();
    let required = |field: &str, value: &str, violations: &mut Vec<FieldViolation>| {
        if value.trim().is_empty() {
            violations.push(FieldViolation::new(field, "is required: a redrive is audited on the row"));
        }
    };
    if caller.subject.is_none() {
        required("requested_by", &ask.requested_by, &mut violations);
    }
    required("reason", &ask.reason, &mut violations);
    InvalidInput::check(violations)?;
    let audit = audit_of(caller, ask.requested_by, ask.reason);
    event_id.map(|id| (id, audit)).ok_or_else(|| InvalidInput { violations: Vec::new() }.into())
}

/// Everything the admin API can answer besides OK.
#[derive(Debug, thiserror::Error)]
enum AdminError {
    #[error(transparent)]
    Call(CallError),
    #[error("no order or outbox row has event {0}")]
    EventNotFound(String),
    #[error("no operation committed under tenant_id {tenant_id} and request_id {request_id}")]
    OrderNotFound { tenant_id: i64, request_id: String },
    #[error("no order has order_id {0}")]
    UnknownOrder(i64),
    #[error("event {event_id} is {}, not FAILED: only FAILED events are redriven", status.as_str())]
    NotFailed { event_id: String, status: OutboxStatus },
    #[error(
        "more than {} events match: narrow the filter (a shorter created_from..created_to range) and replay it in parts",
        replay::MAX_EVENTS
    )]
    ReplayTooLarge,
}

idempost::from_call_error!(AdminError);

impl AdminError {
    /// The one place admin failures become gRPC statuses; the table in `admin_service.proto`
    /// documents it.
    fn into_status(self) -> Status {
        let message = self.to_string();
        let text =
            |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        let (code, reason, metadata) = match self {
            Self::Call(e) => return e.into_status(),
            Self::EventNotFound(event_id) => {
                (Code::NotFound, "EVENT_NOT_FOUND", text(&[("event_id", &event_id)]))
            }
            Self::OrderNotFound { tenant_id, request_id } => (
                Code::NotFound,
                "ORDER_NOT_FOUND",
                text(&[("tenant_id", &tenant_id.to_string()), ("request_id", &request_id)]),
            ),
            Self::UnknownOrder(order_id) => {
                (Code::NotFound, "ORDER_NOT_FOUND", text(&[("order_id", &order_id.to_string())]))
            }
            Self::NotFailed { event_id, status } => (
                Code::FailedPrecondition,
                "NOT_FAILED",
                text(&[("event_id", &event_id), ("status", status.as_str())]),
            ),
            Self::ReplayTooLarge => (
                Code::FailedPrecondition,
                "REPLAY_TOO_LARGE",
                text(&[("limit", &replay::MAX_EVENTS.to_string())]),
            ),
        };
        error_status(code, reason, message, metadata, None)
    }
}

/// What the operators' side of an outbox row says (which relay holds the lease, the broker's
/// error text, who redrove it and why) is for operators: a tenant reading its own event sees
/// the row's state without it. A publish error stays visible as the fact that one happened.
fn seen_by(mut timeline: pb::EventTimeline, caller: &Caller) -> pb::EventTimeline {
    if caller.operator {
        return timeline;
    }
    if let Some(outbox) = timeline.outbox.as_mut() {
        outbox.lease_owner.clear();
        outbox.last_redriven_by.clear();
        outbox.last_redrive_reason.clear();
        if !outbox.last_error.is_empty() {
            outbox.last_error = TENANT_PUBLISH_ERROR.to_owned();
        }
    }
    timeline
}

/// `last_error` as a tenant sees it when the relay recorded one.
const TENANT_PUBLISH_ERROR: &str =
    "publishing failed and will be retried or redriven; an operator can see why";

impl From<Timeline> for pb::EventTimeline {
    /// The order side only: the consumer's parts stay empty (ConsumerAdminService has them).
    fn from(t: Timeline) -> Self {
        Self {
            event_id: t.event_id,
            order: t.order.map(Into::into),
            outbox: t.outbox.map(Into::into),
            order_events_total: t.order_events.total,
            order_events: t.order_events.events.into_iter().map(Into::into).collect(),
            ..Self::default()
        }
    }
}

impl From<OrderEvents> for pb::ListOrderEventsResponse {
    fn from(page: OrderEvents) -> Self {
        Self {
            order_events: page.events.into_iter().map(Into::into).collect(),
            total: page.total,
            next_before_version: page.next_before_version,
        }
    }
}

impl From<OrderEvent> for pb::OrderEventRecord {
    fn from(e: OrderEvent) -> Self {
        let v = e.version;
        // A purged row's type still follows from the operation that made it.
        let (event_type, outbox_status) =
            e.outbox.unwrap_or_else(|| (event_type(&v.operation).to_owned(), String::new()));
        Self {
            event_id: v.event_id,
            version: v.version,
            event_type,
            operation: v.operation,
            request_id: v.request_id,
            committed_at: Some(timestamp(v.committed_at)),
            outbox_status,
        }
    }
}

/// The event type a stored operation commits.
fn event_type(operation: &str) -> &'static str {
    match Operation::from_stored(operation) {
        Some(Operation::Submit) => EVENT_TYPE,
        Some(Operation::Amend) => ORDER_AMENDED_EVENT_TYPE,
        Some(Operation::Cancel) => ORDER_CANCELLED_EVENT_TYPE,
        None => "",
    }
}

/// One row of a backlog listing.
fn entry(row: idempost::entity::outbox_event::Model) -> pb::BacklogEntry {
    pb::BacklogEntry {
        event_id: row.event_id.clone(),
        aggregate_id: row.aggregate_id.clone(),
        outbox: Some(row.into()),
    }
}

impl From<Page> for pb::ListBacklogResponse {
    fn from(b: Page) -> Self {
        let stats = pb::BacklogStats {
            pending: b.stats.count(OutboxStatus::Pending),
            publishing: b.stats.count(OutboxStatus::Publishing),
            failed: b.stats.count(OutboxStatus::Failed),
            oldest_pending_age: b
                .stats
                .oldest_pending
                .map(|oldest| (b.now - oldest).to_std().unwrap_or_default())
                .and_then(|age| prost_types::Duration::try_from(age).ok()),
            ..Default::default()
        };
        let entries = b.rows.into_iter().map(entry).collect();
        Self { entries, stats: Some(stats), next_page_token: b.next.map(|c| c.token()).unwrap_or_default() }
    }
}

fn purge_response(report: &OutboxPurgeReport) -> pb::PurgeResponse {
    pb::PurgeResponse {
        outbox_rows: report.outbox_rows,
        outbox_cutoff: Some(timestamp(report.outbox_cutoff)),
        ..Default::default()
    }
}
