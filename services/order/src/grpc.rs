//! The gRPC edge of the order service (SubmitOrder, AmendOrder, CancelOrder, Reconcile): proto to
//! domain on the way in, outcomes to statuses on the way out. Nothing here touches the database
//! directly.

use std::collections::HashMap;

use idempost_proto::ERROR_DOMAIN;
use idempost_proto::v1::{
    self as pb,
    order_service_server::{OrderService, OrderServiceServer},
};
use tonic::{Code, Request, Response, Status};
use tonic_types::{ErrorDetails, StatusExt};
use tracing::Instrument as _;

use super::accepting::{SubmitError, Submitted};
use super::change::{Changed, Refusal, Refused};
use super::shards::Shards;
use super::store::Reconciled;
use idempost::domain::{
    CancelReason, ChangeKey, ChangeOrder, InvalidInput, RequestId, SubmitOrder, TenantId,
};
use idempost::edge::{CORRELATION_ID, incident, record_status, refusal_status, rpc_span, timestamp};
use idempost::security::{AuthError, Authenticator, Caller};
use idempost::wake::WakeSender;

/// The largest request the service decodes; a full 100-line order is far below it.
const MAX_REQUEST_BYTES: usize = 64 * 1024;

/// The `OrderService` implementation.
#[derive(Debug, Clone)]
pub(crate) struct OrderGrpc {
    /// Each call goes to its tenant's shard.
    shards: Shards,
    wake: WakeSender,
    auth: Authenticator,
}

impl OrderGrpc {
    pub(crate) fn server(shards: Shards, wake: WakeSender, auth: Authenticator) -> OrderServiceServer<Self> {
        OrderServiceServer::new(Self { shards, wake, auth }).max_decoding_message_size(MAX_REQUEST_BYTES)
    }
}

#[tonic::async_trait]
impl OrderService for OrderGrpc {
    async fn submit_order(
        &self,
        request: Request<pb::SubmitOrderRequest>,
    ) -> Result<Response<pb::SubmitOrderResponse>, Status> {
        self.traced("SubmitOrder", request, |caller, r| self.submit_order_inner(caller, r)).await
    }

    async fn reconcile(
        &self,
        request: Request<pb::ReconcileRequest>,
    ) -> Result<Response<pb::ReconcileResponse>, Status> {
        self.traced("Reconcile", request, |caller, r| self.reconcile_inner(caller, r)).await
    }

    async fn amend_order(
        &self,
        request: Request<pb::AmendOrderRequest>,
    ) -> Result<Response<pb::AmendOrderResponse>, Status> {
        self.traced("AmendOrder", request, |caller, r| self.change_inner(caller, r)).await
    }

    async fn cancel_order(
        &self,
        request: Request<pb::CancelOrderRequest>,
    ) -> Result<Response<pb::CancelOrderResponse>, Status> {
        self.traced("CancelOrder", request, |caller, r| self.change_inner(caller, r)).await
    }
}

impl OrderGrpc {
    /// Runs one call inside its server span (continuing the caller's trace): authenticates the
    /// caller there, hands the outcome to `call`, and records the answer's status on the span.
    async fn traced<R, T, F>(
        &self,
        method: &'static str,
        request: Request<R>,
        call: impl FnOnce(Result<Caller, AuthError>, R) -> F,
    ) -> Result<Response<T>, Status>
    where
        F: Future<Output = Result<Response<T>, Status>>,
    {
        let span = rpc_span(SERVICE, method, request.metadata());
        let caller = span.in_scope(|| self.auth.caller(&request));
        let answer = call(caller, request.into_inner()).instrument(span.clone()).await;
        record_status(&span, &answer);
        answer
    }
}

/// A change request as the edge receives it: its key, and how it becomes a domain change and its
/// answer.
trait ChangeRequest: Sized {
    type Response: From<Changed>;
    fn key(&self) -> (i64, &str);
    fn set_tenant(&mut self, tenant_id: i64);
    fn parse(self) -> Result<ChangeOrder, InvalidInput>;
}

impl ChangeRequest for pb::AmendOrderRequest {
    type Response = pb::AmendOrderResponse;

    fn key(&self) -> (i64, &str) {
        (self.tenant_id, &self.request_id)
    }

    fn set_tenant(&mut self, tenant_id: i64) {
        self.tenant_id = tenant_id;
    }

    fn parse(self) -> Result<ChangeOrder, InvalidInput> {
        let lines = self.line_items.into_iter().map(|l| (l.sku, l.quantity, l.unit_price_minor)).collect();
        let key = ChangeKey {
            tenant_id: self.tenant_id,
            request_id: self.request_id,
            event_id: self.event_id,
            order_id: self.order_id,
            expected_version: self.expected_version,
        };
        ChangeOrder::amend(key, self.customer_id, lines)
    }
}

