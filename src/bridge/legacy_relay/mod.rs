//! Legacy (2025 session) clients relayed to the upstream's own sessions
//! (DESIGN §9): the direct path, for fidelity, beside the halves.
//!
//! The client's `initialize` opens an upstream session of its own with the
//! client's own params; the upstream's answer goes back with the upstream's
//! session id swapped for a sealed token ([`token`]) naming route, instance,
//! upstream session, version and principal. Every later request (POST, the
//! GET stream, DELETE) opens the token, on any replica, and goes to that
//! upstream session as sent: the upstream's JSON-RPC messages come back as
//! they are, SSE event by event ([`stream`]). Only the session header is
//! swapped, both ways; the client's credentials never leave the gateway.
//! There is no session table: the upstream's own idle timeout ends sessions
//! the client abandons. Bounded by the rate of new sessions (per principal
//! and overall), body and event sizes, timeouts and the stream slots.

use std::any::Any;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Response, StatusCode};
use serde::Deserialize;
use serde_json::Value;

use super::quota;
use super::relay::{self, Answering, Relay};
use super::session_token::{self as token, Claims, Rejected};
use super::{Caller, Generation, Held, Services, Target};
use crate::config::Config;
use crate::error::Error;
use crate::front::headers::{LAST_EVENT_ID, PROTOCOL_VERSION, SESSION_ID};
use crate::front::legacy::{Kind, Peeked};
use crate::metrics::OpenedLabels;
use crate::reply::{self, Body};
use crate::sealed::Purpose;
use crate::upstream::answers::{judge, Verdict};
use crate::upstream::{h1, SendError, SessionWire, Transport, ACCEPT_BOTH};

/// The longest upstream session id sealed into a token (a token must stay
/// under the length [`token::open`] accepts).
const MAX_UPSTREAM_SESSION_ID: usize = 256;
/// The longest `Last-Event-ID` relayed.
const MAX_EVENT_ID: usize = 1024;
/// A GET stream on which the upstream sent nothing for this many keep-alive
/// intervals is ended (the client reconnects).
const GET_QUIET_KEEPALIVES: u32 = 10;

pub struct Bridge {
    services: Arc<Services>,
    session_ttl: Duration,
    quota: Arc<quota::Creations>,
    /// POST answers being streamed: a draining replica waits for them.
    streaming: Arc<AtomicUsize>,
}

/// Counts one streamed POST answer while it lives.
struct Streaming(Arc<AtomicUsize>);

impl Streaming {
    fn new(count: &Arc<AtomicUsize>) -> Streaming {
        count.fetch_add(1, Ordering::AcqRel);
        Streaming(count.clone())
    }
}

