//! The audit listing's page token: where each shard's next page starts.
//!
//! Text, so that it passes through every client as the opaque string the contract calls it.
//! One database's token is its `before_id` (`"1234"`); a merged listing's names every shard by
//! its number in the map, which never changes while the shard holds rows (unlike a name, it
//! needs no escaping): `"0:1234,1:57"`. A position is a `before_id`: that shard's rows below
//! it, and 1 for a shard read to its end.

use std::collections::BTreeMap;
use std::fmt;

/// Where a page starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Cursor {
    /// At the newest row of every shard.
    Newest,
    /// Below this id, on the one database.
    One(i64),
    /// Below each shard's position. A shard the token does not name (one a reload added
    /// since) starts at its newest row: its rows are listed late rather than never.
    Shards(BTreeMap<u32, i64>),
}

impl Cursor {
    /// The token `text`, if this service handed it out for a listing of this kind.
    pub(super) fn parse(text: &str, merged: bool) -> Option<Self> {
        if !merged {
            return text.parse().ok().filter(|&id| id > 0).map(Self::One);
        }
        let mut positions = BTreeMap::new();
        for part in text.split(',') {
            let (number, at) = part.split_once(':')?;
            let at: i64 = at.parse().ok().filter(|&at| at > 0)?;
            if positions.insert(number.parse().ok()?, at).is_some() {
                return None;
            }
        }
        Some(Self::Shards(positions))
    }

    /// The next page's start: `positions` (shard number, position), one per shard read.
    pub(super) fn after(positions: impl IntoIterator<Item = (u32, i64)>, merged: bool) -> Self {
        let mut positions = positions.into_iter();
        match (merged, positions.next()) {
            (false, Some((_, at))) => Self::One(at),
            (_, first) => Self::Shards(first.into_iter().chain(positions).collect()),
        }
    }

    /// The `before_id` of shard `number`: `None` reads from its newest row.
    pub(super) fn before(&self, number: u32) -> Option<i64> {
        match self {
            Self::Newest => None,
            Self::One(id) => Some(*id),
            Self::Shards(positions) => positions.get(&number).copied(),
        }
    }
}

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Newest => Ok(()),
            Self::One(id) => write!(f, "{id}"),
            Self::Shards(positions) => {
                let parts: Vec<_> = positions.iter().map(|(number, at)| format!("{number}:{at}")).collect();
                f.write_str(&parts.join(","))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_reads_back_as_the_positions_it_was_made_of() {
        let merged = Cursor::after([(0, 1234), (1, 1), (7, 57)], true);
        assert_eq!(Cursor::parse(&merged.to_string(), true), Some(merged));
        let one = Cursor::after([(0, 99)], false);
        assert_eq!(one.to_string(), "99");
        assert_eq!(Cursor::parse("99", false), Some(one));
    }

    #[test]
    fn a_token_of_another_kind_of_listing_or_made_up_is_refused() {
        for (text, merged) in [
            ("99", true),
            ("0:99", false),
            ("0:0", true),
            ("0:5,0:6", true),
            ("x:5", true),
            ("-3", false),
            ("0:5,", true),
        ] {
            assert_eq!(Cursor::parse(text, merged), None, "{text:?}");
        }
    }
}
