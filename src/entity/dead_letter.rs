use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "dead_letter")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub consumer_name: String,
    pub topic: String,
    pub partition_id: i32,
    pub offset_id: i64,
    pub record_key: Option<Vec<u8>>,
    pub payload: Vec<u8>,
    pub event_id: Option<String>,
    pub error: String,
    pub created_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
