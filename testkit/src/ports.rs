//! Ports: the port file a service writes once its listeners are bound (`--port-file`), and, for
//! the few programs that cannot write one, a port nothing listens on yet.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::time::{Duration, Instant};

/// A port nothing listens on at the moment of the call. Racy by nature (another process may take
/// it before the caller binds it): only for programs that cannot bind port 0 and say which port
/// they got, and for addresses that must refuse connections.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("no free port on 127.0.0.1: {e}"))
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
