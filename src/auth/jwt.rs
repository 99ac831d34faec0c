//! JWT bearer tokens (RS256, ES256, EdDSA from a JWKS; HS256 from a
//! configured secret), verified with `jsonwebtoken`: signature, issuer,
//! audience (always configured), expiry and not-before with a leeway, and a
//! subject. Verified tokens are cached by digest (bounded; until their expiry
//! or five minutes) and a cached token whose key left the JWKS is verified
//! again. A JWKS URL is fetched with a timeout, refreshed periodically and on
//! an unknown `kid` (at most once per interval).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use http_body_util::{BodyExt, Limited};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::jwks::{parse_jwks, Key};
use crate::config::{JwksSource, JwtPolicy};

/// Tokens longer than this are refused unread.
const MAX_TOKEN: usize = 8192;
/// The largest JWKS document read.
const MAX_JWKS: usize = 1 << 20;
/// How long a verified token is trusted without checking it again.
const CACHE_FOR: Duration = Duration::from_secs(300);
const CACHE_ENTRIES: usize = 10_000;
/// The time a JWKS fetch may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a token was refused (a metrics label; `error_description` too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Invalid {
    Malformed,
    Algorithm,
    UnknownKey,
    BadSignature,
    Expired,
    NotYetValid,
    WrongIssuer,
    WrongAudience,
    MissingClaim,
}

impl Invalid {
    pub fn reason(self) -> &'static str {
        match self {
            Invalid::Malformed => "malformed",
            Invalid::Algorithm => "algorithm",
            Invalid::UnknownKey => "unknown_key",
            Invalid::BadSignature => "bad_signature",
            Invalid::Expired => "expired",
            Invalid::NotYetValid => "not_yet_valid",
            Invalid::WrongIssuer => "wrong_issuer",
            Invalid::WrongAudience => "wrong_audience",
            Invalid::MissingClaim => "missing_claim",
        }
    }
}

/// A verified token: who, and with which scopes.
#[derive(Debug, Clone)]
pub struct Verified {
    pub principal: String,
    pub scopes: Vec<String>,
    kid: Option<String>,
    until: Instant,
}

pub struct Verifier {
    policy: JwtPolicy,
    keys: ArcSwap<Vec<Key>>,
    hs256: Option<DecodingKey>,
    cache: quick_cache::sync::Cache<[u8; 32], Verified>,
    /// When the JWKS was last fetched (a URL source).
    fetched: Mutex<Option<Instant>>,
    fetch: tokio::sync::Mutex<()>,
}

#[derive(Deserialize)]
struct Claims {
    sub: Option<String>,
    iss: Option<String>,
    exp: u64,
    #[serde(default)]
    scope: Option<String>,
    #[serde(default)]
    scp: Option<Vec<String>>,
}

impl Verifier {
    /// The policy it verifies for.
    pub fn policy(&self) -> &JwtPolicy {
        &self.policy
    }

    /// A verifier for `policy`; a JWKS file is read now (the config check
    /// read it already), a URL on first need.
    pub fn new(policy: JwtPolicy, hs256_secret: Option<Vec<u8>>) -> Result<Verifier, String> {
        let keys = file_keys(&policy)?;
        Ok(Verifier {
            hs256: hs256_secret.map(|s| DecodingKey::from_secret(&s)),
            policy,
            keys: ArcSwap::from_pointee(keys),
            cache: quick_cache::sync::Cache::new(CACHE_ENTRIES),
            fetched: Mutex::new(None),
            fetch: tokio::sync::Mutex::new(()),
        })
    }

    /// Verifies `token`: from the cache, or checked (fetching the JWKS URL
    /// again for an unknown `kid` when that is due) and cached.
    pub async fn verify(&self, token: &str) -> Result<Verified, Invalid> {
        if token.len() > MAX_TOKEN {
            return Err(Invalid::Malformed);
        }
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if let Some(hit) = self.cached(&digest) {
            return Ok(hit);
        }
        let verified = match self.check_now(token) {
            Err(Invalid::UnknownKey) if self.refresh_due() => {
                self.refresh().await;
                self.check_now(token)
            }
            other => other,
        }?;
        self.cache.insert(digest, verified.clone());
        Ok(verified)
    }

    /// A token verified before (by its digest), still fresh and its key
    /// still in the JWKS.
    pub fn cached(&self, digest: &[u8; 32]) -> Option<Verified> {
        let hit = self.cache.get(digest)?;
        let key_kept = hit.kid.is_none() || self.keys.load().iter().any(|k| k.kid == hit.kid);
        if hit.until > Instant::now() && key_kept {
            return Some(hit);
        }
        self.cache.remove(digest);
        None
    }