impl Drop for Streaming {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Bridge {
    pub fn new(config: &Config, services: Arc<Services>) -> Bridge {
        if config.keys.is_empty() {
            tracing::warn!(
                "no sealing keys configured: legacy session ids (and requestState) do not survive a \
                 restart and are not accepted by other replicas; configure [[keys]]"
            );
        }
        Bridge {
            services,
            session_ttl: config.legacy.session_ttl,
            quota: Arc::new(quota::Creations::new(
                config.legacy.max_new_sessions_per_minute,
                config.legacy.max_new_sessions_per_principal_per_minute,
            )),
            streaming: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// How fast legacy sessions may be opened: shared with the translated cell.
    pub fn session_quota(&self) -> Arc<quota::Creations> {
        self.quota.clone()
    }

    /// POST answers still streaming (a tool call waiting on its user, say):
    /// a draining replica keeps relaying them until its deadline.
    pub fn streaming(&self) -> usize {
        self.streaming.load(Ordering::Acquire)
    }

    /// A legacy POST: `initialize` opens an upstream session; anything else
    /// goes to the session its token names.
    pub async fn post(
        &self,
        target: &Target,
        upstream: Generation,
        caller: Caller,
        peek: Peeked,
        held: Held,
        started: Instant,
    ) -> Response<Body> {
        let Held { permits: hold, body: body_share } = held;
        let done = if peek.label == Kind::Batch && caller.access.is_some() {
            Err(Error::InvalidRequest("batches are not relayed on a route with authorization rules".into()))
        } else {
            match target.admit(&caller.principal, &super::asks(&peek)) {
                Err(e) => Err(e),
                Ok(slot) if peek.initialize => {
                    // A session id on initialize must still be one of ours
                    // (404 otherwise, as on every method); a new session opens.
                    let stale = caller.headers.contains_key(&SESSION_ID);
                    match if stale { self.session(target, &caller).map(drop) } else { Ok(()) } {
                        Ok(()) => self.initialize(target, &caller, &peek.ids, Box::new((hold, slot))).await,
                        Err(e) => Err(e),
                    }
                }
                Ok(slot) => self.relay_post(target, &caller, &peek, Box::new((hold, slot)), body_share).await,
            }
        };
        target.observed(matches!(done, Err(Error::UpstreamUnreachable)));
        let (resp, outcome) = match done {
            Ok(resp) => (resp, "forwarded"),
            Err(e) => (self.error(peek.id.as_ref(), &e), e.reason()),
        };
        self.services.count(target, (Generation::Legacy, upstream), peek.label.as_str(), outcome, started);
        resp
    }

    /// GET (the session's standalone stream) and DELETE (ends the upstream session).
    pub async fn session_verb(
        &self,
        target: &Target,
        upstream: Generation,
        method: &http::Method,
        caller: Caller,
        permit: Box<dyn Any + Send + Sync>,
        started: Instant,
    ) -> Response<Body> {
        let get = method == http::Method::GET;
        let done = self.session_verb_inner(target, get, &caller, permit).await;
        target.observed(matches!(done, Err(Error::UpstreamUnreachable)));
        let (resp, outcome) = match done {
            Ok(resp) => (resp, "forwarded"),
            Err(e) => {
                let mut resp = self.error(None, &e);
                if e.status() == StatusCode::METHOD_NOT_ALLOWED {
                    resp.headers_mut().insert(header::ALLOW, HeaderValue::from_static("POST, GET, DELETE"));
                }
                (resp, e.reason())
            }
        };
        let label = if get { "GET" } else { "DELETE" };
        self.services.count(target, (Generation::Legacy, upstream), label, outcome, started);
        resp
    }

    async fn session_verb_inner(
        &self,
        target: &Target,
        get: bool,
        caller: &Caller,
        permit: Box<dyn Any + Send + Sync>,
    ) -> Result<Response<Body>, Error> {
        if !caller.headers.contains_key(&SESSION_ID) {
            return Err(Error::MethodNotAllowed);
        }
        let (claims, upstream) = self.session(target, caller)?;
        let wire = wire(&claims, &caller.headers);
        let gone = |status: u16| status == 404 && claims.upstream_session.is_some();
        if !get {
            let resp = self.send(target, upstream, "DELETE", &wire, &[("accept", ACCEPT_BOTH)], b"").await?;
            let status = resp.status;
            let _ = upstream.read_body(resp.body).await;
            return match status {
                200..=299 => Ok(reply::empty(StatusCode::OK)),
                s if gone(s) => Err(self.gone(target)),
                405 => Err(Error::MethodNotAllowed),
                _ => Err(Error::UpstreamInvalid("error status")),
            };
        }
        if self.services.draining.is_cancelled() {
            // This replica is leaving: the client's reconnect goes elsewhere.
            return Err(Error::Overloaded);
        }
        let last = match caller.headers.get(&LAST_EVENT_ID) {
            None => None,
            Some(v) => match v.to_str() {
                Ok(id) if id.len() <= MAX_EVENT_ID => Some(id),
                _ => {
                    return Err(Error::InvalidRequest(
                        "Last-Event-ID must be visible ASCII, 1 KiB at most".into(),
                    ))
                }
            },
        };
        let place = self.services.stream_place(&target.route.id, &caller.principal)?;
        let resp = match last {
            Some(last) => {
                let extra = [("accept", "text/event-stream"), ("last-event-id", last)];
                self.send(target, upstream, "GET", &wire, &extra, b"").await?
            }
            None => {
                self.send(target, upstream, "GET", &wire, &[("accept", "text/event-stream")], b"").await?
            }
        };
        match resp.status {
            200..=299 if resp.is_sse() => {
                // A draining replica ends its GET streams: the client
                // reconnects, through the balancer, to another replica.
                let mut relay = Relay::new(
                    resp.body,
                    upstream.max_response(),
                    self.services.keepalive,
                    self.services.draining.clone(),
                    Box::new((place, permit)),
                );
                // Ends a stream the upstream went quiet on (half-open, say):
                // the client reconnects, with Last-Event-ID.
                relay.quiet_limit = Some(self.services.keepalive * GET_QUIET_KEEPALIVES);
                Ok(relay.response(None))
            }
            s if gone(s) => Err(self.gone(target)),
            405 => Err(Error::MethodNotAllowed),
            _ => self.json_answer(upstream, resp, &[], None).await,
        }
    }

    /// Opens a session for the client: its own `initialize`, relayed.
    async fn initialize(
        &self,
        target: &Target,
        caller: &Caller,
        sent: &[Value],
        hold: Box<dyn Any + Send + Sync>,
    ) -> Result<Response<Body>, Error> {
        #[derive(Deserialize)]
        struct Init<'a> {
            #[serde(borrow)]
            params: Option<InitParams<'a>>,
        }
        #[derive(Deserialize)]
        struct InitParams<'a> {
            #[serde(rename = "protocolVersion", borrow)]
            version: Option<std::borrow::Cow<'a, str>>,
        }
        let requested = serde_json::from_slice::<Init<'_>>(&caller.body).ok().and_then(|i| i.params?.version);
        self.quota.admit_counted(&caller.principal, &target.route.id, &self.services.metrics)?;
        let wire = SessionWire { id: None, version: client_version(&caller.headers), owner: None };
        let (resp, upstream) = self.post_new(target, &wire, caller).await?;
        // From here on, a session the upstream minted is ended on every
        // path that does not hand it to the client (in the background: the
        // client's answer does not wait for it).
        let minted = resp.header("mcp-session-id").map(str::to_string);
        let end_minted = || {
            if let Some(id) = minted.clone() {
                let (upstream, version) = (upstream.clone(), wire.version.clone());
                tokio::spawn(async move {
                    upstream.delete(&SessionWire { id: Some(id), version, owner: None }).await
                });
            }
        };
        let fits =
            |s: &String| s.len() <= MAX_UPSTREAM_SESSION_ID && s.bytes().all(|b| (0x21..=0x7e).contains(&b));
        if !minted.as_ref().is_none_or(fits) {
            end_minted();
            return Err(Error::UpstreamInvalid("session id"));
        }
        if !(200..300).contains(&resp.status) {
            // The upstream's own JSON-RPC error passes as it is; anything
            // else is a gateway error.
            end_minted();
            return self.json_answer(upstream, resp, sent, None).await;
        }
        // The answer is read whole: the token goes in its headers, and the
        // negotiated version comes from it. An initialize answer is small.
        let (body, sse) = match self.read_initialize(target, upstream, resp, sent).await {
            Ok(read) => read,
            Err(e) => {
                end_minted();
                return Err(e);
            }
        };
        let Some(version) = initialize_result(&body, sse) else {
            // No result: an error message (passed as it is) or something
            // that is not a JSON-RPC message (a gateway error). No session.
            end_minted();
            if !sse && !relay::is_json_message(&body) {
                return Err(Error::UpstreamInvalid("not a JSON-RPC message"));
            }
            return Ok(relay::answer(StatusCode::OK, body, sse, None));
        };
        let upstream_session = minted;
        let now = crate::seal::unix_now();
        let claims = Claims {
            route: target.route.id.clone(),
            instance: upstream.instance().to_string(),
            upstream_session,
            version,
            principal: caller.principal.clone(),
            issued: now,
            expires: now + self.session_ttl.as_secs(),
            translated: None,
        };
        // Under the cap: the upstream's session id is at most MAX_UPSTREAM_SESSION_ID.
        let token = token::issue(&self.services.sealer, &claims)
            .map_err(|_| Error::UpstreamInvalid("session id too long"))?;
        let token = HeaderValue::from_str(&token).expect("base64url is a valid header value");
        self.services
            .metrics
            .legacy_sessions_opened
            .get_or_create(&OpenedLabels {
                route: target.route.id.clone(),
                requested: crate::versions::label(requested.as_deref()),
            })
            .inc();
        drop(hold);
        Ok(relay::answer(StatusCode::OK, body, sse, Some(token)))
    }

