//! How an answer reaches the client: one JSON body, or an SSE stream when there
//! is something to say before the result (progress, log messages, keep-alives).
//! The decision is made late: a call that finishes without notifications is
//! answered as plain JSON.

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::Frame;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// Every answer body: in-memory, streamed SSE, or relayed from another replica.
pub type Body = BoxBody<Bytes, BoxError>;

/// A 200 `text/event-stream` answer with `body` (not cached, not buffered
/// by a proxy in front).
pub fn sse_response(body: Body) -> Response<Body> {
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .header("x-accel-buffering", "no")
        .body(body)
        .expect("static response parts are valid")
}

/// A complete in-memory body.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).map_err(|never| match never {}).boxed()
}

/// The client went away (closed its connection or stream).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientGone;

enum State {
    Pending(oneshot::Sender<Response<Body>>),
    Streaming(mpsc::Sender<Bytes>),
    Done,
}

/// The writing end of one client answer; the handler holds the receiving end.
pub struct Reply {
    state: State,
    accepts_sse: bool,
}

/// SSE events buffered towards a slow client before the call waits for it.
const SSE_BUFFER: usize = 32;

impl Reply {
    pub fn new(accepts_sse: bool) -> (Reply, oneshot::Receiver<Response<Body>>) {
        let (tx, rx) = oneshot::channel();
        (Reply { state: State::Pending(tx), accepts_sse }, rx)
    }

    pub fn is_streaming(&self) -> bool {
        matches!(self.state, State::Streaming(_))
    }

    fn start_stream(&mut self) -> Result<(), ClientGone> {
        let State::Pending(_) = self.state else {
            return Ok(());
        };
        let State::Pending(tx) = std::mem::replace(&mut self.state, State::Done) else { unreachable!() };
        let (stx, srx) = mpsc::channel::<Bytes>(SSE_BUFFER);
        let stream = futures_util::stream::unfold(srx, |mut rx| async move {
            rx.recv().await.map(|b| (Ok::<_, BoxError>(Frame::data(b)), rx))
        });
        let resp = sse_response(StreamBody::new(stream).boxed());
        tx.send(resp).map_err(|_| ClientGone)?;
        self.state = State::Streaming(stx);
        Ok(())
    }

    async fn write(&mut self, bytes: Bytes) -> Result<(), ClientGone> {
        match &self.state {
            State::Streaming(tx) => tx.send(bytes).await.map_err(|_| ClientGone),
            _ => Err(ClientGone),
        }
    }

    /// Sends a notification before the result, switching to SSE if needed.
    pub async fn event(&mut self, message: &Value) -> Result<(), ClientGone> {
        self.start_stream()?;
        self.write(sse_event(message)).await
    }

    /// A keep-alive comment; starts the stream if the client accepts SSE.
    pub async fn keepalive(&mut self) -> Result<(), ClientGone> {
        if !self.accepts_sse && !self.is_streaming() {
            return Ok(());
        }
        self.start_stream()?;
        self.write(Bytes::from_static(b": keep-alive\n\n")).await
    }

    /// The final message: the JSON body with `status`, or the last SSE event.
    pub async fn finish(self, status: StatusCode, message: &Value) {
        self.finish_raw(status, serde_json::to_vec(message).expect("Value serialises")).await
    }

    /// [`Reply::finish`] with the message already serialised.
    pub async fn finish_raw(mut self, status: StatusCode, message: Vec<u8>) {
        match std::mem::replace(&mut self.state, State::Done) {
            State::Pending(tx) => {
                let _ = tx.send(json_bytes_response(status, message));
            }
            State::Streaming(tx) => {
                let _ = tx.send(sse_event_bytes(&message)).await;
            }
            State::Done => {}
        }
    }

    /// Hands over a complete response made elsewhere (a retry answered by the
    /// replica that owns its flow). Only before anything was streamed.
    pub fn relay(mut self, response: Response<Body>) -> Result<(), ClientGone> {
        match std::mem::replace(&mut self.state, State::Done) {
            State::Pending(tx) => tx.send(response).map_err(|_| ClientGone),
            _ => Err(ClientGone),
        }
    }

    /// Resolves when the client has gone away.
    pub async fn closed(&mut self) {
        match &mut self.state {
            State::Pending(tx) => tx.closed().await,
            State::Streaming(tx) => tx.closed().await,
            State::Done => std::future::pending().await,
        }
    }
}

pub fn sse_event(message: &Value) -> Bytes {
    sse_event_bytes(&serde_json::to_vec(message).expect("Value serialises"))
}

fn sse_event_bytes(message: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(message.len() + 24);
    out.extend_from_slice(b"event: message\ndata: ");
    out.extend_from_slice(message);
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

/// Seconds an overloaded gateway asks clients to wait before retrying.
const RETRY_AFTER_SECONDS: &str = "1";

/// A JSON answer; 503 and 429 always say when to retry.
pub fn json_response(status: StatusCode, message: &Value) -> Response<Body> {
    json_bytes_response(status, serde_json::to_vec(message).expect("Value serialises"))
}

fn json_bytes_response(status: StatusCode, body: Vec<u8>) -> Response<Body> {
    let mut resp = Response::new(full(body));
    *resp.status_mut() = status;
    let headers = resp.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if matches!(status, StatusCode::SERVICE_UNAVAILABLE | StatusCode::TOO_MANY_REQUESTS) {
        headers.insert(header::RETRY_AFTER, HeaderValue::from_static(RETRY_AFTER_SECONDS));
    }
    resp
}

/// The JSON-RPC error answer for `err`, echoing `id` (null when unknown),
/// with the `Retry-After` the error asks for.
pub fn error(id: Option<&Value>, err: &crate::error::Error) -> Response<Body> {
    let body = crate::error::error_body(id, err, crate::versions::SUPPORTED);
    let mut resp = json_response(err.status(), &body);
    if let Some(seconds) = err.retry_after() {
        resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    }
    resp
}

pub fn empty(status: StatusCode) -> Response<Body> {
    let mut resp = Response::new(full(Bytes::new()));
    *resp.status_mut() = status;
    resp
}

pub fn text(status: StatusCode, content_type: &'static str, body: String) -> Response<Body> {
    let mut resp = Response::new(full(body));
    *resp.status_mut() = status;
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}
