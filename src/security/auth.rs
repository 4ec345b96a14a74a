//! Bearer-token authentication: who is calling, for which tenant, and whether as an operator.
//!
//! A token is checked against the JWKS file (re-read when it changes), the configured issuer and
//! audience, and `exp`/`nbf` with a bounded leeway. The token itself is never logged, recorded
//! on a span or echoed in an error: only the reason it was refused is.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, AlgorithmFamily, DecodingKey, Validation};
use serde_json::Value;
use tokio::sync::watch;
use tonic::Code;
use tonic::metadata::MetadataMap;

use super::{AuthMode, AuthSettings};

/// Why a call was refused before it did anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No `authorization: Bearer` metadata.
    #[error("the call carries no bearer token: send `authorization: Bearer <JWT>`")]
    TokenMissing,
    /// The token is malformed, signed by an unknown key, or has the wrong issuer or audience.
    #[error("the bearer token is not valid for this service")]
    TokenInvalid,
    /// The token's `exp` has passed (beyond the leeway).
    #[error("the bearer token has expired")]
    TokenExpired,
    /// The request names a tenant other than the token's, or the token names none.
    #[error("the request's tenant_id is not the tenant the token was issued for")]
    TenantMismatch,
    /// The call needs the operator scope.
    #[error("this call needs the operator scope")]
    ScopeMissing,
}

impl AuthError {
    /// The gRPC code: UNAUTHENTICATED for the token, PERMISSION_DENIED for what it allows.
    pub fn code(self) -> Code {
        match self {
            Self::TokenMissing | Self::TokenInvalid | Self::TokenExpired => Code::Unauthenticated,
            Self::TenantMismatch | Self::ScopeMissing => Code::PermissionDenied,
        }
    }

    /// `ErrorInfo.reason`.
    pub fn reason(self) -> &'static str {
        match self {
            Self::TokenMissing => "TOKEN_MISSING",
            Self::TokenInvalid => "TOKEN_INVALID",
            Self::TokenExpired => "TOKEN_EXPIRED",
            Self::TenantMismatch => "TENANT_MISMATCH",
            Self::ScopeMissing => "SCOPE_MISSING",
        }
    }
}

/// The authenticated caller of one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The token's `sub`; `None` only with `--auth none`.
    pub subject: Option<String>,
    /// The tenant the token was issued for, if it names one.
    pub tenant: Option<i64>,
    /// Whether the token carries the operator scope (always with `--auth none`).
    pub operator: bool,
}

impl Caller {
    /// The caller with `--auth none`: anyone on loopback, for any tenant.
    fn unauthenticated() -> Self {
        Self { subject: None, tenant: None, operator: true }
    }

    /// The tenant a write acts for: a request `tenant_id` of 0 takes the token's; any other
    /// must equal it. Operators write only for the tenant their token names, too.
    pub fn tenant_for_write(&self, requested: i64) -> Result<i64, AuthError> {
        if self.subject.is_none() {
            return Ok(requested);
        }
        match self.tenant {
            Some(tenant) if requested == 0 || requested == tenant => Ok(tenant),
            _ => Err(AuthError::TenantMismatch),
        }
    }

    /// The tenant a read by key may look at: the token's, or any with the operator scope.
    pub fn tenant_for_read(&self, requested: i64) -> Result<i64, AuthError> {
        match self.tenant {
            Some(tenant) if requested == 0 => Ok(tenant),
            _ if self.operator => Ok(requested),
            _ => self.tenant_for_write(requested),
        }
    }

    /// Whether rows of `tenant` are visible to this caller.
    pub fn may_read(&self, tenant: i64) -> bool {
        self.operator || self.tenant == Some(tenant)
    }

    /// Refuses callers without the operator scope.
    pub fn require_operator(&self) -> Result<(), AuthError> {
        if self.operator { Ok(()) } else { Err(AuthError::ScopeMissing) }
    }
}

