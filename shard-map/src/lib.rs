//! The shard map: which database (shard) holds each tenant's orders.
//!
//! A deployment that outgrows one database server splits its tenants over several databases.
//! The map is a JSON file (`--shard-map-file`) that names every shard, says where its database
//! is, lists the tenants it holds, and names the shard every other tenant goes to:
//!
//! ```json
//! {
//!   "default": "eu-1",
//!   "shards": [
//!     { "name": "eu-1", "number": 0, "database_url_file": "/run/secrets/eu-1-url" },
//!     { "name": "eu-2", "number": 1, "database_url_file": "/run/secrets/eu-2-url", "tenants": [42, 43] }
//!   ]
//! }
//! ```
//!
//! JSON because serde_json is already what the library reads and writes, so reading the map adds
//! no crate; and tenants are listed under their shard (not shard names under tenants) so that a
//! tenant can never name a shard that does not exist, and a tenant listed twice is found rather
//! than the last entry silently winning, as it would in a JSON object keyed by tenant.
//!
//! A shard's `number` gives it its own block of order ids (see [`Shard::order_ids`]): order ids
//! are the databases' auto-increment keys, and the topic is keyed by order id, so two shards
//! counting from 1 would publish different orders under one key.
//!
//! This crate is pure logic (no database, no I/O but reading the files it is pointed at), shared
//! by the services and `idempost-migrate`, which cannot depend on the `idempost` library.

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::path::{Path, PathBuf};

mod file;

/// Bits of an order id below the shard's number: each shard has 2^40 (about 10^12) order ids.
const ORDER_ID_BITS: u32 = 40;

/// The largest shard number: its ids stay below 2^53, so they survive a JSON number in a
/// JavaScript client.
pub const MAX_SHARD_NUMBER: u32 = (1 << (53 - ORDER_ID_BITS)) - 1;

/// The shard a map without `--shard-map-file` has: today's one `--database-url`.
pub const SINGLE_SHARD: &str = "default";

/// A checked shard map: every tenant maps to exactly one shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardMap {
    shards: Vec<Shard>,
    default: usize,
    tenants: HashMap<i64, usize>,
}

/// One shard: a database of the full schema holding some tenants' orders.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shard {
    name: String,
    number: u32,
    database: Database,
}

/// Where a shard's database is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Database {
    /// A URL without a password, given in the map itself.
    Url(String),
    /// A file holding the URL (a mounted secret): the only way to give a password.
    UrlFile(PathBuf),
}

/// The shard map cannot be used. Messages never hold a database URL.
#[derive(Debug, thiserror::Error)]
pub enum ShardMapError {
    /// The map file cannot be read.
    #[error("cannot read the shard map {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The map is not JSON of the expected shape.
    #[error("the shard map is not valid: {0}")]
    Syntax(String),
    /// The map names no shard.
    #[error("the shard map names no shard")]
    NoShards,
    /// A shard has an empty name.
    #[error("shard {0} of the map has an empty name")]
    EmptyName(usize),
    /// Two shards have one name.
    #[error("two shards are named {0:?}")]
    DuplicateName(String),
    /// Two shards have one number, so they would share order ids.
    #[error(
        "shards {first:?} and {second:?} both have number {number}: each needs its own (its block of order ids)"
    )]
    DuplicateNumber {
        /// The number.
        number: u32,
        /// The first shard with it.
        first: String,
        /// The second.
        second: String,
    },
    /// A shard's number is past [`MAX_SHARD_NUMBER`].
    #[error("shard {name:?} has number {number}; numbers run from 0 to {MAX_SHARD_NUMBER}")]
    NumberTooLarge {
        /// The shard.
        name: String,
        /// Its number.
        number: u32,
    },
    /// `default` names no shard of the map.
    #[error("the default shard {0:?} is not one of the map's shards")]
    UnknownDefault(String),
    /// A tenant is listed under two shards.
    #[error("tenant {tenant} is listed under two shards, {first:?} and {second:?}")]
    TenantOnTwoShards {
        /// The tenant.
        tenant: i64,
        /// The first shard listing it.
        first: String,
        /// The second.
        second: String,
    },
    /// A tenant id is not positive.
    #[error("shard {shard:?} lists tenant {tenant}; tenant ids are greater than zero")]
    InvalidTenant {
        /// The shard.
        shard: String,
        /// The tenant id.
        tenant: i64,
    },
    /// A shard gives both or neither of `database_url` and `database_url_file`.
    #[error("shard {0:?} needs exactly one of database_url and database_url_file")]
    DatabaseForms(String),
    /// A shard's inline URL holds a password: the map is read by whoever can read its file.
    #[error(
        "shard {0:?}: its database_url holds a password; put the URL in a file named by database_url_file"
    )]
    PasswordInline(String),
    /// A shard's URL file cannot be read or is empty.
    #[error("shard {shard:?}: cannot read database_url_file {path}: {why}")]
    UrlFile {
        /// The shard.
        shard: String,
        /// The file.
        path: PathBuf,
        /// Why (never the file's contents).
        why: String,
    },
}

