//! Text that came from elsewhere (a caller's field, an operator's reason, a broker's header, a
//! server's error) made safe to put in a log line, a span field or a terminal: one helper, so
//! that every place that shows such text escapes and bounds it the same way.

use std::fmt::Write as _;

/// `text` with every control character (newlines, ANSI escapes, C1 controls), every bidirectional
/// formatting character and every backslash escaped as [`char::escape_default`] writes them, cut
/// so that the result is at most `max` bytes. A cut text ends with `...(N bytes)`, N the length of
/// the original, so a reader knows that it was cut and by how much.
///
/// Escaped rather than dropped: a reader still sees that a newline or an escape was there. The
/// backslash is escaped too, so that text which already holds one cannot pass for an escape.
/// The work stops at the bound: a 4 MiB text costs no more than a short one.
pub fn escape_for_log(text: &str, max: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max) + 8);
    for c in text.chars() {
        if c.is_control() || c == '\\' || is_bidi_control(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
        if out.len() > max {
            return cut(out, text.len(), max);
        }
    }
    out
}

/// `out` cut to `max` bytes in all, its end replaced by the marker that says so.
fn cut(mut out: String, original: usize, max: usize) -> String {
    let mut marker = String::new();
    let _ = write!(marker, "...({original} bytes)");
    let mut keep = max.saturating_sub(marker.len());
    while !out.is_char_boundary(keep) {
        keep -= 1;
    }
    out.truncate(keep);
    out.push_str(&marker);
    // Only a bound shorter than the marker itself leaves more than `max`: the marker is ASCII.
    out.truncate(max);
    out
}

/// The Unicode characters that reorder displayed text (the "Trojan source" characters).
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

#[cfg(test)]
mod tests {
    use super::escape_for_log;

    #[test]
    fn control_characters_and_backslashes_are_escaped_and_other_text_is_kept() {
        assert_eq!(escape_for_log("a\nb\u{1b}[31mc\\d é", 100), "a\\nb\\u{1b}[31mc\\\\d é");
        assert_eq!(escape_for_log("right\u{202E}left", 100), "right\\u{202e}left");
    }

    #[test]
    fn a_long_text_is_cut_to_the_bound_and_says_how_long_it_was() {
        let long = "\n".repeat(100_000);
        let shown = escape_for_log(&long, 64);
        assert_eq!(shown.len(), 64);
        assert!(shown.ends_with("...(100000 bytes)"), "{shown}");
        assert!(!shown.contains('\n'));
    }

    #[test]
    fn a_cut_never_splits_a_character() {
        let shown = escape_for_log(&"é".repeat(50), 31);
        assert!(shown.len() <= 31);
        assert!(shown.ends_with("...(100 bytes)"), "{shown}");
    }

    #[test]
    fn a_text_that_fits_is_not_cut() {
        assert_eq!(escape_for_log("exactly", 7), "exactly");
    }
}