    /// Reads an initialize answer: the JSON body, or the SSE events up to the
    /// first response. Returns the bytes to relay and whether they are SSE.
    async fn read_initialize(
        &self,
        target: &Target,
        upstream: &Transport,
        resp: h1::Response,
        sent: &[Value],
    ) -> Result<(Bytes, bool), Error> {
        if !resp.is_sse() {
            if !resp.is_json() {
                return Err(Error::UpstreamInvalid("content type"));
            }
            let body = upstream.read_body(resp.body).await.map_err(|e| map_error(e, true))?;
            if judge(&body, sent) == Verdict::Foreign {
                upstream.distrust();
                return Err(Error::UpstreamInvalid("an answer to another request"));
            }
            return Ok((body, false));
        }
        let mut events = Relay::events(resp.body, upstream.max_response());
        let mut out = Vec::new();
        let read = async {
            use futures_util::StreamExt;
            while let Some(event) = events.next().await {
                let event = event.map_err(|_| Error::UpstreamInvalid("invalid event stream"))?;
                let bytes = relay::encode(&event, sent, Some(upstream))?;
                if out.len() + bytes.len() > upstream.max_response() {
                    return Err(Error::UpstreamTooLarge);
                }
                out.extend_from_slice(&bytes);
                if is_response(event.data.as_deref().unwrap_or("").as_bytes()) {
                    return Ok(());
                }
            }
            Err(Error::OutcomeUnknown)
        };
        match tokio::time::timeout(target.route.upstream.response_timeout, read).await {
            Err(_) => Err(Error::UpstreamTimeout),
            Ok(r) => r.map(|()| (Bytes::from(out), true)),
        }
    }