/// The JWKS or the auth settings cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum AuthConfigError {
    /// A setting `--auth jwt` needs is missing.
    #[error("--auth jwt needs {0} (or --auth none, on loopback only)")]
    Missing(&'static str),
    /// The JWKS file cannot be read.
    #[error("cannot read the JWKS {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The JWKS file holds no usable key.
    #[error("the JWKS {path} is unusable: {what}")]
    Jwks {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
    /// `--auth none` with a listener other hosts can reach.
    #[error("--auth none is accepted only when every listener is loopback; {0} is not")]
    NoneNotLoopback(std::net::SocketAddr),
}

/// Checks the bearer tokens of calls. Cheap to clone; clones share the keys.
#[derive(Debug, Clone)]
pub struct Authenticator {
    jwt: Option<Arc<Jwt>>,
}

#[derive(Debug)]
struct Jwt {
    path: PathBuf,
    keys: RwLock<Arc<Keys>>,
    issuer: String,
    audience: String,
    tenant_claim: String,
    admin_scope: String,
    leeway: Duration,
}

/// The usable keys of one JWKS document.
#[derive(Debug, Default)]
struct Keys {
    /// The document's bytes, to notice changes.
    source: Vec<u8>,
    /// Keys by `kid`, each with the algorithms it may verify.
    by_id: HashMap<String, Key>,
    /// Keys without a `kid`: used only when the document holds exactly one key.
    unnamed: Vec<Key>,
}

#[derive(Debug)]
struct Key {
    key: DecodingKey,
    algorithms: Vec<Algorithm>,
}

impl Authenticator {
    /// The authenticator the settings ask for; `listeners` are every address the service
    /// listens on (`--auth none` requires them all to be loopback).
    pub fn from_settings(
        settings: &AuthSettings,
        listeners: &[std::net::SocketAddr],
    ) -> Result<Self, AuthConfigError> {
        match settings.auth {
            AuthMode::None => {
                if let Some(addr) = listeners.iter().find(|a| !a.ip().is_loopback()) {
                    return Err(AuthConfigError::NoneNotLoopback(*addr));
                }
                Ok(Self { jwt: None })
            }
            AuthMode::Jwt => {
                let path = settings.auth_jwks.clone().ok_or(AuthConfigError::Missing("--auth-jwks"))?;
                let issuer = settings.auth_issuer.clone().ok_or(AuthConfigError::Missing("--auth-issuer"))?;
                let audience =
                    settings.auth_audience.clone().ok_or(AuthConfigError::Missing("--auth-audience"))?;
                let keys = load_keys(&path)?;
                Ok(Self {
                    jwt: Some(Arc::new(Jwt {
                        path,
                        keys: RwLock::new(Arc::new(keys)),
                        issuer,
                        audience,
                        tenant_claim: settings.auth_tenant_claim.clone(),
                        admin_scope: settings.auth_admin_scope.clone(),
                        leeway: settings.auth_leeway.min(super::MAX_LEEWAY),
                    })),
                })
            }
        }
    }

    /// No authentication (`--auth none`).
    pub fn none() -> Self {
        Self { jwt: None }
    }

    /// Who is calling, from the call's `authorization` metadata.
    pub fn authenticate(&self, metadata: &MetadataMap) -> Result<Caller, AuthError> {
        self.authenticate_header(metadata.get("authorization").map(|value| value.as_bytes()))
    }

    /// Who is calling: the caller the listener authenticated before admitting `request`, or
    /// (outside a listener) the one its metadata names.
    pub fn caller<T>(&self, request: &tonic::Request<T>) -> Result<Caller, AuthError> {
        match request.extensions().get::<Caller>() {
            Some(caller) => Ok(caller.clone()),
            None => self.authenticate(request.metadata()),
        }
    }

    /// Who is calling, from the value of its `authorization` header: what a listener checks
    /// before the call holds anything.
    pub(crate) fn authenticate_header(&self, authorization: Option<&[u8]>) -> Result<Caller, AuthError> {
        let Some(jwt) = &self.jwt else {
            return Ok(Caller::unauthenticated());
        };
        // A refusal is counted and logged where it becomes a status (`super::note_refusal`),
        // with the reason only: never the token.
        jwt.check(authorization)
    }

    /// Re-reads the JWKS every `every` and on SIGHUP until `stop` turns true. A document that
    /// cannot be used keeps the previous keys (and is reported).
    pub async fn watch(self, every: Duration, mut stop: watch::Receiver<bool>) {
        let Some(jwt) = self.jwt else { return };
        let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
        let mut ticks = tokio::time::interval(every.max(Duration::from_millis(100)));
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                Some(()) = async { match hangup.as_mut() { Some(h) => h.recv().await, None => None } } => {}
                _ = stop.wait_for(|stop| *stop) => return,
            }
            jwt.reload();
        }
    }
}

impl Jwt {
    fn reload(&self) {
        let unchanged = std::fs::read(&self.path).map(|bytes| self.keys().source == bytes).unwrap_or(false);
        if unchanged {
            return;
        }
        match load_keys(&self.path) {
            Ok(keys) => {
                let count = keys.by_id.len() + keys.unnamed.len();
                *self.keys.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(keys);
                tracing::info!(keys = count, "JWKS reloaded");
            }
            Err(e) => tracing::warn!(error = %e, "new JWKS refused; still using the previous keys"),
        }
    }

