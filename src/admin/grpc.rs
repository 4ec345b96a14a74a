//! The gRPC edge of the admin API: requests to queries on the way in, rows to messages and
//! failures to statuses on the way out.

use std::collections::HashMap;
use std::time::Duration;

use sea_orm::DbErr;
use tonic::{Code, Request, Response, Status};
use tonic_types::{ErrorDetails, StatusExt};
use tracing::Instrument as _;

use super::inspect::{Backlog, Inspector, Timeline};
use super::retention::{PurgeReport, Retention, RetentionError};
use crate::domain::{EventId, FieldViolation, InvalidInput, OutboxStatus, RequestId, TenantId};
use crate::entity::{consumed_event, dead_letter, notification_job, orders, outbox_event};
use crate::order::{ERROR_DOMAIN, record_status, rpc_span, timestamp};
use crate::proto::v1::{
    self as pb,
    admin_service_server::{AdminService, AdminServiceServer},
};
use crate::relay::{Outbox, Redrive, RedriveAudit};
use crate::security::{AuthError, Authenticator, Caller};

const SERVICE: &str = "outpost.v1.AdminService";
const DEFAULT_LIMIT: u32 = 100;
const MAX_LIMIT: u32 = 1000;

/// The `AdminService` implementation.
#[derive(Debug, Clone)]
pub(crate) struct AdminGrpc {
    inspector: Inspector,
    outbox: Outbox,
    retention: Retention,
    auth: Authenticator,
}

impl AdminGrpc {
    pub(crate) fn server(
        db: sea_orm::DatabaseConnection,
        retention: Retention,
        auth: Authenticator,
    ) -> AdminServiceServer<Self> {
        AdminServiceServer::new(Self {
            inspector: Inspector::new(db.clone()),
            outbox: Outbox::new(db),
            retention,
            auth,
        })
    }

    /// Authenticates the caller and runs one call inside its server span, recording its status
    /// there; a refused caller reaches no query.
    async fn traced<T, F: Future<Output = Result<T, AdminError>>>(
        &self,
        method: &'static str,
        metadata: &tonic::metadata::MetadataMap,
        event_id: Option<&str>,
        call: impl FnOnce(Caller) -> F,
    ) -> Result<Response<T>, Status> {
        let span = rpc_span(SERVICE, method, metadata);
        if let Some(event_id) = event_id {
            span.record("outpost.event_id", event_id);
        }
        let caller = span.in_scope(|| self.auth.authenticate(metadata));
        let answer = async {
            match caller {
                Ok(caller) => call(caller).await,
                Err(refused) => Err(AdminError::Denied(refused)),
            }
        }
        .instrument(span.clone())
        .await
        .map(Response::new)
        .map_err(AdminError::into_status);
        record_status(&span, &answer);
        answer
    }
}

#[tonic::async_trait]
impl AdminService for AdminGrpc {
    async fn get_event_timeline(
        &self,
        request: Request<pb::GetEventTimelineRequest>,
    ) -> Result<Response<pb::GetEventTimelineResponse>, Status> {
        let event_id = request.get_ref().event_id.clone();
        self.traced(
            "GetEventTimeline",
            request.metadata(),
            Some(&request.get_ref().event_id),
            |caller| async move {
                let event_id = parse_event_id(&event_id)?;
                let timeline = self.inspector.timeline(&event_id).await?;
                // Another tenant's event is answered exactly like an unknown one.
                let visible =
                    caller.operator || timeline.order.as_ref().is_some_and(|o| caller.may_read(o.tenant_id));
                if timeline.is_empty() || !visible {
                    return Err(AdminError::EventNotFound(event_id));
                }
                Ok(pb::GetEventTimelineResponse { timeline: Some(timeline.into()) })
            },
        )
        .await
    }

    async fn find_by_business_key(
        &self,
        request: Request<pb::FindByBusinessKeyRequest>,
    ) -> Result<Response<pb::FindByBusinessKeyResponse>, Status> {
        let key = request.get_ref().clone();
        self.traced("FindByBusinessKey", request.metadata(), None, |caller| async move {
            let tenant_id = caller.tenant_for_read(key.tenant_id)?;
            let (tenant_id, request_id) = parse_key(tenant_id, key.request_id)?;
            match self.inspector.find(tenant_id.get(), request_id.as_str()).await? {
                Some(timeline) => {
                    tracing::Span::current().record("outpost.event_id", timeline.event_id.as_str());
                    Ok(pb::FindByBusinessKeyResponse { timeline: Some(timeline.into()) })
                }
                None => Err(AdminError::OrderNotFound {
                    tenant_id: tenant_id.get(),
                    request_id: request_id.as_str().to_owned(),
                }),
            }
        })
        .await
    }