impl ChangeRequest for pb::CancelOrderRequest {
    type Response = pb::CancelOrderResponse;

    fn key(&self) -> (i64, &str) {
        (self.tenant_id, &self.request_id)
    }

    fn set_tenant(&mut self, tenant_id: i64) {
        self.tenant_id = tenant_id;
    }

    fn parse(self) -> Result<ChangeOrder, InvalidInput> {
        let reason =
            pb::CancelReason::try_from(self.reason).ok().and_then(|r| CancelReason::try_from(r).ok());
        let key = ChangeKey {
            tenant_id: self.tenant_id,
            request_id: self.request_id,
            event_id: self.event_id,
            order_id: self.order_id,
            expected_version: self.expected_version,
        };
        ChangeOrder::cancel(key, reason, self.note)
    }
}

impl OrderGrpc {
    async fn submit_order_inner(
        &self,
        caller: Result<Caller, AuthError>,
        mut request: pb::SubmitOrderRequest,
    ) -> Result<Response<pb::SubmitOrderResponse>, Status> {
        let key = ErrorKey::of(request.tenant_id, &request.request_id);
        // The tenant comes from the credentials: checked before anything is parsed or written.
        request.tenant_id = caller
            .and_then(|caller| caller.tenant_for_write(request.tenant_id))
            .map_err(|e| WriteError::Denied(e).into_status(key.clone()))?;
        let submit =
            SubmitOrder::try_from(request).map_err(|e| WriteError::Invalid(e).into_status(key.clone()))?;
        let shard = self.shards.route_write(submit.tenant_id.get()).await;
        match shard.store.submit(&submit).await {
            Ok(submitted) => {
                if !submitted.replayed {
                    self.wake.wake();
                }
                tracing::Span::current()
                    .record("idempost.event_id", tracing::field::display(submitted.order.event_id));
                Ok(Response::new(submitted.into()))
            }
            Err(e) => Err(WriteError::Store(e).into_status(key)),
        }
    }

    /// AmendOrder and CancelOrder: the tenant from the credentials exactly as for SubmitOrder,
    /// then the change, answered with the same outcomes and errors.
    async fn change_inner<R: ChangeRequest>(
        &self,
        caller: Result<Caller, AuthError>,
        mut request: R,
    ) -> Result<Response<R::Response>, Status> {
        let (tenant_id, request_id) = request.key();
        let key = ErrorKey::of(tenant_id, request_id);
        let tenant_id = caller
            .and_then(|caller| caller.tenant_for_write(tenant_id))
            .map_err(|e| WriteError::Denied(e).into_status(key.clone()))?;
        request.set_tenant(tenant_id);
        let change = request.parse().map_err(|e| WriteError::Invalid(e).into_status(key.clone()))?;
        let shard = self.shards.route_write(tenant_id).await;
        match shard.store.change(&change).await {
            Ok(Ok(changed)) => {
                if !changed.replayed {
                    self.wake.wake();
                }
                tracing::Span::current()
                    .record("idempost.event_id", tracing::field::display(changed.event_id));
                Ok(Response::new(changed.into()))
            }
            Ok(Err(refused)) => Err(WriteError::Refused(refused).into_status(key)),
            Err(e) => Err(WriteError::Store(e).into_status(key)),
        }
    }

    async fn reconcile_inner(
        &self,
        caller: Result<Caller, AuthError>,
        mut request: pb::ReconcileRequest,
    ) -> Result<Response<pb::ReconcileResponse>, Status> {
        let key = ErrorKey::of(request.tenant_id, &request.request_id);
        request.tenant_id = caller
            .and_then(|caller| caller.tenant_for_read(request.tenant_id))
            .map_err(|e| ReconcileError::Denied(e).into_status(key.clone()))?;
        let (tenant_id, request_id) =
            parse_key(request).map_err(|e| ReconcileError::Invalid(e).into_status(key.clone()))?;
        match self.shards.store_for(tenant_id.get()).reconcile(tenant_id, &request_id).await {
            Ok(Some(order)) => Ok(Response::new(order.into())),
            Ok(None) => Err(ReconcileError::NotFound.into_status(key)),
            Err(e) => {
                Err(ReconcileError::Database(incident("Reconcile failed on the database", &e))
                    .into_status(key))
            }
        }
    }
}

const SERVICE: &str = "idempost.v1.OrderService";

