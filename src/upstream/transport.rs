//! HTTP to one upstream instance: the [`Channel`] of legacy sessions (POST
//! a message on a session, open or resume its GET stream, DELETE it; answers
//! come back as JSON or as a stream of JSON-RPC messages read from SSE:
//! priming events, ids, `retry`, resumption), and the raw exchanges of the
//! 2026 pass-through and the legacy relay.

use std::collections::VecDeque;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use http_body_util::{BodyExt, Limited};
use serde::de::IgnoredAny;
use serde_json::value::RawValue;
use serde_json::Value;
use sse_stream::SseStream;

use http::Uri;
use prometheus_client::metrics::counter::Counter;

use super::channel::{
    Answer, Channel, Messages, Pending, SendError, Sent, SessionWire, Stateless, StreamEnd,
};
use super::credentials::Credentials;
use super::event_limit::{BodyError, EventLimited};
use super::h1;
use super::health::Health;
use crate::config::Upstream;
use crate::front::MODERN_VERSION;
use crate::metrics::{Metrics, UpstreamLabels};

/// The `Accept` of a request whose answer may be JSON or SSE.
pub const ACCEPT_BOTH: &str = "application/json, text/event-stream";

/// The HTTP client of one upstream instance, cheap to clone.
#[derive(Clone)]
pub struct Transport(Arc<Inner>);

struct Inner {
    http: h1::Client,
    upstream: Upstream,
    /// The instance's name: its URL, as sealed into tokens that must come back to it.
    instance: String,
    health: Health,
    max_response: usize,
    /// `sessionless_upstream_requests_total`, resolved once per status.
    counts: Counts,
    /// Headers added to every request (`[upstreams.headers]`, the client's token).
    credentials: Credentials,
}

/// One counter per status class of upstream requests.
struct Counts {
    ok: Counter,
    not_found: Counter,
    client_error: Counter,
    server_error: Counter,
    timeout: Counter,
    connect_error: Counter,
    broken: Counter,
    /// Answers to requests that were not sent ([`super::answers`]).
    foreign: Counter,
}

impl Counts {
    fn new(metrics: &Metrics, route: &str, instance: &str) -> Counts {
        let get = |status: &'static str| {
            let labels = UpstreamLabels { route: route.to_string(), instance: instance.to_string(), status };
            metrics.upstream_requests.get_or_create(&labels).clone()
        };
        Counts {
            ok: get("2xx"),
            not_found: get("404"),
            client_error: get("4xx"),
            server_error: get("5xx"),
            timeout: get("timeout"),
            connect_error: get("connect_error"),
            broken: get("broken"),
            foreign: get("foreign_answer"),
        }
    }

    fn status(&self, s: u16) -> &Counter {
        match s {
            404 => &self.not_found,
            200..=299 => &self.ok,
            400..=499 => &self.client_error,
            _ => &self.server_error,
        }
    }
}

impl Transport {
    /// The client of the instance at `url`, one of `upstream`'s.
    pub fn new(
        upstream: Upstream,
        url: &Uri,
        max_response: usize,
        metrics: &Metrics,
        route: &str,
        credentials: Credentials,
    ) -> Transport {
        static TLS: OnceLock<Arc<rustls::ClientConfig>> = OnceLock::new();
        let tls = TLS.get_or_init(|| Arc::new(rustls_config())).clone();
        let settings = h1::Settings {
            connect_timeout: upstream.connect_timeout,
            idle_timeout: Duration::from_secs(60),
            max_idle: 256,
        };
        let http = h1::Client::new(url, tls, settings)
            .expect("upstream URLs are checked for scheme and host when the config is loaded");
        let instance = url.to_string();
        let health = Health::new(metrics, route, &upstream.name, &instance);
        let counts = Counts::new(metrics, route, &instance);
        Transport(Arc::new(Inner { http, upstream, instance, health, max_response, counts, credentials }))
    }

    /// Whether `other` is this very client (not a rebuilt one for the same URL).
    pub fn same(&self, other: &Transport) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// What it adds to every request (an upstream's own headers).
    pub fn credentials(&self) -> &Credentials {
        &self.0.credentials
    }

    /// The upstream's configuration.
    pub fn upstream(&self) -> &Upstream {
        &self.0.upstream
    }

