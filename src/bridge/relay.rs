//! An upstream SSE answer relayed to the client event by event (the legacy
//! relay and the modern pass-through): ids, event names and `retry`
//! untouched, so a legacy client can resume with `Last-Event-ID` through any
//! replica; a cell may rewrite an event's data (the pass-through seals a
//! modern upstream's `requestState`). Each event is held to the upstream
//! size limit and its data must be JSON (a JSON-RPC message or a batch);
//! anything else ends the stream with a gateway error event instead. The
//! gateway adds keep-alive comments while the upstream is quiet, and ends
//! the stream at its deadline or when it is told to stop (draining).

use std::any::Any;
use std::pin::Pin;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use futures_util::StreamExt;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use serde_json::Value;
use sse_stream::{Sse, SseStream};
use tokio_util::sync::CancellationToken;

use crate::error::{error_body, Error};
use crate::front::SUPPORTED_VERSIONS;
use crate::reply::{Body, BoxError};
use crate::upstream::answers::{judge, Verdict};
use crate::upstream::event_limit::{BodyError, EventLimited};
use crate::upstream::{h1, Transport};

pub struct Relay {
    events: Pin<Box<SseStream<EventLimited<h1::Body>>>>,
    pub keepalive: Duration,
    /// Ends the stream with a timeout error (a POST's call timeout).
    pub deadline: Option<tokio::time::Instant>,
    /// Ends the stream quietly when the upstream sent nothing for this long.
    pub quiet_limit: Option<Duration>,
    /// Ends the stream quietly (draining, for a GET stream; shutdown).
    pub stop: CancellationToken,
    /// The request id an error event answers (a single POSTed request).
    pub id: Option<Value>,
    /// Whatever must live as long as the stream (permits, budget shares).
    _hold: Box<dyn Any + Send + Sync>,
    /// Rewrites an event's JSON data; `None` keeps it as it is.
    pub rewrite: Option<Rewrite>,
    /// The requests this stream answers (a POST's): a response to any
    /// other ends it with an error ([`crate::upstream::answers`]).
    pub answering: Option<Answering>,
    /// Time since the upstream last sent an event.
    quiet: Duration,
}

/// The ids of the requests a stream answers, and their upstream.
pub struct Answering {
    pub ids: Vec<Value>,
    pub upstream: Transport,
}

/// An event data rewrite: the new data (empty: the event is dropped, a
/// comment line goes instead), `None` to keep the event as it is, or `Err`
/// when the event cannot be read (the stream ends with an error).
pub type Rewrite = Box<dyn Fn(&str) -> Result<Option<String>, ()> + Send + Sync>;

impl Relay {
    /// Relays the SSE `body` (each event at most `limit` bytes) until it
    /// ends or `stop` fires, with keep-alives; `hold` lives as long as the
    /// stream. Deadline, quiet limit, error id and rewrite are set after.
    pub fn new(
        body: h1::Body,
        limit: usize,
        keepalive: Duration,
        stop: CancellationToken,
        hold: Box<dyn Any + Send + Sync>,
    ) -> Relay {
        Relay {
            events: Self::events(body, limit),
            keepalive,
            deadline: None,
            quiet_limit: None,
            stop,
            id: None,
            _hold: hold,
            rewrite: None,
            answering: None,
            quiet: Duration::ZERO,
        }
    }

    /// An SSE body read as events, each at most `limit` bytes.
    pub fn events(body: h1::Body, limit: usize) -> Pin<Box<SseStream<EventLimited<h1::Body>>>> {
        Box::pin(SseStream::new(EventLimited::new(body, limit)))
    }

    /// The client's answer: 200 `text/event-stream` carrying the relayed events.
    pub fn response(self, session: Option<HeaderValue>) -> Response<Body> {
        let stream = futures_util::stream::unfold(Some(self), |state| async move {
            let mut relay = state?;
            match relay.next().await {
                Next::Event(bytes) => Some((Ok::<_, BoxError>(Frame::data(bytes)), Some(relay))),
                Next::Last(bytes) => Some((Ok(Frame::data(bytes)), None)),
                Next::End => None,
            }
        });
        let mut resp = Response::new(BodyExt::boxed(StreamBody::new(stream)));
        *resp.status_mut() = StatusCode::OK;
        let h = resp.headers_mut();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        h.insert("x-accel-buffering", HeaderValue::from_static("no"));
        if let Some(session) = session {
            h.insert(crate::front::headers::SESSION_ID, session);
        }
        resp
    }

