//! The consumer's operators' edge, served as the gRPC `ConsumerAdminService` on its health
//! listener: what its own database holds for an event, its dead letters, its parked events and
//! the release of an order's gap, and the purge of its dedup history. Every call needs the
//! operator scope: these tables do not know tenants.

mod dead_letters;
mod parked;
mod wait;

use std::collections::HashMap;

use idempost_proto::v1::{
    self as pb,
    consumer_admin_service_server::{ConsumerAdminService, ConsumerAdminServiceServer},
};
use sea_orm::{ColumnTrait, DatabaseConnection, DbErr, EntityTrait, QueryFilter, QueryOrder};
use tonic::{Code, Request, Response, Status};

use super::gap::{self, Audit};
use super::retention::{DedupRetention, RetentionError};
use idempost::domain::{FieldViolation, InvalidInput};
use idempost::edge::{self, CallError, LongPoll, error_status, parse_event_id, timestamp};
use idempost::entity::{consumed_event, dead_letter, notification_job};
use idempost::security::{Authenticator, Caller};
use idempost::telemetry::logged;

const SERVICE: &str = "idempost.v1.ConsumerAdminService";

/// The largest request decoded: the biggest is a gap release's reason, far below it. tonic's
/// default (4 MiB) would let one call make the consumer reserve that much.
const MAX_REQUEST_BYTES: usize = 64 * 1024;

/// The `ConsumerAdminService` implementation.
#[derive(Debug, Clone)]
pub(crate) struct ConsumerAdminGrpc {
    db: DatabaseConnection,
    /// The consumer name whose read model and parked events this listener serves.
    consumer_name: String,
    retention: DedupRetention,
    auth: Authenticator,
    /// The bounds of AwaitConsumed's waits on this listener.
    waits: LongPoll,
}

impl ConsumerAdminGrpc {
    pub(crate) fn server(
        db: DatabaseConnection,
        consumer_name: String,
        retention: DedupRetention,
        auth: Authenticator,
        waits: LongPoll,
    ) -> ConsumerAdminServiceServer<Self> {
        ConsumerAdminServiceServer::new(Self { db, consumer_name, retention, auth, waits })
            .max_decoding_message_size(MAX_REQUEST_BYTES)
    }

    /// Every method needs the operator scope: refused at the listener, before the body is read.
    pub(crate) const OPERATOR_ONLY: &[&str] = &["/idempost.v1.ConsumerAdminService/"];

    /// Authenticates the caller, requires the operator scope, and runs one call inside its
    /// server span, recording its status there.
    async fn operator<R, T, F: Future<Output = Result<T, ConsumerAdminError>>>(
        &self,
        method: &'static str,
        request: &Request<R>,
        event_id: Option<&str>,
        call: impl FnOnce(Caller) -> F,
    ) -> Result<Response<T>, Status> {
        let call = |caller: Caller| async move {
            caller.require_operator()?;
            call(caller).await
        };
        edge::authenticated(
            SERVICE,
            method,
            &self.auth,
            request,
            event_id,
            call,
            ConsumerAdminError::into_status,
        )
        .await
    }
}

#[tonic::async_trait]
impl ConsumerAdminService for ConsumerAdminGrpc {
    async fn await_consumed(
        &self,
        request: Request<pb::AwaitConsumedRequest>,
    ) -> Result<Response<pb::AwaitConsumedResponse>, Status> {
        let ask = request.get_ref().clone();
        self.operator("AwaitConsumed", &request, Some(&request.get_ref().event_id), |_| async move {
            let own = &self.consumer_name;
            wait::await_consumed(&self.db, &self.waits, own, ask).await.map_err(ConsumerAdminError::Call)
        })
        .await
    }

    async fn get_consumer_timeline(
        &self,
        request: Request<pb::GetConsumerTimelineRequest>,
    ) -> Result<Response<pb::GetConsumerTimelineResponse>, Status> {
        let event_id = request.get_ref().event_id.clone();
        self.operator("GetConsumerTimeline", &request, Some(&event_id.clone()), |_| async move {
            let event_id = parse_event_id(&event_id)?;
            let timeline = timeline(&self.db, event_id).await?;
            Ok(pb::GetConsumerTimelineResponse { timeline: Some(timeline) })
        })
        .await
    }

    async fn list_dead_letters(
        &self,
        request: Request<pb::ListDeadLettersRequest>,
    ) -> Result<Response<pb::ListDeadLettersResponse>, Status> {
        let ask = request.get_ref().clone();
        self.operator("ListDeadLetters", &request, None, |_| async move {
            let ask = dead_letters::Ask::try_from(ask)?;
            Ok(dead_letters::page(&self.db, ask).await?)
        })
        .await
    }

    async fn purge_consumed(
        &self,
        request: Request<pb::PurgeConsumedRequest>,
    ) -> Result<Response<pb::PurgeConsumedResponse>, Status> {
        let ask = request.get_ref().clone();
        self.operator("PurgeConsumed", &request, None, |caller| async move {
            let mut violations = Vec::new();
            let consumed = edge::window(
                "consumed_older_than",
                ask.consumed_older_than,
                self.retention.consumed,
                &mut violations,
            );
            InvalidInput::check(violations)?;
            let retention = DedupRetention { consumed, ..self.retention.clone() };
            let requested_by = caller.subject.as_deref().unwrap_or(UNAUTHENTICATED);
            let report = if ask.dry_run {
                retention.purge(&self.db, true).await?
            } else {
                retention.purge_audited(&self.db, requested_by, &ask.reason).await?
            };
            tracing::info!(
                requested_by = %logged(requested_by),
                reason = %logged(&ask.reason),
                consumed_rows = report.consumed_rows,
                dry_run = ask.dry_run,
                "purge of consumed_event"
            );
            Ok(pb::PurgeConsumedResponse {
                consumed_rows: report.consumed_rows,
                consumed_cutoff: Some(timestamp(report.consumed_cutoff)),
                redelivery_horizon: prost_types::Duration::try_from(retention.redelivery_horizon).ok(),
            })
        })
        .await
    }

