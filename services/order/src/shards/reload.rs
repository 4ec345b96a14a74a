//! SIGHUP: the shard map read again, and taken only if every shard of it can be served and no
//! tenant's orders are left behind.

use std::collections::HashMap;
use std::sync::Arc;

use sea_orm::{EntityTrait, QuerySelect};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::{Routing, ShardError, Shards};
use idempost::entity::orders;
use idempost_shard_map::ShardMap;

/// Why a reload was refused; the running map stays.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// The new map, or one of its new shards, cannot be used.
    #[error(transparent)]
    Shard(#[from] ShardError),
    /// A shard keeps its name but not its database or number: its pools and its order ids
    /// would change under running calls.
    #[error("shard {0:?} is redefined (another database or number): restart the service to change a shard")]
    Redefined(String),
    /// A tenant has orders on a shard the new map no longer sends it to: its Reconcile and its
    /// changes would not find them, and a resubmission would make a second order.
    #[error(
        "tenant {tenant} has orders on shard {from:?} but the new map sends it to {to:?}: a tenant \
         moves only once its orders are no longer on the old shard"
    )]
    TenantLeavesOrders {
        /// The tenant.
        tenant: i64,
        /// The shard holding its orders.
        from: String,
        /// Where the new map sends it.
        to: String,
    },
    /// A shard's tenants could not be read, so a move could not be ruled out.
    #[error("cannot read which tenants shard {shard:?} holds: {source}")]
    Unreadable {
        /// The shard.
        shard: String,
        /// Why.
        source: sea_orm::DbErr,
    },
}

impl Shards {
    /// Reads the map file again and serves it, or leaves the running map if any check fails.
    /// Without `--shard-map-file` there is nothing to read.
    pub(crate) async fn reload(&self) -> Result<bool, ReloadError> {
        let Some(path) = &self.opener.map_file else { return Ok(false) };
        let newer = ShardMap::load(path).map_err(ShardError::from)?;
        let running = self.routing();
        if let Some(name) = running.map.redefined_in(&newer).first() {
            return Err(ReloadError::Redefined((*name).to_owned()));
        }
        // New shards are opened before writes are held back, so that only the check waits.
        let mut open = HashMap::new();
        for shard in newer.shards() {
            let pools = match running.open.get(shard.name()) {
                Some(pools) => pools.clone(),
                None => self.opener.open(shard).await?,
            };
            open.insert(shard.name().to_owned(), pools);
        }
        // Waits for the writes in flight to be answered and holds new ones back until the new
        // map is in place (or refused): the tenants checked are all the tenants there will be.
        let _writes = self.writes.write().await;
        let running = self.routing();
        if let Some(name) = running.map.redefined_in(&newer).first() {
            return Err(ReloadError::Redefined((*name).to_owned()));
        }
        no_orders_left_behind(&running, &newer).await?;
        let routing = Arc::new(Routing { map: newer, open });
        *self.current.write().unwrap_or_else(std::sync::PoisonError::into_inner) = routing;
        Ok(true)
    }
}

/// Refuses `newer` if it sends a tenant that has orders on a running shard elsewhere (a tenant
/// moved, a shard removed, or the default changed under unlisted tenants).
async fn no_orders_left_behind(running: &Routing, newer: &ShardMap) -> Result<(), ReloadError> {
    for shard in running.map.shards() {
        let db = running.open[shard.name()].store.db();
        let tenants: Vec<i64> = orders::Entity::find()
            .select_only()
            .column(orders::Column::TenantId)
            .distinct()
            .into_tuple()
            .all(db)
            .await
            .map_err(|source| ReloadError::Unreadable { shard: shard.name().to_owned(), source })?;
        for tenant in tenants {
            let to = newer.shard_for(tenant).name();
            if to != shard.name() {
                let (from, to) = (shard.name().to_owned(), to.to_owned());
                return Err(ReloadError::TenantLeavesOrders { tenant, from, to });
            }
        }
    }
    Ok(())
}

/// Reloads the map on every SIGHUP until `stopped` turns true, logging what came of it. Signals
/// that arrive during a reload are taken once it is done. Listens from this call on (not from
/// the task's first run), so a SIGHUP sent once the service answers calls is never the default
/// action's, which would end the process.
pub(crate) fn watch_hangup(shards: Shards, stopped: watch::Receiver<bool>) -> JoinHandle<()> {
    idempost::hangup::every_hangup("the shard map", stopped, move || {
        let shards = shards.clone();
        async move { reload_logged(&shards).await }
    })
}

async fn reload_logged(shards: &Shards) {
    match shards.reload().await {
        Ok(true) => tracing::info!(shards = shards.all().len(), "SIGHUP: shard map reloaded"),
        Ok(false) => {}
        Err(e) => {
            tracing::error!(error = %e, "SIGHUP: the shard map was not reloaded; the running map stays")
        }
    }
}
