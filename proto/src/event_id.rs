//! The event id: the one id every copy of an event carries, in the one text form the contract
//! allows (`event_id` in the protos, the Kafka key header, the outbox and inbox rows).

use std::fmt;

use uuid::Uuid;

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
