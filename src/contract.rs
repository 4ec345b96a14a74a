//! The event's contract, which the order service writes, the relay publishes and the consumer
//! reads: its topic, type, aggregate and content type; and the datagram that wakes an idle
//! relay. One place, so that no service takes these from another. (The error domain statuses
//! carry is the gRPC contract's: `idempost_proto`.)

/// The Kafka topic OrderAccepted events go to (and the consumer reads) unless configured
/// otherwise.
pub const DEFAULT_TOPIC: &str = "idempost.order-accepted.v1";

/// `outbox_event.event_type` and the Kafka `event_type` header: the protobuf message's full name.
pub const EVENT_TYPE: &str = "idempost.v1.OrderAccepted";

/// `event_type` of the event an AmendOrder commits.
pub const ORDER_AMENDED_EVENT_TYPE: &str = "idempost.v1.OrderAmended";

/// `event_type` of the event a CancelOrder commits.
pub const ORDER_CANCELLED_EVENT_TYPE: &str = "idempost.v1.OrderCancelled";

/// `outbox_event.aggregate_type` for orders.
pub const AGGREGATE_TYPE: &str = "order";

/// `content-type` header of every record: the value is a protobuf message named by `event_type`.
pub const CONTENT_TYPE: &str = "application/x-protobuf";

/// The one datagram an idle relay's wake-up port (`--wake-listen`) answers: it ends the relay's
/// idle wait early and decides nothing else. Anything else arriving there is ignored.
pub const WAKE_DATAGRAM: &[u8] = b"idempost.wake.v1";
