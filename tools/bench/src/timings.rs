//! Each end-to-end order's timestamps, written beside the report, so that a level's tail can be
//! looked at event by event (are the slow ones spread out, or bunched in a few moments?), and
//! the one figure of that the table prints ([`bunching`]).

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

/// The stretch of sending [`bunching`] looks at.
pub(crate) const BUNCH_SECONDS: f64 = 2.0;

/// How the events slower than a level's p99 were spread over the level.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Bunching {
    /// The most of them sent within any [`BUNCH_SECONDS`], as a share of all of them: near 1,
    /// one episode made the tail; near `BUNCH_SECONDS` / the level's length, it was spread out.
    pub(crate) share: f64,
    /// When that stretch began, in seconds after the level's first send.
    pub(crate) from_seconds: f64,
}

/// [`Bunching`] of the events in `level` (each its send time in µs since the epoch and its
/// latency in ms) whose latency is above `p99_ms`; `None` when none is.
pub(crate) fn bunching(level: &[(i64, f64)], p99_ms: f64) -> Option<Bunching> {
    let first = level.iter().map(|&(sent, _)| sent).min()?;
    let mut slow: Vec<i64> = level.iter().filter(|&&(_, ms)| ms > p99_ms).map(|&(sent, _)| sent).collect();
    slow.sort_unstable();
    let window = (BUNCH_SECONDS * 1e6) as i64;
    // For each slow event, how many slow events were sent in the window it opens.
    let (mut best, mut best_from, mut end) = (0, *slow.first()?, 0);
    for (start, &from) in slow.iter().enumerate() {
        while end < slow.len() && slow[end] < from + window {
            end += 1;
        }
        if end - start > best {
            (best, best_from) = (end - start, from);
        }
    }
    Some(Bunching { share: best as f64 / slow.len() as f64, from_seconds: (best_from - first) as f64 / 1e6 })
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

    #[test]
    fn a_tail_sent_in_one_episode_is_all_in_the_worst_stretch_and_a_spread_one_is_not() {
        let second = 1_000_000;
        // Fast events every 100 ms for 30 s; slow ones at 10.0-11.5 s, and one alone at 25 s.
        let mut level: Vec<(i64, f64)> = (0..300).map(|i| (5 * second + i * second / 10, 40.0)).collect();
        level.extend((0..4).map(|i| (15 * second + i * second / 2, 400.0)));
        level.push((30 * second, 300.0));
        let bunched = bunching(&level, 100.0);
        assert_eq!(bunched, Some(Bunching { share: 0.8, from_seconds: 10.0 }));

        let spread: Vec<(i64, f64)> =
            (0..10).map(|i| (i * 3 * second, if i % 2 == 0 { 200.0 } else { 50.0 })).collect();
        assert_eq!(bunching(&spread, 100.0), Some(Bunching { share: 0.2, from_seconds: 0.0 }));
        assert_eq!(bunching(&spread, 500.0), None);
        assert_eq!(bunching(&[], 1.0), None);
    }
}
