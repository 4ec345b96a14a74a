use sea_orm::entity::prelude::*;

/// An event one consumer recorded (dedup row committed) but could not apply yet: its version
/// skips ahead of the read model, or its type is unknown to this consumer.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "parked_event")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub consumer_name: String,
    #[sea_orm(primary_key, auto_increment = false)]
    pub event_id: String,
    pub order_id: i64,
    pub version: i64,
    pub event_type: String,
    pub payload: Vec<u8>,
    pub reason: String,
    pub parked_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
