//! Who is calling (issue 13): each route names an authentication policy
//! (`[auth.<name>]`): `none`, static API keys ([`keys`]) or JWT bearer tokens
//! ([`jwt`]). The gateway is the OAuth 2.1 resource server for its
//! upstreams: missing or invalid credentials are 401 with a `Bearer`
//! challenge naming its RFC 9728 metadata (served at
//! `/.well-known/oauth-protected-resource` and the path-suffixed form), a
//! token without the required scopes is 403 `insufficient_scope`.
//!
//! The principal is the key id (`key:<id>`) or a digest of the token's
//! issuer and subject (`jwt:<hex>`), so a refreshed token of the same user
//! keeps its sessions and sealed states; without a policy it stays a digest
//! of whatever bearer token comes (anyone may call).

pub mod jwks;
pub mod jwt;
pub mod keys;

use std::collections::HashMap;
use std::sync::Arc;

use http::{header, HeaderMap, HeaderValue, Response, StatusCode};
use serde_json::json;

use crate::config::{AuthKind, AuthPolicy, Config, JwksSource};
use crate::error::Error;
use crate::metrics::{Metrics, ReasonLabels};
use crate::reply::{self, Body};

/// The metadata document's path (RFC 9728 §3).
pub const METADATA_PATH: &str = "/.well-known/oauth-protected-resource";

/// Who a request comes from.
#[derive(Debug, Clone)]
pub struct Caller {
    pub principal: String,
    /// JWT scopes (empty for keys).
    pub scopes: Vec<String>,
    /// API key groups (empty for tokens).
    pub groups: Vec<String>,
}

/// The verifiers of every JWT policy and the keys of every API key
/// policy, by policy name: built from the configuration's policies.
pub struct Auth {
    jwt: HashMap<String, Arc<jwt::Verifier>>,
    keys: HashMap<String, keys::Keys>,
    metrics: Metrics,
}

impl Auth {
    /// Builds the verifiers and key lookups; an HS256 secret and a JWKS
    /// file are read now. On a reload (`previous`), a policy that fetches
    /// its keys from a URL and did not change keeps its verifier: its keys
    /// and verified tokens.
    pub fn new(config: &Config, metrics: Metrics, previous: Option<&Auth>) -> Result<Auth, String> {
        let mut verifiers = HashMap::new();
        let mut api_keys = HashMap::new();
        for route in &config.routes {
            let Some(policy) = &route.auth else { continue };
            if let AuthKind::ApiKeys(k) = &policy.kind {
                api_keys.entry(policy.name.clone()).or_insert_with(|| keys::Keys::new(k));
            }
            let AuthKind::Jwt(j) = &policy.kind else { continue };
            if verifiers.contains_key(&policy.name) {
                continue;
            }
            let kept = previous.and_then(|p| p.jwt.get(&policy.name)).filter(|v| {
                v.policy() == j && j.hs256_secret.is_none() && matches!(j.jwks, Some(JwksSource::Url(_)))
            });
            if let Some(kept) = kept {
                verifiers.insert(policy.name.clone(), kept.clone());
                continue;
            }
            let secret = match &j.hs256_secret {
                Some(source) => {
                    Some(source.hs256_secret().map_err(|e| format!("auth.{}: {e}", policy.name))?)
                }
                None => None,
            };
            let verifier =
                jwt::Verifier::new(j.clone(), secret).map_err(|e| format!("auth.{}: {e}", policy.name))?;
            verifiers.insert(policy.name.clone(), Arc::new(verifier));
        }
        Ok(Auth { jwt: verifiers, keys: api_keys, metrics })
    }

    /// The JWKS refreshers to run (one per policy with a JWKS URL).
    pub fn verifiers(&self) -> impl Iterator<Item = &Arc<jwt::Verifier>> {
        self.jwt.values()
    }

    /// Authenticates a request on `route` under `policy`.
    pub async fn check(
        &self,
        route: &str,
        policy: &AuthPolicy,
        headers: &HeaderMap,
    ) -> Result<Caller, Error> {
        let outcome = self.authenticate(policy, headers).await;
        if let Err(e) = &outcome {
            let reason = match e {
                Error::Unauthorized(why) => why,
                _ => "insufficient_scope",
            };
            let labels = ReasonLabels { route: route.to_string(), reason };
            self.metrics.auth_failures.get_or_create(&labels).inc();
        }
        outcome
    }

    async fn authenticate(&self, policy: &AuthPolicy, headers: &HeaderMap) -> Result<Caller, Error> {
        if let AuthKind::None = policy.kind {
            return Ok(anyone(headers));
        }
        let token = bearer(headers)?;
        let caller = match &policy.kind {
            AuthKind::None => anyone(headers),
            AuthKind::ApiKeys(_) => {
                let keys = self.keys.get(&policy.name).ok_or(Error::Internal("no keys".into()))?;
                let key = keys.find(token).ok_or(Error::Unauthorized("unknown_key"))?;
                Caller {
                    principal: format!("key:{}", key.id),
                    scopes: Vec::new(),
                    groups: key.groups.clone(),
                }
            }
            AuthKind::Jwt(_) => {
                let verifier = self.jwt.get(&policy.name).ok_or(Error::Internal("no verifier".into()))?;
                let v = verifier.verify(token).await.map_err(|why| Error::Unauthorized(why.reason()))?;
                Caller { principal: v.principal, scopes: v.scopes, groups: Vec::new() }
            }
        };
        if policy.required_scopes.iter().any(|s| !caller.scopes.contains(s)) {
            return Err(Error::Forbidden(policy.required_scopes.join(" ")));
        }
        Ok(caller)
    }
}