    /// The instance's name (its URL).
    pub fn instance(&self) -> &str {
        &self.0.instance
    }

    pub fn health(&self) -> &Health {
        &self.0.health
    }

    /// The largest answer (or SSE event) read from this upstream.
    pub fn max_response(&self) -> usize {
        self.0.max_response
    }

    /// After an answer to a request that was not sent: no idle connection
    /// of this upstream is used again ([`super::answers`]).
    pub fn distrust(&self) {
        self.0.counts.foreign.inc();
        self.0.http.forget_idle();
        crate::log_limited!(
            tracing::Level::WARN,
            instance = %self.0.instance,
            "upstream answered a request that was not sent; its idle connections are dropped"
        );
    }

    /// Sends one request on `session`: the session headers, then `extra`
    /// (at most three); the raw answer once its head has arrived.
    pub(crate) async fn send(
        &self,
        method: &str,
        session: &SessionWire,
        extra: &[(&str, &str)],
        body: &[u8],
    ) -> Result<h1::Response, SendError> {
        let mut headers: [(&str, &str); 5] = [("", ""); 5];
        let mut n = 0;
        if let Some(id) = &session.id {
            headers[n] = ("mcp-session-id", id.as_str());
            n += 1;
        }
        if let Some(v) = session.version.as_deref().filter(|v| *v != "2025-03-26") {
            headers[n] = ("mcp-protocol-version", v);
            n += 1;
        }
        debug_assert!(extra.len() <= headers.len() - n, "room for every header");
        for h in extra.iter().take(headers.len() - n) {
            headers[n] = *h;
            n += 1;
        }
        self.send_headers(method, &headers[..n], body).await
    }

    /// Runs `attempt` once more when it could not send on an instance that
    /// is still up (a connection that had gone stale); an instance that
    /// could not be reached is not tried again here (it is marked down).
    pub(crate) async fn once_more<T, F, Fut>(&self, attempt: F) -> Result<T, SendError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T, SendError>>,
    {
        super::channel::once_more(self.health(), attempt).await
    }

    /// [`Transport::send`], [once more](Transport::once_more) if not sent.
    pub(crate) async fn send_again(
        &self,
        method: &str,
        session: &SessionWire,
        extra: &[(&str, &str)],
        body: &[u8],
    ) -> Result<h1::Response, SendError> {
        self.once_more(|| self.send(method, session, extra, body)).await
    }

