//! The `/mcp` endpoint as legacy Streamable HTTP: POST (one message, or a
//! 2025-03-26 batch), GET (the standalone SSE stream), DELETE (end the
//! session), with the status codes the legacy transport specifies.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Either, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ACCEPT, ALLOW, CACHE_CONTROL, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::value::RawValue;

use super::methods::{self, Reply, VERSIONS};
use super::rpc::{self, DemoBody, Kind, Message, RpcError};
use super::session::Session;
use super::tools::{self, Job};
use super::Server;

const SESSION_HEADER: &str = "mcp-session-id";
const VERSION_HEADER: &str = "mcp-protocol-version";
pub(super) const MAX_BODY: usize = 4 * 1024 * 1024;
/// How often the standalone GET stream sends an SSE comment.
pub(super) const KEEPALIVE: Duration = Duration::from_secs(15);

/// Routes one HTTP request.
pub(super) async fn handle(server: Arc<Server>, req: Request<Incoming>) -> Response<DemoBody> {
    if req.uri().path() != "/mcp" {
        return plain(StatusCode::NOT_FOUND, "not found: the MCP endpoint is /mcp");
    }
    if let Some(v) = req.headers().get(VERSION_HEADER) {
        if !VERSIONS.iter().any(|known| v.as_bytes() == known.as_bytes()) {
            return error(StatusCode::BAD_REQUEST, rpc::INVALID_REQUEST, "unsupported MCP-Protocol-Version");
        }
    }
    match *req.method() {
        Method::POST => post(&server, req).await,
        Method::GET => get(&server, &req),
        Method::DELETE => delete(&server, &req),
        _ => {
            let mut resp = plain(StatusCode::METHOD_NOT_ALLOWED, "method not allowed");
            resp.headers_mut().insert(ALLOW, HeaderValue::from_static("GET, POST, DELETE"));
            resp
        }
    }
}

async fn post(server: &Server, req: Request<Incoming>) -> Response<DemoBody> {
    let header = req.headers().get(SESSION_HEADER).cloned();
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            return error(StatusCode::PAYLOAD_TOO_LARGE, rpc::INVALID_REQUEST, "body too large");
        }
        Err(_) => return plain(StatusCode::BAD_REQUEST, "could not read the request body"),
    };
    let Ok(text) = std::str::from_utf8(&body) else {
        return error(StatusCode::BAD_REQUEST, rpc::PARSE_ERROR, "body is not UTF-8");
    };
    if text.trim_start().starts_with('[') {
        return post_batch(server, header.as_ref(), text);
    }
    let msg: Message<'_> = match serde_json::from_str(text) {
        Ok(msg) => msg,
        Err(e) => return unparsable(&e),
    };
    let kind = msg.kind();
    if let Kind::Request { id, method: "initialize" } = kind {
        return initialize(server, id, &msg);
    }
    if let Kind::Invalid = kind {
        return error(StatusCode::BAD_REQUEST, rpc::INVALID_REQUEST, "not a JSON-RPC message");
    }
    let session = match lookup(server, header.as_ref()) {
        Ok(session) => session,
        Err(no) => return no.respond(),
    };
    match kind {
        Kind::Request { id, method } => {
            match methods::dispatch(&server.catalog, &session, id, method, &msg) {
                Reply::Json(bytes) => json(StatusCode::OK, bytes),
                Reply::Stream(job) => stream(session, Vec::new(), vec![job]),
            }
        }
        Kind::Notification { method } => {
            methods::notify(&session, method, &msg);
            empty(StatusCode::ACCEPTED)
        }
        Kind::Response { id } => {
            methods::deliver(&session, id, &msg);
            empty(StatusCode::ACCEPTED)
        }
        Kind::Invalid => empty(StatusCode::BAD_REQUEST),
    }
}

fn initialize(server: &Server, id: &RawValue, msg: &Message<'_>) -> Response<DemoBody> {
    match methods::initialize(id, msg, &server.stop) {
        Ok((bytes, session)) => {
            let mut resp = json(StatusCode::OK, bytes);
            if let Ok(value) = HeaderValue::from_str(&session.id) {
                resp.headers_mut().insert(SESSION_HEADER, value);
            }
            server.store.insert(Arc::new(session));
            resp
        }
        Err(bytes) => json(StatusCode::OK, bytes),
    }
}

/// A 2025-03-26 batch: JSON array out if every answer is immediate,
/// otherwise one SSE stream carrying all of them.
fn post_batch(server: &Server, header: Option<&HeaderValue>, text: &str) -> Response<DemoBody> {
    let items: Vec<&RawValue> = match serde_json::from_str(text) {
        Ok(items) => items,
        Err(e) => return unparsable(&e),
    };
    if items.is_empty() {
        return error(StatusCode::BAD_REQUEST, rpc::INVALID_REQUEST, "empty batch");
    }
    let session = match lookup(server, header) {
        Ok(session) => session,
        Err(no) => return no.respond(),
    };
    if session.version != "2025-03-26" {
        return error(StatusCode::BAD_REQUEST, rpc::INVALID_REQUEST, "batches need protocol 2025-03-26");
    }
    let (mut replies, mut jobs) = (Vec::new(), Vec::new());
    for item in items {
        let Ok(msg) = serde_json::from_str::<Message<'_>>(item.get()) else {
            let err = RpcError::new(rpc::INVALID_REQUEST, "not a JSON-RPC message");
            replies.push(rpc::error_bytes(None, &err));
            continue;
        };
        match msg.kind() {
            Kind::Request { id, method: "initialize" } => {
                let err = RpcError::new(rpc::INVALID_REQUEST, "initialize cannot be batched");
                replies.push(rpc::error_bytes(Some(id), &err));
            }
            Kind::Request { id, method } => {
                match methods::dispatch(&server.catalog, &session, id, method, &msg) {
                    Reply::Json(bytes) => replies.push(bytes),
                    Reply::Stream(job) => jobs.push(job),
                }
            }
            Kind::Notification { method } => methods::notify(&session, method, &msg),
            Kind::Response { id } => methods::deliver(&session, id, &msg),
            Kind::Invalid => {
                let err = RpcError::new(rpc::INVALID_REQUEST, "not a JSON-RPC message");
                replies.push(rpc::error_bytes(None, &err));
            }
        }
    }
    match (replies.is_empty(), jobs.is_empty()) {
        (true, true) => empty(StatusCode::ACCEPTED),
        (_, true) => json(StatusCode::OK, join_array(&replies)),
        _ => stream(session, replies, jobs),
    }
}

