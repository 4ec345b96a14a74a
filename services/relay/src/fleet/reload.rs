//! SIGHUP: the shard map read again, and taken only if every shard of it can be owned. All or
//! nothing, as the order service's reload: a refused map leaves the running one.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::ownership::Membership;
use super::{FleetError, check_numbers};
use idempost_shard_map::ShardMap;

/// Why a reload was refused.
#[derive(Debug, thiserror::Error)]
enum ReloadError {
    /// The new map, or a shard number without a partition.
    #[error(transparent)]
    Fleet(#[from] FleetError),
    /// A shard keeps its name but not its database or number.
    #[error("shard {0:?} is redefined (another database or number): restart the relays to change a shard")]
    Redefined(String),
}

/// Reloads the map on every SIGHUP until `stop`, publishing a map that passed on `map`.
/// Listens from this call on, so a SIGHUP sent once the relay runs is always taken.
pub(super) fn watch_hangup(
    path: PathBuf,
    membership: Membership,
    map: watch::Sender<Arc<ShardMap>>,
    stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let fleet = Arc::new((path, membership, map));
    idempost::hangup::every_hangup("the shard map", stop, move || {
        let fleet = Arc::clone(&fleet);
        async move {
            let (path, membership, map) = &*fleet;
            match reload(path, membership, map).await {
                Ok(shards) => tracing::info!(shards, "SIGHUP: shard map reloaded"),
                Err(e) => {
                    tracing::error!(error = %e, "SIGHUP: the shard map was not reloaded; the running map stays")
                }
            }
        }
    })
}

/// Reads the map at `path` and publishes it if it passes; answers its number of shards.
async fn reload(
    path: &Path,
    membership: &Membership,
    map: &watch::Sender<Arc<ShardMap>>,
) -> Result<usize, ReloadError> {
    let newer = ShardMap::load(path).map_err(FleetError::from)?;
    if let Some(name) = map.borrow().redefined_in(&newer).first() {
        return Err(ReloadError::Redefined((*name).to_owned()));
    }
    check_numbers(&newer, membership).await?;
    let shards = newer.shards().len();
    map.send_replace(Arc::new(newer));
    Ok(shards)
}
