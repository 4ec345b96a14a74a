//! The audit listing's two request/response pairs. Each admin service has a ListAudit of its own
//! types (buf's rule: one request and one response type per RPC, so either can change alone), with
//! the same fields; servers and tools share one implementation over AdminService's pair and convert
//! at the consumer's edge.

use crate::v1::{
    ConsumerAdminServiceListAuditRequest, ConsumerAdminServiceListAuditResponse, ListAuditRequest,
    ListAuditResponse,
};

impl From<ConsumerAdminServiceListAuditRequest> for ListAuditRequest {
    fn from(ask: ConsumerAdminServiceListAuditRequest) -> Self {
        let ConsumerAdminServiceListAuditRequest { limit, before_id, action, order_id, event_id } = ask;
        Self { limit, before_id, action, order_id, event_id, page_token: String::new() }
    }
}

impl From<ListAuditRequest> for ConsumerAdminServiceListAuditRequest {
    fn from(ask: ListAuditRequest) -> Self {
        // The consumer has one database: `before_id` is its whole position, and a page token is
        // the order service's (the consumer's own request has no field for one).
        let ListAuditRequest { limit, before_id, action, order_id, event_id, page_token: _ } = ask;
        Self { limit, before_id, action, order_id, event_id }
    }
}

impl From<ConsumerAdminServiceListAuditResponse> for ListAuditResponse {
    fn from(page: ConsumerAdminServiceListAuditResponse) -> Self {
        let ConsumerAdminServiceListAuditResponse { records, next_before_id } = page;
        Self { records, next_before_id, next_page_token: String::new() }
    }
}

impl From<ListAuditResponse> for ConsumerAdminServiceListAuditResponse {
    fn from(page: ListAuditResponse) -> Self {
        let ListAuditResponse { records, next_before_id, next_page_token: _ } = page;
        Self { records, next_before_id }
    }
}
