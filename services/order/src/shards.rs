//! The order service over a shard map: each tenant's calls go to the database of its shard
//! (`--shard-map-file`; without it, `--database-url` is the one shard every tenant is on).
//!
//! Every shard's pool is opened at start-up, and a shard added by a reload before the new map
//! takes over: a shard that is misconfigured, unmigrated or has order ids outside its block is
//! found then, by the operator who changed the map, not by a tenant's first call. Each shard's
//! pool has `--db-max-connections` (and group commit its own writers), as one database had.
//!
//! SIGHUP rereads the map ([`Shards::reload`]). A reload is all or nothing: a map that cannot be
//! used, a shard that cannot be opened, a shard redefined (another database or number under the
//! same name), or a tenant whose orders would be left behind on a shard the new map no longer
//! sends it to, and the running map stays as it was, with the reason logged.

mod claimable;
mod health;
mod reload;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use idempost::service::{self, ReadyError};
use idempost_migration::order_ids::OrderIds;
use idempost_shard_map::{Database, Shard, ShardMap, ShardMapError};
use sea_orm::DatabaseConnection;

use super::group::{BatchStats, GroupCommitSettings};
use super::settings::Settings;
use super::store::OrderStore;

pub(crate) use claimable::watch as report_claimable;
pub(crate) use health::watch as watch_health;
pub use reload::ReloadError;
pub(crate) use reload::watch_hangup;

/// The shards the service can not start on.
#[derive(Debug, thiserror::Error)]
pub enum ShardError {
    /// The map cannot be used, or a shard's URL file cannot be read.
    #[error(transparent)]
    Map(#[from] ShardMapError),
    /// A shard's database is not reachable or not migrated.
    #[error("{}{source}", shard.as_ref().map(|s| format!("shard {s:?}: ")).unwrap_or_default())]
    Ready {
        /// The shard; `None` without a map, whose one database's errors read as they always did.
        shard: Option<String>,
        /// Why.
        source: ReadyError,
    },
    /// A shard hands out, or holds, order ids outside its block.
    #[error("shard {shard:?}: {why}")]
    OrderIds {
        /// The shard.
        shard: String,
        /// Why.
        why: String,
    },
}

/// The open shards and the map that routes tenants to them; clones share them, and a reload
/// swaps both at once for every clone.
#[derive(Debug, Clone)]
pub(crate) struct Shards {
    current: Arc<RwLock<Arc<Routing>>>,
    /// Held shared by every write from routing to answer, and exclusively by a reload while it
    /// checks that no tenant leaves orders behind and swaps the map: no write routed by the old
    /// map can commit after that check.
    writes: Arc<tokio::sync::RwLock<()>>,
    opener: Arc<Opener>,
}

/// A write's shard, and its share of [`Shards::writes`] until it is dropped.
#[derive(Debug)]
pub(crate) struct Routed {
    pub(crate) store: OrderStore,
    _write: tokio::sync::OwnedRwLockReadGuard<()>,
}

/// One map and a pool for each of its shards.
#[derive(Debug)]
struct Routing {
    map: ShardMap,
    open: HashMap<String, OpenShard>,
}

/// One shard's pools.
#[derive(Debug, Clone)]
pub(crate) struct OpenShard {
    pub(crate) store: OrderStore,
    /// Health's own connection, as one database had.
    pub(crate) health_db: DatabaseConnection,
}

/// How a shard is opened: what the settings say besides the map.
#[derive(Debug)]
struct Opener {
    map_file: Option<PathBuf>,
    max_connections: u32,
    group_commit: GroupCommitSettings,
    batches: BatchStats,
}

impl Shards {
    /// Reads the map (or takes `--database-url` as the one shard) and opens every shard.
    pub(crate) async fn open(settings: &Settings, batches: BatchStats) -> Result<Self, ShardError> {
        let map = match &settings.shard_map_file {
            Some(path) => ShardMap::load(path)?,
            None => ShardMap::single(Database::Url(settings.database.url.clone())),
        };
        let opener = Opener {
            map_file: settings.shard_map_file.clone(),
            max_connections: settings.db_max_connections,
            group_commit: settings.group_commit.clone(),
            batches,
        };
        let mut open = HashMap::new();
        for shard in map.shards() {
            open.insert(shard.name().to_owned(), opener.open(shard).await?);
        }
        let routing = Arc::new(Routing { map, open });
        let writes = Arc::new(tokio::sync::RwLock::new(()));
        Ok(Self { current: Arc::new(RwLock::new(routing)), writes, opener: Arc::new(opener) })
    }

