use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "outbox_event")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub event_id: String,
    pub aggregate_type: String,
    pub aggregate_id: String,
    pub event_type: String,
    pub event_version: i64,
    pub payload: Vec<u8>,
    pub status: String,
    pub lease_owner: Option<String>,
    pub lease_until: Option<DateTimeUtc>,
    pub attempts: i32,
    pub last_error: Option<String>,
    pub created_at: DateTimeUtc,
    pub published_at: Option<DateTimeUtc>,
    pub published_topic: Option<String>,
    pub published_partition: Option<i32>,
    pub published_offset: Option<i64>,
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
    pub redrive_count: i32,
    pub last_redriven_at: Option<DateTimeUtc>,
    pub last_redriven_by: Option<String>,
    pub last_redrive_reason: Option<String>,
    /// TRUE while the version just before this one was known to be unpublished when this row
    /// was written, and that version's mark has not cleared it: the relay's claim skips it
    /// without probing. FALSE only says "may be claimable".
    pub held_back: bool,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