    /// [`Transport::send_headers`], [once more](Transport::once_more) if not sent.
    pub(crate) async fn send_headers_again(
        &self,
        method: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<h1::Response, SendError> {
        self.once_more(|| self.send_headers(method, headers, body)).await
    }

    /// Sends one request with `headers`, the upstream's configured ones and,
    /// where it takes it, the client's token (besides `Host` and the
    /// framing); the raw answer once its head has arrived. A 401 or 403 is
    /// [`SendError::Denied`], whatever its body says.
    pub(crate) async fn send_headers(
        &self,
        method: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<h1::Response, SendError> {
        let inner = &*self.0;
        // On behalf of a client request: its trace, the gateway's hop as parent.
        let sent = crate::observe::hop().map(|hop| hop.sent());
        let traced;
        let headers = match &sent {
            None => headers,
            Some(sent) => {
                traced = crate::observe::traceparent::with_headers(headers, sent);
                &traced[..]
            }
        };
        let token = inner.credentials.forwards().then(super::credentials::client_token).flatten();
        let headers = inner.credentials.add(headers, token.as_ref().map(|f| &f.token));
        let send = inner.http.send(method, &headers, body);
        match tokio::time::timeout(inner.upstream.response_timeout, send).await {
            Err(_) => {
                inner.counts.timeout.inc();
                Err(SendError::Timeout)
            }
            Ok(Err(h1::Error::Unreachable(e))) => {
                inner.counts.connect_error.inc();
                inner.health.failed(&super::health::io_words(&e));
                Err(SendError::NotSent)
            }
            Ok(Err(h1::Error::NotSent(_))) => {
                inner.counts.connect_error.inc();
                Err(SendError::NotSent)
            }
            Ok(Err(h1::Error::Request(what))) => Err(SendError::Invalid(what)),
            Ok(Err(h1::Error::Broken(_) | h1::Error::Invalid(_))) => {
                inner.counts.broken.inc();
                Err(SendError::Broken)
            }
            Ok(Ok(resp)) => {
                inner.counts.status(resp.status).inc();
                match (resp.status, &token) {
                    (401 | 403, Some(forwarded)) => {
                        forwarded.refuse();
                        Err(SendError::Denied { status: resp.status, client_token: true })
                    }
                    (401 | 403, None) => Err(SendError::Denied { status: resp.status, client_token: false }),
                    _ => Ok(resp),
                }
            }
        }
    }

    /// POSTs one JSON-RPC message on `session`.
    async fn post(&self, session: &SessionWire, message: &[u8]) -> Result<Sent, SendError> {
        let headers = [("accept", ACCEPT_BOTH), ("content-type", "application/json")];
        let resp = self.send("POST", session, &headers, message).await?;
        let opened = resp.header("mcp-session-id").map(str::to_string);
        let answer = self.answer(resp, session, Resume::Yes).await?;
        Ok(Sent { answer, session: opened })
    }

    /// POSTs a 2026-07-28 request with its `Mcp-*` headers.
    async fn post_stateless(&self, request: &Stateless<'_>) -> Result<Sent, SendError> {
        let headers = stateless_headers(request);
        let resp = self.send_headers("POST", &headers, request.body).await?;
        // 2026-07-28 has no resumability: a broken stream loses the request.
        let answer = self.answer(resp, &SessionWire::default(), Resume::No).await?;
        Ok(Sent { answer, session: None })
    }

    async fn answer(
        &self,
        resp: h1::Response,
        session: &SessionWire,
        resume: Resume,
    ) -> Result<Answer, SendError> {
        let status = resp.status;
        if status == 202 {
            return Ok(Answer::Accepted);
        }
        if status == 404 && session.id.is_some() {
            return Err(SendError::SessionGone);
        }
        let success = (200..300).contains(&status);
        if success && resp.is_sse() {
            let stream = EventStream::new(self.clone(), session.clone(), resp.body, resume);
            return Ok(Answer::Stream(Box::new(stream)));
        }
        if !resp.is_json() {
            return Err(if success { SendError::Invalid("content type") } else { SendError::Status(status) });
        }
        let body = self.read_body(resp.body).await?;
        // Whichever way it is read below, the tree is bounded (free under 1 MiB).
        if super::event_limit::too_many_values(&body, self.0.max_response) {
            return Err(SendError::TooLarge);
        }
        if success {
            if let Some((id, result)) = plain_result(&body) {
                return Ok(Answer::Result { id, result });
            }
        }
        match serde_json::from_slice::<Value>(&body) {
            Ok(v) if success || v.get("error").is_some() => Ok(Answer::Json(v)),
            Ok(_) => Err(SendError::Status(status)),
            Err(_) if success => Err(SendError::Invalid("json")),
            Err(_) => Err(SendError::Status(status)),
        }
    }

    /// Reads a whole answer body under the size limit and the response timeout.
    pub(crate) async fn read_body(&self, body: h1::Body) -> Result<Bytes, SendError> {
        let limited = Limited::new(body, self.0.max_response);
        match tokio::time::timeout(self.0.upstream.response_timeout, limited.collect()).await {
            Err(_) => Err(SendError::Timeout),
            Ok(Ok(c)) => Ok(c.to_bytes()),
            Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(SendError::TooLarge),
            Ok(Err(_)) => Err(SendError::Broken),
        }
    }

    /// Opens the session's standalone GET stream, or resumes a stream after `last_event_id`.
    pub async fn get_stream(
        &self,
        session: &SessionWire,
        last_event_id: Option<&str>,
    ) -> Result<EventStream, SendError> {
        let accept = ("accept", "text/event-stream");
        let resp = match last_event_id {
            Some(id) => self.send("GET", session, &[accept, ("last-event-id", id)], b"").await?,
            None => self.send("GET", session, &[accept], b"").await?,
        };
        match resp.status {
            200..=299 if resp.is_sse() => {
                Ok(EventStream::new(self.clone(), session.clone(), resp.body, Resume::Yes))
            }
            404 => Err(SendError::SessionGone),
            200..=299 => Err(SendError::Invalid("content type")),
            s => Err(SendError::Status(s)),
        }
    }

    /// Ends a session upstream; failures are ignored (the session idles out there).
    pub async fn delete(&self, session: &SessionWire) {
        if session.id.is_none() {
            return;
        }
        if let Ok(resp) = self.send("DELETE", session, &[("accept", ACCEPT_BOTH)], b"").await {
            let _ = self.read_body(resp.body).await;
        }
    }
}

pub(crate) fn rustls_config() -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth()
}

/// `{"jsonrpc":"2.0","id":N,"result":{…}}` with no `error` or `method`: the
/// id and the result's text. Anything else is read as a [`Value`].
fn plain_result(body: &[u8]) -> Option<(u64, Box<RawValue>)> {
    #[derive(serde::Deserialize)]
    struct Plain<'a> {
        id: Option<u64>,
        #[serde(borrow)]
        result: Option<&'a RawValue>,
        error: Option<IgnoredAny>,
        method: Option<IgnoredAny>,
    }
    let p: Plain<'_> = serde_json::from_slice(body).ok()?;
    match (p.id, p.result, p.error, p.method) {
        (Some(id), Some(r), None, None) if r.get().starts_with('{') => Some((id, r.to_owned())),
        _ => None,
    }
}

