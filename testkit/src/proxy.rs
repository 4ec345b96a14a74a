//! A TCP proxy in front of a database, which a test re-points at another server: what a load
//! balancer with a health check (HAProxy in front of a Galera cluster, say) does when the node
//! behind it fails. The services take one database URL each, and neither sqlx nor SeaORM can
//! name several MySQL hosts in one, so moving them to another node is the proxy's job.
//!
//! Re-pointing sends new connections to the new server and cuts every connection to the old one
//! (HAProxy's `on-marked-down shutdown-sessions`): a session on a node cut off from its cluster
//! stays open and only refuses queries (it even answers a ping), so a pool would otherwise keep
//! using it. It returns once every old connection is closed, so the test's next call cannot
//! race a session still open to the old server.
//!
//! A test can also hold the server's replies back ([`TcpProxy::hold_replies`]): a statement the
//! server ran and answered whose answer never reaches the client before the cut, as when a node
//! is cut off between its COMMIT and the acknowledgement.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::wait::{WAIT, eventually};

/// A proxy on a loopback port of its own; every connection is cut when it is dropped.
#[derive(Debug)]
pub struct TcpProxy {
    port: u16,
    route: Arc<Route>,
    accepting: JoinHandle<()>,
}

/// Where connections go, a token every connection to the current target holds (so a re-point
/// can tell when the last one to the old target has closed), and whether replies are held.
#[derive(Debug)]
struct Route {
    target: watch::Sender<SocketAddr>,
    open: Mutex<Arc<()>>,
    replies_held: watch::Sender<bool>,
}

/// What one connection follows: the target, and whether the server's replies are held.
struct Follow {
    target: watch::Receiver<SocketAddr>,
    replies_held: watch::Receiver<bool>,
}

impl Route {
    /// What a new connection needs: what to follow and the token of its generation, taken
    /// together so that a re-point falls before or after both.
    fn join(&self) -> (Follow, Arc<()>) {
        let open = self.open.lock().unwrap();
        let follow = Follow { target: self.target.subscribe(), replies_held: self.replies_held.subscribe() };
        (follow, Arc::clone(&open))
    }
}

impl TcpProxy {
    /// Listens on a free loopback port and forwards each connection to `target`.
    pub async fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let route = Arc::new(Route {
            target: watch::channel(target).0,
            open: Mutex::new(Arc::new(())),
            replies_held: watch::channel(false).0,
        });
        let accepting = tokio::spawn({
            let route = Arc::clone(&route);
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    let (follow, token) = route.join();
                    tokio::spawn(forward(client, follow, token));
                }
            }
        });
        Self { port, route, accepting }
    }

    /// The port the proxy listens on (on 127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Sends new connections to `target`, cuts every open one, and waits until they are closed.
    pub async fn repoint(&self, target: SocketAddr) {
        let old = {
            let mut open = self.route.open.lock().unwrap();
            self.route.target.send_replace(target);
            std::mem::replace(&mut *open, Arc::new(()))
        };
        let closed = eventually(WAIT, || {
            let old = Arc::clone(&old);
            async move { Arc::strong_count(&old) == 2 }
        })
        .await;
        assert!(closed, "the proxy's connections to the old target did not close within {WAIT:?}");
    }

    /// From now on, no byte a server sends reaches its client (on every connection, new ones
    /// too) until [`TcpProxy::release_replies`]; the client's bytes still reach the server.
    pub fn hold_replies(&self) {
        self.route.replies_held.send_replace(true);
    }

    /// Ends [`TcpProxy::hold_replies`]: the held replies go on to their clients.
    pub fn release_replies(&self) {
        self.route.replies_held.send_replace(false);
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        // The open connections end with the route's sender, once the accepting task (which
        // holds the route too) is gone.
        self.accepting.abort();
    }
}

/// Copies both ways between `client` and the current target until either side closes, the
/// proxy is re-pointed, or it is gone.
/// `_open` is held until the connection is closed.
async fn forward(client: TcpStream, follow: Follow, _open: Arc<()>) {
    let Follow { mut target, replies_held } = follow;
    let to = *target.borrow_and_update();
    let Ok(server) = TcpStream::connect(to).await else {
        return;
    };
    let (mut from_client, mut to_client) = client.into_split();
    let (from_server, mut to_server) = server.into_split();
    tokio::select! {
        _ = tokio::io::copy(&mut from_client, &mut to_server) => {}
        _ = replies(from_server, &mut to_client, replies_held) => {}
        _ = target.changed() => {}
    }
}

/// Copies the server's bytes to the client, except while replies are held: bytes read then wait
/// here until they are released (or the connection is cut, and they are lost).
async fn replies(mut server: OwnedReadHalf, client: &mut OwnedWriteHalf, mut held: watch::Receiver<bool>) {
    let mut buffer = vec![0; 16 * 1024];
    loop {
        let Ok(read @ 1..) = server.read(&mut buffer).await else {
            return;
        };
        if held.wait_for(|held| !*held).await.is_err() || client.write_all(&buffer[..read]).await.is_err() {
            return;
        }
    }
}