    async fn next(&mut self) -> Next {
        enum Woke {
            Stop,
            Deadline,
            Quiet,
            Event(Option<Result<Sse, sse_stream::Error>>),
        }
        let at = self.deadline;
        let deadline = async move {
            match at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let woke = tokio::select! {
            _ = self.stop.cancelled() => Woke::Stop,
            _ = deadline => Woke::Deadline,
            _ = tokio::time::sleep(self.keepalive) => Woke::Quiet,
            event = self.events.next() => Woke::Event(event),
        };
        match woke {
            Woke::Stop => Next::End,
            Woke::Deadline => self.fail(&Error::UpstreamTimeout),
            Woke::Quiet => {
                self.quiet += self.keepalive;
                if self.quiet_limit.is_some_and(|limit| self.quiet >= limit) {
                    return Next::End;
                }
                Next::Event(Bytes::from_static(b": keep-alive\n\n"))
            }
            Woke::Event(Some(Ok(mut event))) => {
                self.quiet = Duration::ZERO;
                if let (Some(rewrite), Some(data)) = (&self.rewrite, &event.data) {
                    match rewrite(data) {
                        Ok(Some(new)) if new.is_empty() => return Next::Event(Bytes::from_static(b":\n\n")),
                        Ok(Some(new)) => event.data = Some(new),
                        Ok(None) => {}
                        Err(()) if data.trim().is_empty() => {}
                        Err(()) => {
                            return self.fail(&Error::UpstreamInvalid("event is not a JSON-RPC message"))
                        }
                    }
                }
                self.encoded(&event)
            }
            Woke::Event(Some(Err(sse_stream::Error::Body(e))))
                if e.downcast_ref::<BodyError>() == Some(&BodyError::TooLarge) =>
            {
                self.fail(&Error::UpstreamTooLarge)
            }
            Woke::Event(Some(Err(sse_stream::Error::Body(_))) | None) => Next::End,
            Woke::Event(Some(Err(_))) => self.fail(&Error::UpstreamInvalid("invalid event stream")),
        }
    }

    fn encoded(&self, event: &Sse) -> Next {
        let (ids, upstream) = match &self.answering {
            Some(a) => (&a.ids[..], Some(&a.upstream)),
            None => (&[][..], None),
        };
        match encode(event, ids, upstream) {
            Ok(bytes) => Next::Event(bytes),
            Err(e) => self.fail(&e),
        }
    }

    fn fail(&self, err: &Error) -> Next {
        crate::log_limited!(tracing::Level::WARN, reason = err.reason(), "relayed stream ended");
        let body =
            serde_json::to_vec(&error_body(self.id.as_ref(), err, SUPPORTED_VERSIONS)).expect("serialises");
        let mut out = BytesMut::with_capacity(body.len() + 24);
        out.put_slice(b"event: message\ndata: ");
        out.put_slice(&body);
        out.put_slice(b"\n\n");
        Next::Last(out.freeze())
    }
}

enum Next {
    Event(Bytes),
    /// The last bytes of the stream.
    Last(Bytes),
    End,
}

/// One event as SSE text; an error when its data is not JSON, or is a
/// response to none of the requests `sent` (when any are given: then the
/// upstream that sent it is distrusted).
pub fn encode(event: &Sse, sent: &[Value], upstream: Option<&Transport>) -> Result<Bytes, Error> {
    let data = event.data.as_deref().unwrap_or("");
    if !data.trim().is_empty() {
        match judge(data.as_bytes(), sent) {
            Verdict::Fine => {}
            Verdict::NotJson => return Err(Error::UpstreamInvalid("event is not JSON")),
            Verdict::Foreign => {
                if let Some(upstream) = upstream {
                    upstream.distrust();
                }
                return Err(Error::UpstreamInvalid("an answer to another request"));
            }
        }
    }
    let mut out = BytesMut::with_capacity(data.len() + 64);
    // The parser has split lines: no field below holds a line break.
    if let Some(id) = &event.id {
        out.put_slice(b"id: ");
        out.put_slice(id.as_bytes());
        out.put_u8(b'\n');
    }
    if let Some(name) = &event.event {
        out.put_slice(b"event: ");
        out.put_slice(name.as_bytes());
        out.put_u8(b'\n');
    }
    if let Some(retry) = event.retry {
        out.put_slice(format!("retry: {retry}\n").as_bytes());
    }
    for line in data.split('\n') {
        out.put_slice(b"data: ");
        out.put_slice(line.as_bytes());
        out.put_u8(b'\n');
    }
    out.put_u8(b'\n');
    Ok(out.freeze())
}

/// A complete answer to relay: JSON, or SSE text already encoded; `session`
/// is the gateway's session id for a legacy client.
pub fn answer(status: StatusCode, body: Bytes, sse: bool, session: Option<HeaderValue>) -> Response<Body> {
    let mut resp = Response::new(crate::reply::full(body));
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    let ct = if sse { "text/event-stream" } else { "application/json" };
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(ct));
    if let Some(session) = session {
        h.insert(crate::front::headers::SESSION_ID, session);
    }
    resp
}

pub use crate::upstream::answers::is_json_message;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_keep_their_fields_and_lose_nothing() {
        let ev = Sse {
            event: Some("message".into()),
            data: Some("{\"a\":1}".into()),
            id: Some("7_1".into()),
            retry: Some(500),
        };
        assert_eq!(
            encode(&ev, &[], None).unwrap(),
            &b"id: 7_1\nevent: message\nretry: 500\ndata: {\"a\":1}\n\n"[..]
        );
        let priming = Sse { event: None, data: Some(String::new()), id: Some("p".into()), retry: None };
        assert_eq!(encode(&priming, &[], None).unwrap(), &b"id: p\ndata: \n\n"[..]);
        let multi = Sse { event: None, data: Some("{\n\"a\":1}".into()), id: None, retry: None };
        assert_eq!(encode(&multi, &[], None).unwrap(), &b"data: {\ndata: \"a\":1}\n\n"[..]);
    }

    #[test]
    fn data_that_is_not_a_json_message_is_refused() {
        for bad in ["<html>", "42", "\"s\"", "{", "{\"a\":1} x"] {
            let ev = Sse { event: None, data: Some(bad.into()), id: None, retry: None };
            assert!(encode(&ev, &[], None).is_err(), "{bad}");
        }
        assert!(is_json_message(b" [{\"jsonrpc\":\"2.0\"}]"));
    }
}
