//! Cluster mode: a retry whose flow is parked on another replica is forwarded
//! to that replica's internal listener and its answer relayed back unchanged.
//! The shared secret never crosses the wire: each forwarded retry is signed
//! (`sign.rs`), optionally over TLS (`tls.rs`). The internal listener's gate
//! ([`Gate`]) lets through only signed, fresh, unreplayed retries; the bridge
//! then checks that they resume a call paused on this replica.

pub mod sign;
pub mod tls;

use std::sync::Mutex;
use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use crate::config::Cluster;
use crate::metrics::RefusedLabels;
use crate::reply::{Body, BoxError};
use sign::{Keys, Signed, NONCE_LEN};

/// The internal listener's one endpoint.
pub const RETRY_PATH: &str = "/internal/v1/retry";
pub const ROUTE_HEADER: &str = "x-sessionless-route";
pub const PRINCIPAL_HEADER: &str = "x-sessionless-principal";
/// Unix milliseconds when the retry was forwarded.
pub const TIMESTAMP_HEADER: &str = "x-sessionless-timestamp";
/// [`NONCE_LEN`] random bytes, base64url.
pub const NONCE_HEADER: &str = "x-sessionless-nonce";
/// SHA-256 of the body, base64url (signed: checked before the body is read).
pub const BODY_DIGEST_HEADER: &str = "x-sessionless-body-sha256";
/// HMAC-SHA256 over [`sign::canonical`], base64url.
pub const SIGNATURE_HEADER: &str = "x-sessionless-signature";
/// The translated legacy session a client's answer was posted on (signed;
/// only on such answers).
pub const SESSION_HEADER: &str = "x-sessionless-session";
/// The longest session header taken.
const MAX_SESSION: usize = 128;
/// Set on the internal listener's own refusals, so that the forwarding
/// replica can tell them from the owner's answer to the client.
pub const REFUSED_HEADER: &str = "x-sessionless-refused";

/// Why a retry could not be handed to its owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForwardError {
    /// Nothing answers at the owner's address (gone, restarted elsewhere).
    OwnerGone,
    /// The owner's internal listener refused the request (wrong secret, not
    /// the owner, unknown route) or its TLS certificate did not verify.
    Refused,
    /// The owner accepted the retry but its answer broke off.
    Broken,
}

pub struct Forwarder {
    http: Client<tls::Connector, Full<Bytes>>,
    scheme: &'static str,
    /// This replica's own internal address, sealed into the states it issues.
    advertise: String,
    keys: Keys,
    /// Time allowed for the owner's answer to start.
    timeout: Duration,
}

impl Forwarder {
    /// `tls`: built from `cluster.tls` when the gateway started.
    pub fn new(cluster: &Cluster, tls: Option<&tls::ClusterTls>, timeout: Duration) -> Forwarder {
        let mut tcp = HttpConnector::new();
        tcp.set_connect_timeout(Some(cluster.connect_timeout));
        tcp.set_nodelay(true);
        let connector = tls::Connector::new(tcp, tls);
        let scheme = connector.scheme();
        let http =
            Client::builder(TokioExecutor::new()).pool_idle_timeout(Duration::from_secs(30)).build(connector);
        Forwarder {
            http,
            scheme,
            advertise: cluster.advertise.clone(),
            keys: Keys::derive(&cluster.secrets),
            timeout,
        }
    }

    pub fn advertise(&self) -> &str {
        &self.advertise
    }

