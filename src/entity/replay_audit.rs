use sea_orm::entity::prelude::*;

/// An operator's replay of PUBLISHED outbox rows: who, when, why, the filter, and how many
/// events went back to PENDING. Append-only.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "replay_audit")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub requested_by: String,
    pub reason: String,
    pub order_id: Option<i64>,
    pub created_from: Option<DateTimeUtc>,
    pub created_to: Option<DateTimeUtc>,
    pub event_type: Option<String>,
    pub replayed: i64,
    pub not_published: i64,
    pub purged: i64,
    pub replayed_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