    fn keys(&self) -> Arc<Keys> {
        Arc::clone(&self.keys.read().unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    fn check(&self, authorization: Option<&[u8]>) -> Result<Caller, AuthError> {
        let value = authorization.ok_or(AuthError::TokenMissing)?;
        let value = std::str::from_utf8(value).map_err(|_| AuthError::TokenInvalid)?;
        let token = match value.split_once(' ') {
            Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") => token.trim(),
            _ => return Err(AuthError::TokenInvalid),
        };
        let header = jsonwebtoken::decode_header(token).map_err(|_| AuthError::TokenInvalid)?;
        let keys = self.keys();
        let key = match &header.kid {
            Some(kid) => keys.by_id.get(kid),
            None if keys.by_id.len() + keys.unnamed.len() == 1 => {
                keys.unnamed.first().or_else(|| keys.by_id.values().next())
            }
            None => None,
        }
        .ok_or(AuthError::TokenInvalid)?;
        if !key.algorithms.contains(&header.alg) {
            return Err(AuthError::TokenInvalid);
        }
        let mut validation = Validation::new(header.alg);
        validation.leeway = self.leeway.as_secs();
        validation.validate_nbf = true;
        validation.set_issuer(&[&self.issuer]);
        validation.set_audience(&[&self.audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        let claims = jsonwebtoken::decode::<HashMap<String, Value>>(token, &key.key, &validation)
            .map_err(|e| match e.kind() {
                ErrorKind::ExpiredSignature => AuthError::TokenExpired,
                _ => AuthError::TokenInvalid,
            })?
            .claims;
        let subject = match claims.get("sub") {
            Some(Value::String(sub)) if !sub.trim().is_empty() => sub.clone(),
            _ => return Err(AuthError::TokenInvalid),
        };
        let tenant = match claims.get(&self.tenant_claim) {
            None | Some(Value::Null) => None,
            Some(Value::Number(n)) => Some(n.as_i64().filter(|t| *t > 0).ok_or(AuthError::TokenInvalid)?),
            Some(Value::String(s)) => {
                Some(s.parse::<i64>().ok().filter(|t| *t > 0).ok_or(AuthError::TokenInvalid)?)
            }
            Some(_) => return Err(AuthError::TokenInvalid),
        };
        let operator = scopes(&claims).any(|scope| scope == self.admin_scope);
        Ok(Caller { subject: Some(subject), tenant, operator })
    }
}

/// The token's scopes: `scope` (space-separated, RFC 8693) or `scp` (a string or a list).
fn scopes(claims: &HashMap<String, Value>) -> impl Iterator<Item = &str> {
    ["scope", "scp"].into_iter().filter_map(|name| claims.get(name)).flat_map(|value| {
        let listed: Vec<&str> = match value {
            Value::String(s) => s.split_whitespace().collect(),
            Value::Array(items) => items.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        listed
    })
}

fn load_keys(path: &std::path::Path) -> Result<Keys, AuthConfigError> {
    let source =
        std::fs::read(path).map_err(|source| AuthConfigError::Read { path: path.to_owned(), source })?;
    let unusable = |what: String| AuthConfigError::Jwks { path: path.to_owned(), what };
    let set: JwkSet = serde_json::from_slice(&source).map_err(|e| unusable(e.to_string()))?;
    let mut keys = Keys { source, ..Keys::default() };
    for jwk in &set.keys {
        let Ok(key) = DecodingKey::from_jwk(jwk) else { continue };
        let family = key.family();
        // Shared secrets are refused: the service only ever verifies, so it holds public keys.
        if family == AlgorithmFamily::Hmac {
            continue;
        }
        let algorithms =
            match jwk.common.key_algorithm.and_then(|alg| alg.to_string().parse::<Algorithm>().ok()) {
                Some(alg) if alg.family() == family => vec![alg],
                Some(_) => continue,
                None => family.algorithms().to_vec(),
            };
        let key = Key { key, algorithms };
        match &jwk.common.key_id {
            Some(kid) => {
                keys.by_id.insert(kid.clone(), key);
            }
            None => keys.unnamed.push(key),
        }
    }
    if keys.by_id.is_empty() && keys.unnamed.is_empty() {
        return Err(unusable("no RSA, EC or OKP public key".into()));
    }
    Ok(keys)
}