    async fn list_backlog(
        &self,
        request: Request<pb::ListBacklogRequest>,
    ) -> Result<Response<pb::ListBacklogResponse>, Status> {
        let query = request.get_ref().clone();
        self.traced("ListBacklog", request.metadata(), None, |caller| async move {
            // The backlog spans every tenant: operators only.
            caller.require_operator()?;
            let (status, older_than, limit) = parse_backlog(query)?;
            let backlog = self.inspector.backlog(status, older_than, u64::from(limit)).await?;
            Ok(backlog.into())
        })
        .await
    }

    async fn redrive(
        &self,
        request: Request<pb::RedriveRequest>,
    ) -> Result<Response<pb::RedriveResponse>, Status> {
        let ask = request.get_ref().clone();
        self.traced("Redrive", request.metadata(), Some(&ask.event_id.clone()), |caller| async move {
            caller.require_operator()?;
            let (event_id, audit) = parse_redrive(ask, &caller)?;
            match self.outbox.redrive(&event_id, &audit).await? {
                Redrive::Redriven => {
                    tracing::info!(
                        outpost.event_id = %event_id,
                        requested_by = %audit.requested_by,
                        reason = %audit.reason,
                        "redriven: FAILED -> PENDING"
                    );
                    let row = self.inspector.timeline(&event_id).await?.outbox;
                    Ok(pb::RedriveResponse { outbox: row.map(Into::into) })
                }
                Redrive::NotFailed(status) => Err(AdminError::NotFailed { event_id, status }),
                Redrive::NotFound => Err(AdminError::EventNotFound(event_id)),
            }
        })
        .await
    }

    async fn purge(&self, request: Request<pb::PurgeRequest>) -> Result<Response<pb::PurgeResponse>, Status> {
        let ask = *request.get_ref();
        self.traced("Purge", request.metadata(), None, |caller| async move {
            caller.require_operator()?;
            let retention = self.retention_for(&ask)?;
            let report = retention.purge(self.inspector.db(), ask.dry_run).await?;
            tracing::info!(
                requested_by = caller.subject.as_deref().unwrap_or("unauthenticated"),
                outbox_rows = report.outbox_rows,
                consumed_rows = report.consumed_rows,
                dry_run = ask.dry_run,
                "purge"
            );
            Ok(purge_response(&report, retention.redelivery_horizon))
        })
        .await
    }
}

impl AdminGrpc {
    /// The configured retention with the request's windows in place of the defaults.
    fn retention_for(&self, ask: &pb::PurgeRequest) -> Result<Retention, AdminError> {
        let mut violations = Vec::new();
        let mut window = |field: &str, value: Option<prost_types::Duration>, default: Duration| match value {
            None => default,
            Some(d) => Duration::try_from(d).unwrap_or_else(|_| {
                violations.push(FieldViolation::new(field, "must not be negative"));
                default
            }),
        };
        let retention = Retention {
            outbox: window("outbox_older_than", ask.outbox_older_than, self.retention.outbox),
            consumed: window("consumed_older_than", ask.consumed_older_than, self.retention.consumed),
            ..self.retention.clone()
        };
        InvalidInput::check(violations)?;
        Ok(retention)
    }
}

fn parse_event_id(text: &str) -> Result<String, AdminError> {
    EventId::parse(text).map(|id| id.to_string()).map_err(|e| {
        AdminError::Invalid(InvalidInput { violations: vec![FieldViolation::new("event_id", e)] })
    })
}

fn parse_key(tenant_id: i64, request_id: String) -> Result<(TenantId, RequestId), AdminError> {
    let mut violations = Vec::new();
    let tenant =
        TenantId::new(tenant_id).map_err(|e| violations.push(FieldViolation::new("tenant_id", e))).ok();
    let request =
        RequestId::parse(request_id).map_err(|e| violations.push(FieldViolation::new("request_id", e))).ok();
    InvalidInput::check(violations)?;
    tenant.zip(request).ok_or(AdminError::Invalid(InvalidInput { violations: Vec::new() }))
}

