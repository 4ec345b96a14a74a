use sea_orm::entity::prelude::*;

/// One operator's write (a redrive, a purge, a replay, a gap's release), recorded in the
/// transaction that made it: who, what, why, when, the call's trace, what came of it.
/// Append-only.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "admin_audit")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub recorded_at: DateTimeUtc,
    pub actor: String,
    pub action: String,
    pub event_id: Option<String>,
    pub order_id: Option<i64>,
    pub consumer_name: Option<String>,
    pub reason: String,
    pub trace_id: Option<String>,
    pub outcome: String,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