fn join_array(items: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::with_capacity(items.iter().map(|i| i.len() + 1).sum::<usize>() + 2);
    out.push(b'[');
    for (n, item) in items.iter().enumerate() {
        if n > 0 {
            out.push(b',');
        }
        out.extend_from_slice(item);
    }
    out.push(b']');
    out
}

/// Answers on an SSE stream: ready replies first, then each job in turn.
fn stream(session: Arc<Session>, replies: Vec<Vec<u8>>, jobs: Vec<Job>) -> Response<DemoBody> {
    let (mut sink, body) = rpc::sse_channel(session.next_stream());
    tokio::spawn(async move {
        for reply in replies {
            if !sink.event(&reply).await {
                return;
            }
        }
        for job in jobs {
            tools::run_job(&session, job, &mut sink).await;
        }
    });
    sse(body)
}

fn get(server: &Server, req: &Request<Incoming>) -> Response<DemoBody> {
    let session = match lookup(server, req.headers().get(SESSION_HEADER)) {
        Ok(session) => session,
        Err(no) => return no.respond(),
    };
    if let Some(accept) = req.headers().get(ACCEPT).and_then(|a| a.to_str().ok()) {
        if !accept.contains("text/event-stream") && !accept.contains("*/*") {
            return plain(StatusCode::NOT_ACCEPTABLE, "GET needs Accept: text/event-stream");
        }
    }
    // Events are not kept: a stream cannot be resumed, and saying so beats
    // handing out a fresh standalone stream the client would wait on forever.
    if req.headers().contains_key("last-event-id") {
        return plain(StatusCode::NOT_FOUND, "this server keeps no events; streams cannot be resumed");
    }
    let stop = session.open_get_stream();
    let (mut sink, body) = rpc::sse_channel(session.next_stream());
    drop(session);
    tokio::spawn(async move {
        let watcher = sink.watcher();
        let start = tokio::time::Instant::now() + KEEPALIVE;
        let mut ticks = tokio::time::interval_at(start, KEEPALIVE);
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                () = watcher.closed() => break,
                _ = ticks.tick() => if !sink.comment(": keep-alive\n\n").await { break },
            }
        }
    });
    sse(body)
}

fn delete(server: &Server, req: &Request<Incoming>) -> Response<DemoBody> {
    match lookup(server, req.headers().get(SESSION_HEADER)) {
        Ok(session) => {
            server.store.remove(&session.id);
            empty(StatusCode::OK)
        }
        Err(no) => no.respond(),
    }
}

/// Why a request has no usable session.
enum NoSession {
    /// No `Mcp-Session-Id` header: 400.
    Missing,
    /// Unknown, deleted, evicted or expired: 404.
    Unknown,
}

impl NoSession {
    fn respond(self) -> Response<DemoBody> {
        match self {
            Self::Missing => error(
                StatusCode::BAD_REQUEST,
                rpc::BAD_SESSION_REQUEST,
                "Bad Request: Mcp-Session-Id header is required",
            ),
            Self::Unknown => error(StatusCode::NOT_FOUND, rpc::SESSION_NOT_FOUND, "Session not found"),
        }
    }
}

/// Finds the request's session.
fn lookup(server: &Server, header: Option<&HeaderValue>) -> Result<Arc<Session>, NoSession> {
    let header = header.ok_or(NoSession::Missing)?;
    let id = header.to_str().map_err(|_| NoSession::Unknown)?;
    server.store.get(id).ok_or(NoSession::Unknown)
}

pub(super) fn unparsable(e: &serde_json::Error) -> Response<DemoBody> {
    let code = match e.classify() {
        serde_json::error::Category::Data => rpc::INVALID_REQUEST,
        _ => rpc::PARSE_ERROR,
    };
    let message = if code == rpc::PARSE_ERROR { "Parse error" } else { "Invalid Request" };
    error(StatusCode::BAD_REQUEST, code, message)
}

pub(super) fn json(status: StatusCode, bytes: Vec<u8>) -> Response<DemoBody> {
    let mut resp = Response::new(Either::Left(Full::new(Bytes::from(bytes))));
    *resp.status_mut() = status;
    resp.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

fn error(status: StatusCode, code: i64, message: &'static str) -> Response<DemoBody> {
    json(status, rpc::error_bytes(None, &RpcError::new(code, message)))
}

pub(super) fn sse(body: rpc::SseBody) -> Response<DemoBody> {
    let mut resp = Response::new(Either::Right(body));
    let headers = resp.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

pub(super) fn plain(status: StatusCode, text: &'static str) -> Response<DemoBody> {
    let mut resp = Response::new(Either::Left(Full::new(Bytes::from_static(text.as_bytes()))));
    *resp.status_mut() = status;
    resp.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    resp
}

pub(super) fn empty(status: StatusCode) -> Response<DemoBody> {
    let mut resp = Response::new(Either::Left(Full::new(Bytes::new())));
    *resp.status_mut() = status;
    resp
}
