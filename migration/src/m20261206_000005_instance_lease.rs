//! The consumer's instance lock on a MariaDB Galera cluster: one row per locked instance name,
//! held under a lease read from the database's clock.
//!
//! Why a table: the consumer's instance lock is `GET_LOCK` on MariaDB/MySQL, and on Galera a
//! named lock is local to the node that granted it, so two consumers under one name on two nodes
//! would both hold it. A row is the cluster's: two nodes' takes of one row are certified against
//! each other and only one commits. MariaDB/MySQL only (the other backends lock as before), and
//! only Galera nodes write it.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::DbBackend;

#[derive(DeriveMigrationName)]
pub(crate) struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if manager.get_database_backend() != DbBackend::MySql {
            return Ok(());
        }
        // `name` compared byte for byte, as every identifier of the schema is.
        manager
            .get_connection()
            .execute_unprepared(
                "CREATE TABLE `consumer_instance_lease` (\
                 `name` VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY, \
                 `holder` CHAR(36) CHARACTER SET ascii COLLATE ascii_bin NOT NULL, \
                 `lease_until` DATETIME(6) NOT NULL) ENGINE=InnoDB",
            )
            .await
            .map(drop)
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if manager.get_database_backend() != DbBackend::MySql {
            return Ok(());
        }
        manager.get_connection().execute_unprepared("DROP TABLE `consumer_instance_lease`").await.map(drop)
    }
}