fn parse_key(request: pb::ReconcileRequest) -> Result<(TenantId, RequestId), InvalidInput> {
    let mut violations = Vec::new();
    let tenant_id = TenantId::new(request.tenant_id)
        .map_err(|e| violations.push(idempost::domain::FieldViolation::new("tenant_id", e)))
        .ok();
    let request_id = RequestId::parse(request.request_id)
        .map_err(|e| violations.push(idempost::domain::FieldViolation::new("request_id", e)))
        .ok();
    InvalidInput::check(violations)?;
    tenant_id.zip(request_id).ok_or_else(|| InvalidInput { violations: Vec::new() })
}

impl From<Submitted> for pb::SubmitOrderResponse {
    fn from(submitted: Submitted) -> Self {
        let order = submitted.order;
        Self {
            outcome: pb::TransactionOutcome::Committed.into(),
            replayed: submitted.replayed,
            order_id: order.order_id,
            event_id: order.event_id.to_string(),
            total_minor: order.total_minor,
            version: order.version,
            accepted_at: Some(timestamp(order.accepted_at)),
        }
    }
}

impl From<Reconciled> for pb::ReconcileResponse {
    fn from(found: Reconciled) -> Self {
        Self {
            order_id: found.order_id,
            event_id: found.event_id.to_string(),
            version: found.version,
            status: pb::OrderStatus::from(found.status).into(),
            total_minor: found.total_minor,
            accepted_at: Some(timestamp(found.accepted_at)),
            operation: pb::OrderOperation::from(found.operation).into(),
            current_version: found.current_version,
            committed_at: Some(timestamp(found.committed_at)),
        }
    }
}

impl From<Changed> for pb::AmendOrderResponse {
    fn from(changed: Changed) -> Self {
        Self {
            outcome: pb::TransactionOutcome::Committed.into(),
            replayed: changed.replayed,
            order_id: changed.order_id,
            event_id: changed.event_id.to_string(),
            version: changed.version,
            total_minor: changed.total_minor,
            amended_at: Some(timestamp(changed.committed_at)),
        }
    }
}

impl From<Changed> for pb::CancelOrderResponse {
    fn from(changed: Changed) -> Self {
        Self {
            outcome: pb::TransactionOutcome::Committed.into(),
            replayed: changed.replayed,
            order_id: changed.order_id,
            event_id: changed.event_id.to_string(),
            version: changed.version,
            cancelled_at: Some(timestamp(changed.committed_at)),
        }
    }
}

/// The idempotency key as the caller sent it, echoed in every error's metadata.
#[derive(Debug, Clone)]
struct ErrorKey {
    tenant_id: String,
    request_id: String,
}

impl ErrorKey {
    fn of(tenant_id: i64, request_id: &str) -> Self {
        // Echo at most the longest valid key, so a huge invalid one is not sent back.
        let request_id = request_id.chars().take(RequestId::MAX_LEN).collect();
        Self { tenant_id: tenant_id.to_string(), request_id }
    }
}

/// Everything SubmitOrder, AmendOrder and CancelOrder can answer besides OK: one table of
/// outcomes for every write.
#[derive(Debug, thiserror::Error)]
enum WriteError {
    #[error(transparent)]
    Invalid(InvalidInput),
    #[error(transparent)]
    Store(SubmitError),
    #[error(transparent)]
    Denied(AuthError),
    /// A change's refusal (never a submission's).
    #[error(transparent)]
    Refused(Refused),
}

