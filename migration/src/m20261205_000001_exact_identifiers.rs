//! Every identifier compared in SQL is compared byte for byte on MariaDB/MySQL, as it already is
//! on PostgreSQL and SQLite.
//!
//! The first migration gave these columns the server's default collation, which on MariaDB is
//! case-insensitive and pads trailing blanks (`utf8mb4_general_ci`): `Req-1` and `req-1` were one
//! idempotency key, so the second order was answered as a replay of the first (or as
//! REQUEST_ID_REUSED), and Reconcile found the other order. The same rule compared consumer
//! names (two consumers' dedup rows), lease tokens (the relay's fence) and topic names. This
//! migration gives each a binary collation without padding: `ascii_nopad_bin` where the edge
//! admits only visible ASCII (request id, customer id, SKU, aggregate id), `utf8mb4_nopad_bin`
//! where the text is the operator's or the broker's (consumer names, lease tokens that carry the
//! host name, topics, a dead letter's event id). A server without the no-pad collations (MySQL)
//! gets `ascii_bin` / `utf8mb4_0900_bin` or `utf8mb4_bin`; trailing blanks never reach the
//! caller-given columns, which the edge refuses.
//!
//! Existing rows are kept as they are. None can collide under the new rule: two values equal
//! byte for byte were already equal under the old, looser rule, so each unique key that held
//! before still holds. Converting `utf8mb4` text to `ascii` fails (and, InnoDB's `ALTER TABLE`
//! being atomic, changes nothing) only if a row holds a non-ASCII request id, customer id, SKU or
//! aggregate id, which the service never wrote. The rewrite copies `orders`, `order_line`,
//! `outbox_event`, `consumed_event`, `notification_job` and `dead_letter` once: on a large
//! database, run it in a quiet period.
//!
//! PostgreSQL and SQLite are unchanged: PostgreSQL's default collation is deterministic (equal
//! only when the bytes are equal) and these columns are `varchar`, never blank-padded `char(n)`
//! (the `char(36)` event ids are always exactly 36 characters); SQLite compares text with its
//! `BINARY` collation unless told otherwise.
//!
//! `down` returns the columns to the table's default collation. It fails, and changes nothing,
//! while two keys differ only by case or trailing blanks: merging them would lose an order.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::{DbBackend, Statement};

#[derive(DeriveMigrationName)]
pub(crate) struct Migration;

/// Which text a column holds, and so which binary collation it gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Text {
    /// Visible ASCII only, enforced at the edge.
    Ascii,
    /// Any text.
    Unicode,
}

/// One column as the first migration made it, apart from its collation.
struct Column {
    name: &'static str,
    length: u32,
    text: Text,
    /// `NOT NULL`, `NULL`, with the column's default where it has one.
    rest: &'static str,
}

const fn column(name: &'static str, length: u32, text: Text, rest: &'static str) -> Column {
    Column { name, length, text, rest }
}

/// Every identifier column compared in SQL, by table.
const TABLES: &[(&str, &[Column])] = &[
    (
        "orders",
        &[
            column("request_id", 128, Text::Ascii, "NOT NULL"),
            column("customer_id", 128, Text::Ascii, "NOT NULL"),
        ],
    ),
    ("order_line", &[column("sku", 64, Text::Ascii, "NOT NULL")]),
    (
        "outbox_event",
        &[
            column("aggregate_id", 128, Text::Ascii, "NOT NULL"),
            column("lease_owner", 128, Text::Unicode, "NULL"),
            column("published_topic", 249, Text::Unicode, "NULL"),
        ],
    ),
    ("consumed_event", &[column("consumer_name", 128, Text::Unicode, "NOT NULL")]),
    (
        "notification_job",
        &[column("consumer_name", 128, Text::Unicode, "NOT NULL DEFAULT 'notification-planner'")],
    ),
    (
        "dead_letter",
        &[
            column("consumer_name", 128, Text::Unicode, "NOT NULL"),
            column("topic", 249, Text::Unicode, "NOT NULL"),
            column("event_id", 128, Text::Unicode, "NULL"),
        ],
    ),
];

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if manager.get_database_backend() != DbBackend::MySql {
            return Ok(());
        }
        let ascii = first_collation(manager, &["ascii_nopad_bin", "ascii_bin"]).await?;
        let unicode =
            first_collation(manager, &["utf8mb4_nopad_bin", "utf8mb4_0900_bin", "utf8mb4_bin"]).await?;
        alter_all(manager, |text| match text {
            Text::Ascii => format!(" CHARACTER SET ascii COLLATE {ascii}"),
            Text::Unicode => format!(" CHARACTER SET utf8mb4 COLLATE {unicode}"),
        })
        .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if manager.get_database_backend() != DbBackend::MySql {
            return Ok(());
        }
        // No character set: the column takes the table's default again.
        alter_all(manager, |_| String::new()).await
    }
}

/// One `ALTER TABLE` per table, each column restated with `collation(text)` after its type.
async fn alter_all(manager: &SchemaManager<'_>, collation: impl Fn(Text) -> String) -> Result<(), DbErr> {
    for (table, columns) in TABLES {
        let modify = columns
            .iter()
            .map(|c| format!("MODIFY `{}` VARCHAR({}){} {}", c.name, c.length, collation(c.text), c.rest))
            .collect::<Vec<_>>()
            .join(", ");
        manager.get_connection().execute_unprepared(&format!("ALTER TABLE `{table}` {modify}")).await?;
    }
    Ok(())
}

/// The first of `names` the server knows.
async fn first_collation(manager: &SchemaManager<'_>, names: &[&'static str]) -> Result<&'static str, DbErr> {
    for name in names {
        let found = manager
            .get_connection()
            .query_one_raw(Statement::from_sql_and_values(
                DbBackend::MySql,
                "SELECT 1 FROM information_schema.COLLATIONS WHERE COLLATION_NAME = ?",
                [(*name).into()],
            ))
            .await?;
        if found.is_some() {
            return Ok(name);
        }
    }
    Err(DbErr::Migration(format!("the server has none of the collations {names:?}")))
}