/// A 2026 request's headers: version, method, name (already encoded), and
/// the tool's `Mcp-Param-*`.
pub fn stateless_headers<'a>(request: &Stateless<'a>) -> Vec<(&'a str, &'a str)> {
    let mut headers = vec![
        ("mcp-protocol-version", MODERN_VERSION),
        ("mcp-method", request.method),
        ("accept", ACCEPT_BOTH),
        ("content-type", "application/json"),
    ];
    if let Some(name) = request.name {
        headers.push(("mcp-name", name));
    }
    headers.extend(request.params.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    headers
}

/// The data of each event of a complete SSE text, joined across its
/// `data:` lines; events without data are left out.
pub fn sse_data(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split("\n\n").flat_map(|e| e.split("\r\n\r\n")).filter_map(|event| {
        let lines: Vec<&str> = event
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(|d| d.strip_prefix(' ').unwrap_or(d))
            .collect();
        (!lines.is_empty()).then(|| lines.join("\n"))
    })
}

const MAX_RESUMES: u32 = 5;
const MAX_RETRY: Duration = Duration::from_secs(5);

type Body = EventLimited<h1::Body>;

/// Whether a stream that breaks off is resumed (`Last-Event-ID`): a legacy
/// session's are; 2026-07-28 has no resumability.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Resume {
    Yes,
    No,
}

/// JSON-RPC messages read from an upstream SSE stream; when the upstream closes
/// the stream after having sent event ids, it is resumed with `Last-Event-ID`.
pub struct EventStream {
    transport: Transport,
    session: SessionWire,
    inner: std::pin::Pin<Box<SseStream<Body>>>,
    pending: VecDeque<Value>,
    last_event_id: Option<String>,
    retry: Duration,
    resumes: u32,
}

impl EventStream {
    fn new(transport: Transport, session: SessionWire, body: h1::Body, resume: Resume) -> EventStream {
        let limit = transport.max_response();
        EventStream {
            transport,
            session,
            inner: Box::pin(SseStream::new(EventLimited::new(body, limit))),
            pending: VecDeque::new(),
            last_event_id: None,
            retry: Duration::from_millis(1000),
            resumes: if resume == Resume::Yes { 0 } else { MAX_RESUMES },
        }
    }

    /// The id of the last SSE event read, if the stream carries ids.
    pub fn last_event_id(&self) -> Option<&str> {
        self.last_event_id.as_deref()
    }

    /// The next message, or why there is none.
    pub async fn next(&mut self) -> Result<Value, StreamEnd> {
        loop {
            if let Some(v) = self.pending.pop_front() {
                return Ok(v);
            }
            match self.inner.next().await {
                Some(Ok(event)) => self.take(event)?,
                Some(Err(sse_stream::Error::Body(e)))
                    if e.downcast_ref::<BodyError>() == Some(&BodyError::TooLarge) =>
                {
                    return Err(StreamEnd::TooLarge)
                }
                // Boxed: rare, and its request would size every waiting stream's future.
                Some(Err(sse_stream::Error::Body(_))) | None => Box::pin(self.resume()).await?,
                Some(Err(_)) => return Err(StreamEnd::Invalid),
            }
        }
    }

