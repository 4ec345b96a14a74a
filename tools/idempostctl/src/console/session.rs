//! The console key and the sessions it is exchanged for.
//!
//! The key printed in the console's URL is good for one exchange: the page sends it once and gets
//! a session cookie in return, and the key is spent. A key printed in a terminal (its scrollback,
//! a screen share, a shell history) is then worth nothing, and a page that did not make the
//! exchange cannot use the console. A key left unused expires too; a new one is printed on demand.

use std::time::{Duration, Instant};

/// How long a printed key may wait for its one use.
pub(super) const KEY_LIFETIME: Duration = Duration::from_secs(15 * 60);

/// How long a session lasts from its exchange: an incident's working stretch, not a day. The
/// cookie says the same (`Max-Age`), so the browser drops it when the console does.
pub(super) const SESSION_LIFETIME: Duration = Duration::from_secs(60 * 60);

/// Sessions held at once. A session is made only by spending a key, and keys are printed only on
/// the operator's terminal, so a few cover several browser windows; past it the oldest ends.
const MAX_SESSIONS: usize = 8;

/// A session's id, as the cookie carries it.
pub(super) type SessionId = String;

/// Why a key was not exchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum NotExchanged {
    /// No key, or not the one printed last.
    Unknown,
    /// The key was exchanged already, or waited longer than [`KEY_LIFETIME`].
    Spent,
}

/// The key that may still be exchanged, and the sessions exchanged so far.
#[derive(Debug, Default)]
pub(super) struct Sessions {
    key: Option<Key>,
    spent: Vec<String>,
    sessions: Vec<(SessionId, Instant)>,
}

#[derive(Debug)]
struct Key {
    secret: String,
    until: Instant,
}

impl Sessions {
    /// A new key for the URL; a key printed before and still unused can no longer be exchanged.
    pub(super) fn issue_key(&mut self, now: Instant) -> String {
        let secret = secret();
        if let Some(previous) = self.key.replace(Key { secret: secret.clone(), until: now + KEY_LIFETIME }) {
            self.remember_spent(previous.secret);
        }
        secret
    }

    /// Exchanges `presented` for a new session when it is the key printed last, unused and in
    /// time; the key is spent either way once it matched.
    pub(super) fn exchange(&mut self, presented: &[u8], now: Instant) -> Result<SessionId, NotExchanged> {
        let Some(key) = self.key.take_if(|key| same(presented, key.secret.as_bytes())) else {
            let spent = self.spent.iter().any(|old| same(presented, old.as_bytes()));
            return Err(if spent { NotExchanged::Spent } else { NotExchanged::Unknown });
        };
        let expired = now >= key.until;
        self.remember_spent(key.secret);
        if expired {
            return Err(NotExchanged::Spent);
        }
        self.sessions.retain(|(_, until)| *until > now);
        if self.sessions.len() >= MAX_SESSIONS {
            self.sessions.remove(0);
        }
        let id = secret();
        self.sessions.push((id.clone(), now + SESSION_LIFETIME));
        Ok(id)
    }

    /// Whether `presented` is a session that has not ended.
    pub(super) fn admits(&self, presented: &[u8], now: Instant) -> bool {
        self.sessions.iter().any(|(id, until)| *until > now && same(presented, id.as_bytes()))
    }

    /// Keeps a few spent keys so that a second use is told it is late rather than wrong.
    fn remember_spent(&mut self, secret: String) {
        if self.spent.len() >= MAX_SESSIONS {
            self.spent.remove(0);
        }
        self.spent.push(secret);
    }
}

/// 244 random bits (two v4 UUIDs), hex.
fn secret() -> String {
    format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple())
}

/// Compares secrets in time independent of where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_exchanged_once_for_a_session_that_ends() {
        let now = Instant::now();
        let mut sessions = Sessions::default();
        let key = sessions.issue_key(now);

        let session = sessions.exchange(key.as_bytes(), now).unwrap();

        assert!(sessions.admits(session.as_bytes(), now + SESSION_LIFETIME / 2));
        assert!(!sessions.admits(session.as_bytes(), now + SESSION_LIFETIME));
        assert_eq!(sessions.exchange(key.as_bytes(), now), Err(NotExchanged::Spent));
        assert_eq!(sessions.exchange(b"guess", now), Err(NotExchanged::Unknown));
        assert!(!sessions.admits(key.as_bytes(), now), "the key is not a session");
    }

    #[test]
    fn an_unused_key_expires_and_a_new_one_replaces_it() {
        let now = Instant::now();
        let mut sessions = Sessions::default();
        let late = sessions.issue_key(now);
        assert_eq!(sessions.exchange(late.as_bytes(), now + KEY_LIFETIME), Err(NotExchanged::Spent));

        let replaced = sessions.issue_key(now);
        let current = sessions.issue_key(now);

        assert_eq!(sessions.exchange(replaced.as_bytes(), now), Err(NotExchanged::Spent));
        assert!(sessions.exchange(current.as_bytes(), now).is_ok());
    }

    #[test]
    fn only_the_same_secret_matches() {
        assert!(same(b"abc", b"abc"));
        assert!(!same(b"abc", b"abd") && !same(b"abc", b"ab") && !same(b"", b"a"));
    }
}
