//! `[auth.<name>]` tables: the authentication policies routes name with
//! `auth = "<name>"`, as plain values. Key files, JWKS files and HS256
//! secrets are read through [`Outside`], so that a bad one fails the check
//! and a missing one is listed by `check-config`; the HS256 secret and the
//! JWKS file are read again when `crate::auth` builds its verifiers (the
//! secret is not kept in the config), the key file's keys are kept.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http::Uri;
use jsonwebtoken::Algorithm;
use serde::Deserialize;

use super::file::Kind;
use super::keys::ApiKeys;
use super::{at, ConfigError, Outside, Source};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAuth {
    /// "none", "api_key" or "jwt".
    #[serde(rename = "type")]
    pub kind: String,
    /// api_key: the key file (`<id> <sha256 hex> [groups]` per line).
    pub keys_file: Option<String>,
    /// jwt: the expected `iss` and `aud` (the audience is never taken from a request).
    pub issuer: Option<String>,
    pub audience: Option<String>,
    /// jwt: where the verification keys are (one of the two).
    pub jwks_file: Option<String>,
    pub jwks_url: Option<String>,
    /// jwt: how often a JWKS URL is fetched again, and the least time
    /// between two fetches for an unknown `kid` (default 300 s).
    pub jwks_refresh_s: Option<u64>,
    /// jwt: accepted algorithms (default RS256, ES256, EdDSA; HS256 needs a secret).
    pub algorithms: Option<Vec<String>>,
    /// jwt: HS256 shared secret, from an environment variable or a file.
    pub hs256_secret_env: Option<String>,
    pub hs256_secret_file: Option<String>,
    /// jwt: clock skew allowed on `exp` and `nbf` (default 30 s).
    pub leeway_s: Option<u64>,
    /// Scopes every request needs (403 `insufficient_scope` otherwise).
    pub required_scopes: Option<Vec<String>>,
    /// RFC 9728 metadata: the resource identifier (default: the audience),
    /// its authorization servers and scopes.
    pub resource: Option<String>,
    pub authorization_servers: Option<Vec<String>>,
    pub scopes_supported: Option<Vec<String>>,
}

/// A named authentication policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthPolicy {
    pub name: String,
    pub kind: AuthKind,
    /// The protected resource's identifier (an https URL), when known.
    pub resource: Option<String>,
    pub authorization_servers: Vec<String>,
    pub scopes_supported: Vec<String>,
    pub required_scopes: Vec<String>,
}

