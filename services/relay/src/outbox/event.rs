//! What the relay holds of an event it claimed, and what a mark or release of it answers.

use chrono::{DateTime, Utc};

use crate::lease::LeaseToken;

/// An event this worker holds the lease on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimedEvent {
    /// The event's stable id.
    pub event_id: String,
    /// `order` for OrderAccepted.
    pub(crate) aggregate_type: String,
    /// The order id: the Kafka record key, so one order's events stay in order.
    pub(crate) aggregate_id: String,
    /// The protobuf message name of the payload.
    pub(crate) event_type: String,
    /// The version of the aggregate's facts the event describes.
    pub(crate) event_version: i64,
    /// The encoded event, published verbatim.
    pub(crate) payload: Vec<u8>,
    /// Claims so far, this one included.
    pub attempts: i32,
    /// When this claim's lease ends, by the database clock.
    pub lease_until: DateTime<Utc>,
    /// This claim's fence: every mark or release of the event carries it.
    pub lease_token: LeaseToken,
    /// When the order service wrote the event.
    pub(crate) created_at: DateTime<Utc>,
    /// The W3C `traceparent` of the SubmitOrder that wrote the event, if it was traced.
    pub(crate) traceparent: Option<String>,
    /// The W3C `tracestate` that goes with it.
    pub(crate) tracestate: Option<String>,
}

/// Where the broker put a confirmed record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The record's offset in the partition.
    pub offset: i64,
}

/// The result of an owner-fenced update.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fenced<T> {
    /// The claim still held the lease; the update happened.
    Done(T),
    /// Another claim holds the lease now (or the row left PUBLISHING): nothing was changed.
    LeaseLost,
}
