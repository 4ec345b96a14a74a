//! Conversions between the contracts' messages and the domain's types and the stored rows, for
//! every gRPC edge. They live here, beside the types they join, because Rust lets an impl of
//! `From` for two foreign types live only in the crate of one of them: a service crate could not
//! hold them.

use idempost_proto::v1 as pb;

use super::timestamp;
use crate::domain::{CancelReason, InvalidInput, LineItem, Operation, OrderStatus, SubmitOrder};
use crate::entity::{consumed_event, dead_letter, notification_job, orders, outbox_event};
use crate::telemetry;

impl TryFrom<pb::SubmitOrderRequest> for SubmitOrder {
    type Error = InvalidInput;

    fn try_from(request: pb::SubmitOrderRequest) -> Result<Self, Self::Error> {
        let lines = request.line_items.into_iter().map(|l| (l.sku, l.quantity, l.unit_price_minor)).collect();
        SubmitOrder::parse(
            request.tenant_id,
            request.request_id,
            &request.event_id,
            request.customer_id,
            request.currency,
            lines,
        )
    }
}

impl From<&LineItem> for pb::LineItem {
    fn from(line: &LineItem) -> Self {
        Self {
            sku: line.sku.as_str().to_owned(),
            quantity: line.quantity,
            unit_price_minor: line.unit_price_minor,
        }
    }
}

impl From<OrderStatus> for pb::OrderStatus {
    fn from(status: OrderStatus) -> Self {
        match status {
            OrderStatus::Accepted => Self::Accepted,
            OrderStatus::Cancelled => Self::Cancelled,
        }
    }
}

impl From<Operation> for pb::OrderOperation {
    fn from(operation: Operation) -> Self {
        match operation {
            Operation::Submit => Self::Submit,
            Operation::Amend => Self::Amend,
            Operation::Cancel => Self::Cancel,
        }
    }
}

impl From<CancelReason> for pb::CancelReason {
    fn from(reason: CancelReason) -> Self {
        match reason {
            CancelReason::CustomerRequest => Self::CustomerRequest,
            CancelReason::OutOfStock => Self::OutOfStock,
            CancelReason::PaymentFailed => Self::PaymentFailed,
            CancelReason::FraudSuspected => Self::FraudSuspected,
            CancelReason::Other => Self::Other,
        }
    }
}

impl TryFrom<pb::CancelReason> for CancelReason {
    /// `CANCEL_REASON_UNSPECIFIED`.
    type Error = ();

    fn try_from(reason: pb::CancelReason) -> Result<Self, ()> {
        Ok(match reason {
            pb::CancelReason::Unspecified => return Err(()),
            pb::CancelReason::CustomerRequest => Self::CustomerRequest,
            pb::CancelReason::OutOfStock => Self::OutOfStock,
            pb::CancelReason::PaymentFailed => Self::PaymentFailed,
            pb::CancelReason::FraudSuspected => Self::FraudSuspected,
            pb::CancelReason::Other => Self::Other,
        })
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
            trace_id: r.traceparent.as_deref().and_then(telemetry::trace_id_of).unwrap_or_default(),
            event_type: r.event_type,
            payload: r.payload,
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
