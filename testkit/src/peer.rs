//! Peers at addresses of their own: Linux answers every 127.0.0.0/8 address on loopback, so a
//! test binds 127.0.0.2, 127.0.0.3, ... to stand for distinct hosts, while 127.0.0.1 is the
//! service host's own (its probes).

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::mpsc;
use tonic::codegen::http::Uri;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

/// The loopback address `127.0.0.<last>`, a peer of its own.
pub fn host(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
}

/// A TCP connection from `source` to the service's `port` on 127.0.0.1.
pub async fn connect_from(source: IpAddr, port: u16) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(source, 0))?;
    socket.connect(SocketAddr::new(host(1), port)).await
}

/// A gRPC connector whose connections come from `source`; each one it makes is announced on
/// `connected`, so a test can act once the service has the connection.
#[derive(Debug, Clone)]
pub struct FromSource {
    source: IpAddr,
    port: u16,
    connected: mpsc::UnboundedSender<()>,
}

impl tonic::codegen::Service<Uri> for FromSource {
    type Response = TokioIo<TcpStream>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = std::io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: Uri) -> Self::Future {
        let (source, port, connected) = (self.source, self.port, self.connected.clone());
        Box::pin(async move {
            let stream = connect_from(source, port).await?;
            let _ = connected.send(());
            Ok(TokioIo::new(stream))
        })
    }
}

/// What a TLS health probe from `source` to a service on `port` (with a certificate for
/// `localhost` from `ca`) got: the status, or why it got none. `connected` hears of its TCP
/// connection as soon as it is made, before the handshake.
pub async fn tls_health_from(
    source: IpAddr,
    port: u16,
    ca: &Path,
    connected: mpsc::UnboundedSender<()>,
) -> Result<ServingStatus, String> {
    let tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(std::fs::read(ca).unwrap()));
    let endpoint = Endpoint::from_shared(format!("https://localhost:{port}"))
        .unwrap()
        .tls_config(tls)
        .map_err(|e| e.to_string())?
        .timeout(Duration::from_secs(20));
    let channel = endpoint
        .connect_with_connector(FromSource { source, port, connected })
        .await
        .map_err(|e| format!("{e:?}"))?;
    let answer = HealthClient::new(channel)
        .check(HealthCheckRequest { service: String::new() })
        .await
        .map_err(|e| format!("{e:?}"))?;
    Ok(answer.into_inner().status())
}

/// [`tls_health_from`] for a probe that need not be watched.
pub async fn tls_probe_from(source: IpAddr, port: u16, ca: &Path) -> Result<ServingStatus, String> {
    tls_health_from(source, port, ca, mpsc::unbounded_channel().0).await
}
