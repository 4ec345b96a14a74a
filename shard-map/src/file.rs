//! The map file's shape, and its checks on the way to a [`ShardMap`].

use std::collections::HashMap;
use std::path::PathBuf;

use serde::Deserialize;

use super::{Database, Shard, ShardMap, ShardMapError};

/// The file as written. Unknown fields are refused: a misspelt `tenants` would otherwise send
/// those tenants to the default shard without a word.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MapFile {
    default: String,
    shards: Vec<ShardEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ShardEntry {
    name: String,
    number: u32,
    database_url: Option<String>,
    database_url_file: Option<PathBuf>,
    #[serde(default)]
    tenants: Vec<i64>,
}

pub(super) fn parse(text: &str) -> Result<ShardMap, ShardMapError> {
    let file: MapFile = serde_json::from_str(text).map_err(|e| ShardMapError::Syntax(e.to_string()))?;
    if file.shards.is_empty() {
        return Err(ShardMapError::NoShards);
    }
    let mut tenants: HashMap<i64, usize> = HashMap::new();
    let mut shards = Vec::with_capacity(file.shards.len());
    for (index, entry) in file.shards.into_iter().enumerate() {
        if entry.name.trim().is_empty() {
            return Err(ShardMapError::EmptyName(index));
        }
        for &tenant in &entry.tenants {
            if tenant <= 0 {
                return Err(ShardMapError::InvalidTenant { shard: entry.name, tenant });
            }
            if let Some(first) = tenants.insert(tenant, index) {
                let first: &Shard = &shards[first];
                let first = first.name.clone();
                return Err(ShardMapError::TenantOnTwoShards { tenant, first, second: entry.name });
            }
        }
        let database = database(&entry)?;
        shards.push(Shard { name: entry.name, number: entry.number, database });
    }
    let default = shards
        .iter()
        .position(|s| s.name == file.default)
        .ok_or(ShardMapError::UnknownDefault(file.default))?;
    ShardMap { shards, default, tenants }.check()
}

fn database(entry: &ShardEntry) -> Result<Database, ShardMapError> {
    match (&entry.database_url, &entry.database_url_file) {
        (Some(url), None) if has_password(url) => Err(ShardMapError::PasswordInline(entry.name.clone())),
        (Some(url), None) if !url.trim().is_empty() => Ok(Database::Url(url.trim().to_owned())),
        (None, Some(path)) => Ok(Database::UrlFile(path.clone())),
        _ => Err(ShardMapError::DatabaseForms(entry.name.clone())),
    }
}

/// Whether `url` carries a password: in its user info (`scheme://user:secret@host`) or as a
/// `password=` query parameter (which the PostgreSQL driver reads too).
fn has_password(url: &str) -> bool {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    let in_user_info = authority.rsplit_once('@').is_some_and(|(user_info, _)| user_info.contains(':'));
    let query = rest.split_once('?').map(|(_, q)| q).unwrap_or_default();
    in_user_info || query.split('&').any(|p| p.to_ascii_lowercase().starts_with("password="))
}

#[cfg(test)]
mod tests {
    use super::has_password;

    #[test]
    fn a_password_is_found_in_the_user_info_or_the_query() {
        assert!(has_password("mysql://root:secret@127.0.0.1:3306/orders"));
        assert!(has_password("postgres://app@db/orders?sslmode=require&Password=x"));
        assert!(!has_password("mysql://root@127.0.0.1:3306/orders"));
        assert!(!has_password("postgres://db:5432/orders"));
        assert!(!has_password("sqlite:///var/lib/idempost/orders.db?mode=rwc"));
    }
}
