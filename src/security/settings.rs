use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// How every gRPC listener of a service is served: TLS, plaintext policy, load bounds.
///
/// Flattened into each service's settings, so every listener is configured the same way.
#[derive(Debug, Clone, clap::Args)]
pub struct ListenerSettings {
    /// PEM certificate chain served on every gRPC listener; turns TLS on. Re-read when the file
    /// changes and on SIGHUP.
    #[arg(long, env = "IDEMPOST_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// PEM private key of `--tls-cert`.
    #[arg(long, env = "IDEMPOST_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// PEM CA bundle for mutual TLS: clients must present a certificate it signed.
    #[arg(long, env = "IDEMPOST_TLS_CLIENT_CA", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,

    /// Serve without TLS on a non-loopback address (a warning says so at start-up). Without it
    /// such a listener refuses to start.
    #[arg(long, env = "IDEMPOST_ALLOW_PLAINTEXT")]
    pub allow_plaintext: bool,

    /// Most calls one listener runs at once; past it a call is answered RESOURCE_EXHAUSTED at
    /// once instead of queueing for a database connection. A call holds no permit before its
    /// token was checked. Default: 8 per connection of the order service's
    /// `--db-max-connections` (128) on each of its two listeners, 16 on a health listener.
    #[arg(long, env = "IDEMPOST_MAX_CONCURRENT_CALLS", value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub max_concurrent_calls: Option<u32>,

    /// Most calls one client connection runs at once, so that one connection cannot take every
    /// permit of its listener; past it a call is answered RESOURCE_EXHAUSTED at once. Default:
    /// the listener's `--max-concurrent-calls` less an eighth of it (at least one less, at least
    /// one call).
    #[arg(long, env = "IDEMPOST_MAX_CALLS_PER_CONNECTION", value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub max_calls_per_connection: Option<u32>,

    /// Longest a call may run on the server; the caller's own deadline wins when shorter.
    #[arg(long, env = "IDEMPOST_CALL_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    pub call_timeout: Duration,

    /// Longest a call's request body may take to arrive after its headers; a body still
    /// incomplete then ends the call DEADLINE_EXCEEDED, before any work.
    #[arg(long, env = "IDEMPOST_BODY_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub body_timeout: Duration,

    /// Most client connections one listener keeps open; past it (or once the process holds 90%
    /// of its open-file limit) a new connection is closed at once, except a few kept for health
    /// checks only, and `idempost.listener.connections_shed` counts it.
    #[arg(long, env = "IDEMPOST_MAX_CONNECTIONS", default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_connections: u32,

    /// Most TLS handshakes one listener runs at once; a connection whose ClientHello arrived
    /// waits briefly for one, then is closed (and counted). Each handshake must also finish
    /// within 10 s of the connection's accept.
    #[arg(long, env = "IDEMPOST_MAX_TLS_HANDSHAKES", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub max_tls_handshakes: u32,

    /// Most client connections one peer address (an IPv6 peer: its /64) keeps open on one
    /// listener; past it a new connection from it is closed at once (and counted). Peers at
    /// 127.0.0.1 and ::1 (this host's own probes and sidecars) are not counted. Raise it when a
    /// proxy or NAT puts many clients behind one address.
    #[arg(long, env = "IDEMPOST_MAX_CONNECTIONS_PER_ADDRESS", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_connections_per_address: u32,

    /// Most TLS handshakes one peer address runs at once on one listener, from its connection's
    /// accept to the handshake's end; past it a new connection from it is closed at once (and
    /// counted). Peers at 127.0.0.1 and ::1 draw on 8 handshakes of their own instead.
    #[arg(long, env = "IDEMPOST_MAX_TLS_HANDSHAKES_PER_ADDRESS", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub max_tls_handshakes_per_address: u32,

    /// The TLS client's first bytes (its ClientHello) must arrive this soon after it connects,
    /// else the connection is closed before it waits for a handshake slot: a silent connection
    /// holds no slot. Not a flag: a client sends its ClientHello as soon as it is connected.
    #[arg(skip = Duration::from_secs(3))]
    pub tls_first_byte_timeout: Duration,

    /// How long a connection whose ClientHello arrived waits for one of the listener's
    /// `--max-tls-handshakes` before it is closed: a burst waits its turn, a listener held full
    /// sheds. Not a flag: it only needs to outlast a burst of honest handshakes.
    #[arg(skip = Duration::from_secs(1))]
    pub tls_handshake_slot_wait: Duration,

