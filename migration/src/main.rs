//! `idempost-migrate`: applies Idempost's schema as a deploy step (`idempost-migrate up`).
//!
//! The database comes from `DATABASE_URL` or `-u URL`; see `idempost-migrate --help`.

#[tokio::main]
async fn main() {
    sea_orm_migration::cli::run_cli(idempost_migration::Migrator).await;
}
