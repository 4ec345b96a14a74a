//! The console's own AdminService and ConsumerAdminService: each call the browser makes is made
//! again to the real service with the operator's token, which never leaves this process.

use std::sync::Arc;
use std::time::Duration;

use idempost_client::{BearerToken, ClientTls};
use idempost_proto::v1::{
    self as pb, admin_service_client::AdminServiceClient, admin_service_server::AdminService,
    consumer_admin_service_client::ConsumerAdminServiceClient,
    consumer_admin_service_server::ConsumerAdminService,
};
use tokio::sync::Mutex;
use tonic::transport::Channel;
use tonic::{Code, Request, Response, Status};
use tonic_types::{ErrorDetails, StatusExt as _};

/// How long one forwarded call may take: a page waits no longer than this for an answer.
const CALL_TIMEOUT: Duration = Duration::from_secs(20);

/// The `ErrorInfo.reason` of a call the console could not forward (the service is unreachable or
/// the console's TLS settings are wrong).
pub(crate) const UPSTREAM_UNAVAILABLE: &str = "CONSOLE_UPSTREAM_UNAVAILABLE";

/// One real service: where it is, how to reach it, and the token to present. The channel is made
/// on the first call (so the console starts while a service is down) and kept: tonic reconnects
/// it by itself.
#[derive(Debug, Clone)]
pub(crate) struct Upstream {
    url: String,
    tls: ClientTls,
    token: Option<BearerToken>,
    channel: Arc<Mutex<Option<Channel>>>,
}

impl Upstream {
    pub(crate) fn new(url: &str, tls: ClientTls, token: Option<BearerToken>) -> Self {
        Self { url: url.to_owned(), tls, token, channel: Arc::default() }
    }

    async fn channel(&self) -> Result<Channel, Status> {
        let mut slot = self.channel.lock().await;
        if let Some(channel) = slot.as_ref() {
            return Ok(channel.clone());
        }
        let channel = idempost_client::connect_with_token(&self.url, &self.tls, self.token.as_ref())
            .await
            .map_err(|e| {
                let details = ErrorDetails::with_error_info(UPSTREAM_UNAVAILABLE, "idempost.v1", []);
                Status::with_error_details(Code::Unavailable, format!("the console {e}"), details)
            })?;
        *slot = Some(channel.clone());
        Ok(channel)
    }

    /// `message` as a request of its own: only the operator's token and a deadline, nothing the
    /// browser sent besides the message.
    fn request<T>(&self, message: T) -> Request<T> {
        let mut request = Request::new(message);
        request.set_timeout(CALL_TIMEOUT);
        if let Some(token) = &self.token {
            token.apply(&mut request);
        }
        request
    }
}

/// The service's answer with its code, message and details (ErrorInfo, BadRequest), without the
/// service's response metadata.
fn relayed(status: Status) -> Status {
    Status::with_details(status.code(), status.message().to_owned(), status.details().to_vec().into())
}

/// Makes the call `$method` of `$client` on `$upstream` with `$message`.
macro_rules! forward {
    ($upstream:expr, $client:ident, $method:ident, $message:expr) => {{
        let upstream = &$upstream;
        let mut client = $client::new(upstream.channel().await?);
        client
            .$method(upstream.request($message))
            .await
            .map(|reply| Response::new(reply.into_inner()))
            .map_err(relayed)
    }};
}

/// AdminService, forwarded to the order service's admin listener.
#[derive(Debug, Clone)]
pub(crate) struct AdminProxy(pub(crate) Upstream);

#[tonic::async_trait]
impl AdminService for AdminProxy {
    /// The console shows states; it does not hold waits open for a browser.
    async fn await_published(
        &self,
        _: Request<pb::AwaitPublishedRequest>,
    ) -> Result<Response<pb::AwaitPublishedResponse>, Status> {
        Err(Status::unimplemented("the console does not wait: use `idempostctl wait --published`"))
    }

    async fn get_event_timeline(
        &self,
        request: Request<pb::GetEventTimelineRequest>,
    ) -> Result<Response<pb::GetEventTimelineResponse>, Status> {
        forward!(self.0, AdminServiceClient, get_event_timeline, request.into_inner())
    }

    async fn find_by_business_key(
        &self,
        request: Request<pb::FindByBusinessKeyRequest>,
    ) -> Result<Response<pb::FindByBusinessKeyResponse>, Status> {
        forward!(self.0, AdminServiceClient, find_by_business_key, request.into_inner())
    }

    async fn list_order_events(
        &self,
        request: Request<pb::ListOrderEventsRequest>,
    ) -> Result<Response<pb::ListOrderEventsResponse>, Status> {
        forward!(self.0, AdminServiceClient, list_order_events, request.into_inner())
    }

