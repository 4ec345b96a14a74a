//! `idempost-migrate`: applies Idempost's schema as a deploy step (`idempost-migrate up`).
//!
//! sea-orm-migration's own CLI, plus `--database-url-file` (or `IDEMPOST_DATABASE_URL_FILE`) as the
//! services take it: the URL holds a password, so a deployment mounts it from a secret as a file
//! rather than putting it in the environment (`DATABASE_URL`) or on the command line (`-u`).
//!
//! With `--shard-map-file` it runs the subcommand on every shard of the map instead, one after
//! another (see `shards.rs`).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Arg, ArgMatches, CommandFactory, FromArgMatches};
use sea_orm_cli::MigrateSubcommands;
use sea_orm_migration::cli::{Cli, run_cli, run_migrate};
use sea_orm_migration::sea_orm::{ConnectOptions, Database};

mod shards;

const URL_FILE: &str = "database_url_file";
const SHARD_MAP_FILE: &str = "shard_map_file";
/// sea-orm-migration's argument id for `-u` / `DATABASE_URL`.
const URL: &str = "database_url";

fn command() -> clap::Command {
    Cli::command().name("idempost-migrate").arg(shards::argument(SHARD_MAP_FILE, [URL, URL_FILE])).arg(
        Arg::new(URL_FILE)
            .long("database-url-file")
            .value_name("DATABASE_URL_FILE")
            .env("IDEMPOST_DATABASE_URL_FILE")
            .value_parser(clap::value_parser!(PathBuf))
            .global(true)
            .conflicts_with(URL)
            .help(
                "File holding the database URL, such as a mounted secret (surrounding white space \
                 is dropped); instead of --database-url / DATABASE_URL, not with it",
            ),
    )
}

/// The URL from the file, or from `-u` / `DATABASE_URL`. Errors never hold the URL.
fn database_url(matches: &ArgMatches) -> Result<String, String> {
    let Some(path) = matches.get_one::<PathBuf>(URL_FILE) else {
        return matches.get_one::<String>(URL).cloned().ok_or_else(|| {
            "the database URL is required: --database-url-file (IDEMPOST_DATABASE_URL_FILE), or \
             DATABASE_URL"
                .to_owned()
        });
    };
    let url = std::fs::read_to_string(path)
        .map_err(|e| format!("--database-url-file: cannot read {}: {e}", path.display()))?;
    let url = url.trim();
    if url.is_empty() {
        return Err(format!("--database-url-file: {} is empty", path.display()));
    }
    Ok(url.to_owned())
}

/// The subcommand to run (`None`: `up`).
fn subcommand(matches: &ArgMatches) -> Option<MigrateSubcommands> {
    matches.subcommand()?;
    match MigrateSubcommands::from_arg_matches(matches) {
        Ok(subcommand) => Some(subcommand),
        Err(error) => error.exit(),
    }
}

/// The PostgreSQL schema (`-s`), `public` by default.
fn schema(matches: &ArgMatches) -> String {
    matches.get_one::<String>("database_schema").cloned().unwrap_or_else(|| "public".to_owned())
}

#[tokio::main]
async fn main() -> ExitCode {
    let matches = command().get_matches();
    // `init` and `generate` write migration sources and open no database: sea-orm-migration's
    // own CLI runs them as it always did.
    if matches!(matches.subcommand_name(), Some("init" | "generate")) {
        run_cli(idempost_migration::Migrator).await;
        return ExitCode::SUCCESS;
    }
    if let Some(path) = matches.get_one::<PathBuf>(SHARD_MAP_FILE) {
        return shards::migrate(path, subcommand(&matches), schema(&matches), matches.get_flag("verbose"))
            .await;
    }
    let url = match database_url(&matches) {
        Ok(url) => url,
        Err(message) => {
            eprintln!("idempost-migrate: {message}");
            return ExitCode::from(2);
        }
    };
    let subcommand = subcommand(&matches);
    let options = ConnectOptions::new(url).set_schema_search_path(schema(&matches)).to_owned();
    let db = match Database::connect(options).await {
        Ok(db) => db,
        Err(error) => {
            eprintln!("idempost-migrate: cannot connect to the database: {error}");
            return ExitCode::FAILURE;
        }
    };
    match run_migrate(idempost_migration::Migrator, &db, subcommand, matches.get_flag("verbose")).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("idempost-migrate: {error}");
            ExitCode::FAILURE
        }
    }
}