/// What building the verifiers would refuse that needs no secret and no
/// network (`check-config`): a JWKS file without a key usable with its
/// policy's algorithms.
pub fn check(config: &Config) -> Result<(), String> {
    for policy in config.routes.iter().filter_map(|r| r.auth.as_ref()) {
        let AuthKind::Jwt(j) = &policy.kind else { continue };
        // A file `check-config` listed as absent is not there to build from.
        let absent = matches!(&j.jwks, Some(JwksSource::File(f)) if crate::config::file::check(f).is_err());
        if !absent {
            jwt::file_keys(j).map_err(|e| format!("auth.{}: {e}", policy.name))?;
        }
    }
    Ok(())
}

/// A caller on a route that asks nobody to authenticate: a digest of
/// whatever bearer token comes, or "anonymous".
pub fn anyone(headers: &HeaderMap) -> Caller {
    Caller { principal: crate::guard::principal(headers), scopes: Vec::new(), groups: Vec::new() }
}

/// The bearer token of `Authorization` (exactly one header; the scheme in
/// any case).
fn bearer(headers: &HeaderMap) -> Result<&str, Error> {
    let mut values = headers.get_all(header::AUTHORIZATION).iter();
    let (value, None) = (values.next(), values.next()) else {
        return Err(Error::Unauthorized("malformed"));
    };
    let Some(value) = value else {
        return Err(Error::Unauthorized("missing"));
    };
    let value = value.to_str().map_err(|_| Error::Unauthorized("malformed"))?;
    let (scheme, token) = value.split_once(' ').ok_or(Error::Unauthorized("malformed"))?;
    if !scheme.eq_ignore_ascii_case("bearer") || token.trim().is_empty() {
        return Err(Error::Unauthorized("malformed"));
    }
    Ok(token.trim())
}

/// The `WWW-Authenticate` challenge for a refusal under `policy`.
pub fn challenge(policy: &AuthPolicy, err: &Error) -> HeaderValue {
    let mut parts = Vec::new();
    match err {
        Error::Unauthorized("missing") => {}
        Error::Unauthorized(why) => {
            parts.push("error=\"invalid_token\"".to_string());
            parts.push(format!("error_description=\"{why}\""));
        }
        Error::Forbidden(scope) => {
            parts.push("error=\"insufficient_scope\"".to_string());
            parts.push(format!("scope=\"{}\"", quoted(scope)));
        }
        // The upstream the token was forwarded to refused it.
        Error::UpstreamDenied { status: 403, .. } => parts.push("error=\"insufficient_scope\"".to_string()),
        Error::UpstreamDenied { .. } => parts.push("error=\"invalid_token\"".to_string()),
        _ => {}
    }
    if let Some(url) = metadata_url(policy) {
        parts.push(format!("resource_metadata=\"{}\"", quoted(&url)));
    }
    let value = if parts.is_empty() { "Bearer".to_string() } else { format!("Bearer {}", parts.join(", ")) };
    HeaderValue::from_str(&value).unwrap_or_else(|_| HeaderValue::from_static("Bearer"))
}

/// A value fit for a quoted-string (configured text: no quotes or backslashes kept).
fn quoted(s: &str) -> String {
    s.chars().filter(|c| *c != '"' && *c != '\\' && !c.is_control()).collect()
}

/// Where the policy's metadata is served: the resource's origin, the
/// well-known path, then the resource's path (RFC 9728 §3.1).
pub fn metadata_url(policy: &AuthPolicy) -> Option<String> {
    let resource: http::Uri = policy.resource.as_ref()?.parse().ok()?;
    let path = resource.path().trim_end_matches('/');
    Some(format!("{}://{}{METADATA_PATH}{path}", resource.scheme_str()?, resource.authority()?))
}

/// The metadata document answering `path` (`/.well-known/oauth-protected-resource`
/// followed by a route's path, or alone when one route is protected) on
/// `host` (the request's, as routes name hosts).
pub fn metadata(config: &Config, host: Option<&str>, path: &str) -> Option<Response<Body>> {
    let suffix = path.strip_prefix(METADATA_PATH)?;
    // Only a policy that names its resource has metadata (RFC 9728: `resource` is required).
    // A route naming another host is not this host's.
    // Routes naming this host first: they win over a host-less route of the
    // same path, as in routing.
    let mut protected: Vec<_> = config
        .routes
        .iter()
        .filter(|r| r.host.is_none() || r.host.as_deref() == host)
        .filter_map(|r| Some((r, r.auth.as_ref().filter(|p| p.resource.is_some())?)))
        .collect();
    protected.sort_by_key(|(r, _)| r.host.is_none());
    let (_, policy) = match suffix {
        "" | "/" if protected.len() == 1 => protected[0],
        _ => *protected.iter().find(|(r, p)| {
            let resource_path =
                p.resource.as_ref().and_then(|u| u.parse::<http::Uri>().ok()).map(|u| u.path().to_string());
            r.path == suffix || resource_path.as_deref() == Some(suffix)
        })?,
    };
    let mut doc = json!({
        "resource": policy.resource,
        "authorization_servers": policy.authorization_servers,
        "bearer_methods_supported": ["header"],
    });
    if !policy.scopes_supported.is_empty() {
        doc["scopes_supported"] = json!(policy.scopes_supported);
    }
    let mut resp = reply::json_response(StatusCode::OK, &doc);
    resp.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("max-age=300"));
    Some(resp)
}