fn parse_backlog(query: pb::ListBacklogRequest) -> Result<(OutboxStatus, Option<Duration>, u32), AdminError> {
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
    let older_than = query.older_than.and_then(|d| {
        Duration::try_from(d)
            .map_err(|_| violations.push(FieldViolation::new("older_than", "must not be negative")))
            .ok()
    });
    let limit = match query.limit {
        0 => DEFAULT_LIMIT,
        n if n <= MAX_LIMIT => n,
        _ => {
            violations.push(FieldViolation::new("limit", format!("must be at most {MAX_LIMIT}")));
            DEFAULT_LIMIT
        }
    };
    InvalidInput::check(violations)?;
    Ok((status.unwrap_or(OutboxStatus::Pending), older_than, limit))
}

/// The event and the audit record. With a token, the token's subject is who did it and the
/// request's free-text `requested_by` is kept only as a note in the reason; without
/// authentication (`--auth none`, loopback) `requested_by` is required and recorded as given.
fn parse_redrive(ask: pb::RedriveRequest, caller: &Caller) -> Result<(String, RedriveAudit), AdminError> {
    let mut violations = Vec::new();
    let event_id = EventId::parse(&ask.event_id)
        .map_err(|e| violations.push(FieldViolation::new("event_id", e)))
        .ok()
        .map(|id| id.to_string());
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
    let audit = match &caller.subject {
        None => RedriveAudit { requested_by: ask.requested_by, reason: ask.reason },
        Some(subject) => {
            let note = ask.requested_by.trim();
            let reason = if note.is_empty() || note == subject {
                ask.reason
            } else {
                format!("{} (requested_by note: {note})", ask.reason)
            };
            RedriveAudit { requested_by: subject.clone(), reason }
        }
    };
    event_id.map(|id| (id, audit)).ok_or(AdminError::Invalid(InvalidInput { violations: Vec::new() }))
}

