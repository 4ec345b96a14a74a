//! Checks and digests of plain text that the order facts share.

/// `true` when `text` is 1 to `max` visible ASCII characters (0x21 to 0x7E).
pub(super) fn is_visible_ascii(text: &str, max: usize) -> bool {
    !text.is_empty() && text.len() <= max && text.bytes().all(|b| b.is_ascii_graphic())
}

/// SHA-256 of `text` in lower-case hex: the fingerprint of a request's content.
pub(super) fn sha256_hex(text: &str) -> String {
    use sha2::{Digest as _, Sha256};
    Sha256::digest(text.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}