impl ShardMap {
    /// Reads and checks the map at `path`. A relative `database_url_file` is taken relative to
    /// the map's own directory, where a deployment mounts the two together.
    pub fn load(path: &Path) -> Result<Self, ShardMapError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ShardMapError::Read { path: path.to_owned(), source })?;
        let mut map = Self::parse(&text)?;
        let dir = path.parent().unwrap_or(Path::new(""));
        for shard in &mut map.shards {
            if let Database::UrlFile(file) = &mut shard.database {
                *file = dir.join(&*file);
            }
        }
        Ok(map)
    }

    /// Parses and checks a map's text.
    pub fn parse(text: &str) -> Result<Self, ShardMapError> {
        file::parse(text)
    }

    /// Today's deployment: one database, which holds every tenant, as shard number 0 (so its
    /// order ids are the ones it has always had).
    pub fn single(database: Database) -> Self {
        let shard = Shard { name: SINGLE_SHARD.to_owned(), number: 0, database };
        Self { shards: vec![shard], default: 0, tenants: HashMap::new() }
    }

    /// The shard holding `tenant`'s orders: the one that lists it, or the default.
    pub fn shard_for(&self, tenant: i64) -> &Shard {
        &self.shards[self.tenants.get(&tenant).copied().unwrap_or(self.default)]
    }

    /// Every shard, in the map's order.
    pub fn shards(&self) -> &[Shard] {
        &self.shards
    }

    /// The shard named `name`.
    pub fn get(&self, name: &str) -> Option<&Shard> {
        self.shards.iter().find(|s| s.name == name)
    }

    /// The shard whose block holds `order_id`: the only one that can have made it.
    pub fn shard_of_order(&self, order_id: i64) -> Option<&Shard> {
        self.shards.iter().find(|s| s.order_ids().contains(&order_id))
    }

    /// The shard of every tenant the map does not list.
    pub fn default_shard(&self) -> &Shard {
        &self.shards[self.default]
    }

    /// The shards of `self` whose name `newer` still has but with another database or number:
    /// a shard's identity, which a running service cannot swap under its callers.
    pub fn redefined_in<'a>(&'a self, newer: &ShardMap) -> Vec<&'a str> {
        self.shards
            .iter()
            .filter(|old| newer.get(&old.name).is_some_and(|new| new != *old))
            .map(|old| old.name.as_str())
            .collect()
    }

    fn check(self) -> Result<Self, ShardMapError> {
        let mut names = HashSet::new();
        let mut numbers: HashMap<u32, &str> = HashMap::new();
        for shard in &self.shards {
            if !names.insert(shard.name.as_str()) {
                return Err(ShardMapError::DuplicateName(shard.name.clone()));
            }
            if let Some(first) = numbers.insert(shard.number, &shard.name) {
                return Err(ShardMapError::DuplicateNumber {
                    number: shard.number,
                    first: first.to_owned(),
                    second: shard.name.clone(),
                });
            }
            if shard.number > MAX_SHARD_NUMBER {
                return Err(ShardMapError::NumberTooLarge { name: shard.name.clone(), number: shard.number });
            }
        }
        Ok(self)
    }
}

impl Shard {
    /// Its name, as the map and the logs call it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its number, which picks its block of order ids.
    pub fn number(&self) -> u32 {
        self.number
    }

    /// Where its database is.
    pub fn database(&self) -> &Database {
        &self.database
    }

    /// The order ids this shard's database may hand out: shard `n` has `[n·2^40, (n+1)·2^40)`,
    /// without 0 for shard 0 (whose ids are those of a database that was never sharded). Disjoint
    /// blocks keep every order id, and so the topic's key, unique across shards.
    pub fn order_ids(&self) -> Range<i64> {
        let start = i64::from(self.number) << ORDER_ID_BITS;
        start.max(1)..(i64::from(self.number) + 1) << ORDER_ID_BITS
    }

    /// The database URL: the inline one, or the contents of its file without surrounding white
    /// space. Errors never hold the URL.
    pub fn url(&self) -> Result<String, ShardMapError> {
        let path = match &self.database {
            Database::Url(url) => return Ok(url.clone()),
            Database::UrlFile(path) => path,
        };
        let failed =
            |why: String| ShardMapError::UrlFile { shard: self.name.clone(), path: path.clone(), why };
        let url = std::fs::read_to_string(path).map_err(|e| failed(e.to_string()))?;
        let url = url.trim();
        if url.is_empty() { Err(failed("the file is empty".to_owned())) } else { Ok(url.to_owned()) }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests;
