//! HTTP to one legacy upstream: POST a message on a session, open or resume
//! its GET stream, DELETE it. Answers come back as JSON or as a stream of
//! JSON-RPC messages read from SSE (priming events, ids, `retry`, resumption).

use std::collections::VecDeque;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use http::{header, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use sse_stream::SseStream;

use super::event_limit::{BodyError, EventLimited};
use crate::config::Upstream;
use crate::metrics::{Metrics, UpstreamLabels};

type Https = hyper_rustls::HttpsConnector<HttpConnector>;
type HttpClient = Client<Https, Full<Bytes>>;

/// How a POST went wrong, in the terms the caller decides on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PostError {
    /// The connection failed before the request was sent: safe to resend.
    NotSent,
    /// 404 on a session: the upstream did not process the request.
    SessionGone,
    /// No answer started within the response timeout.
    Timeout,
    /// The request may have reached the upstream, but its answer broke.
    Broken,
    /// An HTTP error status without a JSON-RPC body.
    Status(u16),
    Invalid(&'static str),
    TooLarge,
}

/// The upstream's answer to a POST.
pub enum Reply {
    /// 202: a notification or response was taken.
    Accepted,
    /// A single JSON message (possibly a JSON-RPC error on an HTTP error status).
    Json(Value),
    /// An SSE stream of messages.
    Stream(Box<EventStream>),
}

/// The upstream session a request belongs to, as sent on the wire.
#[derive(Debug, Clone, Default)]
pub struct SessionWire {
    pub id: Option<String>,
    /// The negotiated version; `None` before `initialize` has answered.
    pub version: Option<String>,
}

#[derive(Clone)]
pub struct Transport {
    http: HttpClient,
    pub upstream: Upstream,
    max_response: usize,
    metrics: Metrics,
    route: String,
}

impl Transport {
    pub fn new(upstream: Upstream, max_response: usize, metrics: Metrics, route: String) -> Transport {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(upstream.connect_timeout));
        http.set_nodelay(true);
        let tls = rustls_config();
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let http = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .pool_max_idle_per_host(256)
            .build(https);
        Transport { http, upstream, max_response, metrics, route }
    }

    fn request(&self, method: Method, session: &SessionWire) -> http::request::Builder {
        let mut b = Request::builder()
            .method(method)
            .uri(self.upstream.url.clone())
            .header(header::ACCEPT, "application/json, text/event-stream");
        if let Some(id) = &session.id {
            b = b.header("mcp-session-id", id.as_str());
        }
        if let Some(v) = &session.version {
            if v.as_str() != "2025-03-26" {
                b = b.header("mcp-protocol-version", v.as_str());
            }
        }
        b
    }

    fn count(&self, status: &'static str) {
        self.metrics
            .upstream_requests
            .get_or_create(&UpstreamLabels { route: self.route.clone(), status })
            .inc();
    }

    async fn send(&self, req: Request<Full<Bytes>>) -> Result<http::Response<Incoming>, PostError> {
        match tokio::time::timeout(self.upstream.response_timeout, self.http.request(req)).await {
            Err(_) => {
                self.count("timeout");
                Err(PostError::Timeout)
            }
            Ok(Err(e)) if e.is_connect() => {
                self.count("connect_error");
                Err(PostError::NotSent)
            }
            Ok(Err(_)) => {
                self.count("broken");
                Err(PostError::Broken)
            }
            Ok(Ok(resp)) => {
                self.count(status_class(resp.status()));
                Ok(resp)
            }
        }
    }

    /// POSTs one JSON-RPC message on `session`.
    pub async fn post(
        &self,
        session: &SessionWire,
        body: &Value,
    ) -> Result<(Reply, Option<String>), PostError> {
        let bytes = Bytes::from(serde_json::to_vec(body).map_err(|_| PostError::Invalid("encode"))?);
        let req = self
            .request(Method::POST, session)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(bytes))
            .map_err(|_| PostError::Invalid("request"))?;
        let resp = self.send(req).await?;
        let session_id =
            resp.headers().get("mcp-session-id").and_then(|v| v.to_str().ok()).map(str::to_string);
        let reply = self.reply(resp, session).await?;
        Ok((reply, session_id))
    }

    async fn reply(&self, resp: http::Response<Incoming>, session: &SessionWire) -> Result<Reply, PostError> {
        let status = resp.status();
        if status == StatusCode::ACCEPTED {
            return Ok(Reply::Accepted);
        }
        if status == StatusCode::NOT_FOUND && session.id.is_some() {
            return Err(PostError::SessionGone);
        }
        let is_sse = content_type(&resp).starts_with("text/event-stream");
        if status.is_success() && is_sse {
            return Ok(Reply::Stream(Box::new(EventStream::new(
                self.clone(),
                session.clone(),
                resp.into_body(),
            ))));
        }
        let is_json = content_type(&resp).starts_with("application/json");
        if !is_json {
            return Err(if status.is_success() {
                PostError::Invalid("content type")
            } else {
                PostError::Status(status.as_u16())
            });
        }
        let body = self.read_limited(resp.into_body()).await?;
        match serde_json::from_slice::<Value>(&body) {
            Ok(v) if status.is_success() || v.get("error").is_some() => Ok(Reply::Json(v)),
            Ok(_) => Err(PostError::Status(status.as_u16())),
            Err(_) if status.is_success() => Err(PostError::Invalid("json")),
            Err(_) => Err(PostError::Status(status.as_u16())),
        }
    }

    async fn read_limited(&self, body: Incoming) -> Result<Bytes, PostError> {
        let limited = Limited::new(body, self.max_response);
        match tokio::time::timeout(self.upstream.response_timeout, limited.collect()).await {
            Err(_) => Err(PostError::Timeout),
            Ok(Ok(c)) => Ok(c.to_bytes()),
            Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(PostError::TooLarge),
            Ok(Err(_)) => Err(PostError::Broken),
        }
    }

    /// Opens the session's standalone GET stream, or resumes a stream after `last_event_id`.
    pub async fn get_stream(
        &self,
        session: &SessionWire,
        last_event_id: Option<&str>,
    ) -> Result<EventStream, PostError> {
        let mut b = self.request(Method::GET, session).header(header::ACCEPT, "text/event-stream");
        if let Some(id) = last_event_id {
            b = b.header("last-event-id", id);
        }
        let req = b.body(Full::new(Bytes::new())).map_err(|_| PostError::Invalid("request"))?;
        let resp = self.send(req).await?;
        match resp.status() {
            s if s.is_success() && content_type(&resp).starts_with("text/event-stream") => {
                Ok(EventStream::new(self.clone(), session.clone(), resp.into_body()))
            }
            StatusCode::NOT_FOUND => Err(PostError::SessionGone),
            s if s.is_success() => Err(PostError::Invalid("content type")),
            s => Err(PostError::Status(s.as_u16())),
        }
    }

    /// Ends a session upstream; failures are ignored (the session idles out there).
    pub async fn delete(&self, session: &SessionWire) {
        if session.id.is_none() {
            return;
        }
        if let Ok(req) = self.request(Method::DELETE, session).body(Full::new(Bytes::new())) {
            let _ = self.send(req).await;
        }
    }
}

