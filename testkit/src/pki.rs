//! Certificates, keys and tokens made on the spot, for the security tests and the demo: a CA, a
//! server certificate for `localhost` and `127.0.0.1`, a client certificate (mutual TLS), and an
//! ES256 signing key published in a JWKS file, with bearer tokens signed by it.

use std::error::Error;
use std::path::{Path, PathBuf};

use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};

/// The issuer every token carries.
pub const ISSUER: &str = "https://issuer.idempost.example";
/// The audience every token carries.
pub const AUDIENCE: &str = "idempost";

type Fallible<T> = Result<T, Box<dyn Error + Send + Sync>>;

/// Files under one directory: TLS material and the JWKS, plus the key tokens are signed with.
pub struct Pki {
    /// The CA that signed the server and client certificates.
    pub ca: PathBuf,
    /// The server's certificate (localhost, 127.0.0.1) and key.
    pub cert: PathBuf,
    pub key: PathBuf,
    /// A client certificate and key signed by the CA.
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    /// The JWKS the service trusts.
    pub jwks: PathBuf,
    signing: EncodingKey,
    kid: String,
}

impl std::fmt::Debug for Pki {
    // Without the signing key: test output shows paths, never key material.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pki").field("ca", &self.ca).field("jwks", &self.jwks).field("kid", &self.kid).finish()
    }
}

fn write(path: &Path, contents: &str) -> Fallible<PathBuf> {
    std::fs::write(path, contents)?;
    Ok(path.to_owned())
}

/// A new ES256 key with its id, and its public half as a JWK.
fn signing_key(kid: &str) -> Fallible<(EncodingKey, Jwk)> {
    let key = KeyPair::generate()?;
    let signing = EncodingKey::from_ec_der(&key.serialize_der());
    let mut jwk = Jwk::from_encoding_key(&signing, Algorithm::ES256)?;
    jwk.common.key_id = Some(kid.to_owned());
    Ok((signing, jwk))
}

impl Pki {
    /// Makes everything in `dir`.
    pub fn make(dir: &Path) -> Fallible<Self> {
        // Distinct subject names: OpenSSL-based clients take a leaf named like its issuer for a
        // self-signed certificate.
        let named = |names: Vec<String>, common_name: &str| -> Fallible<CertificateParams> {
            let mut params = CertificateParams::new(names)?;
            params.distinguished_name.push(DnType::CommonName, common_name);
            Ok(params)
        };
        let mut ca_params = named(Vec::new(), "Idempost test CA")?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)?;
        let server_key = KeyPair::generate()?;
        let server = named(vec!["localhost".to_owned(), "127.0.0.1".to_owned()], "localhost")?
            .signed_by(&server_key, &ca)?;
        let client_key = KeyPair::generate()?;
        let client = named(vec!["client.idempost.example".to_owned()], "client.idempost.example")?
            .signed_by(&client_key, &ca)?;
        let (signing, jwk) = signing_key("key-1")?;
        let jwks = dir.join("jwks.json");
        std::fs::write(&jwks, serde_json::to_vec(&JwkSet { keys: vec![jwk] })?)?;
        Ok(Self {
            ca: write(&dir.join("ca.pem"), &ca.pem())?,
            cert: write(&dir.join("server.pem"), &server.pem())?,
            key: write(&dir.join("server.key"), &server_key.serialize_pem())?,
            client_cert: write(&dir.join("client.pem"), &client.pem())?,
            client_key: write(&dir.join("client.key"), &client_key.serialize_pem())?,
            jwks,
            signing,
            kid: "key-1".to_owned(),
        })
    }

    /// A token signed with the trusted key: `claims` over a default `iss`, `aud`, and an `exp`
    /// an hour away.
    pub fn token(&self, claims: serde_json::Value) -> Fallible<String> {
        sign(&self.signing, &self.kid, claims)
    }

    /// Replaces the JWKS with one holding only a new key (`kid`), and signs with that from now on.
    pub fn rotate(&mut self, kid: &str) -> Fallible<()> {
        self.rotate_beside(kid, Vec::new())
    }

    /// As [`Pki::rotate`], with `others` (JWK documents as JSON, readable or not) listed before
    /// the new key in the new JWKS.
    pub fn rotate_beside(&mut self, kid: &str, mut others: Vec<serde_json::Value>) -> Fallible<()> {
        let (signing, jwk) = signing_key(kid)?;
        others.push(serde_json::to_value(jwk)?);
        let staged = self.jwks.with_extension("new");
        std::fs::write(&staged, serde_json::to_vec(&serde_json::json!({ "keys": others }))?)?;
        // Renamed into place, as deployment tools do: the service never reads half a file.
        std::fs::rename(&staged, &self.jwks)?;
        self.signing = signing;
        self.kid = kid.to_owned();
        Ok(())
    }
}

/// A token signed with a key nobody trusts, under the trusted key's id.
pub fn token_from_unknown_key(kid: &str, claims: serde_json::Value) -> Fallible<String> {
    let (signing, _) = signing_key(kid)?;
    sign(&signing, kid, claims)
}

fn sign(key: &EncodingKey, kid: &str, claims: serde_json::Value) -> Fallible<String> {
    let now = jsonwebtoken::get_current_timestamp();
    let mut all = serde_json::json!({ "iss": ISSUER, "aud": AUDIENCE, "iat": now, "exp": now + 3600 });
    if let (Some(all), serde_json::Value::Object(extra)) = (all.as_object_mut(), claims) {
        all.extend(extra);
    }
    let mut header = Header::new(Algorithm::ES256);
    header.kid = Some(kid.to_owned());
    Ok(jsonwebtoken::encode(&header, &all, key)?)
}