    fn take(&mut self, event: sse_stream::Sse) -> Result<(), StreamEnd> {
        if let Some(id) = event.id.filter(|i| !i.is_empty()) {
            self.last_event_id = Some(id);
        }
        if let Some(ms) = event.retry {
            self.retry = Duration::from_millis(ms).min(MAX_RETRY);
        }
        let Some(data) = event.data.filter(|d| !d.trim().is_empty()) else {
            return Ok(()); // priming event or keep-alive
        };
        if super::event_limit::too_many_values(data.as_bytes(), self.transport.max_response()) {
            return Err(StreamEnd::TooLarge);
        }
        match serde_json::from_str::<Value>(&data) {
            Ok(Value::Array(batch)) => self.pending.extend(batch),
            Ok(v) => self.pending.push_back(v),
            Err(_) => return Err(StreamEnd::Invalid),
        }
        Ok(())
    }

    async fn resume(&mut self) -> Result<(), StreamEnd> {
        let Some(last) = self.last_event_id.clone() else {
            return Err(StreamEnd::Closed);
        };
        while self.resumes < MAX_RESUMES {
            self.resumes += 1;
            tokio::time::sleep(self.retry).await;
            match self.transport.get_stream(&self.session, Some(&last)).await {
                Ok(s) => {
                    self.inner = s.inner;
                    return Ok(());
                }
                Err(SendError::NotSent | SendError::Timeout) => continue,
                Err(_) => break,
            }
        }
        Err(StreamEnd::Closed)
    }
}

impl Messages for EventStream {
    fn next(&mut self) -> Pending<'_, Result<Value, StreamEnd>> {
        Box::pin(EventStream::next(self))
    }

    fn resume_point(&self) -> Option<&str> {
        self.last_event_id()
    }
}

/// Legacy sessions over Streamable HTTP: a message is a POST, the session's
/// own messages its GET stream, its end a DELETE. Any replica can speak on
/// a session by its id.
impl Channel for Transport {
    fn send<'a>(
        &'a self,
        session: &'a SessionWire,
        message: &'a [u8],
    ) -> Pending<'a, Result<Sent, SendError>> {
        Box::pin(self.post(session, message))
    }

    fn send_stateless<'a>(&'a self, request: &'a Stateless<'a>) -> Pending<'a, Result<Sent, SendError>> {
        Box::pin(self.post_stateless(request))
    }

    fn messages<'a>(
        &'a self,
        session: &'a SessionWire,
        resume: Option<&'a str>,
    ) -> Pending<'a, Result<Box<dyn Messages>, SendError>> {
        Box::pin(async move { Ok(Box::new(self.get_stream(session, resume).await?) as Box<dyn Messages>) })
    }

    fn close<'a>(&'a self, session: &'a SessionWire) -> Pending<'a, ()> {
        Box::pin(self.delete(session))
    }

    fn distrust(&self) {
        Transport::distrust(self)
    }

    fn instance(&self) -> &str {
        Transport::instance(self)
    }

    fn identity(&self) -> *const () {
        Arc::as_ptr(&self.0).cast()
    }

    fn handle(&self) -> Arc<dyn Channel> {
        Arc::new(self.clone())
    }

    fn health(&self) -> &Health {
        Transport::health(self)
    }

    fn upstream(&self) -> &Upstream {
        Transport::upstream(self)
    }
}

#[cfg(test)]
mod tests {
    use super::sse_data;

    #[test]
    fn sse_data_joins_lines_and_skips_events_without_data() {
        let text = "id: 1\ndata: \n\nevent: message\ndata:{\"a\":\ndata: 1}\n\n: comment\n\nid: 2\r\ndata: x\r\n\r\n";
        let got: Vec<String> = sse_data(text).collect();
        assert_eq!(got, vec!["".to_string(), "{\"a\":\n1}".into(), "x".into()]);
    }
}