    /// The store of `tenant`'s shard for a write (SubmitOrder, AmendOrder, CancelOrder): keep
    /// it until the write is answered.
    pub(crate) async fn route_write(&self, tenant: i64) -> Routed {
        let write = Arc::clone(&self.writes).read_owned().await;
        Routed { store: self.store_for(tenant), _write: write }
    }

    /// The store of `tenant`'s shard, for a read.
    pub(crate) fn store_for(&self, tenant: i64) -> OrderStore {
        let routing = self.routing();
        routing.open[routing.map.shard_for(tenant).name()].store.clone()
    }

    /// Every shard's name and pools, in the map's order.
    pub(crate) fn all(&self) -> Vec<(String, OpenShard)> {
        let routing = self.routing();
        routing.map.shards().iter().map(|s| (s.name().to_owned(), routing.open[s.name()].clone())).collect()
    }

    /// The database of `tenant`'s shard.
    pub(crate) fn tenant_db(&self, tenant: i64) -> DatabaseConnection {
        self.store_for(tenant).db().clone()
    }

    /// The database of the default shard (the one database, without a map).
    pub(crate) fn default_db(&self) -> DatabaseConnection {
        let routing = self.routing();
        routing.open[routing.map.default_shard().name()].store.db().clone()
    }

    /// The database of the shard that made `order_id`, if any shard's block holds it.
    pub(crate) fn order_db(&self, order_id: i64) -> Option<DatabaseConnection> {
        let routing = self.routing();
        let shard = routing.map.shard_of_order(order_id)?;
        Some(routing.open[shard.name()].store.db().clone())
    }

    /// The database of the shard named `name`.
    pub(crate) fn named_db(&self, name: &str) -> Option<DatabaseConnection> {
        self.routing().open.get(name).map(|shard| shard.store.db().clone())
    }

    /// Every shard's number and database, in the map's order.
    pub(crate) fn numbered_dbs(&self) -> Vec<(u32, DatabaseConnection)> {
        let routing = self.routing();
        let db = |shard: &Shard| routing.open[shard.name()].store.db().clone();
        routing.map.shards().iter().map(|shard| (shard.number(), db(shard))).collect()
    }

    /// Every shard's database, in the map's order.
    pub(crate) fn dbs(&self) -> Vec<DatabaseConnection> {
        self.all().into_iter().map(|(_, shard)| shard.store.db().clone()).collect()
    }

    /// The attributes of shard `name`'s values in a metric: `idempost.shard` with a map, none
    /// without one (a single database's series stay as they were).
    pub(crate) fn attributes_of(&self, name: &str) -> Vec<opentelemetry::KeyValue> {
        let mapped = self.opener.map_file.is_some();
        mapped.then(|| opentelemetry::KeyValue::new("idempost.shard", name.to_owned())).into_iter().collect()
    }

    fn routing(&self) -> Arc<Routing> {
        Arc::clone(&self.current.read().unwrap_or_else(std::sync::PoisonError::into_inner))
    }
}

/// Reloads the shard map on demand, as SIGHUP does: for a program that embeds the service.
#[derive(Debug, Clone)]
pub struct ShardMapReload(pub(crate) Shards);

impl ShardMapReload {
    /// Rereads `--shard-map-file` and serves it, or keeps the running map and says why. `false`
    /// without a map file: there is nothing to reread.
    pub async fn reload(&self) -> Result<bool, ReloadError> {
        self.0.reload().await
    }
}

impl Opener {
    /// Connects to `shard`, checks it is migrated and that its order ids are in its block.
    async fn open(&self, shard: &Shard) -> Result<OpenShard, ShardError> {
        let named = self.map_file.is_some().then(|| shard.name().to_owned());
        let ready = |source| ShardError::Ready { shard: named.clone(), source };
        let url = shard.url()?;
        let db = service::open_database(&url, self.max_connections).await.map_err(ready)?;
        let health_db = service::open_health_connection(&url).await.map_err(ready)?;
        let ids = OrderIds::read(&db).await.map_err(|e| ready(ReadyError::Database(e)))?;
        if let Some(why) = ids.outside(&shard.order_ids()) {
            return Err(ShardError::OrderIds { shard: shard.name().to_owned(), why });
        }
        let store = OrderStore::with_settings(db, &self.group_commit, self.batches.clone());
        Ok(OpenShard { store, health_db })
    }
}
