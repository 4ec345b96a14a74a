use std::fmt;

use uuid::Uuid;

/// The tenant that owns an order: a positive integer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TenantId(i64);

impl TenantId {
    /// Accepts only values greater than zero.
    pub fn new(value: i64) -> Result<Self, &'static str> {
        if value > 0 { Ok(Self(value)) } else { Err("must be greater than zero") }
    }

    /// The raw value.
    pub fn get(self) -> i64 {
        self.0
    }
}

impl fmt::Display for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The caller's idempotency key within a tenant: 1 to 128 visible ASCII characters.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RequestId(String);

impl RequestId {
    /// The longest request id accepted, in bytes.
    pub const MAX_LEN: usize = 128;

    /// Accepts 1 to [`Self::MAX_LEN`] visible ASCII characters.
    pub fn parse(value: impl Into<String>) -> Result<Self, &'static str> {
        let value = value.into();
        if super::is_visible_ascii(&value, Self::MAX_LEN) {
            Ok(Self(value))
        } else {
            Err("must be 1 to 128 visible ASCII characters")
        }
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The stable identity of one business event.
///
/// Made once, before the transaction that stores the event, and carried unchanged through every
/// retry, publish and delivery. Time-ordered (UUIDv7) so that new rows land at the end of the
/// outbox's primary key instead of splitting pages at random.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventId(Uuid);

impl EventId {
    /// A new, unique event id.
    #[allow(clippy::new_without_default)] // a fresh id is an act, not a default value
    pub fn new() -> Self {
        Self(Uuid::now_v7())
    }

    /// Accepts only the canonical form: 36 characters, lower-case, hyphenated.
    ///
    /// One spelling per id keeps byte-wise comparison in the database equal to id equality.
    pub fn parse(text: &str) -> Result<Self, &'static str> {
        const MESSAGE: &str = "must be a UUID in canonical lower-case hyphenated form";
        let uuid = Uuid::try_parse(text).map_err(|_| MESSAGE)?;
        let id = Self(uuid);
        if text.len() == 36 && id.to_string() == text { Ok(id) } else { Err(MESSAGE) }
    }
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.hyphenated().fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_id_is_positive() {
        assert_eq!(TenantId::new(1).map(TenantId::get), Ok(1));
        assert!(TenantId::new(0).is_err());
        assert!(TenantId::new(-7).is_err());
    }

    #[test]
    fn a_request_id_is_1_to_128_visible_ascii_characters() {
        assert!(RequestId::parse("req-1").is_ok());
        assert!(RequestId::parse("x".repeat(RequestId::MAX_LEN)).is_ok());
        for bad in [
            String::new(),
            "x".repeat(RequestId::MAX_LEN + 1),
            "has space".into(),
            "tab\t".into(),
            "é".into(),
        ] {
            assert!(RequestId::parse(bad.clone()).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn an_event_id_is_a_canonical_lower_case_uuid_and_prints_as_parsed() {
        let id = EventId::new();
        let text = id.to_string();
        assert_eq!(EventId::parse(&text), Ok(id));
        assert_eq!(EventId::parse(&text).map(|id| id.to_string()).as_deref(), Ok(text.as_str()));
        for bad in [
            text.to_uppercase(),
            text.replace('-', ""),
            format!("{{{text}}}"),
            format!("urn:uuid:{text}"),
            String::new(),
            "not-a-uuid".to_owned(),
        ] {
            assert!(EventId::parse(&bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn fresh_event_ids_sort_in_creation_order() {
        let (first, second) = (EventId::new(), EventId::new());
        assert!(first < second);
    }
}
