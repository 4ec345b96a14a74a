//! Each end-to-end order's timestamps, written beside the report, so that a level's tail can be
//! looked at event by event (are the slow ones spread out, or bunched in a few moments?).

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

use crate::load::Sent;

/// What the database says happened to an event: created (stamped by the order service),
/// published (marked by the relay; not yet when the consumer was faster) and consumed, each in
/// microseconds since the Unix epoch.
pub(crate) type Committed = HashMap<String, (i64, Option<i64>, i64)>;

/// Writes one line per sent order to `path`: when it was sent (µs since the epoch) and, in ms
/// after that, when it was stamped, published and consumed (empty where it was not).
pub(crate) fn write(path: &Path, sent: &[Sent], committed: &Committed) -> std::io::Result<()> {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    write_to(&mut out, sent, committed)?;
    out.flush()
}

fn write_to(out: &mut impl Write, sent: &[Sent], committed: &Committed) -> std::io::Result<()> {
    writeln!(out, "sent_us,stamped_ms,published_ms,consumed_ms")?;
    for s in sent {
        let sent_us = s.at_micros();
        let after = |at: i64| format!("{:.3}", (at - sent_us) as f64 / 1000.0);
        match committed.get(&s.event_id) {
            Some(&(created, published, consumed)) => writeln!(
                out,
                "{sent_us},{},{},{}",
                after(created),
                published.map(after).unwrap_or_default(),
                after(consumed)
            )?,
            None => writeln!(out, "{sent_us},,,")?,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    #[test]
    fn each_order_is_one_line_of_times_after_its_send_blank_where_none() -> std::io::Result<()> {
        let at = |us| UNIX_EPOCH + Duration::from_micros(us);
        let sent = [
            Sent { at: at(1_000_000), event_id: "a".into() },
            Sent { at: at(2_000_000), event_id: "b".into() },
            Sent { at: at(3_000_000), event_id: "c".into() },
        ];
        let committed = Committed::from([
            ("a".to_owned(), (1_000_100, Some(1_020_000), 1_031_500)),
            ("b".to_owned(), (2_000_200, None, 2_010_000)),
        ]);
        let mut out = Vec::new();
        write_to(&mut out, &sent, &committed)?;
        assert_eq!(
            String::from_utf8_lossy(&out),
            "sent_us,stamped_ms,published_ms,consumed_ms\n\
             1000000,0.100,20.000,31.500\n\
             2000000,0.200,,10.000\n\
             3000000,,,\n"
        );
        Ok(())
    }
}