    async fn list_backlog(
        &self,
        request: Request<pb::ListBacklogRequest>,
    ) -> Result<Response<pb::ListBacklogResponse>, Status> {
        forward!(self.0, AdminServiceClient, list_backlog, request.into_inner())
    }

    async fn redrive(
        &self,
        request: Request<pb::RedriveRequest>,
    ) -> Result<Response<pb::RedriveResponse>, Status> {
        let mut ask = request.into_inner();
        ask.requested_by = self.requester(ask.requested_by);
        forward!(self.0, AdminServiceClient, redrive, ask)
    }

    async fn replay(
        &self,
        request: Request<pb::ReplayRequest>,
    ) -> Result<Response<pb::ReplayResponse>, Status> {
        let mut ask = request.into_inner();
        ask.requested_by = self.requester(ask.requested_by);
        forward!(self.0, AdminServiceClient, replay, ask)
    }

    async fn purge(&self, request: Request<pb::PurgeRequest>) -> Result<Response<pb::PurgeResponse>, Status> {
        forward!(self.0, AdminServiceClient, purge, request.into_inner())
    }

    async fn list_audit(
        &self,
        request: Request<pb::ListAuditRequest>,
    ) -> Result<Response<pb::ListAuditResponse>, Status> {
        forward!(self.0, AdminServiceClient, list_audit, request.into_inner())
    }
}

impl AdminProxy {
    /// Who asks for an audited change. With a token the service records its subject. Without one
    /// (`--auth none`, loopback) it needs a name, as `idempostctl redrive --by` gives it: the
    /// same default.
    fn requester(&self, given: String) -> String {
        if self.0.token.is_none() && given.trim().is_empty() {
            return std::env::var("USER").unwrap_or_else(|_| "operator".to_owned());
        }
        given
    }
}

/// ConsumerAdminService, forwarded to the consumer's listener.
#[derive(Debug, Clone)]
pub(crate) struct ConsumerAdminProxy(pub(crate) Upstream);

#[tonic::async_trait]
impl ConsumerAdminService for ConsumerAdminProxy {
    /// The console shows states; it does not hold waits open for a browser.
    async fn await_consumed(
        &self,
        _: Request<pb::AwaitConsumedRequest>,
    ) -> Result<Response<pb::AwaitConsumedResponse>, Status> {
        Err(Status::unimplemented("the console does not wait: use `idempostctl wait --consumed`"))
    }

    async fn get_consumer_timeline(
        &self,
        request: Request<pb::GetConsumerTimelineRequest>,
    ) -> Result<Response<pb::GetConsumerTimelineResponse>, Status> {
        forward!(self.0, ConsumerAdminServiceClient, get_consumer_timeline, request.into_inner())
    }

    async fn list_dead_letters(
        &self,
        request: Request<pb::ListDeadLettersRequest>,
    ) -> Result<Response<pb::ListDeadLettersResponse>, Status> {
        forward!(self.0, ConsumerAdminServiceClient, list_dead_letters, request.into_inner())
    }

    async fn purge_consumed(
        &self,
        request: Request<pb::PurgeConsumedRequest>,
    ) -> Result<Response<pb::PurgeConsumedResponse>, Status> {
        forward!(self.0, ConsumerAdminServiceClient, purge_consumed, request.into_inner())
    }

    async fn list_audit(
        &self,
        request: Request<pb::ConsumerAdminServiceListAuditRequest>,
    ) -> Result<Response<pb::ConsumerAdminServiceListAuditResponse>, Status> {
        forward!(self.0, ConsumerAdminServiceClient, list_audit, request.into_inner())
    }

    async fn list_parked_events(
        &self,
        request: Request<pb::ListParkedEventsRequest>,
    ) -> Result<Response<pb::ListParkedEventsResponse>, Status> {
        forward!(self.0, ConsumerAdminServiceClient, list_parked_events, request.into_inner())
    }

    async fn release_parked_gap(
        &self,
        request: Request<pb::ReleaseParkedGapRequest>,
    ) -> Result<Response<pb::ReleaseParkedGapResponse>, Status> {
        forward!(self.0, ConsumerAdminServiceClient, release_parked_gap, request.into_inner())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_relayed_refusal_keeps_its_code_message_and_reason_but_not_the_services_metadata() {
        let details = ErrorDetails::with_error_info("TOKEN_INVALID", "idempost.v1", []);
        let mut refused = Status::with_error_details(Code::Unauthenticated, "bad token", details);
        refused.metadata_mut().insert("x-served-by", "order-1".parse().unwrap());

        let relayed = relayed(refused);

        assert_eq!((relayed.code(), relayed.message()), (Code::Unauthenticated, "bad token"));
        assert_eq!(relayed.get_details_error_info().unwrap().reason, "TOKEN_INVALID");
        assert!(relayed.metadata().get("x-served-by").is_none());
    }
}