    /// What a cache miss costs: the header read, the key found, the
    /// signature and claims checked.
    pub fn check_now(&self, token: &str) -> Result<Verified, Invalid> {
        let header = jsonwebtoken::decode_header(token).map_err(|_| Invalid::Malformed)?;
        if !self.policy.algorithms.contains(&header.alg) {
            return Err(Invalid::Algorithm);
        }
        if header.alg == Algorithm::HS256 {
            let key = self.hs256.as_ref().ok_or(Invalid::Algorithm)?;
            return self.check(token, key, header.alg, None);
        }
        let keys = self.keys.load();
        let key = self.key_for(header.kid.as_deref(), header.alg).and_then(|i| keys.get(i));
        let key = key.ok_or(Invalid::UnknownKey)?;
        self.check(token, &key.key, header.alg, key.kid.clone())
    }

    /// The index of the key for `kid` that verifies `alg`; without a `kid`,
    /// the one key that does.
    fn key_for(&self, kid: Option<&str>, alg: Algorithm) -> Option<usize> {
        let keys = self.keys.load();
        match kid {
            Some(kid) => keys.iter().position(|k| k.kid.as_deref() == Some(kid) && k.algorithm == alg),
            None => {
                let mut fitting = keys.iter().enumerate().filter(|(_, k)| k.algorithm == alg);
                match (fitting.next(), fitting.next()) {
                    (Some((i, _)), None) => Some(i),
                    _ => None,
                }
            }
        }
    }

    fn check(
        &self,
        token: &str,
        key: &DecodingKey,
        alg: Algorithm,
        kid: Option<String>,
    ) -> Result<Verified, Invalid> {
        let p = &self.policy;
        let mut v = Validation::new(alg);
        v.set_issuer(&[&p.issuer]);
        v.set_audience(&[&p.audience]);
        v.leeway = p.leeway.as_secs();
        v.validate_nbf = true;
        v.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        let data = jsonwebtoken::decode::<Claims>(token, key, &v).map_err(|e| {
            use jsonwebtoken::errors::ErrorKind as K;
            match e.kind() {
                K::InvalidSignature => Invalid::BadSignature,
                K::ExpiredSignature => Invalid::Expired,
                K::ImmatureSignature => Invalid::NotYetValid,
                K::InvalidIssuer => Invalid::WrongIssuer,
                K::InvalidAudience => Invalid::WrongAudience,
                K::MissingRequiredClaim(_) => Invalid::MissingClaim,
                K::InvalidAlgorithm => Invalid::Algorithm,
                _ => Invalid::Malformed,
            }
        })?;
        let c = data.claims;
        let (Some(iss), Some(sub)) = (c.iss, c.sub) else {
            return Err(Invalid::MissingClaim);
        };
        let mut scopes: Vec<String> =
            c.scope.map(|s| s.split(' ').map(str::to_string).collect()).unwrap_or_default();
        scopes.extend(c.scp.unwrap_or_default());
        scopes.retain(|s| !s.is_empty());
        let left = c.exp.saturating_sub(crate::seal::unix_now()) + p.leeway.as_secs();
        Ok(Verified {
            principal: principal(&iss, &sub),
            scopes,
            kid,
            until: Instant::now() + CACHE_FOR.min(Duration::from_secs(left)),
        })
    }

    /// Whether the JWKS URL may be fetched again: once the refresh interval
    /// has passed since the last fetch (for an unknown `kid` too).
    fn refresh_due(&self) -> bool {
        let Some(JwksSource::Url(_)) = &self.policy.jwks else {
            return false;
        };
        let last = *self.fetched.lock().expect("fetched lock");
        last.is_none_or(|at| at.elapsed() >= self.policy.jwks_refresh)
    }

    /// Fetches the JWKS URL (one fetch at a time); a failure keeps the keys.
    pub async fn refresh(&self) {
        let Some(JwksSource::Url(url)) = &self.policy.jwks else {
            return;
        };
        let _one = self.fetch.lock().await;
        if !self.refresh_due() && self.fetched.lock().expect("fetched lock").is_some() {
            // Another request fetched it while this one waited.
            return;
        }
        *self.fetched.lock().expect("fetched lock") = Some(Instant::now());
        match tokio::time::timeout(FETCH_TIMEOUT, fetch(url)).await {
            Ok(Ok(body)) => match parse_jwks(&body, &self.policy.algorithms) {
                Ok(keys) => {
                    tracing::info!(keys = keys.len(), "JWKS fetched");
                    self.keys.store(Arc::new(keys));
                }
                Err(e) => tracing::warn!(error = %e, "JWKS not usable; the keys in use are kept"),
            },
            Ok(Err(e)) => tracing::warn!(error = %e, "JWKS fetch failed; the keys in use are kept"),
            Err(_) => tracing::warn!("JWKS fetch timed out; the keys in use are kept"),
        }
    }

