//! `idempost-migrate --shard-map-file`: the subcommand on every shard of a shard map, one after
//! another in the map's order, each reported on its own line. The first shard that fails stops
//! the run: the shards after it are named as not migrated, and running the same command again
//! once the failure is fixed finishes them (a migrated shard has nothing pending).
//!
//! After `up`, `fresh` and `refresh` each shard's order ids are started at its block
//! ([`idempost_migration::order_ids`]) and checked to be in it.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Arg;
use idempost_migration::order_ids::{self, OrderIds};
use idempost_migration::{Migrator, MigratorTrait};
use idempost_shard_map::{Shard, ShardMap};
use sea_orm_cli::MigrateSubcommands;
use sea_orm_migration::sea_orm::{ConnectOptions, Database, DatabaseConnection};

/// The `--shard-map-file` flag, given instead of any form of one database's URL.
pub(crate) fn argument(id: &'static str, instead_of: [&'static str; 2]) -> Arg {
    Arg::new(id)
        .long("shard-map-file")
        .value_name("SHARD_MAP_FILE")
        .env("IDEMPOST_SHARD_MAP_FILE")
        .value_parser(clap::value_parser!(PathBuf))
        .global(true)
        .conflicts_with_all(instead_of)
        .help(
            "Shard map (JSON, as the order service's --shard-map-file): run the subcommand on every \
             shard it names, one after another, and start each shard's order ids at its block; \
             instead of one database's URL",
        )
}

/// Runs `subcommand` on every shard of the map at `path`.
pub(crate) async fn migrate(
    path: &Path,
    subcommand: Option<MigrateSubcommands>,
    schema: String,
    verbose: bool,
) -> ExitCode {
    let map = match ShardMap::load(path) {
        Ok(map) => map,
        Err(error) => {
            eprintln!("idempost-migrate: {error}");
            return ExitCode::from(2);
        }
    };
    show_progress(verbose);
    let shards = map.shards();
    for (index, shard) in shards.iter().enumerate() {
        match migrate_shard(shard, subcommand.as_ref(), &schema).await {
            Ok(report) => println!(
                "idempost-migrate: shard {:?} ({} of {}): {report}",
                shard.name(),
                index + 1,
                shards.len()
            ),
            Err(error) => {
                let left: Vec<&str> = shards[index + 1..].iter().map(Shard::name).collect();
                eprintln!(
                    "idempost-migrate: shard {:?}: {error}; not run on the shards after it: {left:?}",
                    shard.name()
                );
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}

/// What the run did to one shard, or why it failed (never holding its URL).
async fn migrate_shard(
    shard: &Shard,
    subcommand: Option<&MigrateSubcommands>,
    schema: &str,
) -> Result<String, String> {
    let url = shard.url().map_err(|e| e.to_string())?;
    let options = ConnectOptions::new(url).set_schema_search_path(schema.to_owned()).to_owned();
    let db = Database::connect(options).await.map_err(|e| format!("cannot connect to its database: {e}"))?;
    let leaves_schema = run(&db, subcommand).await.map_err(|e| e.to_string())?;
    if !leaves_schema {
        return Ok("done".to_owned());
    }
    let block = shard.order_ids();
    order_ids::start_at(&db, block.start).await.map_err(|e| format!("cannot start its order ids: {e}"))?;
    let ids = OrderIds::read(&db).await.map_err(|e| format!("cannot read its order ids: {e}"))?;
    match ids.outside(&block) {
        Some(why) => Err(why),
        None => Ok(format!("migrated; next order id {}", ids.next)),
    }
}

/// Runs the subcommand as sea-orm-migration's own CLI would; whether it leaves the full schema
/// (so that the order ids can be set).
async fn run(
    db: &DatabaseConnection,
    subcommand: Option<&MigrateSubcommands>,
) -> Result<bool, sea_orm_migration::sea_orm::DbErr> {
    match subcommand {
        Some(MigrateSubcommands::Status) => Migrator::status(db).await.map(|()| false),
        Some(MigrateSubcommands::Reset) => Migrator::reset(db).await.map(|()| false),
        Some(MigrateSubcommands::Down { num }) => Migrator::down(db, Some(*num)).await.map(|()| false),
        Some(MigrateSubcommands::Fresh) => Migrator::fresh(db).await.map(|()| true),
        Some(MigrateSubcommands::Refresh) => Migrator::refresh(db).await.map(|()| true),
        Some(MigrateSubcommands::Up { num: Some(num) }) => Migrator::up(db, Some(*num)).await.map(|()| false),
        _ => Migrator::up(db, None).await.map(|()| true),
    }
}

/// sea-orm-migration's progress lines (which migration it applies; `status`'s answer), as its
/// own CLI shows them. Its CLI sets them up on each run, which would fail on the second shard.
fn show_progress(verbose: bool) {
    let filter = if verbose { "debug" } else { "sea_orm_migration=info" };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(verbose)
        .with_level(verbose)
        .without_time()
        .try_init();
}
