use sea_orm::entity::prelude::*;

/// An operator's release of an order's gap in one consumer's read model: who, why, and which
/// versions were given up.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "gap_release")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub consumer_name: String,
    pub order_id: i64,
    pub from_version: i64,
    pub to_version: i64,
    pub released_by: String,
    pub reason: String,
    pub released_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
