//! Bearer-token authentication: who is calling, for which tenant, and whether as an operator.
//!
//! A token is checked against the JWKS file (re-read when it changes), the configured issuer and
//! audience, and `exp`/`nbf` with a bounded leeway. The token itself is never logged, recorded
//! on a span or echoed in an error: only the reason it was refused is.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::jwk::{Jwk, KeyOperations, PublicKeyUse};
use jsonwebtoken::{Algorithm, AlgorithmFamily, DecodingKey, Validation};
use serde_json::Value;
use tokio::sync::watch;
use tonic::Code;
use tonic::metadata::MetadataMap;

use super::settings::{AuthMode, AuthSettings, MAX_LEEWAY};
use crate::telemetry::metrics;

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
    /// The JWKS file is not a JWKS document.
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
    /// The file as last looked at, good or not: a reload acts (and reports) only on a change.
    seen: Mutex<Seen>,
    /// Whether the file as last seen was refused and older keys stay in force.
    stale: AtomicBool,
    issuer: String,
    audience: String,
    tenant_claim: String,
    admin_scope: String,
    leeway: Duration,
}

/// The JWKS file as one reload saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    /// Its bytes.
    Document(Vec<u8>),
    /// It could not be read, for this reason.
    Unreadable(std::io::ErrorKind),
}