    /// A connection that has made no authenticated call this long after it opened is closed;
    /// health checks, reflection and calls refused for their token do not count (nor do they
    /// keep a connection from its `--idle-timeout`).
    #[arg(long, env = "IDEMPOST_UNAUTHENTICATED_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    pub unauthenticated_timeout: Duration,

    /// A connection is closed once this many of its calls were refused for their token (missing,
    /// invalid, expired), after the last refusal's answer.
    #[arg(long, env = "IDEMPOST_MAX_REFUSED_CALLS", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_refused_calls: u32,

    /// Most HTTP/2 streams a client may open at once on one connection (the
    /// `SETTINGS_MAX_CONCURRENT_STREAMS` the server announces); health checks count too.
    #[arg(long, env = "IDEMPOST_MAX_CONCURRENT_STREAMS", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub max_concurrent_streams: u32,

    /// Most `grpc.health.v1.Health/Watch` streams one listener serves at once; past it a Watch
    /// is answered RESOURCE_EXHAUSTED. A stream lives at most as long as its connection.
    #[arg(long, env = "IDEMPOST_MAX_WATCH_STREAMS", default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub max_watch_streams: u32,

    /// A connection with no authenticated call in flight for this long is closed.
    #[arg(long, env = "IDEMPOST_IDLE_TIMEOUT", default_value = "5m", value_parser = humantime::parse_duration)]
    pub idle_timeout: Duration,

    /// A connection open this long is asked to go away (HTTP/2 GOAWAY: the client reconnects)
    /// and closed once its calls finish, or after one more `--call-timeout` at the latest.
    #[arg(long, env = "IDEMPOST_MAX_CONNECTION_AGE", default_value = "30m", value_parser = humantime::parse_duration)]
    pub max_connection_age: Duration,

    /// How often an HTTP/2 PING checks that a connection's client is still there.
    #[arg(long, env = "IDEMPOST_KEEPALIVE_INTERVAL", default_value = "30s", value_parser = humantime::parse_duration)]
    pub keepalive_interval: Duration,

    /// A connection whose client does not answer a PING within this is closed.
    #[arg(long, env = "IDEMPOST_KEEPALIVE_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub keepalive_timeout: Duration,

    /// How often the certificate, key, client CA and JWKS files are checked for changes.
    #[arg(long, env = "IDEMPOST_RELOAD_EVERY", default_value = "5s", value_parser = humantime::parse_duration)]
    pub reload_every: Duration,
}

impl ListenerSettings {
    /// These settings with `limit` as the concurrency limit unless one was set.
    pub fn limited_by_default(&self, limit: u32) -> Self {
        Self { max_concurrent_calls: Some(self.max_concurrent_calls.unwrap_or(limit)), ..self.clone() }
    }
}

impl Default for ListenerSettings {
    /// Plaintext (loopback only), the default load limits, 30 s per call.
    fn default() -> Self {
        Self {
            tls_cert: None,
            tls_key: None,
            tls_client_ca: None,
            allow_plaintext: false,
            max_concurrent_calls: None,
            max_calls_per_connection: None,
            call_timeout: Duration::from_secs(30),
            body_timeout: Duration::from_secs(10),
            max_connections: 512,
            max_tls_handshakes: 64,
            max_connections_per_address: 64,
            max_tls_handshakes_per_address: 8,
            tls_first_byte_timeout: Duration::from_secs(3),
            tls_handshake_slot_wait: Duration::from_secs(1),
            unauthenticated_timeout: Duration::from_secs(30),
            max_refused_calls: 8,
            max_concurrent_streams: 256,
            max_watch_streams: 32,
            idle_timeout: Duration::from_secs(300),
            max_connection_age: Duration::from_secs(1800),
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(10),
            reload_every: Duration::from_secs(5),
        }
    }
}

/// How callers of the OrderService, the AdminService and the consumer's ConsumerAdminService
/// prove who they are.
#[derive(Debug, Clone, clap::Args)]
pub struct AuthSettings {
    /// `jwt`: every call carries `authorization: Bearer <JWT>`. `none`: no authentication, for
    /// the demo and tests; accepted only when every listener is on loopback.
    #[arg(long, env = "IDEMPOST_AUTH", value_enum, default_value_t = AuthMode::Jwt)]
    pub auth: AuthMode,