impl WriteError {
    /// The one place write failures become gRPC statuses; the tables in `order_service.proto`
    /// document it.
    fn into_status(self, key: ErrorKey) -> Status {
        let (code, reason, event_id) = match &self {
            Self::Denied(e) => return refusal_status(*e, metadata(key, None)),
            Self::Refused(Refused { refusal, event_id }) => match refusal {
                Refusal::VersionConflict { .. } => {
                    (Code::FailedPrecondition, "VERSION_CONFLICT", Some(event_id))
                }
                Refusal::OrderCancelled { .. } => {
                    (Code::FailedPrecondition, "ORDER_CANCELLED", Some(event_id))
                }
                Refusal::OrderNotFound => (Code::NotFound, "ORDER_NOT_FOUND", Some(event_id)),
            },
            Self::Invalid(_) => (Code::InvalidArgument, "INVALID_ORDER", None),
            Self::Store(SubmitError::RequestIdReused { existing_event_id }) => {
                (Code::AlreadyExists, "REQUEST_ID_REUSED", Some(existing_event_id))
            }
            Self::Store(SubmitError::EventIdInUse { event_id }) => {
                (Code::AlreadyExists, "EVENT_ID_IN_USE", Some(event_id))
            }
            Self::Store(SubmitError::RolledBack { event_id, .. }) => {
                (Code::Aborted, "ROLLED_BACK", Some(event_id))
            }
            Self::Store(SubmitError::OutcomeUnknown { event_id, .. }) => {
                (Code::Unknown, "OUTCOME_UNKNOWN", Some(event_id))
            }
            Self::Store(SubmitError::Unavailable { event_id, .. }) => {
                (Code::Unavailable, "DATABASE_UNAVAILABLE", Some(event_id))
            }
            // The reason the listener's admission control gives: clients already retry it.
            Self::Store(SubmitError::Overloaded { event_id, .. }) => {
                (Code::ResourceExhausted, "OVERLOADED", Some(event_id))
            }
        };
        let mut metadata = metadata(key, event_id.map(ToString::to_string));
        // What failed inside goes to the log under a correlation id; the caller gets the id.
        if let Self::Store(
            SubmitError::RolledBack { cause, .. }
            | SubmitError::Unavailable { cause, .. }
            | SubmitError::OutcomeUnknown { cause, .. },
        ) = &self
        {
            metadata
                .insert(CORRELATION_ID.to_owned(), incident("an order write failed on the database", cause));
        }
        let mut details = ErrorDetails::new();
        if let Self::Refused(Refused {
            refusal:
                Refusal::VersionConflict { current_version } | Refusal::OrderCancelled { current_version },
            ..
        }) = &self
        {
            metadata.insert("current_version".to_owned(), current_version.to_string());
        }
        details.set_error_info(reason, ERROR_DOMAIN, metadata);
        let message = match self {
            Self::Invalid(invalid) => {
                for v in &invalid.violations {
                    details.add_bad_request_violation(v.field.clone(), v.description.clone());
                }
                invalid.to_string()
            }
            Self::Store(SubmitError::RolledBack { .. }) => {
                "the transaction rolled back before commit; nothing was written: retry with the same request_id and event_id".to_owned()
            }
            Self::Store(SubmitError::Unavailable { .. }) => {
                "the database is unavailable; no transaction began and nothing was written: retry with the same request_id and event_id".to_owned()
            }
            Self::Store(SubmitError::Overloaded { queued, .. }) => {
                format!("{queued} orders are already waiting for a transaction; nothing was written: retry after a backoff with the same request_id and event_id")
            }
            Self::Store(SubmitError::OutcomeUnknown { .. }) => {
                "the commit outcome is unknown: call Reconcile with the same tenant_id and request_id before retrying".to_owned()
            }
            Self::Store(SubmitError::RequestIdReused { existing_event_id }) => {
                format!("request_id already holds a different order (event {existing_event_id}): make a new request_id for a new order")
            }
            // The same words whichever order, of whichever tenant, holds the event id.
            Self::Store(SubmitError::EventIdInUse { .. }) => {
                "this event_id cannot be used: make a new one, or send none and the service makes one".to_owned()
            }
            Self::Denied(e) => e.to_string(),
            Self::Refused(refusal) => refusal.to_string(),
        };
        Status::with_error_details(code, message, details)
    }
}

/// Everything Reconcile can answer besides OK.
#[derive(Debug)]
enum ReconcileError {
    Denied(AuthError),
    Invalid(InvalidInput),
    NotFound,
    /// The database failed; the correlation id of the log record that says how.
    Database(String),
}

impl ReconcileError {
    fn into_status(self, key: ErrorKey) -> Status {
        let mut details = ErrorDetails::new();
        let (code, reason, message) = match self {
            Self::Denied(e) => return refusal_status(e, metadata(key, None)),
            Self::Invalid(invalid) => {
                for v in &invalid.violations {
                    details.add_bad_request_violation(v.field.clone(), v.description.clone());
                }
                (Code::InvalidArgument, "INVALID_KEY", invalid.to_string())
            }
            Self::NotFound => (
                Code::NotFound,
                "ORDER_NOT_FOUND",
                "no committed order has this tenant_id and request_id: resubmit with the same ids".to_owned(),
            ),
            Self::Database(id) => {
                let message =
                    format!("the database could not be read; retry Reconcile (correlation_id {id})");
                let mut metadata = metadata(key, None);
                metadata.insert(CORRELATION_ID.to_owned(), id);
                details.set_error_info("DATABASE_UNAVAILABLE", ERROR_DOMAIN, metadata);
                return Status::with_error_details(Code::Unavailable, message, details);
            }
        };
        details.set_error_info(reason, ERROR_DOMAIN, metadata(key, None));
        Status::with_error_details(code, message, details)
    }
}

fn metadata(key: ErrorKey, event_id: Option<String>) -> HashMap<String, String> {
    let mut metadata =
        HashMap::from([("tenant_id".to_owned(), key.tenant_id), ("request_id".to_owned(), key.request_id)]);
    if let Some(event_id) = event_id {
        metadata.insert("event_id".to_owned(), event_id);
    }
    metadata
}