/// Everything the admin API can answer besides OK.
#[derive(Debug, thiserror::Error)]
enum AdminError {
    #[error(transparent)]
    Denied(#[from] AuthError),
    #[error(transparent)]
    Invalid(#[from] InvalidInput),
    #[error("no order, outbox row or consumer record has event {0}")]
    EventNotFound(String),
    #[error("no committed order has tenant_id {tenant_id} and request_id {request_id}")]
    OrderNotFound { tenant_id: i64, request_id: String },
    #[error("event {event_id} is {}, not FAILED: only FAILED events are redriven", status.as_str())]
    NotFailed { event_id: String, status: OutboxStatus },
    #[error(transparent)]
    BelowHorizon(RetentionError),
    #[error("the database failed; nothing was changed by this call: {0}")]
    Database(#[from] DbErr),
}

impl From<RetentionError> for AdminError {
    fn from(e: RetentionError) -> Self {
        match e {
            RetentionError::Database(e) => Self::Database(e),
            refused => Self::BelowHorizon(refused),
        }
    }
}

impl AdminError {
    /// The one place admin failures become gRPC statuses; the table in `admin_service.proto`
    /// documents it.
    fn into_status(self) -> Status {
        let mut details = ErrorDetails::new();
        let mut metadata = HashMap::new();
        let (code, reason) = match &self {
            Self::Denied(refused) => (refused.code(), refused.reason()),
            Self::Invalid(invalid) => {
                for v in &invalid.violations {
                    details.add_bad_request_violation(v.field.clone(), v.description.clone());
                }
                (Code::InvalidArgument, "INVALID_REQUEST")
            }
            Self::EventNotFound(event_id) => {
                metadata.insert("event_id".to_owned(), event_id.clone());
                (Code::NotFound, "EVENT_NOT_FOUND")
            }
            Self::OrderNotFound { tenant_id, request_id } => {
                metadata.insert("tenant_id".to_owned(), tenant_id.to_string());
                metadata.insert("request_id".to_owned(), request_id.clone());
                (Code::NotFound, "ORDER_NOT_FOUND")
            }
            Self::NotFailed { event_id, status } => {
                metadata.insert("event_id".to_owned(), event_id.clone());
                metadata.insert("status".to_owned(), status.as_str().to_owned());
                (Code::FailedPrecondition, "NOT_FAILED")
            }
            Self::BelowHorizon(_) => (Code::FailedPrecondition, "RETENTION_BELOW_HORIZON"),
            Self::Database(e) => {
                tracing::warn!(error = %e, "admin call failed on the database");
                (Code::Unavailable, "DATABASE_UNAVAILABLE")
            }
        };
        details.set_error_info(reason, ERROR_DOMAIN, metadata);
        Status::with_error_details(code, self.to_string(), details)
    }
}

impl From<Timeline> for pb::EventTimeline {
    fn from(t: Timeline) -> Self {
        Self {
            event_id: t.event_id,
            order: t.order.map(Into::into),
            outbox: t.outbox.map(Into::into),
            consumers: t.consumers.into_iter().map(Into::into).collect(),
            notification_job: t.jobs.first().cloned().map(Into::into),
            notification_jobs: t.jobs.into_iter().map(Into::into).collect(),
            dead_letters: t.dead_letters.into_iter().map(Into::into).collect(),
        }
    }
}

impl From<orders::Model> for pb::OrderRecord {
    fn from(o: orders::Model) -> Self {
        Self {
            order_id: o.id,
            tenant_id: o.tenant_id,
            request_id: o.request_id,
            version: o.version,
            status: o.status,
            total_minor: o.total,
            currency: o.currency,
            created_at: Some(timestamp(o.created_at)),
        }
    }
}

impl From<outbox_event::Model> for pb::OutboxRecord {
    fn from(r: outbox_event::Model) -> Self {
        let published_to = match (r.published_topic, r.published_partition, r.published_offset) {
            (Some(topic), Some(partition), Some(offset)) => {
                Some(pb::KafkaCoordinates { topic, partition, offset })
            }
            _ => None,
        };
        Self {
            status: r.status,
            attempts: r.attempts,
            last_error: r.last_error.unwrap_or_default(),
            lease_owner: r.lease_owner.unwrap_or_default(),
            lease_until: r.lease_until.map(timestamp),
            created_at: Some(timestamp(r.created_at)),
            published_at: r.published_at.map(timestamp),
            published_to,
            redrive_count: r.redrive_count,
            last_redriven_at: r.last_redriven_at.map(timestamp),
            last_redriven_by: r.last_redriven_by.unwrap_or_default(),
            last_redrive_reason: r.last_redrive_reason.unwrap_or_default(),
        }
    }
}

impl From<consumed_event::Model> for pb::ConsumerRecord {
    fn from(c: consumed_event::Model) -> Self {
        Self { consumer_name: c.consumer_name, consumed_at: Some(timestamp(c.consumed_at)) }
    }
}

impl From<notification_job::Model> for pb::NotificationJobRecord {
    fn from(j: notification_job::Model) -> Self {
        Self {
            consumer_name: j.consumer_name,
            order_id: j.order_id,
            source_version: j.source_version,
            status: j.status,
            created_at: Some(timestamp(j.created_at)),
        }
    }
}

impl From<dead_letter::Model> for pb::DeadLetterRecord {
    fn from(d: dead_letter::Model) -> Self {
        Self {
            consumer_name: d.consumer_name,
            coordinates: Some(pb::KafkaCoordinates {
                topic: d.topic,
                partition: d.partition_id,
                offset: d.offset_id,
            }),
            error: d.error,
            created_at: Some(timestamp(d.created_at)),
        }
    }
}

impl From<Backlog> for pb::ListBacklogResponse {
    fn from(b: Backlog) -> Self {
        let count = |status| b.counts.iter().find(|(s, _)| *s == status).map_or(0, |(_, n)| *n);
        let stats = pb::BacklogStats {
            pending: count(OutboxStatus::Pending),
            publishing: count(OutboxStatus::Publishing),
            published: count(OutboxStatus::Published),
            failed: count(OutboxStatus::Failed),
            oldest_pending_age: b
                .oldest_pending_age
                .and_then(|age| prost_types::Duration::try_from(age).ok()),
        };
        let entries = b
            .entries
            .into_iter()
            .map(|row| pb::BacklogEntry {
                event_id: row.event_id.clone(),
                aggregate_id: row.aggregate_id.clone(),
                outbox: Some(row.into()),
            })
            .collect();
        Self { entries, stats: Some(stats) }
    }
}

fn purge_response(report: &PurgeReport, horizon: Duration) -> pb::PurgeResponse {
    pb::PurgeResponse {
        outbox_rows: report.outbox_rows,
        consumed_rows: report.consumed_rows,
        outbox_cutoff: Some(timestamp(report.outbox_cutoff)),
        consumed_cutoff: Some(timestamp(report.consumed_cutoff)),
        redelivery_horizon: prost_types::Duration::try_from(horizon).ok(),
    }
}
