//! The bound on a listing's answer: the admin listings (the backlog, dead letters) stop adding
//! rows once the answer would pass a byte budget and hand the caller a token to go on from, so
//! that rows with large payloads can neither make an answer the clients refuse (their decode
//! limit is tonic's default, 4 MiB) nor make the service hold many megabytes per call.

use prost::Message;

/// The most bytes of rows one listing answer holds, encoded: a quarter of the clients' 4 MiB
/// decode limit, leaving room for the rest of the answer and for clients that set lower limits.
pub const LISTING_BYTES: usize = 1024 * 1024;

/// How many rows' payloads a listing reads from the database in one query: the service holds at
/// most this many payloads beyond the answer's budget while it fills a page.
pub const PAYLOAD_BATCH: usize = 8;

/// The bytes still free in one answer.
#[derive(Debug, Clone)]
pub struct ByteBudget {
    left: usize,
    taken: usize,
}

impl ByteBudget {
    /// A budget of [`LISTING_BYTES`].
    pub fn listing() -> Self {
        Self::new(LISTING_BYTES)
    }

    pub fn new(bytes: usize) -> Self {
        Self { left: bytes, taken: 0 }
    }

    /// Takes `row` as one element of a repeated field when it fits. The first row always fits,
    /// however large: a page that could hold nothing would never let the caller go on.
    pub fn take<M: Message>(&mut self, row: &M) -> bool {
        let len = row.encoded_len();
        // The field's tag (one byte for the listings' fields) and the length prefix.
        let size = 1 + prost::length_delimiter_len(len) + len;
        if self.taken > 0 && size > self.left {
            return false;
        }
        self.left = self.left.saturating_sub(size);
        self.taken += 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_takes_rows_until_the_next_one_would_not_fit_but_always_the_first() {
        let row = prost_types::Duration { seconds: 1, nanos: 0 };
        // Encoded: 2 bytes, plus tag and length prefix: 4.
        let mut budget = ByteBudget::new(9);
        assert!(budget.take(&row));
        assert!(budget.take(&row));
        assert!(!budget.take(&row));
        let mut tiny = ByteBudget::new(1);
        assert!(tiny.take(&row), "the first row is taken whatever its size");
        assert!(!tiny.take(&row));
    }
}
