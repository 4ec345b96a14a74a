//! A set of shards on the bench's one database server: a database per shard, created and
//! migrated as an operator would (`idempost-migrate --shard-map-file map.json up`, which also
//! starts each shard's order ids at its block), its shard map in the output directory, its
//! backlog in each shard's block of order ids, and the control topic of a fleet over it.

use std::path::PathBuf;

use sea_orm::DatabaseConnection;
use serde_json::json;

use crate::error::BenchError;
use crate::plan::Plan;
use crate::sql::{self, BenchDatabase};

/// Order ids per shard: shard n's block starts at n·2^40 (`idempost_shard_map::Shard::order_ids`).
const BLOCK: i64 = 1 << 40;

/// The shards of one drain or failover, and their map.
pub(super) struct ShardSet {
    databases: Vec<BenchDatabase>,
    /// A connection to each shard, in number order.
    pub(super) dbs: Vec<DatabaseConnection>,
    /// The shard map file.
    pub(super) map: PathBuf,
}

impl ShardSet {
    /// `count` shards numbered from 0, named `shard-<n>`, migrated by `idempost-migrate`.
    pub(super) async fn create(plan: &Plan, count: usize, label: &str) -> Result<Self, BenchError> {
        let mut set =
            Self { databases: Vec::new(), dbs: Vec::new(), map: plan.out_dir.join(format!("{label}.json")) };
        let outcome = set.fill_in(plan, count).await;
        if let Err(e) = outcome {
            set.remove().await;
            return Err(e);
        }
        Ok(set)
    }

    async fn fill_in(&mut self, plan: &Plan, count: usize) -> Result<(), BenchError> {
        for _ in 0..count {
            self.databases.push(BenchDatabase::create(&plan.database_url).await?);
        }
        std::fs::write(
            &self.map,
            map_json(&self.databases.iter().map(|d| d.url.as_str()).collect::<Vec<_>>()),
        )?;
        migrate(plan, &self.map).await?;
        for database in &self.databases {
            self.dbs.push(sql::connect(&database.url, 4).await?);
        }
        Ok(())
    }

    /// The first order id of shard `n`'s block (shard 0's ids start at 1).
    pub(super) fn first_order_id(n: usize) -> i64 {
        (i64::try_from(n).unwrap_or(0) * BLOCK).max(1)
    }

    /// Fills each shard's outbox with `total / shards` PENDING events (the first shards one
    /// more when it does not divide), in its block of order ids.
    pub(super) async fn prefill(&self, total: u64) -> Result<(), BenchError> {
        let shards = self.dbs.len() as u64;
        for (n, db) in self.dbs.iter().enumerate() {
            let count = total / shards + u64::from((n as u64) < total % shards);
            crate::raw::prefill_orders(db, count, Self::first_order_id(n)).await?;
        }
        Ok(())
    }

    /// The URL of the first shard, for a relay without a map.
    pub(super) fn first_url(&self) -> &str {
        self.databases.first().map_or("", |d| d.url.as_str())
    }

    /// Events PUBLISHED over every shard.
    pub(super) async fn published(&self) -> Result<u64, BenchError> {
        let mut total = 0;
        for db in &self.dbs {
            total += sql::count(db, "SELECT COUNT(*) FROM outbox_event WHERE status = 'PUBLISHED'").await?;
        }
        Ok(u64::try_from(total).unwrap_or(0))
    }

    /// Closes the connections and drops the databases; a failure is printed, not returned, so
    /// that every database is tried.
    pub(super) async fn remove(self) {
        for db in self.dbs {
            let _ = db.close().await;
        }
        for database in self.databases {
            let name = database.name.clone();
            if let Err(e) = database.remove().await {
                println!("   could not drop the shard database {name}: {e}");
            }
        }
        let _ = std::fs::remove_file(&self.map);
    }
}

/// The shard map of `urls`, shard n at `urls[n]`, the first the default (no tenants listed: the
/// bench writes outbox rows, not orders, and the relay never routes by tenant).
pub(super) fn map_json(urls: &[&str]) -> String {
    let shards: Vec<_> = urls
        .iter()
        .enumerate()
        .map(|(n, url)| json!({"name": name(n), "number": n, "database_url": url}))
        .collect();
    serde_json::to_string_pretty(&json!({"default": name(0), "shards": shards})).unwrap_or_default()
}

/// Shard n's name in the map.
pub(super) fn name(n: usize) -> String {
    format!("shard-{n}")
}

/// `idempost-migrate --shard-map-file MAP up`, from the bench's binary directory.
async fn migrate(plan: &Plan, map: &std::path::Path) -> Result<(), BenchError> {
    let binary = plan.bin_dir.join("idempost-migrate");
    let output = tokio::process::Command::new(&binary)
        .arg(format!("--shard-map-file={}", map.display()))
        .arg("up")
        .env("RUST_LOG", "warn")
        .output()
        .await
        .map_err(|e| BenchError::Stuck(format!("cannot run {}: {e}", binary.display())))?;
    if !output.status.success() {
        return Err(BenchError::Stuck(format!(
            "idempost-migrate --shard-map-file up failed ({}): {}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )));
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn the_map_numbers_the_shards_in_order_and_the_first_is_the_default() {
        let map = idempost_shard_map::ShardMap::parse(&map_json(&["mysql://root@h/a", "mysql://root@h/b"]))
            .expect("the order service's parser takes the bench's map");
        let shards: Vec<(&str, u32)> = map.shards().iter().map(|s| (s.name(), s.number())).collect();
        assert_eq!(shards, vec![("shard-0", 0), ("shard-1", 1)]);
        assert_eq!(map.default_shard().name(), "shard-0");
    }

    #[test]
    fn each_shards_backlog_starts_at_its_block() {
        let map = idempost_shard_map::ShardMap::parse(&map_json(&[
            "mysql://root@h/a",
            "mysql://root@h/b",
            "mysql://root@h/c",
            "mysql://root@h/d",
        ]))
        .expect("parses");
        for (n, shard) in map.shards().iter().enumerate() {
            let first = ShardSet::first_order_id(n);
            assert!(shard.order_ids().contains(&first), "shard {n}: {first} in {:?}", shard.order_ids());
            assert!(shard.order_ids().contains(&(first + 1_000_000)));
        }
    }
}