    /// JWKS document (JSON) with the public keys tokens are signed with; re-read when it changes
    /// and on SIGHUP. Required with `--auth jwt`.
    #[arg(long, env = "IDEMPOST_AUTH_JWKS")]
    pub auth_jwks: Option<PathBuf>,

    /// The `iss` every token must carry. Required with `--auth jwt`.
    #[arg(long, env = "IDEMPOST_AUTH_ISSUER")]
    pub auth_issuer: Option<String>,

    /// An `aud` every token must carry. Required with `--auth jwt`.
    #[arg(long, env = "IDEMPOST_AUTH_AUDIENCE")]
    pub auth_audience: Option<String>,

    /// The claim naming the caller's tenant (a positive integer, or its decimal string).
    #[arg(long, env = "IDEMPOST_AUTH_TENANT_CLAIM", default_value = "tenant_id")]
    pub auth_tenant_claim: String,

    /// The scope (in `scope` or `scp`) that makes a caller an operator: needed for ListBacklog,
    /// Redrive, Purge and every ConsumerAdminService call, and to read another tenant's orders
    /// (a tenant's token reads its own with Reconcile, FindByBusinessKey and GetEventTimeline,
    /// without the relay's lease owner and error text).
    #[arg(long, env = "IDEMPOST_AUTH_ADMIN_SCOPE", default_value = "idempost:admin")]
    pub auth_admin_scope: String,

    /// Clock skew allowed on `exp` and `nbf`, at most 2 minutes.
    #[arg(long, env = "IDEMPOST_AUTH_LEEWAY", default_value = "30s", value_parser = parse_leeway)]
    pub auth_leeway: Duration,

    /// Serve gRPC reflection (unauthenticated, like health) on every gRPC listener. Default, for
    /// each listener alike: on when it is loopback, off otherwise.
    #[arg(long, env = "IDEMPOST_REFLECTION")]
    pub reflection: Option<bool>,
}

/// Whether callers are authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AuthMode {
    /// Bearer JWTs checked against `--auth-jwks`.
    Jwt,
    /// Nobody is authenticated; only on loopback.
    None,
}

/// The most clock skew a token check allows.
pub(crate) const MAX_LEEWAY: Duration = Duration::from_secs(120);

fn parse_leeway(text: &str) -> Result<Duration, String> {
    let leeway = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    if leeway > MAX_LEEWAY {
        return Err(format!("at most {}", humantime::format_duration(MAX_LEEWAY)));
    }
    Ok(leeway)
}

impl AuthSettings {
    /// No authentication: for tests and embedding on loopback.
    pub fn none() -> Self {
        Self {
            auth: AuthMode::None,
            auth_jwks: None,
            auth_issuer: None,
            auth_audience: None,
            auth_tenant_claim: "tenant_id".to_owned(),
            auth_admin_scope: "idempost:admin".to_owned(),
            auth_leeway: Duration::from_secs(30),
            reflection: None,
        }
    }

    /// JWT authentication against the JWKS in `jwks`, for `issuer` and `audience`.
    pub fn jwt(jwks: impl Into<PathBuf>, issuer: impl Into<String>, audience: impl Into<String>) -> Self {
        Self {
            auth: AuthMode::Jwt,
            auth_jwks: Some(jwks.into()),
            auth_issuer: Some(issuer.into()),
            auth_audience: Some(audience.into()),
            ..Self::none()
        }
    }

    /// Whether the listener at `addr` serves reflection.
    pub fn reflection_on(&self, addr: SocketAddr) -> bool {
        self.reflection.unwrap_or_else(|| addr.ip().is_loopback())
    }
}

/// The order service's security settings: its listeners and its callers.
#[derive(Debug, Clone, clap::Args)]
pub struct SecuritySettings {
    /// TLS, plaintext policy and load bounds of both listeners.
    #[command(flatten)]
    pub listeners: ListenerSettings,
    /// Who may call.
    #[command(flatten)]
    pub auth: AuthSettings,
}

impl SecuritySettings {
    /// Plaintext and no authentication: only valid on loopback (tests, embedding).
    pub fn loopback() -> Self {
        Self { listeners: ListenerSettings::default(), auth: AuthSettings::none() }
    }
}
