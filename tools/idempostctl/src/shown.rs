//! Text the servers send (a dead letter's error, a parked event's reason taken from a record's
//! headers, a broker's error, an operator's reason) made safe for the terminal: whoever could
//! write that text must not be able to move the cursor, recolour the screen, or rewrite lines
//! above it.

use idempost_proto::escape_for_log;

/// The most bytes of one server text a table cell shows.
const CELL_BYTES: usize = 2048;

/// One server text as a table cell shows it: control characters (newlines included) escaped,
/// at most [`CELL_BYTES`].
pub(crate) fn shown(text: &str) -> String {
    escape_for_log(text, CELL_BYTES)
}

/// The whole output, once more, with every control character but the newline escaped as
/// [`char::escape_default`] writes it: the last guard for server text a table cell took as it
/// came. The tables' own layout is made of newlines and printable characters only. (Backslashes
/// stay: [`shown`] already escaped those of the text it took.)
pub(crate) fn terminal_safe(output: &str) -> String {
    let mut safe = String::with_capacity(output.len());
    for c in output.chars() {
        if c.is_control() && c != '\n' {
            safe.extend(c.escape_default());
        } else {
            safe.push(c);
        }
    }
    safe
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ansi_escape_in_server_text_is_printed_escaped() {
        assert_eq!(shown("boom\u{1b}[2J\nnext"), "boom\\u{1b}[2J\\nnext");
        assert_eq!(terminal_safe("row 1 \u{1b}[31mred\nrow 2\r"), "row 1 \\u{1b}[31mred\nrow 2\\r");
    }
}