    /// Sends the retry (`headers`, `body`) to the replica at `owner`, signed,
    /// and returns its answer, to be relayed to the client as it is.
    /// `session`: the translated legacy session a client's answer came on.
    pub async fn forward(
        &self,
        owner: &str,
        route: &str,
        principal: &str,
        session: Option<&str>,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Result<Response<Body>, ForwardError> {
        let mcp = crate::front::headers::mcp_only(headers);
        let mut nonce = [0u8; NONCE_LEN];
        rand::RngCore::fill_bytes(&mut rand::thread_rng(), &mut nonce);
        let timestamp_ms = sign::now_ms();
        let body_digest = sign::body_digest(&body);
        let signed = Signed {
            audience: owner,
            route,
            principal,
            headers: &mcp,
            body_digest: &body_digest,
            timestamp_ms,
            nonce: &nonce,
            session,
        };
        let tag = self.keys.sign(&signed);
        let uri = format!("{}://{owner}{RETRY_PATH}", self.scheme);
        let mut req = Request::post(uri).body(Full::new(body)).map_err(|_| ForwardError::Refused)?;
        let h = req.headers_mut();
        *h = mcp;
        let value = |s: &str| HeaderValue::from_str(s).map_err(|_| ForwardError::Refused);
        h.insert(ROUTE_HEADER, value(route)?);
        h.insert(PRINCIPAL_HEADER, value(principal)?);
        h.insert(TIMESTAMP_HEADER, value(&timestamp_ms.to_string())?);
        h.insert(NONCE_HEADER, value(&URL_SAFE_NO_PAD.encode(nonce))?);
        h.insert(BODY_DIGEST_HEADER, value(&URL_SAFE_NO_PAD.encode(body_digest))?);
        h.insert(SIGNATURE_HEADER, value(&URL_SAFE_NO_PAD.encode(tag))?);
        if let Some(session) = session {
            h.insert(SESSION_HEADER, value(session)?);
        }
        let resp = match tokio::time::timeout(self.timeout, self.http.request(req)).await {
            Err(_) => return Err(ForwardError::Broken),
            Ok(Err(e)) if tls::handshake_failed(&e) => {
                crate::log_limited!(tracing::Level::WARN, owner, error = %e, "owner replica: TLS handshake failed");
                return Err(ForwardError::Refused);
            }
            Ok(Err(e)) if e.is_connect() => return Err(ForwardError::OwnerGone),
            Ok(Err(_)) => return Err(ForwardError::Broken),
            Ok(Ok(resp)) => resp,
        };
        if resp.headers().contains_key(REFUSED_HEADER) {
            return Err(ForwardError::Refused);
        }
        let (parts, body) = resp.into_parts();
        let mut out = Response::new(body.map_err(|e| Box::new(e) as BoxError).boxed());
        *out.status_mut() = parts.status;
        for name in ["content-type", "cache-control", "x-accel-buffering", "retry-after"] {
            if let Some(v) = parts.headers.get(name) {
                out.headers_mut().insert(name, v.clone());
            }
        }
        Ok(out)
    }
}

/// Why the internal listener refused a request; each is a metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refused {
    /// Not `POST` to [`RETRY_PATH`].
    NotFound,
    /// Without a well-formed timestamp, nonce, signature, route and principal.
    Unsigned,
    /// Timestamp outside [`sign::WINDOW_MS`].
    Stale,
    TooLarge,
    /// The body broke off.
    Unreadable,
    /// The signature does not verify (wrong secret, altered request).
    BadSignature,
    /// The same signed request again.
    Replayed,
    /// Too many recent forwarded retries to remember one more.
    Busy,
    UnknownRoute,
    /// Not the retry of a paused call (no `requestState`, one that does not
    /// open, a replay-mode or URL-round state).
    NotARetry,
    /// The state names another caller than the signed principal.
    WrongPrincipal,
    /// The state names another replica as the owner.
    NotOwner,
}

impl Refused {
    pub fn reason(self) -> &'static str {
        match self {
            Refused::NotFound => "not_found",
            Refused::Unsigned => "unsigned",
            Refused::Stale => "stale",
            Refused::TooLarge => "too_large",
            Refused::Unreadable => "unreadable",
            Refused::BadSignature => "bad_signature",
            Refused::Replayed => "replayed",
            Refused::Busy => "busy",
            Refused::UnknownRoute => "unknown_route",
            Refused::NotARetry => "not_a_retry",
            Refused::WrongPrincipal => "wrong_principal",
            Refused::NotOwner => "not_owner",
        }
    }

    fn status(self) -> StatusCode {
        match self {
            Refused::NotFound | Refused::UnknownRoute => StatusCode::NOT_FOUND,
            Refused::Unsigned | Refused::Stale | Refused::BadSignature | Refused::Replayed => {
                StatusCode::UNAUTHORIZED
            }
            Refused::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Refused::Unreadable => StatusCode::BAD_REQUEST,
            Refused::Busy => StatusCode::SERVICE_UNAVAILABLE,
            Refused::NotARetry | Refused::WrongPrincipal | Refused::NotOwner => StatusCode::FORBIDDEN,
        }
    }
}

/// The internal listener's refusal: plain status, marked so it is never relayed.
pub fn refusal(status: StatusCode) -> Response<Body> {
    let mut resp = crate::reply::empty(status);
    resp.headers_mut().insert(REFUSED_HEADER, HeaderValue::from_static("1"));
    resp
}

/// A forwarded request's signature headers, before the body is read.
pub struct Head {
    pub route: String,
    pub principal: String,
    /// [`SESSION_HEADER`], when sent.
    pub session: Option<String>,
    timestamp_ms: u64,
    nonce: [u8; NONCE_LEN],
    body_digest: [u8; 32],
    tag: Vec<u8>,
}

