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

/// The CloudEvents version every record declares (`ce_specversion`, or `specversion` in the
/// structured envelope).
pub const CLOUDEVENTS_SPEC_VERSION: &str = "1.0";

/// `ce_source` of every record: a URI reference naming the order service's events as a whole,
/// stable across deployments, so that (`source`, `id`) is unique as CloudEvents requires.
pub const CLOUDEVENTS_SOURCE: &str = "/idempost/orders";

/// `content-type` of a record in the CloudEvents structured mode: its value is the JSON envelope,
/// whose `data_base64` holds the protobuf payload. A consumer tells the modes apart by this
/// header (its prefix up to `;`), as the Kafka protocol binding prescribes.
pub const CLOUDEVENTS_JSON: &str = "application/cloudevents+json; charset=UTF-8";