    /// Refreshes a JWKS URL every interval until `stop` (keys that left
    /// the set stop verifying, cached tokens included).
    pub async fn run_refresh(self: Arc<Self>, stop: tokio_util::sync::CancellationToken) {
        if !matches!(self.policy.jwks, Some(JwksSource::Url(_))) {
            return;
        }
        loop {
            self.refresh().await;
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(self.policy.jwks_refresh) => {}
            }
        }
    }
}

/// The keys of a policy's JWKS file (none for a URL or HS256): at least
/// one usable with its algorithms; errors name the file.
pub fn file_keys(policy: &JwtPolicy) -> Result<Vec<Key>, String> {
    let Some(JwksSource::File(path)) = &policy.jwks else { return Ok(Vec::new()) };
    let text = crate::config::file::read(path, crate::config::file::Kind::Jwks)
        .map_err(|e| format!("jwks_file {e}"))?;
    let keys =
        parse_jwks(&text, &policy.algorithms).map_err(|e| format!("jwks_file {}: {e}", path.display()))?;
    if keys.is_empty() {
        return Err(format!("jwks_file {}: no key usable with the configured algorithms", path.display()));
    }
    Ok(keys)
}

/// The principal of a token: issuer and subject, digested (bounded, and no
/// personal data in logs).
pub fn principal(iss: &str, sub: &str) -> String {
    let digest =
        Sha256::new().chain_update(iss.as_bytes()).chain_update([0]).chain_update(sub.as_bytes()).finalize();
    format!("jwt:{}", crate::seal::hex(&digest[..16]))
}

async fn fetch(url: &http::Uri) -> Result<Vec<u8>, String> {
    let tls = Arc::new(crate::upstream::transport::rustls_config());
    let settings = crate::upstream::h1::Settings {
        connect_timeout: FETCH_TIMEOUT,
        idle_timeout: Duration::from_secs(1),
        max_idle: 0,
    };
    let client = crate::upstream::h1::Client::new(url, tls, settings).map_err(str::to_string)?;
    let resp = client.send("GET", &[("accept", "application/json")], b"").await.map_err(|e| e.to_string())?;
    if resp.status != 200 {
        return Err(format!("status {}", resp.status));
    }
    let body = Limited::new(resp.body, MAX_JWKS).collect().await.map_err(|e| e.to_string())?;
    Ok(body.to_bytes().to_vec())
}

/// Whether the `aud` of a token (already verified by its route's policy)
/// names `audience`: read again before the token is forwarded to the
/// upstream of that audience, so that no configuration change can send a
/// token anywhere it was not issued for.
pub fn audience_includes(token: &str, audience: &str) -> bool {
    use base64::Engine;
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum Aud {
        One(String),
        Many(Vec<String>),
    }
    #[derive(serde::Deserialize)]
    struct Claims {
        aud: Option<Aud>,
    }
    let Some(payload) = token.split('.').nth(1) else { return false };
    let Ok(bytes) = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload.trim_end_matches('='))
    else {
        return false;
    };
    match serde_json::from_slice::<Claims>(&bytes).ok().and_then(|c| c.aud) {
        Some(Aud::One(a)) => a == audience,
        Some(Aud::Many(all)) => all.iter().any(|a| a == audience),
        None => false,
    }
}

#[cfg(test)]
mod audience_tests {
    use super::audience_includes;
    use base64::Engine;

    fn token(claims: &str) -> String {
        let enc = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        format!("{}.{}.sig", enc(r#"{"alg":"HS256"}"#), enc(claims))
    }

    #[test]
    fn only_a_token_naming_the_audience_is_forwarded() {
        assert!(audience_includes(&token(r#"{"aud":"https://api"}"#), "https://api"));
        assert!(audience_includes(&token(r#"{"aud":["https://gw","https://api"]}"#), "https://api"));
        assert!(!audience_includes(&token(r#"{"aud":"https://gw"}"#), "https://api"));
        assert!(!audience_includes(&token(r#"{"sub":"x"}"#), "https://api"));
        assert!(!audience_includes("not-a-jwt", "https://api"));
    }
}
