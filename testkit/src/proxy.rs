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

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::copy_bidirectional;
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

/// Where connections go, and a token every connection to the current target holds (so a
/// re-point can tell when the last one to the old target has closed).
#[derive(Debug)]
struct Route {
    target: watch::Sender<SocketAddr>,
    open: Mutex<Arc<()>>,
}

impl Route {
    /// What a new connection needs: the target to follow and the token of its generation, taken
    /// together so that a re-point falls before or after both.
    fn join(&self) -> (watch::Receiver<SocketAddr>, Arc<()>) {
        let open = self.open.lock().unwrap();
        (self.target.subscribe(), Arc::clone(&open))
    }
}

impl TcpProxy {
    /// Listens on a free loopback port and forwards each connection to `target`.
    pub async fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let route = Arc::new(Route { target: watch::channel(target).0, open: Mutex::new(Arc::new(())) });
        let accepting = tokio::spawn({
            let route = Arc::clone(&route);
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    let (target, token) = route.join();
                    tokio::spawn(forward(client, target, token));
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
async fn forward(mut client: TcpStream, mut target: watch::Receiver<SocketAddr>, _open: Arc<()>) {
    let to = *target.borrow_and_update();
    let Ok(mut server) = TcpStream::connect(to).await else {
        return;
    };
    tokio::select! {
        _ = copy_bidirectional(&mut client, &mut server) => {}
        _ = target.changed() => {}
    }
}
