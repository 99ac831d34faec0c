//! JSON-RPC 2.0 framing: the flat incoming envelope, response builders that
//! splice the request id in without re-serialising it, and the SSE body/sink
//! that carries server messages on a POST or GET stream.

use std::borrow::Cow;
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::{Either, Full};
use hyper::body::{Body, Frame};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;
use tokio::sync::mpsc;

pub(super) const PARSE_ERROR: i64 = -32700;
pub(super) const INVALID_REQUEST: i64 = -32600;
pub(super) const METHOD_NOT_FOUND: i64 = -32601;
pub(super) const INVALID_PARAMS: i64 = -32602;
/// Legacy "resource not found", kept on purpose so the gateway has to map it.
pub(super) const RESOURCE_NOT_FOUND: i64 = -32002;
/// Implementation-defined codes used by the reference SDKs for session errors.
pub(super) const BAD_SESSION_REQUEST: i64 = -32000;
pub(super) const SESSION_NOT_FOUND: i64 = -32001;

/// The response body: a whole JSON document, or an SSE stream.
pub(super) type DemoBody = Either<Full<Bytes>, SseBody>;

/// One JSON-RPC message as posted by the client, params and ids left raw.
#[derive(Deserialize)]
pub(super) struct Message<'a> {
    #[serde(borrow, default)]
    pub id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub method: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub params: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub result: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub error: Option<&'a RawValue>,
}

/// What an incoming message is, once its fields have been looked at.
pub(super) enum Kind<'m> {
    Request { id: &'m RawValue, method: &'m str },
    Notification { method: &'m str },
    Response { id: &'m RawValue },
    Invalid,
}

impl<'a> Message<'a> {
    pub(super) fn kind(&self) -> Kind<'_> {
        match (self.id, self.method.as_deref()) {
            (Some(id), Some(method)) => Kind::Request { id, method },
            (None, Some(method)) => Kind::Notification { method },
            (Some(id), None) if self.result.is_some() || self.error.is_some() => Kind::Response { id },
            _ => Kind::Invalid,
        }
    }

    /// Deserialises the params (absent params read as JSON `null`).
    pub(super) fn params_as<T: Deserialize<'a>>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_str(self.params.map_or("null", RawValue::get))
    }
}

/// A JSON-RPC error ready to be framed around a request id.
#[derive(Debug)]
pub(super) struct RpcError {
    pub code: i64,
    pub message: Cow<'static, str>,
    pub data: Option<Value>,
}

impl RpcError {
    pub(super) fn new(code: i64, message: impl Into<Cow<'static, str>>) -> Self {
        Self { code, message: message.into(), data: None }
    }

    pub(super) fn invalid_params(message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(INVALID_PARAMS, message)
    }

    pub(super) fn with_data(mut self, data: Value) -> Self {
        self.data = Some(data);
        self
    }
}

const NULL_ID: &str = "null";

/// `{"jsonrpc":"2.0","id":<id>,"result":<result>}` without re-parsing the id.
pub(super) fn result_bytes(id: &RawValue, result: &impl serde::Serialize) -> Vec<u8> {
    let mut out = Vec::with_capacity(128);
    out.extend_from_slice(br#"{"jsonrpc":"2.0","id":"#);
    out.extend_from_slice(id.get().as_bytes());
    out.extend_from_slice(br#","result":"#);
    // Writing a serde_json::Value (or our own derive types) into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut out, result);
    out.push(b'}');
    out
}

/// The error envelope; `id` is `None` when the request's id is unknown.
pub(super) fn error_bytes(id: Option<&RawValue>, err: &RpcError) -> Vec<u8> {
    let mut body = serde_json::json!({ "code": err.code, "message": err.message });
    if let Some(data) = &err.data {
        body["data"] = data.clone();
    }
    let mut out = Vec::with_capacity(128);
    out.extend_from_slice(br#"{"jsonrpc":"2.0","id":"#);
    out.extend_from_slice(id.map_or(NULL_ID, RawValue::get).as_bytes());
    out.extend_from_slice(br#","error":"#);
    let _ = serde_json::to_writer(&mut out, &body);
    out.push(b'}');
    out
}

/// A notification or server-initiated request, serialised whole.
pub(super) fn message_bytes(message: &Value) -> Vec<u8> {
    serde_json::to_vec(message).unwrap_or_default()
}

/// A request id in a canonical textual form, for matching `requestId`s.
pub(super) fn canonical_id(id: &RawValue) -> String {
    serde_json::from_str::<Value>(id.get()).map(|v| v.to_string()).unwrap_or_else(|_| id.get().to_owned())
}

/// An SSE response body fed by a channel; dropping it tells the producer the
/// client has gone (`Sink::closed`).
pub(super) struct SseBody {
    rx: mpsc::Receiver<Bytes>,
}

impl Body for SseBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.rx.poll_recv(cx).map(|chunk| chunk.map(|b| Ok(Frame::data(b))))
    }
}

/// The producing end of an SSE stream. Event ids are `<stream>-<seq>`, unique
/// within a session because each stream gets its own number; a 2026-07-28
/// stream has none (no resumability).
pub(super) struct Sink {
    tx: mpsc::Sender<Bytes>,
    stream: u64,
    seq: u64,
    ids: bool,
}

/// Opens a stream numbered `stream`; returns the producer and the body.
pub(super) fn sse_channel(stream: u64) -> (Sink, SseBody) {
    let (tx, rx) = mpsc::channel(16);
    (Sink { tx, stream, seq: 0, ids: true }, SseBody { rx })
}

/// Opens a stream whose events carry no `id:` (2026-07-28).
pub(super) fn sse_channel_without_ids() -> (Sink, SseBody) {
    let (tx, rx) = mpsc::channel(16);
    (Sink { tx, stream: 0, seq: 0, ids: false }, SseBody { rx })
}

impl Sink {
    /// Sends one `data:` event; false once the client has gone.
    pub(super) async fn event(&mut self, json: &[u8]) -> bool {
        self.seq += 1;
        let mut out = Vec::with_capacity(json.len() + 32);
        if self.ids {
            out.extend_from_slice(format!("id: {}-{}\ndata: ", self.stream, self.seq).as_bytes());
        } else {
            out.extend_from_slice(b"data: ");
        }
        out.extend_from_slice(json);
        out.extend_from_slice(b"\n\n");
        self.tx.send(Bytes::from(out)).await.is_ok()
    }

    /// Sends an SSE comment line (keep-alive); false once the client has gone.
    pub(super) async fn comment(&mut self, text: &'static str) -> bool {
        self.tx.send(Bytes::from_static(text.as_bytes())).await.is_ok()
    }

    /// This stream's number within its session.
    pub(super) fn stream(&self) -> u64 {
        self.stream
    }

    /// A handle that resolves when the client drops the stream.
    pub(super) fn watcher(&self) -> mpsc::Sender<Bytes> {
        self.tx.clone()
    }
}
