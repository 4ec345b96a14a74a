//! `outpost-migrate`: applies Outpost's schema as a deploy step (`outpost-migrate up`).
//!
//! The database comes from `DATABASE_URL` or `-u URL`; see `outpost-migrate --help`.

#[tokio::main]
async fn main() {
    sea_orm_migration::cli::run_cli(outpost_migration::Migrator).await;
}
