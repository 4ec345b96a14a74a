//! The consumer's operators' edge, served as the gRPC `ConsumerAdminService` on its health
//! listener: what its own database holds for an event, its dead letters, and the purge of its
//! dedup history. Every call needs the operator scope: these tables do not know tenants.

use std::collections::HashMap;

use sea_orm::{ColumnTrait, DatabaseConnection, DbErr, EntityTrait, QueryFilter, QueryOrder, QuerySelect};
use tonic::{Code, Request, Response, Status};

use super::retention::{Retention, RetentionError};
use crate::domain::InvalidInput;
use crate::edge::{self, CallError, error_status, parse_event_id, timestamp};
use crate::entity::{consumed_event, dead_letter, notification_job};
use crate::proto::v1::{
    self as pb,
    consumer_admin_service_server::{ConsumerAdminService, ConsumerAdminServiceServer},
};
use crate::security::{Authenticator, Caller};

const SERVICE: &str = "outpost.v1.ConsumerAdminService";

/// The `ConsumerAdminService` implementation.
#[derive(Debug, Clone)]
pub(crate) struct ConsumerAdminGrpc {
    db: DatabaseConnection,
    retention: Retention,
    auth: Authenticator,
}

impl ConsumerAdminGrpc {
    pub(crate) fn server(
        db: DatabaseConnection,
        retention: Retention,
        auth: Authenticator,
    ) -> ConsumerAdminServiceServer<Self> {
        ConsumerAdminServiceServer::new(Self { db, retention, auth })
    }

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
            let mut violations = Vec::new();
            let limit = edge::limit(ask.limit, &mut violations);
            InvalidInput::check(violations)?;
            let mut query = dead_letter::Entity::find();
            if !ask.consumer_name.is_empty() {
                query = query.filter(dead_letter::Column::ConsumerName.eq(ask.consumer_name));
            }
            let rows =
                query.order_by_asc(dead_letter::Column::Id).limit(u64::from(limit)).all(&self.db).await?;
            Ok(pb::ListDeadLettersResponse { dead_letters: rows.into_iter().map(Into::into).collect() })
        })
        .await
    }

    async fn purge_consumed(
        &self,
        request: Request<pb::PurgeConsumedRequest>,
    ) -> Result<Response<pb::PurgeConsumedResponse>, Status> {
        let ask = *request.get_ref();
        self.operator("PurgeConsumed", &request, None, |caller| async move {
            let mut violations = Vec::new();
            let consumed = edge::window(
                "consumed_older_than",
                ask.consumed_older_than,
                self.retention.consumed,
                &mut violations,
            );
            InvalidInput::check(violations)?;
            let retention = Retention { consumed, ..self.retention.clone() };
            let report = retention.purge(&self.db, ask.dry_run).await?;
            tracing::info!(
                requested_by = caller.subject.as_deref().unwrap_or("unauthenticated"),
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
}

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
}

edge::from_call_error!(ConsumerAdminError);

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
            event_id: d.event_id.unwrap_or_default(),
            payload: d.payload,
        }
    }
}
