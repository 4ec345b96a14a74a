//! Read-only queries behind the order side's timeline: the order database only.

use std::collections::HashMap;

use sea_orm::{
    ColumnTrait, DatabaseConnection, DbErr, EntityTrait, PaginatorTrait, QueryFilter, QueryOrder, QuerySelect,
};

use idempost::entity::{order_version, orders, outbox_event};

/// The most versions of its order an event's timeline holds: the latest ones. Older ones are
/// paged with ListOrderEvents, so that an order amended many thousand times answers in bounded
/// size and binds a bounded number of event ids in the outbox read.
pub(crate) const TIMELINE_VERSIONS: u64 = 100;

/// What the order database holds for one event.
#[derive(Debug, Clone)]
pub(crate) struct Timeline {
    pub(crate) event_id: String,
    pub(crate) order: Option<orders::Model>,
    pub(crate) outbox: Option<outbox_event::Model>,
    /// The latest [`TIMELINE_VERSIONS`] versions of the event's order, oldest first.
    pub(crate) order_events: OrderEvents,
}

/// A page of an order's versions.
#[derive(Debug, Clone, Default)]
pub(crate) struct OrderEvents {
    /// Oldest first.
    pub(crate) events: Vec<OrderEvent>,
    /// How many versions the order has recorded.
    pub(crate) total: u64,
    /// The version below which the next (older) page starts; 0 when this page holds the oldest.
    pub(crate) next_before_version: i64,
}

/// One version of an order: the operation that made it and its event's outbox row, if retention
/// has not purged it.
#[derive(Debug, Clone)]
pub(crate) struct OrderEvent {
    pub(crate) version: order_version::Model,
    /// The outbox row's `event_type` and `status`.
    pub(crate) outbox: Option<(String, String)>,
}

impl Timeline {
    /// Neither table knows the event.
    pub(crate) fn is_empty(&self) -> bool {
        self.order.is_none() && self.outbox.is_none()
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Inspector {
    db: DatabaseConnection,
}

impl Inspector {
    pub(crate) fn new(db: DatabaseConnection) -> Self {
        Self { db }
    }

    pub(crate) fn db(&self) -> &DatabaseConnection {
        &self.db
    }

    /// The event's timeline; empty when no table knows it. Every event of an order (its
    /// acceptance, amendments, cancellation) has its `order_version` row, which names the order.
    pub(crate) async fn timeline(&self, event_id: &str) -> Result<Timeline, DbErr> {
        let version = order_version::Entity::find()
            .filter(order_version::Column::EventId.eq(event_id))
            .one(&self.db)
            .await?;
        let order = match &version {
            Some(version) => self.order(version.order_id).await?,
            // Accepted by an order service older than `order_version` (a rolling upgrade).
            None => {
                orders::Entity::find()
                    .filter(orders::Column::AcceptanceEventId.eq(event_id))
                    .one(&self.db)
                    .await?
            }
        };
        let outbox = outbox_event::Entity::find_by_id(event_id.to_owned()).one(&self.db).await?;
        let order_events = match &order {
            Some(order) => self.order_events(order.id, 0, TIMELINE_VERSIONS).await?,
            None => OrderEvents::default(),
        };
        Ok(Timeline { event_id: event_id.to_owned(), order, outbox, order_events })
    }

    /// The order row, if there is one.
    pub(crate) async fn order(&self, order_id: i64) -> Result<Option<orders::Model>, DbErr> {
        orders::Entity::find_by_id(order_id).one(&self.db).await
    }

    /// The latest `limit` versions of the order below `before_version` (0: from the latest),
    /// oldest first, each with its event's outbox type and status, and the order's count of
    /// versions: one read of at most `limit + 1` of the order's `order_version` rows (its primary
    /// key, newest first), one count on that key, and one read of their outbox rows by event id
    /// (at most `limit` ids).
    pub(crate) async fn order_events(
        &self,
        order_id: i64,
        before_version: i64,
        limit: u64,
    ) -> Result<OrderEvents, DbErr> {
        let of_order = || order_version::Entity::find().filter(order_version::Column::OrderId.eq(order_id));
        let mut query = of_order();
        if before_version > 0 {
            query = query.filter(order_version::Column::Version.lt(before_version));
        }
        let mut versions =
            query.order_by_desc(order_version::Column::Version).limit(limit + 1).all(&self.db).await?;
        let older = versions.len() as u64 > limit;
        versions.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
        versions.reverse();
        let next_before_version = if older { versions.first().map_or(0, |v| v.version) } else { 0 };
        let total = of_order().count(&self.db).await?;
        let mut outbox: HashMap<String, (String, String)> = outbox_event::Entity::find()
            .select_only()
            .column(outbox_event::Column::EventId)
            .column(outbox_event::Column::EventType)
            .column(outbox_event::Column::Status)
            .filter(outbox_event::Column::EventId.is_in(versions.iter().map(|v| v.event_id.clone())))
            .into_tuple::<(String, String, String)>()
            .all(&self.db)
            .await?
            .into_iter()
            .map(|(event_id, event_type, status)| (event_id, (event_type, status)))
            .collect();
        let events = versions
            .into_iter()
            .map(|version| OrderEvent { outbox: outbox.remove(&version.event_id), version })
            .collect();
        Ok(OrderEvents { events, total, next_before_version })
    }

    /// The timeline of the event committed under `(tenant_id, request_id)` (a submission,
    /// amendment or cancellation), if one committed.
    pub(crate) async fn find(&self, tenant_id: i64, request_id: &str) -> Result<Option<Timeline>, DbErr> {
        let version = order_version::Entity::find()
            .filter(order_version::Column::TenantId.eq(tenant_id))
            .filter(order_version::Column::RequestId.eq(request_id))
            .one(&self.db)
            .await?;
        match version {
            Some(version) => Ok(Some(self.timeline(&version.event_id).await?)),
            None => Ok(None),
        }
    }
}