/// The internal listener's checks on who sent a request: signature,
/// freshness, replay. Refusals are counted and logged (rate-limited).
pub struct Gate {
    keys: Keys,
    /// This replica's advertised address: the audience signatures must name.
    audience: String,
    seen: Mutex<sign::Seen>,
    refused: Family<RefusedLabels, Counter>,
}

impl Gate {
    pub fn new(cluster: &Cluster, refused: Family<RefusedLabels, Counter>) -> Gate {
        Gate {
            keys: Keys::derive(&cluster.secrets),
            audience: cluster.advertise.clone(),
            seen: Mutex::new(sign::Seen::new(sign::MAX_SEEN)),
            refused,
        }
    }

    /// Checks the method, path, signature headers and timestamp window.
    pub fn head(&self, parts: &http::request::Parts) -> Result<Head, Refused> {
        if parts.uri.path() != RETRY_PATH || parts.method != http::Method::POST {
            return Err(Refused::NotFound);
        }
        let header = |name: &str| parts.headers.get(name).and_then(|v| v.to_str().ok());
        let (Some(route), Some(principal), Some(ts), Some(nonce), Some(digest), Some(tag)) = (
            header(ROUTE_HEADER),
            header(PRINCIPAL_HEADER),
            header(TIMESTAMP_HEADER),
            header(NONCE_HEADER),
            header(BODY_DIGEST_HEADER),
            header(SIGNATURE_HEADER),
        ) else {
            return Err(Refused::Unsigned);
        };
        // Digits only: `u64::from_str` would take a leading `+`.
        let timestamp_ms = Some(ts)
            .filter(|t| !t.is_empty() && t.len() <= 20 && t.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|t| t.parse::<u64>().ok())
            .ok_or(Refused::Unsigned)?;
        let nonce = URL_SAFE_NO_PAD
            .decode(nonce)
            .ok()
            .and_then(|n| <[u8; NONCE_LEN]>::try_from(n).ok())
            .ok_or(Refused::Unsigned)?;
        let body_digest = URL_SAFE_NO_PAD
            .decode(digest)
            .ok()
            .and_then(|d| <[u8; 32]>::try_from(d).ok())
            .ok_or(Refused::Unsigned)?;
        let tag = URL_SAFE_NO_PAD.decode(tag).map_err(|_| Refused::Unsigned)?;
        if !sign::in_window(timestamp_ms, sign::now_ms()) {
            return Err(Refused::Stale);
        }
        let session = match parts.headers.get(SESSION_HEADER) {
            None => None,
            Some(v) => Some(v.to_str().ok().filter(|s| s.len() <= MAX_SESSION).ok_or(Refused::Unsigned)?),
        };
        Ok(Head {
            route: route.into(),
            principal: principal.into(),
            session: session.map(str::to_string),
            timestamp_ms,
            nonce,
            body_digest,
            tag,
        })
    }

    /// Verifies the signature over the request's head (the body by its
    /// signed digest), before a byte of the body is read; then records its
    /// nonce: the same signed request is refused from then on.
    pub fn verify(&self, head: &Head, headers: &HeaderMap) -> Result<(), Refused> {
        let signed = Signed {
            audience: &self.audience,
            route: &head.route,
            principal: &head.principal,
            headers,
            body_digest: &head.body_digest,
            timestamp_ms: head.timestamp_ms,
            nonce: &head.nonce,
            session: head.session.as_deref(),
        };
        if !self.keys.verify(&signed, &head.tag) {
            return Err(Refused::BadSignature);
        }
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.insert(head.nonce, head.timestamp_ms, sign::now_ms()).map_err(|e| match e {
            sign::Unseen::Replayed => Refused::Replayed,
            sign::Unseen::Full => Refused::Busy,
        })
    }

    /// The body read after [`Gate::verify`] is the one that was signed.
    pub fn body_matches(&self, head: &Head, body: &[u8]) -> Result<(), Refused> {
        if sign::body_digest(body) == head.body_digest {
            Ok(())
        } else {
            Err(Refused::BadSignature)
        }
    }

    /// Counts and logs a refusal and returns its answer.
    pub fn refuse(&self, why: Refused) -> Response<Body> {
        self.refused.get_or_create(&RefusedLabels { reason: why.reason() }).inc();
        crate::log_limited!(
            tracing::Level::WARN,
            reason = why.reason(),
            "internal listener refused a request"
        );
        refusal(why.status())
    }
}