// One per policy, in an `Arc`: its size does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthKind {
    /// Anyone: the principal is a digest of whatever bearer token comes.
    None,
    ApiKeys(ApiKeys),
    Jwt(JwtPolicy),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JwtPolicy {
    pub issuer: String,
    pub audience: String,
    pub jwks: Option<JwksSource>,
    pub jwks_refresh: Duration,
    pub algorithms: Vec<Algorithm>,
    pub hs256_secret: Option<SecretSource>,
    pub leeway: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JwksSource {
    File(PathBuf),
    Url(Uri),
}

/// Where an HS256 secret comes from.
pub type SecretSource = Source;

impl SecretSource {
    /// The HS256 secret's bytes (trailing whitespace of a file trimmed).
    pub fn hs256_secret(&self) -> Result<Vec<u8>, String> {
        hs256_bytes(&self.read(Kind::Secret)?)
    }
}

/// An HS256 secret as read: at least 32 bytes once trailing whitespace is trimmed.
fn hs256_bytes(raw: &str) -> Result<Vec<u8>, String> {
    let secret = raw.trim_end().as_bytes().to_vec();
    if secret.len() < 32 {
        return Err("an HS256 secret must be at least 32 bytes".into());
    }
    Ok(secret)
}

/// The policies of the file, by name.
pub fn policies(
    raw: &BTreeMap<String, RawAuth>,
    text: &str,
    outside: &Outside,
) -> Result<Vec<Arc<AuthPolicy>>, ConfigError> {
    raw.iter().map(|(name, a)| policy(name, a, text, outside).map(Arc::new)).collect()
}

fn policy(name: &str, a: &RawAuth, text: &str, outside: &Outside) -> Result<AuthPolicy, ConfigError> {
    let err = |msg: String| ConfigError(format!("{}auth.{name}: {msg}", at(text, &format!("[auth.{name}]"))));
    let only = |allowed: &[&str]| -> Result<(), ConfigError> {
        let set = [
            ("keys_file", a.keys_file.is_some()),
            ("issuer", a.issuer.is_some()),
            ("audience", a.audience.is_some()),
            ("jwks_file", a.jwks_file.is_some()),
            ("jwks_url", a.jwks_url.is_some()),
            ("jwks_refresh_s", a.jwks_refresh_s.is_some()),
            ("algorithms", a.algorithms.is_some()),
            ("hs256_secret_env", a.hs256_secret_env.is_some()),
            ("hs256_secret_file", a.hs256_secret_file.is_some()),
            ("leeway_s", a.leeway_s.is_some()),
        ];
        match set.iter().find(|(k, present)| *present && !allowed.contains(k)) {
            Some((k, _)) => Err(err(format!("`{k}` does not apply to type \"{}\"", a.kind))),
            None => Ok(()),
        }
    };
    let kind = match a.kind.as_str() {
        "none" => {
            only(&[])?;
            AuthKind::None
        }
        "api_key" => {
            only(&["keys_file"])?;
            let path = a.keys_file.as_ref().ok_or_else(|| err("needs `keys_file`".into()))?;
            let what = format!("auth.{name} API key file");
            let text = outside
                .read(&what, Source::File(path.into()), Kind::ApiKeys)
                .map_err(|e| err(format!("keys_file {e}")))?;
            // Missing (check-config only): the policy is checked without its keys.
            let keys = text.as_deref().map(ApiKeys::parse).transpose();
            AuthKind::ApiKeys(keys.map_err(|e| err(format!("keys_file {path}: {e}")))?.unwrap_or_default())
        }
        "jwt" => AuthKind::Jwt(jwt(name, a, &err, outside)?),
        other => return Err(err(format!("type must be \"none\", \"api_key\" or \"jwt\", not `{other}`"))),
    };
    if a.required_scopes.is_some() && !matches!(kind, AuthKind::Jwt(_)) {
        return Err(err("required_scopes applies to JWT policies (keys carry no scopes)".into()));
    }
    let resource = match (&a.resource, &kind) {
        (Some(r), _) => Some(r.clone()),
        (None, AuthKind::Jwt(j))
            if j.audience.starts_with("https://") || j.audience.starts_with("http://") =>
        {
            Some(j.audience.clone())
        }
        _ => None,
    };
    if let Some(r) = &resource {
        let uri: Uri = r.parse().map_err(|_| err(format!("resource `{r}` is not a URL")))?;
        if !matches!(uri.scheme_str(), Some("https" | "http"))
            || uri.host().is_none()
            || uri.query().is_some()
        {
            return Err(err(format!("resource `{r}` must be an http(s) URL without a query")));
        }
    }
    Ok(AuthPolicy {
        name: name.to_string(),
        kind,
        resource,
        authorization_servers: a.authorization_servers.clone().unwrap_or_default(),
        scopes_supported: a.scopes_supported.clone().unwrap_or_default(),
        required_scopes: a.required_scopes.clone().unwrap_or_default(),
    })
}

fn jwt(
    name: &str,
    a: &RawAuth,
    err: &dyn Fn(String) -> ConfigError,
    outside: &Outside,
) -> Result<JwtPolicy, ConfigError> {
    let issuer = a.issuer.clone().ok_or_else(|| err("needs `issuer`".into()))?;
    let audience =
        a.audience.clone().ok_or_else(|| err("needs `audience` (never taken from a request)".into()))?;
    let hs256_secret = match (&a.hs256_secret_env, &a.hs256_secret_file) {
        (Some(_), Some(_)) => return Err(err("one of hs256_secret_env and hs256_secret_file".into())),
        (Some(env), None) => Some(SecretSource::Env(env.clone())),
        (None, Some(file)) => Some(SecretSource::File(file.into())),
        (None, None) => None,
    };
    let algorithms = match &a.algorithms {
        None if hs256_secret.is_some() => vec![Algorithm::HS256],
        None => vec![Algorithm::RS256, Algorithm::ES256, Algorithm::EdDSA],
        Some(names) => names
            .iter()
            .map(|n| match n.as_str() {
                "RS256" => Ok(Algorithm::RS256),
                "ES256" => Ok(Algorithm::ES256),
                "EdDSA" => Ok(Algorithm::EdDSA),
                "HS256" => Ok(Algorithm::HS256),
                other => Err(err(format!("algorithm `{other}` is not one of RS256, ES256, EdDSA, HS256"))),
            })
            .collect::<Result<Vec<_>, _>>()?,
    };
    if algorithms.is_empty() {
        return Err(err("algorithms is empty".into()));
    }
    let hs = algorithms.contains(&Algorithm::HS256);
    if hs != hs256_secret.is_some() {
        return Err(err("HS256 and an hs256_secret_env/hs256_secret_file go together".into()));
    }
    if hs && algorithms.len() > 1 {
        // A key of one kind is never tried as another (no HS/RS confusion).
        return Err(err("HS256 cannot be mixed with public-key algorithms in one policy".into()));
    }
    let jwks = match (&a.jwks_file, &a.jwks_url) {
        (Some(_), Some(_)) => return Err(err("one of jwks_file and jwks_url".into())),
        (Some(file), None) => {
            let what = format!("auth.{name} JWKS file");
            let body = outside
                .read(&what, Source::File(file.into()), Kind::Jwks)
                .map_err(|e| err(format!("jwks_file {e}")))?;
            // Whether its keys suit the algorithms is for `crate::auth` to say.
            if let Some(body) = body {
                serde_json::from_str::<jsonwebtoken::jwk::JwkSet>(&body)
                    .map_err(|e| err(format!("jwks_file {file}: not a JWKS: {e}")))?;
            }
            Some(JwksSource::File(file.into()))
        }
        (None, Some(url)) => {
            let uri: Uri = url.parse().map_err(|_| err(format!("jwks_url `{url}` is not a URL")))?;
            let loopback = uri.host().is_some_and(|h| {
                h == "localhost"
                    || h.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
                    || h == "[::1]"
            });
            match uri.scheme_str() {
                Some("https") if uri.host().is_some() => {}
                // Keys fetched in the clear could be replaced on the way.
                Some("http") if loopback => {}
                _ => return Err(err(format!("jwks_url `{url}` must be https (http only on loopback)"))),
            }
            Some(JwksSource::Url(uri))
        }
        (None, None) if hs => None,
        (None, None) => return Err(err("needs `jwks_file` or `jwks_url`".into())),
    };
    // Read last: what the file itself says is checked first.
    if let Some(source) = &hs256_secret {
        let what = format!("auth.{name} HS256 secret");
        if let Some(raw) = outside
            .read(&what, source.clone(), Kind::Secret)
            .map_err(|e| err(format!("hs256 secret: {e}")))?
        {
            hs256_bytes(&raw).map_err(err)?;
        }
    }
    Ok(JwtPolicy {
        issuer,
        audience,
        jwks,
        jwks_refresh: Duration::from_secs(a.jwks_refresh_s.unwrap_or(300).max(1)),
        algorithms,
        hs256_secret,
        leeway: Duration::from_secs(a.leeway_s.unwrap_or(30)),
    })
}
