//! `idempost-relay redrive`: the operator's way out of FAILED, on the one `--database-url`, or
//! with `--shard-map-file` on the shard of the map that holds the event.
//!
//! An operator knows the event's id, not its shard; event ids are UUIDv7, unique across shards,
//! so every shard is asked and the one that holds the event is the one to redrive on. Every
//! shard is asked before anything changes: a shard that cannot be asked may be the one holding
//! it, and an id found on two shards (a database restored into another) is refused rather than
//! redriven twice.

use idempost::backlog::{self, Redrive, RedriveAudit};
use idempost::entity::outbox_event;
use idempost::service;
use idempost_shard_map::{Shard, ShardMap, ShardMapError};
use sea_orm::{DatabaseConnection, EntityTrait as _};

use super::application::{self, StartupError};
use super::settings::Settings;

/// What a redrive found, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redriven {
    /// What became of the event.
    pub outcome: Redrive,
    /// The shard that holds it, with `--shard-map-file`; `None` with one database, or when no
    /// shard holds it.
    pub shard: Option<String>,
}

/// A redrive that could not be done, or not safely.
#[derive(Debug, thiserror::Error)]
pub enum RedriveError {
    /// The one database (`--database-url`) is not ready.
    #[error(transparent)]
    Database(#[from] StartupError),
    /// The shard map cannot be used.
    #[error(transparent)]
    Map(#[from] ShardMapError),
    /// A shard could not be asked whether it holds the event, so it may be the one.
    #[error(
        "cannot look for {event_id} on shard {shard:?}: {reason}; nothing was redriven (it may be on that \
         shard: redrive it there with that shard's --database-url)"
    )]
    Unasked {
        /// The event.
        event_id: String,
        /// The shard.
        shard: String,
        /// Why.
        reason: String,
    },
    /// More than one shard holds the event.
    #[error("{event_id} is on shards {}: nothing was redriven", shards.join(", "))]
    OnSeveralShards {
        /// The event.
        event_id: String,
        /// The shards holding it.
        shards: Vec<String>,
    },
    /// The redrive on the shard holding the event failed.
    #[error("the redrive of {event_id} on shard {shard:?} failed: {reason}")]
    Failed {
        /// The event.
        event_id: String,
        /// The shard.
        shard: String,
        /// Why.
        reason: String,
    },
}

/// Returns a FAILED event to PENDING, audited with `audit`: on the one database, or on the shard
/// of the map that holds it.
pub async fn redrive(
    settings: &Settings,
    event_id: &str,
    audit: &RedriveAudit,
) -> Result<Redriven, RedriveError> {
    let Some(map_file) = &settings.shard_map_file else {
        let outcome = application::redrive(settings, event_id, audit).await?;
        return Ok(Redriven { outcome, shard: None });
    };
    let map = ShardMap::load(map_file)?;
    // Asked together: a shard that does not answer costs its own connect timeout, not one per shard.
    let looked = futures::future::join_all(map.shards().iter().map(|shard| holds(shard, event_id))).await;
    let mut holding = Vec::new();
    for (shard, found) in map.shards().iter().zip(looked) {
        let unasked = |reason| RedriveError::Unasked {
            event_id: event_id.to_owned(),
            shard: shard.name().to_owned(),
            reason,
        };
        if let Some(db) = found.map_err(unasked)? {
            holding.push((shard.name().to_owned(), db));
        }
    }
    if holding.len() > 1 {
        let shards = holding.into_iter().map(|(name, _)| name).collect();
        return Err(RedriveError::OnSeveralShards { event_id: event_id.to_owned(), shards });
    }
    let Some((shard, db)) = holding.pop() else {
        return Ok(Redriven { outcome: Redrive::NotFound, shard: None });
    };
    let outcome = backlog::redrive(&db, event_id, audit).await.map_err(|e| RedriveError::Failed {
        event_id: event_id.to_owned(),
        shard: shard.clone(),
        reason: e.to_string(),
    })?;
    Ok(Redriven { outcome, shard: Some(shard) })
}

/// The shard's database when it holds `event_id`, `None` when it does not.
async fn holds(shard: &Shard, event_id: &str) -> Result<Option<DatabaseConnection>, String> {
    let url = shard.url().map_err(|e| e.to_string())?;
    let db = service::open_database(&url, 1).await.map_err(|e| e.to_string())?;
    let found =
        outbox_event::Entity::find_by_id(event_id.to_owned()).one(&db).await.map_err(|e| e.to_string())?;
    Ok(found.map(|_| db))
}