    /// Any other POST: relayed on the session its token names.
    async fn relay_post(
        &self,
        target: &Target,
        caller: &Caller,
        peek: &Peeked,
        hold: Box<dyn Any + Send + Sync>,
        body_share: Option<crate::body::Share>,
    ) -> Result<Response<Body>, Error> {
        if !caller.headers.contains_key(&SESSION_ID) {
            return Err(Error::SessionRequired);
        }
        let (claims, upstream) = self.session(target, caller)?;
        let wire = wire(&claims, &caller.headers);
        let deadline = tokio::time::Instant::now() + target.route.upstream.call_timeout;
        // The route's rules hide denied items from the lists relayed.
        let filter = caller.access.clone();
        let resp = match self.post_upstream(upstream, &wire, caller).await {
            Err(SendError::NotSent) => return Err(self.instance_gone(target)),
            other => other.map_err(|e| map_error(e, true))?,
        };
        drop(body_share);
        match resp.status {
            202 => Ok(reply::empty(StatusCode::ACCEPTED)),
            404 if claims.upstream_session.is_some() => Err(self.gone(target)),
            200..=299 if resp.is_sse() => {
                let mut relay = Relay::new(
                    resp.body,
                    upstream.max_response(),
                    self.services.keepalive,
                    self.services.shutdown.clone(),
                    Box::new((hold, Streaming::new(&self.streaming))),
                );
                relay.deadline = Some(deadline);
                relay.id = peek.id.clone();
                relay.answering = Some(Answering { ids: peek.ids.clone(), upstream: upstream.clone() });
                if let Some(view) = filter.clone() {
                    let method = peek.label.as_str();
                    relay.rewrite = Some(Box::new(move |data: &str| view.filter_message(method, data)));
                }
                Ok(relay.response(None))
            }
            _ => {
                let filter = filter.as_deref().map(|v| (v, peek.label.as_str()));
                self.json_answer(upstream, resp, &peek.ids, filter).await
            }
        }
    }

    /// POSTs a new session's `initialize` to the next instance that is up
    /// (to the one after if that one cannot be reached).
    async fn post_new<'t>(
        &self,
        target: &'t Target,
        wire: &SessionWire,
        caller: &Caller,
    ) -> Result<(h1::Response, &'t Transport), Error> {
        let work = |upstream| self.post_upstream(upstream, wire, caller);
        let (resp, upstream) = target.on_instance(work, |e| *e == SendError::NotSent).await;
        Ok((resp.map_err(|e| map_error(e, true))?, upstream))
    }

    /// POSTs the client's body as it came, on `wire`. Sent again only when
    /// the first attempt cannot have reached an instance that is still up
    /// (a connection that had gone stale).
    async fn post_upstream(
        &self,
        upstream: &Transport,
        wire: &SessionWire,
        caller: &Caller,
    ) -> Result<h1::Response, SendError> {
        upstream.once_more(|| self.post_once(upstream, wire, caller)).await
    }

    async fn post_once(
        &self,
        upstream: &Transport,
        wire: &SessionWire,
        caller: &Caller,
    ) -> Result<h1::Response, SendError> {
        let accept = caller.headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or(ACCEPT_BOTH);
        let extra = [("accept", accept), ("content-type", "application/json")];
        upstream.send("POST", wire, &extra, &caller.body).await
    }

    /// A GET or DELETE on a session's instance; one that cannot reach the
    /// instance ends the session (404: the client starts a new one, on an
    /// instance that is up).
    async fn send(
        &self,
        target: &Target,
        upstream: &Transport,
        method: &str,
        wire: &SessionWire,
        extra: &[(&str, &str)],
        body: &[u8],
    ) -> Result<h1::Response, Error> {
        match upstream.send_again(method, wire, extra, body).await {
            Err(SendError::NotSent) => Err(self.instance_gone(target)),
            other => other.map_err(|e| map_error(e, method != "GET")),
        }
    }

