use sea_orm::entity::prelude::*;

/// One consumer's effect of one event: keyed like `consumed_event`, by (consumer_name, event_id).
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "notification_job")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub consumer_name: String,
    #[sea_orm(primary_key, auto_increment = false)]
    pub event_id: String,
    pub order_id: i64,
    pub source_version: i64,
    pub status: String,
    pub created_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