    async fn list_parked_events(
        &self,
        request: Request<pb::ListParkedEventsRequest>,
    ) -> Result<Response<pb::ListParkedEventsResponse>, Status> {
        let ask = request.get_ref().clone();
        self.operator("ListParkedEvents", &request, None, |_| async move {
            let ask = parked::Ask::try_from(ask)?;
            Ok(parked::page(&self.db, &self.consumer_name, ask).await?)
        })
        .await
    }

    async fn release_parked_gap(
        &self,
        request: Request<pb::ReleaseParkedGapRequest>,
    ) -> Result<Response<pb::ReleaseParkedGapResponse>, Status> {
        let ask = request.get_ref().clone();
        self.operator("ReleaseParkedGap", &request, None, |caller| async move {
            let mut violations = Vec::new();
            if ask.order_id <= 0 {
                violations.push(FieldViolation::new("order_id", "must be positive"));
            }
            if ask.reason.trim().is_empty() {
                violations.push(FieldViolation::new("reason", "is required: a release is audited"));
            } else if ask.reason.chars().count() > 512 {
                violations.push(FieldViolation::new("reason", "must be at most 512 characters"));
            }
            InvalidInput::check(violations)?;
            let released_by = caller.subject.as_deref().unwrap_or(UNAUTHENTICATED);
            let audit = Audit { released_by, reason: &ask.reason };
            let released = gap::release(&self.db, &self.consumer_name, ask.order_id, &audit)
                .await?
                .ok_or(ConsumerAdminError::NothingParked(ask.order_id))?;
            tracing::warn!(
                released_by = %logged(released_by),
                reason = %logged(&ask.reason),
                order_id = ask.order_id,
                from_version = released.from,
                to_version = released.to,
                applied = ?released.applied,
                "gap released in the read model"
            );
            Ok(pb::ReleaseParkedGapResponse {
                released_from_version: released.from,
                released_to_version: released.to,
                applied_versions: released.applied,
                read_model_version: released.version,
                still_parked: u32::try_from(released.still_parked).unwrap_or(u32::MAX),
            })
        })
        .await
    }

    async fn list_audit(
        &self,
        request: Request<pb::ConsumerAdminServiceListAuditRequest>,
    ) -> Result<Response<pb::ConsumerAdminServiceListAuditResponse>, Status> {
        let ask = request.get_ref().clone().into();
        self.operator("ListAudit", &request, None, |_| async move {
            edge::list_audit(&self.db, ask).await.map(Into::into).map_err(ConsumerAdminError::Call)
        })
        .await
    }
}

/// Who an operator's write is recorded as when the listener runs with `--auth none` (loopback
/// only).
const UNAUTHENTICATED: &str = "unauthenticated (--auth none)";

/// Everything the database holds for `event_id`, oldest first.
async fn timeline(db: &DatabaseConnection, event_id: String) -> Result<pb::ConsumerTimeline, DbErr> {
    let consumers = consumed_event::Entity::find()
        .filter(consumed_event::Column::EventId.eq(&event_id))
        .order_by_asc(consumed_event::Column::ConsumedAt)
        .all(db)
        .await?;
    let jobs = notification_job::Entity::find()
        .filter(notification_job::Column::EventId.eq(&event_id))
        .order_by_asc(notification_job::Column::CreatedAt)
        .order_by_asc(notification_job::Column::ConsumerName)
        .all(db)
        .await?;
    let dead_letters = dead_letter::Entity::find()
        .filter(dead_letter::Column::EventId.eq(&event_id))
        .order_by_asc(dead_letter::Column::Id)
        .all(db)
        .await?;
    Ok(pb::ConsumerTimeline {
        event_id,
        consumers: consumers.into_iter().map(Into::into).collect(),
        notification_jobs: jobs.into_iter().map(Into::into).collect(),
        dead_letters: dead_letters.into_iter().map(Into::into).collect(),
    })
}

/// Everything the consumer's admin API can answer besides OK.
#[derive(Debug, thiserror::Error)]
enum ConsumerAdminError {
    #[error(transparent)]
    Call(CallError),
    #[error(transparent)]
    BelowHorizon(RetentionError),
    #[error("order {0} has no parked event in this consumer's read model")]
    NothingParked(i64),
}

idempost::from_call_error!(ConsumerAdminError);

impl From<RetentionError> for ConsumerAdminError {
    fn from(e: RetentionError) -> Self {
        match e {
            RetentionError::Database(e) => e.into(),
            refused => Self::BelowHorizon(refused),
        }
    }
}

impl ConsumerAdminError {
    /// The one place these failures become gRPC statuses; the table in
    /// `consumer_admin_service.proto` documents it.
    fn into_status(self) -> Status {
        match self {
            Self::Call(e) => e.into_status(),
            nothing @ Self::NothingParked(_) => error_status(
                Code::FailedPrecondition,
                "NOTHING_PARKED",
                nothing.to_string(),
                HashMap::new(),
                None,
            ),
            refused @ Self::BelowHorizon(_) => {
                let message = refused.to_string();
                error_status(
                    Code::FailedPrecondition,
                    "RETENTION_BELOW_HORIZON",
                    message,
                    HashMap::new(),
                    None,
                )
            }
        }
    }
}