    /// A JSON answer relayed as it is when it is a JSON-RPC message (an
    /// error status included); anything else becomes a gateway error.
    /// `filter`: the caller's view of the route's rules and the list method
    /// whose answer this is (denied items are removed).
    async fn json_answer(
        &self,
        upstream: &Transport,
        resp: h1::Response,
        sent: &[Value],
        filter: Option<(&crate::authz::View, &str)>,
    ) -> Result<Response<Body>, Error> {
        let status = StatusCode::from_u16(resp.status).unwrap_or(StatusCode::BAD_GATEWAY);
        let success = status.is_success();
        let json = resp.is_json();
        let body = upstream.read_body(resp.body).await.map_err(|e| map_error(e, true))?;
        let verdict = if json { judge(&body, sent) } else { Verdict::NotJson };
        if verdict == Verdict::Foreign {
            upstream.distrust();
            return Err(Error::UpstreamInvalid("an answer to another request"));
        }
        if verdict == Verdict::Fine {
            let filtered = match (filter, std::str::from_utf8(&body)) {
                (Some((view, method)), Ok(text)) => view.filter_message(method, text).ok().flatten(),
                _ => None,
            };
            let body = filtered.map(Bytes::from).unwrap_or(body);
            return Ok(relay::answer(status, body, false, None));
        }
        Err(if success {
            Error::UpstreamInvalid("content type")
        } else {
            Error::UpstreamInvalid("error status")
        })
    }

    /// The claims of the request's session token and the instance holding
    /// the session, or why it is refused (404).
    fn session<'t>(&self, target: &'t Target, caller: &Caller) -> Result<(Claims, &'t Transport), Error> {
        let claims =
            token::of_request(&self.services.sealer, &caller.headers, &target.route.id, &caller.principal)
                .map_err(|why| self.reject(target, why))?;
        if claims.translated.is_some() {
            return Err(self.reject(target, Rejected::OtherCell));
        }
        let upstream =
            target.instance(&claims.instance).ok_or_else(|| self.reject(target, Rejected::OtherInstance))?;
        Ok((claims, upstream))
    }

    fn reject(&self, target: &Target, why: Rejected) -> Error {
        why.refuse(Purpose::LegacySession, &target.route.id, &self.services.metrics)
    }

    /// The upstream no longer knows the session: the client starts over.
    fn gone(&self, target: &Target) -> Error {
        self.reject(target, Rejected::UpstreamGone)
    }

    /// The session's instance cannot be reached (nothing was sent): the
    /// session ends, the client starts a new one on an instance that is up.
    fn instance_gone(&self, target: &Target) -> Error {
        self.reject(target, Rejected::InstanceGone)
    }

    fn error(&self, id: Option<&Value>, err: &Error) -> Response<Body> {
        reply::error(id, err)
    }
}

/// The upstream session a request goes to: the token's session id, and the
/// version header as the client sent it (2025-03-26 clients send none).
fn wire(claims: &Claims, headers: &HeaderMap) -> SessionWire {
    SessionWire { id: claims.upstream_session.clone(), version: client_version(headers), owner: None }
}

fn client_version(headers: &HeaderMap) -> Option<String> {
    headers.get(&PROTOCOL_VERSION).and_then(|v| v.to_str().ok()).map(str::to_string)
}

fn map_error(e: SendError, sent: bool) -> Error {
    crate::upstream::map_send_error(e, sent)
}

/// Whether `data` is a JSON-RPC response (a result or an error).
fn is_response(data: &[u8]) -> bool {
    #[derive(Deserialize)]
    struct Msg {
        id: Option<serde::de::IgnoredAny>,
        method: Option<serde::de::IgnoredAny>,
    }
    serde_json::from_slice::<Msg>(data).is_ok_and(|m| m.id.is_some() && m.method.is_none())
}

/// The negotiated version of an `InitializeResult` message (JSON, or the
/// events relayed as SSE text), or `None` when it is not a result.
fn initialize_result(body: &[u8], sse: bool) -> Option<Option<String>> {
    #[derive(Deserialize)]
    struct Msg {
        result: Option<Result>,
    }
    #[derive(Deserialize)]
    struct Result {
        #[serde(rename = "protocolVersion")]
        version: Option<String>,
    }
    let parse =
        |bytes: &[u8]| serde_json::from_slice::<Msg>(bytes).ok().and_then(|m| m.result).map(|r| r.version);
    if !sse {
        return parse(body);
    }
    crate::upstream::sse_data(std::str::from_utf8(body).ok()?).find_map(|data| parse(data.as_bytes()))
}
