use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "consumed_event")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub consumer_name: String,
    pub event_id: String,
    pub consumed_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