/// The signature keys of one JWKS document: possibly none, and then no token is accepted.
#[derive(Debug, Default)]
struct Keys {
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
                let source = std::fs::read(&path)
                    .map_err(|source| AuthConfigError::Read { path: path.clone(), source })?;
                let keys =
                    parse_keys(&source).map_err(|what| AuthConfigError::Jwks { path: path.clone(), what })?;
                report_keys(&keys, &path);
                Ok(Self {
                    jwt: Some(Arc::new(Jwt {
                        path,
                        keys: RwLock::new(Arc::new(keys)),
                        seen: Mutex::new(Seen::Document(source)),
                        stale: AtomicBool::new(false),
                        issuer,
                        audience,
                        tenant_claim: settings.auth_tenant_claim.clone(),
                        admin_scope: settings.auth_admin_scope.clone(),
                        leeway: settings.auth_leeway.min(MAX_LEEWAY),
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
    pub fn authenticate_header(&self, authorization: Option<&[u8]>) -> Result<Caller, AuthError> {
        let Some(jwt) = &self.jwt else {
            return Ok(Caller::unauthenticated());
        };
        // A refusal is counted and logged where it becomes a status (`super::note_refusal`),
        // with the reason only: never the token.
        jwt.check(authorization)
    }

    /// Re-reads the JWKS every `every` and on SIGHUP until `stop` turns true. A document that
    /// parses replaces the keys, even with none (revoking every key); a file that cannot be read
    /// or parsed keeps the previous keys, sets `idempost.auth.jwks.stale` to 1 and is logged at
    /// WARN once per change of the file, not at every check.
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

/// What one check of the JWKS file did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reload {
    /// The file is as it was at the last check: nothing done, nothing logged.
    Unchanged,
    /// The file changed and its keys (this many) are in force now.
    Loaded(usize),
    /// The file changed and cannot be used: the keys read before stay in force.
    Refused,
}

impl Jwt {
    fn reload(&self) -> Reload {
        let seen = match std::fs::read(&self.path) {
            Ok(bytes) => Seen::Document(bytes),
            Err(e) => Seen::Unreadable(e.kind()),
        };
        let changed = {
            let mut last = self.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let changed = *last != seen;
            if changed {
                *last = seen.clone();
            }
            changed
        };
        let outcome = if !changed {
            Reload::Unchanged
        } else {
            let parsed = match &seen {
                Seen::Document(bytes) => parse_keys(bytes),
                Seen::Unreadable(kind) => Err(format!("cannot read it: {kind}")),
            };
            match parsed {
                Ok(keys) => {
                    report_keys(&keys, &self.path);
                    let count = keys.count();
                    *self.keys.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(keys);
                    self.stale.store(false, Ordering::Relaxed);
                    Reload::Loaded(count)
                }
                Err(what) => {
                    self.stale.store(true, Ordering::Relaxed);
                    tracing::warn!(
                        path = %self.path.display(),
                        error = %what,
                        "new JWKS refused; the keys read before stay in force"
                    );
                    Reload::Refused
                }
            }
        };
        self.record();
        outcome
    }

    /// Records the keys in force and whether the file on disk is refused, at every check, so
    /// the gauges hold the current state whatever the export's temporality.
    fn record(&self) {
        metrics().auth_jwks_keys.record(self.keys().count() as u64, &[]);
        metrics().auth_jwks_stale.record(u64::from(self.stale.load(Ordering::Relaxed)), &[]);
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
            None if keys.count() == 1 => keys.unnamed.first().or_else(|| keys.by_id.values().next()),
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

/// Logs and records the keys about to be put in force.
fn report_keys(keys: &Keys, path: &std::path::Path) {
    let count = keys.count();
    if count == 0 {
        tracing::warn!(path = %path.display(), "the JWKS holds no signature key: every token is refused");
    } else {
        tracing::info!(path = %path.display(), keys = count, "JWKS loaded");
    }
}

impl Keys {
    fn count(&self) -> usize {
        self.by_id.len() + self.unnamed.len()
    }
}

/// The signature keys of a JWKS document, or why it is not one. A document that parses is
/// authoritative: `{"keys": []}`, or one whose keys are all for encryption or unreadable, holds
/// no key, and then every token is refused. The keys are read one by one, not as a `JwkSet`: a
/// key of a type this build does not know (a new algorithm published ahead of a rotation) or a
/// malformed one is skipped and logged by its position and `kid`, and must not keep the
/// document's other keys out of force.
fn parse_keys(source: &[u8]) -> Result<Keys, String> {
    let mut document: serde_json::Value =
        serde_json::from_slice(source).map_err(|e| format!("not a JWKS: {e}"))?;
    let Some(serde_json::Value::Array(documents)) = document.get_mut("keys").map(serde_json::Value::take)
    else {
        return Err("not a JWKS: no `keys` array".to_owned());
    };
    let mut keys = Keys::default();
    for (index, value) in documents.into_iter().enumerate() {
        let kid = value.get("kid").and_then(serde_json::Value::as_str).map(str::to_owned);
        let jwk: Jwk = match serde_json::from_value(value) {
            Ok(jwk) => jwk,
            Err(e) => {
                tracing::warn!(index, kid = kid.as_deref().unwrap_or("-"), error = %e, "JWKS key skipped: cannot be read");
                continue;
            }
        };
        let jwk = &jwk;
        let Some(key) = signature_key(jwk) else {
            tracing::debug!(
                kid = jwk.common.key_id.as_deref().unwrap_or("-"),
                "JWKS key skipped: not a signature key"
            );
            continue;
        };
        match &jwk.common.key_id {
            Some(kid) => {
                keys.by_id.insert(kid.clone(), key);
            }
            None => keys.unnamed.push(key),
        }
    }
    Ok(keys)
}

/// `jwk` as a key that verifies signatures, with the algorithms it may verify; `None` for a key
/// meant for anything else (`use` other than `sig`, `key_ops` without `verify`, an encryption or
/// unknown `alg`) and for shared secrets (the service only ever verifies, so it holds public
/// keys).
fn signature_key(jwk: &Jwk) -> Option<Key> {
    let common = &jwk.common;
    if common.public_key_use.as_ref().is_some_and(|usage| *usage != PublicKeyUse::Signature) {
        return None;
    }
    if common.key_operations.as_ref().is_some_and(|ops| !ops.contains(&KeyOperations::Verify)) {
        return None;
    }
    let key = DecodingKey::from_jwk(jwk).ok()?;
    let family = key.family();
    if family == AlgorithmFamily::Hmac {
        return None;
    }
    let algorithms = match common.key_algorithm {
        // RSA1_5, RSA-OAEP and unknown algorithms name no signature algorithm: not for tokens.
        Some(alg) => match alg.to_string().parse::<Algorithm>() {
            Ok(alg) if alg.family() == family => vec![alg],
            _ => return None,
        },
        None => family.algorithms().to_vec(),
    };
    Some(Key { key, algorithms })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use jsonwebtoken::jwk::KeyAlgorithm;
    use jsonwebtoken::{EncodingKey, Header};
    use serde_json::json;

    use super::*;

    const ISSUER: &str = "https://issuer.example";
    const AUDIENCE: &str = "idempost";

    /// A new ES256 signing key and its public half as a JWK named `kid`.
    fn signing_key(kid: &str) -> (EncodingKey, Jwk) {
        let pair = rcgen::KeyPair::generate().unwrap();
        let signing = EncodingKey::from_ec_der(&pair.serialize_der());
        let mut jwk = Jwk::from_encoding_key(&signing, Algorithm::ES256).unwrap();
        jwk.common.key_id = Some(kid.to_owned());
        (signing, jwk)
    }

    fn token(signing: &EncodingKey, kid: &str) -> MetadataMap {
        let now = jsonwebtoken::get_current_timestamp();
        let claims =
            json!({ "iss": ISSUER, "aud": AUDIENCE, "sub": "svc", "tenant_id": 7, "exp": now + 600 });
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(kid.to_owned());
        let token = jsonwebtoken::encode(&header, &claims, signing).unwrap();
        let mut metadata = MetadataMap::new();
        metadata.insert("authorization", format!("Bearer {token}").parse().unwrap());
        metadata
    }

    fn write_jwks(path: &std::path::Path, keys: &[&Jwk]) {
        let set = json!({ "keys": keys });
        std::fs::write(path, serde_json::to_vec(&set).unwrap()).unwrap();
    }

    /// An authenticator over the JWKS file `path`, and its JWT state.
    fn authenticator(path: &std::path::Path) -> (Authenticator, Arc<Jwt>) {
        let auth = Authenticator::from_settings(&AuthSettings::jwt(path, ISSUER, AUDIENCE), &[]).unwrap();
        let jwt = Arc::clone(auth.jwt.as_ref().unwrap());
        (auth, jwt)
    }

    /// An authenticator over a JWKS file holding one signing key, `key-1`.
    struct OneKey {
        _dir: tempfile::TempDir,
        path: std::path::PathBuf,
        jwk: Jwk,
        auth: Authenticator,
        jwt: Arc<Jwt>,
        /// A call carrying a token signed with the key.
        call: MetadataMap,
    }

    fn one_key() -> OneKey {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jwks.json");
        let (signing, jwk) = signing_key("key-1");
        write_jwks(&path, &[&jwk]);
        let (auth, jwt) = authenticator(&path);
        OneKey { _dir: dir, path, jwk, auth, jwt, call: token(&signing, "key-1") }
    }

    #[test]
    fn an_explicitly_empty_key_set_revokes_every_key_and_refuses_every_token() {
        let OneKey { path, auth, jwt, call, _dir, .. } = one_key();
        assert!(auth.authenticate(&call).is_ok(), "the key in force verifies");

        std::fs::write(&path, br#"{"keys": []}"#).unwrap();
        assert_eq!(jwt.reload(), Reload::Loaded(0));
        assert_eq!(auth.authenticate(&call), Err(AuthError::TokenInvalid), "a revoked key verifies nothing");
        assert!(!jwt.stale.load(Ordering::Relaxed), "an empty set is a good document, not a stale one");
    }

    #[test]
    fn a_service_may_start_with_no_key_and_then_refuses_every_token() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jwks.json");
        std::fs::write(&path, br#"{"keys": []}"#).unwrap();
        let (auth, _) = authenticator(&path);
        let (signing, _) = signing_key("key-1");
        assert_eq!(auth.authenticate(&token(&signing, "key-1")), Err(AuthError::TokenInvalid));
    }

    #[test]
    fn an_unreadable_or_malformed_file_keeps_the_last_good_keys_and_is_reported_once_per_change() {
        let OneKey { path, jwk, auth, jwt, call, _dir } = one_key();

        std::fs::write(&path, b"{\"keys\": [").unwrap();
        assert_eq!(jwt.reload(), Reload::Refused, "half a document");
        assert!(jwt.stale.load(Ordering::Relaxed));
        assert_eq!(jwt.reload(), Reload::Unchanged, "the same bad file is not reported again");
        assert!(auth.authenticate(&call).is_ok(), "the last good keys stay in force");

        std::fs::remove_file(&path).unwrap();
        assert_eq!(jwt.reload(), Reload::Refused, "a file that is gone");
        assert_eq!(jwt.reload(), Reload::Unchanged);
        assert!(auth.authenticate(&call).is_ok());

        write_jwks(&path, &[&jwk]);
        assert_eq!(jwt.reload(), Reload::Loaded(1), "a good file again");
        assert!(!jwt.stale.load(Ordering::Relaxed));
        assert_eq!(jwt.reload(), Reload::Unchanged);
    }

    #[test]
    fn only_signature_keys_verify_tokens() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jwks.json");
        let (for_encryption, mut marked_enc) = signing_key("enc");
        marked_enc.common.public_key_use = Some(PublicKeyUse::Encryption);
        let (for_wrapping, mut oaep) = signing_key("oaep");
        oaep.common.key_algorithm = Some(KeyAlgorithm::RSA_OAEP);
        let (for_unknown, mut unknown) = signing_key("unknown");
        unknown.common.key_algorithm = Some(KeyAlgorithm::UNKNOWN_ALGORITHM);
        let (for_encrypting_ops, mut encrypt_ops) = signing_key("ops");
        encrypt_ops.common.key_operations = Some(vec![KeyOperations::Encrypt]);
        let (signing, mut marked_sig) = signing_key("sig");
        marked_sig.common.public_key_use = Some(PublicKeyUse::Signature);
        marked_sig.common.key_operations = Some(vec![KeyOperations::Verify]);
        write_jwks(&path, &[&marked_enc, &oaep, &unknown, &encrypt_ops, &marked_sig]);
        let (auth, jwt) = authenticator(&path);

        assert_eq!(jwt.keys().count(), 1, "the signature key only");
        assert!(auth.authenticate(&token(&signing, "sig")).is_ok());
        for (key, kid) in [
            (&for_encryption, "enc"),
            (&for_wrapping, "oaep"),
            (&for_unknown, "unknown"),
            (&for_encrypting_ops, "ops"),
        ] {
            assert_eq!(auth.authenticate(&token(key, kid)), Err(AuthError::TokenInvalid), "{kid}");
        }
    }

    #[test]
    fn a_key_that_cannot_be_read_is_skipped_and_the_others_stay_in_force() {
        let (signing, jwk) = signing_key("good");
        let document = json!({ "keys": [
            { "kty": "AKP", "alg": "ML-DSA-44", "kid": "from-a-later-standard", "pub": "AAAA" },
            { "kty": "EC", "crv": "P-256", "kid": "half", "x": "AAAA" },
            jwk,
        ]});
        let keys = parse_keys(&serde_json::to_vec(&document).unwrap()).unwrap();
        assert_eq!(keys.count(), 1, "the good key only");
        assert!(keys.by_id.contains_key("good"));
        drop(signing);
        assert!(parse_keys(br#"{"keys": {}}"#).is_err(), "not a JWKS at all is still refused whole");
    }
}
