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
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use futures_util::Stream;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Frame;
use serde_json::Value;
use sse_stream::{Sse, SseStream};
use tokio::time::Sleep;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

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
        let mut resp = crate::reply::sse_response(BodyExt::boxed(RelayBody::new(self)));
        if let Some(session) = session {
            resp.headers_mut().insert(crate::front::headers::SESSION_ID, session);
        }
        resp
    }

    /// What the timer's firing means: the deadline passed, or the upstream
    /// was quiet for a keep-alive interval.
    fn timed_out(&mut self, deadline: bool) -> Next {
        if deadline {
            return self.fail(&Error::UpstreamTimeout);
        }
        self.quiet += self.keepalive;
        if self.quiet_limit.is_some_and(|limit| self.quiet >= limit) {
            return Next::End;
        }
        Next::Event(Bytes::from_static(b": keep-alive\n\n"))
    }

    /// An event from the upstream (or its end), as what the client gets.
    fn on_event(&mut self, event: Option<Result<Sse, sse_stream::Error>>) -> Next {
        match event {
            Some(Ok(mut event)) => {
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
            Some(Err(sse_stream::Error::Body(e)))
                if e.downcast_ref::<BodyError>() == Some(&BodyError::TooLarge) =>
            {
                self.fail(&Error::UpstreamTooLarge)
            }
            Some(Err(sse_stream::Error::Body(_))) | None => Next::End,
            Some(Err(_)) => self.fail(&Error::UpstreamInvalid("invalid event stream")),
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

/// A [`Relay`] as the answer's body, polled by hyper itself: the relay, the
/// stop signal's future and one timer (the keep-alive's, or the deadline's
/// when that comes first), each held once for the stream's life. The relay
/// (with the upstream connection and what it holds) goes as soon as the
/// last bytes are out.
struct RelayBody {
    relay: Option<Relay>,
    stopped: Pin<Box<WaitForCancellationFutureOwned>>,
    timer: Pin<Box<Sleep>>,
    /// The timer is the deadline's, not a keep-alive's.
    timer_is_deadline: bool,
    /// The timer starts again at the next poll: a frame was just given out.
    rearm: bool,
}

impl RelayBody {
    fn new(relay: Relay) -> RelayBody {
        RelayBody {
            stopped: Box::pin(relay.stop.clone().cancelled_owned()),
            timer: Box::pin(tokio::time::sleep(relay.keepalive)),
            timer_is_deadline: false,
            rearm: true,
            relay: Some(relay),
        }
    }

    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Next> {
        let Some(relay) = self.relay.as_mut() else {
            return Poll::Ready(Next::End);
        };
        if std::mem::take(&mut self.rearm) {
            // A keep-alive interval from now, or the deadline when that comes first.
            let quiet_at = tokio::time::Instant::now() + relay.keepalive;
            let (at, deadline) = match relay.deadline {
                Some(deadline) if deadline <= quiet_at => (deadline, true),
                _ => (quiet_at, false),
            };
            self.timer.as_mut().reset(at);
            self.timer_is_deadline = deadline;
        }
        if self.stopped.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Next::End);
        }
        if let Poll::Ready(event) = relay.events.as_mut().poll_next(cx) {
            return Poll::Ready(relay.on_event(event));
        }
        ready!(self.timer.as_mut().poll(cx));
        Poll::Ready(relay.timed_out(self.timer_is_deadline))
    }
}

impl hyper::body::Body for RelayBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let next = ready!(this.poll_next(cx));
        this.rearm = true;
        let frame = match next {
            Next::Event(bytes) => return Poll::Ready(Some(Ok(Frame::data(bytes)))),
            Next::Last(bytes) => Some(Ok(Frame::data(bytes))),
            Next::End => None,
        };
        this.relay = None;
        Poll::Ready(frame)
    }
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
