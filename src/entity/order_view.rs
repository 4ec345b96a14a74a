use sea_orm::entity::prelude::*;

/// One consumer's read model of one order: the state after the last version it applied.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "order_view")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub consumer_name: String,
    #[sea_orm(primary_key, auto_increment = false)]
    pub order_id: i64,
    pub tenant_id: i64,
    pub version: i64,
    pub status: String,
    pub total_minor: i64,
    pub last_event_id: String,
    pub updated_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