fn rustls_config() -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth()
}

fn content_type(resp: &http::Response<Incoming>) -> &str {
    resp.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("")
}

fn status_class(s: StatusCode) -> &'static str {
    match s.as_u16() {
        404 => "404",
        200..=299 => "2xx",
        400..=499 => "4xx",
        _ => "5xx",
    }
}

/// Why a stream ended without the message the reader waited for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamEnd {
    /// The stream closed and could not be resumed.
    Closed,
    Invalid,
    TooLarge,
}

const MAX_RESUMES: u32 = 5;
const MAX_RETRY: Duration = Duration::from_secs(5);

type Body = EventLimited<Incoming>;

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
    fn new(transport: Transport, session: SessionWire, body: Incoming) -> EventStream {
        let limit = transport.max_response;
        EventStream {
            transport,
            session,
            inner: Box::pin(SseStream::new(EventLimited::new(body, limit))),
            pending: VecDeque::new(),
            last_event_id: None,
            retry: Duration::from_millis(1000),
            resumes: 0,
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
                Some(Err(sse_stream::Error::Body(_))) | None => self.resume().await?,
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
                Err(PostError::NotSent | PostError::Timeout) => continue,
                Err(_) => break,
            }
        }
        Err(StreamEnd::Closed)
    }
}

/// A call's POST stream, plus the session's standalone GET stream when the call
/// has the session to itself (a legacy server may ask `roots/list` there).
pub struct Streams {
    pub post: Box<EventStream>,
    pub get: Option<Box<EventStream>>,
}

impl Streams {
    /// The next message from either stream; the end of the GET stream only
    /// stops reading it.
    pub async fn next(&mut self) -> Result<Value, StreamEnd> {
        loop {
            let Some(get) = self.get.as_mut() else {
                return self.post.next().await;
            };
            tokio::select! {
                biased;
                msg = self.post.next() => return msg,
                msg = get.next() => match msg {
                    Ok(v) => return Ok(v),
                    Err(_) => self.get = None,
                },
            }
        }
    }
}
