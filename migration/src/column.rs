//! Column types whose spelling differs per backend.
//!
//! The same migration code runs everywhere; only these few types need a backend's own words.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::DbBackend;

/// A timestamp that keeps microseconds on every backend.
///
/// MariaDB/MySQL `DATETIME` without a precision drops them, and `TIMESTAMP` carries implicit
/// `ON UPDATE` behaviour on older servers, so MySQL gets `DATETIME(6)` (always UTC by contract).
pub(crate) fn timestamp(backend: DbBackend, column: impl IntoIden) -> ColumnDef {
    let mut def = ColumnDef::new(column);
    match backend {
        DbBackend::MySql => def.custom(Alias::new("DATETIME(6)")),
        _ => def.timestamp_with_time_zone(),
    };
    def
}

/// A canonical UUID string (36 ASCII characters) compared byte for byte.
pub(crate) fn event_id(backend: DbBackend, column: impl IntoIden) -> ColumnDef {
    let mut def = ColumnDef::new(column);
    match backend {
        // The character set must follow the type directly, so it cannot go in `extra`.
        DbBackend::MySql => def.custom(Alias::new("CHAR(36) CHARACTER SET ascii COLLATE ascii_bin")),
        _ => def.char_len(36),
    };
    def
}

/// A caller's key (visible ASCII, at most `len` characters) compared byte for byte: two keys that
/// differ only in case or trailing spaces are two keys on every backend.
///
/// PostgreSQL and SQLite compare `VARCHAR`/`TEXT` byte for byte already (SQLite's default
/// collation is BINARY); MariaDB/MySQL would compare with the table's case- and pad-insensitive
/// default collation, so they get `ascii_bin`.
pub(crate) fn ascii_key(backend: DbBackend, column: impl IntoIden, len: u32) -> ColumnDef {
    let mut def = ColumnDef::new(column);
    match backend {
        DbBackend::MySql => {
            def.custom(Alias::new(format!("VARCHAR({len}) CHARACTER SET ascii COLLATE ascii_bin")))
        }
        _ => def.string_len(len),
    };
    def
}
