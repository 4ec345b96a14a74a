//! The effect's identity becomes the dedup identity: `notification_job` is keyed by
//! `(consumer_name, event_id)`, as `consumed_event` is, so two consumer names on one database
//! each make their own job once instead of the second one failing on the first one's key.
//!
//! Existing jobs are kept. Each is given the name of the consumer whose `consumed_event` row
//! committed with it (before this migration an event could have only one job, so only one
//! consumer could have committed it); a job whose dedup row retention already purged keeps the
//! default consumer name. The column's default stays, so a consumer binary older than this
//! migration (a rollback) still writes its jobs.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::DbBackend;

#[derive(DeriveMigrationName)]
pub(crate) struct Migration;

/// The consumer name of jobs written before the name was recorded, when no dedup row tells.
const DEFAULT_CONSUMER_NAME: &str = "notification-planner";

/// Fills in the committing consumer's name on the jobs that existed before this migration.
const NAME_EXISTING_JOBS: &str = "UPDATE notification_job SET consumer_name = \
     (SELECT MIN(c.consumer_name) FROM consumed_event c WHERE c.event_id = notification_job.event_id) \
     WHERE EXISTS (SELECT 1 FROM consumed_event c WHERE c.event_id = notification_job.event_id)";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        match manager.get_database_backend() {
            DbBackend::MySql => {
                add_consumer_name(manager).await?;
                db.execute_unprepared(NAME_EXISTING_JOBS).await?;
                db.execute_unprepared(
                    "ALTER TABLE notification_job DROP PRIMARY KEY, ADD PRIMARY KEY (consumer_name, event_id)",
                )
                .await?;
            }
            DbBackend::Postgres => {
                add_consumer_name(manager).await?;
                db.execute_unprepared(NAME_EXISTING_JOBS).await?;
                db.execute_unprepared(
                    "ALTER TABLE notification_job DROP CONSTRAINT notification_job_pkey, \
                     ADD CONSTRAINT notification_job_pkey PRIMARY KEY (consumer_name, event_id)",
                )
                .await?;
            }
            // SQLite cannot change a primary key in place: the table is rebuilt and its rows copied.
            _ => {
                rebuild_sqlite(manager, true).await?;
                db.execute_unprepared(NAME_EXISTING_JOBS).await?;
            }
        }
        Ok(())
    }

    /// Back to one job per event. Fails (and changes nothing on PostgreSQL and SQLite) while two
    /// consumers hold jobs for one event: dropping one of them would lose an effect.
    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        match manager.get_database_backend() {
            DbBackend::MySql => {
                db.execute_unprepared(
                    "ALTER TABLE notification_job DROP PRIMARY KEY, ADD PRIMARY KEY (event_id)",
                )
                .await?;
                drop_consumer_name(manager).await
            }
            DbBackend::Postgres => {
                db.execute_unprepared(
                    "ALTER TABLE notification_job DROP CONSTRAINT notification_job_pkey, \
                     ADD CONSTRAINT notification_job_pkey PRIMARY KEY (event_id)",
                )
                .await?;
                drop_consumer_name(manager).await
            }
            _ => rebuild_sqlite(manager, false).await,
        }
    }
}

async fn add_consumer_name(manager: &SchemaManager<'_>) -> Result<(), DbErr> {
    manager
        .alter_table(Table::alter().table(NotificationJob::Table).add_column(consumer_name()).to_owned())
        .await
}

async fn drop_consumer_name(manager: &SchemaManager<'_>) -> Result<(), DbErr> {
    manager
        .alter_table(
            Table::alter()
                .table(NotificationJob::Table)
                .drop_column(NotificationJob::ConsumerName)
                .to_owned(),
        )
        .await
}

/// The same type as `consumed_event.consumer_name`, so both keys compare names alike.
fn consumer_name() -> ColumnDef {
    ColumnDef::new(NotificationJob::ConsumerName)
        .string_len(128)
        .not_null()
        .default(DEFAULT_CONSUMER_NAME)
        .to_owned()
}

/// Rebuilds `notification_job` keyed per consumer (`per_consumer`) or per event, keeping rows.
/// One batch on one connection: SQLite's rename must see the drop before it.
async fn rebuild_sqlite(manager: &SchemaManager<'_>, per_consumer: bool) -> Result<(), DbErr> {
    let (name_column, key) = if per_consumer {
        (
            format!("\"consumer_name\" varchar(128) NOT NULL DEFAULT '{DEFAULT_CONSUMER_NAME}', "),
            "\"consumer_name\", \"event_id\"",
        )
    } else {
        (String::new(), "\"event_id\"")
    };
    let columns = "event_id, order_id, source_version, status, created_at";
    manager
        .get_connection()
        .execute_unprepared(&format!(
            "CREATE TABLE notification_job_next ( {name_column}\"event_id\" char(36) NOT NULL, \
             \"order_id\" integer NOT NULL, \"source_version\" integer NOT NULL, \
             \"status\" varchar(16) NOT NULL, \"created_at\" timestamp_with_timezone_text NOT NULL, \
             PRIMARY KEY ({key}) ); \
             INSERT INTO notification_job_next ({columns}) SELECT {columns} FROM notification_job; \
             DROP TABLE notification_job; \
             ALTER TABLE notification_job_next RENAME TO notification_job;"
        ))
        .await
        .map(|_| ())
}

#[derive(DeriveIden)]
enum NotificationJob {
    Table,
    ConsumerName,
}
