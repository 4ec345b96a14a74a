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
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
