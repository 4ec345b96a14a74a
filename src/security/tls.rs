//! Server TLS whose certificate, key and client CA are re-read without a restart.
//!
//! tonic's `ServerTlsConfig` fixes its rustls config when the server starts, so listeners
//! terminate TLS themselves with tokio-rustls: each accepted connection takes the config current
//! at that moment, and a reload swaps it for later connections.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;

/// The TLS files could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file holds no usable PEM of the expected kind.
    #[error("{path}: {what}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        what: String,
    },
    /// rustls refused the certificate, key or CA.
    #[error("TLS configuration refused: {0}")]
    Config(String),
}

/// Where the server's TLS material lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TlsFiles {
    /// PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM private key.
    pub key: PathBuf,
    /// PEM CA bundle clients' certificates must chain to (mutual TLS), if any.
    pub client_ca: Option<PathBuf>,
    /// The application protocols offered in the handshake (ALPN).
    pub alpn: Alpn,
}

/// The application protocol a listener speaks, as its TLS handshake offers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Alpn {
    /// gRPC is HTTP/2 only; clients (tonic's among them) require h2 to be negotiated.
    H2,
    /// The `/metrics` listeners: Prometheus scrapes over HTTP/1.1 unless told otherwise.
    Http1,
}

/// The bytes a config was built from, to tell whether the files changed.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Material {
    cert: Vec<u8>,
    key: Vec<u8>,
    client_ca: Option<Vec<u8>>,
}

/// A server TLS config that follows its files.
#[derive(Debug, Clone)]
pub(crate) struct ReloadingTls {
    files: Arc<TlsFiles>,
    state: Arc<RwLock<(Material, Arc<ServerConfig>)>>,
}

impl ReloadingTls {
    /// Loads the files now; a bad file fails start-up.
    pub(crate) fn load(files: TlsFiles) -> Result<Self, TlsError> {
        let material = read(&files)?;
        let config = build(&files, &material)?;
        Ok(Self { files: Arc::new(files), state: Arc::new(RwLock::new((material, config))) })
    }

    /// The config new connections use.
    pub(crate) fn current(&self) -> Arc<ServerConfig> {
        let state = self.state.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        Arc::clone(&state.1)
    }

    /// Re-reads the files and swaps the config when they changed. A file that cannot be used
    /// keeps the previous config serving (and is reported): a half-written rotation must not
    /// take the listener down.
    pub(crate) fn reload(&self) {
        let material = match read(&self.files) {
            Ok(material) => material,
            Err(e) => {
                tracing::warn!(error = %e, "TLS files unreadable; still serving the previous certificate");
                return;
            }
        };
        if self.state.read().map(|state| state.0 == material).unwrap_or(false) {
            return;
        }
        match build(&self.files, &material) {
            Ok(config) => {
                let mut state = self.state.write().unwrap_or_else(std::sync::PoisonError::into_inner);
                *state = (material, config);
                tracing::info!(cert = %self.files.cert.display(), "TLS certificate reloaded");
            }
            Err(e) => {
                tracing::warn!(error = %e, "new TLS files refused; still serving the previous certificate")
            }
        }
    }
}

fn read_file(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read { path: path.to_owned(), source })
}

fn read(files: &TlsFiles) -> Result<Material, TlsError> {
    Ok(Material {
        cert: read_file(&files.cert)?,
        key: read_file(&files.key)?,
        client_ca: files.client_ca.as_deref().map(read_file).transpose()?,
    })
}

fn certificates(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem { path: path.to_owned(), what: e.to_string() })?;
    if certs.is_empty() {
        return Err(TlsError::Pem { path: path.to_owned(), what: "no CERTIFICATE block".into() });
    }
    Ok(certs)
}

fn build(files: &TlsFiles, material: &Material) -> Result<Arc<ServerConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = certificates(&files.cert, &material.cert)?;
    // The key's parse error is not echoed: it could quote the key.
    let key = PrivateKeyDer::from_pem_slice(&material.key)
        .map_err(|_| TlsError::Pem { path: files.key.clone(), what: "no usable PRIVATE KEY block".into() })?;
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let builder = match (&files.client_ca, &material.client_ca) {
        (Some(path), Some(pem)) => {
            let mut roots = rustls::RootCertStore::empty();
            for ca in certificates(path, pem)? {
                roots.add(ca).map_err(|e| TlsError::Config(e.to_string()))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| TlsError::Config(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
        _ => builder.with_no_client_auth(),
    };
    let mut config = builder.with_single_cert(chain, key).map_err(|e| TlsError::Config(e.to_string()))?;
    config.alpn_protocols = match files.alpn {
        Alpn::H2 => vec![b"h2".to_vec()],
        Alpn::Http1 => vec![b"http/1.1".to_vec()],
    };
    Ok(Arc::new(config))
}
