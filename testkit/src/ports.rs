//! Ports: the port file a service writes once its listeners are bound (`--port-file`), and, for
//! the few programs that cannot write one, a port nothing listens on yet.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::time::{Duration, Instant};

/// Where ports are reserved: below the kernel's ephemeral range (`ip_local_port_range`, 32768-60999
/// by default), so no program that binds port 0 (every Idempost service in the tests) is handed one
/// of them, and above the ports of the machine's own servers.
const RESERVABLE: std::ops::Range<u16> = 20_000..32_000;

/// The lock files of the ports this process reserved, held (and so the ports reserved) until the
/// process exits: nextest runs each test in a process of its own.
static RESERVED: std::sync::Mutex<Vec<std::fs::File>> = std::sync::Mutex::new(Vec::new());

/// A port for a program that cannot bind port 0 and say which port it got (Tansu, mariadbd,
/// pg_ctl), and for addresses that must refuse connections. Nothing listens on it at the call,
/// no other test process is given it while this one lives (a lock on a file of its own in the
/// temporary directory, released by the kernel when the process exits, however it ends), and no
/// port-0 bind can take it (see [`RESERVABLE`]). A port that is free only by chance, bound and
/// dropped, was taken by another test's service between the drop and the broker's bind.
pub fn free_port() -> u16 {
    let dir = std::env::temp_dir().join("idempost-test-ports");
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
    let span = RESERVABLE.end - RESERVABLE.start;
    // A random start, so that test processes seldom try the same ports first.
    let start = (uuid::Uuid::new_v4().as_u128() % u128::from(span)) as u16;
    for offset in 0..span {
        let port = RESERVABLE.start + (start + offset) % span;
        let Ok(file) = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(port.to_string()))
        else {
            continue;
        };
        if file.try_lock().is_ok() && TcpListener::bind(("127.0.0.1", port)).is_ok() {
            RESERVED.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(file);
            return port;
        }
    }
    panic!("no port of {RESERVABLE:?} on 127.0.0.1 is free and unreserved")
}

/// The listeners a service wrote to its port file: `name=address`, one a line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Bound(HashMap<String, SocketAddr>);

impl Bound {
    /// Parses a port file's text; lines that are not `name=address` are skipped.
    pub fn parse(text: &str) -> Self {
        let pairs = text.lines().filter_map(|line| {
            let (name, addr) = line.split_once('=')?;
            Some((name.trim().to_owned(), addr.trim().parse().ok()?))
        });
        Self(pairs.collect())
    }

    /// The address of the listener called `name` (the flag that set it: `listen`,
    /// `admin-listen`, `wake-listen`).
    pub fn addr(&self, name: &str) -> Option<SocketAddr> {
        self.0.get(name).copied()
    }

    /// The port of the listener called `name`; panics if there is none.
    pub fn port(&self, name: &str) -> u16 {
        self.addr(name).unwrap_or_else(|| panic!("no `{name}` listener in the port file: {self:?}")).port()
    }
}

/// Waits up to `timeout` for the port file at `path` (written whole, by rename, once every
/// listener is bound) and reads it. `alive` is asked between looks so that a service that exited
/// fails at once instead of after the timeout; it answers why it is not alive.
pub async fn wait_for_port_file(
    path: &Path,
    timeout: Duration,
    mut alive: impl FnMut() -> Result<(), String>,
) -> Result<Bound, String> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(text) = std::fs::read_to_string(path) {
            return Ok(Bound::parse(&text));
        }
        alive()?;
        if Instant::now() >= deadline {
            return Err(format!("no port file at {} within {timeout:?}", path.display()));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reserved_port_is_outside_the_ephemeral_range_and_not_reserved_twice() {
        let (a, b) = (free_port(), free_port());
        assert_ne!(a, b);
        assert!(RESERVABLE.contains(&a) && RESERVABLE.contains(&b));
        // Another process (here: another open file description) cannot take the reservation.
        let lock = std::env::temp_dir().join("idempost-test-ports").join(a.to_string());
        let again = std::fs::OpenOptions::new().write(true).open(lock).unwrap();
        assert!(again.try_lock().is_err(), "port {a} is reserved by this process");
    }
}
