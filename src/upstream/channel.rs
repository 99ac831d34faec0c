//! What a legacy session's upstream half needs from whatever carries its
//! messages (DESIGN §10, §12): a duplex message channel. Write a message on a
//! session; get back what the server links to it (a request's response, and
//! the progress, log lines and questions that precede it); read the
//! session's own messages, linked to no request; end the session.
//!
//! HTTP ([`super::Transport`]) is one implementation: a message is a POST,
//! what it brings back is the POST's JSON or SSE answer, the session's own
//! messages are its GET stream, the end is a DELETE, and a session is named
//! by its `Mcp-Session-Id`. A spawned process's stdio is another: its
//! sessions are processes, and it links what the process writes to a message
//! by response id and progress token. Pooling, MRTR parking and forwarding
//! to the owner replica see only this trait.

use std::future::Future;
use std::pin::Pin;

use serde_json::value::RawValue;
use serde_json::Value;

use super::health::Health;
use crate::config::Upstream;
use crate::error::Error;

/// A channel operation in progress. Boxed: the trait is used as an object.
pub type Pending<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// How a message went wrong, in the terms the caller decides on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendError {
    /// The message could not be written (no connection, no process): safe to resend.
    NotSent,
    /// The server does not know the session (HTTP 404; a process that is
    /// gone): it did not process the message.
    SessionGone,
    /// No answer started within the response timeout.
    Timeout,
    /// The message may have reached the server, but its answer broke.
    Broken,
    /// A refusal without a JSON-RPC body (an HTTP error status).
    Status(u16),
    /// The server refused the credentials sent (HTTP 401 or 403): the
    /// client's own token (`client_token`) or the upstream's configured ones.
    Denied {
        status: u16,
        client_token: bool,
    },
    Invalid(&'static str),
    TooLarge,
    /// A process could not be started for the session: it did not finish
    /// `initialize` in time (`timed_out`), or exited, or could not be spawned.
    Start {
        timed_out: bool,
    },
    /// The upstream has as many processes as it may, none free within the
    /// admission wait (nothing was sent).
    Busy,
    /// The session has as many processes as the caller's share allows, all
    /// busy, none free within the admission wait (nothing was sent).
    Share,
}

impl SendError {
    /// The failure as a log field value (`outcome=not_sent`).
    pub fn as_str(self) -> &'static str {
        match self {
            SendError::NotSent => "not_sent",
            SendError::SessionGone => "session_gone",
            SendError::Timeout => "timeout",
            SendError::Broken => "broken",
            SendError::Status(_) => "error_status",
            SendError::Denied { .. } => "denied",
            SendError::Invalid(_) => "invalid",
            SendError::TooLarge => "too_large",
            SendError::Start { timed_out: true } => "start_timeout",
            SendError::Start { timed_out: false } => "start_failed",
            SendError::Busy => "busy",
            SendError::Share => "share",
        }
    }

    /// The failure in words, for logs and `check-config --probe`.
    pub fn words(self) -> String {
        match self {
            SendError::NotSent => "could not connect (see the instance's log line for why)".into(),
            SendError::SessionGone => "the session is gone".into(),
            SendError::Timeout => "no answer within response_timeout_ms".into(),
            SendError::Broken => "the connection broke during the answer".into(),
            SendError::Status(404) => "404 Not Found: is the path of the URL right?".into(),
            SendError::Status(s) => {
                match http::StatusCode::from_u16(s).ok().and_then(|c| c.canonical_reason()) {
                    Some(reason) => format!("HTTP {s} {reason}: not an MCP answer"),
                    None => format!("HTTP {s}: not an MCP answer"),
                }
            }
            SendError::Denied { status, .. } => format!("HTTP {status}: the server refused the credentials"),
            SendError::Invalid(why) => format!("an answer that is not MCP ({why})"),
            SendError::TooLarge => "an answer over the size cap".into(),
            SendError::Start { timed_out: true } => "its process did not finish initialize in time".into(),
            SendError::Start { timed_out: false } => "its process could not be started".into(),
            SendError::Busy => "as many processes as it may have, all busy".into(),
            SendError::Share => "this caller's share of processes, all busy".into(),
        }
    }
}

/// Maps a channel failure to the client-facing error. `sent`: the message
/// may have reached the server, so its outcome is unknown.
pub fn map_send_error(e: SendError, sent: bool) -> Error {
    match e {
        SendError::NotSent => Error::UpstreamUnreachable,
        SendError::Timeout => Error::UpstreamTimeout,
        SendError::Broken if sent => Error::OutcomeUnknown,
        SendError::Broken => Error::UpstreamUnreachable,
        SendError::SessionGone => Error::UpstreamInvalid("session lost"),
        SendError::Status(_) => Error::UpstreamInvalid("error status"),
        SendError::Denied { status, client_token } => Error::UpstreamDenied { status, client_token },
        SendError::Invalid(why) => Error::UpstreamInvalid(why),
        SendError::TooLarge => Error::UpstreamTooLarge,
        SendError::Start { timed_out } => Error::ProcessStart { timed_out, upstream: None },
        SendError::Busy => Error::UpstreamBusy,
        SendError::Share => Error::TooManySessions,
    }
}

/// The session a message belongs to, as the channel names it: the id the
/// server gave it (none before `initialize` has answered) and the
/// negotiated version. Sealed into flows and cursors, so that another
/// replica can speak on the session where the channel allows it.
#[derive(Debug, Clone, Default)]
pub struct SessionWire {
    pub id: Option<String>,
    /// The negotiated version; `None` before `initialize` has answered.
    pub version: Option<String>,
    /// Who the session is opened for (its principal), on the `initialize`
    /// that opens it: a channel whose sessions cost a process each counts
    /// them per caller. Not sealed anywhere.
    pub owner: Option<std::sync::Arc<str>>,
}

/// What the server links to a message.
pub enum Answer {
    /// Nothing: a notification or a response was taken.
    Accepted,
    /// One whole message (possibly a JSON-RPC error, or a 2025-03-26 batch).
    Json(Value),
    /// The common answer, a plain success response, with its result kept as
    /// JSON text: it is passed on without building a tree.
    Result { id: u64, result: Box<RawValue> },
    /// Messages in order, the response among them (or last).
    Stream(Box<dyn Messages>),
}

/// A plain result answer as a message, for readers that want the tree.
pub fn result_message(id: u64, result: &RawValue) -> Value {
    let result = serde_json::from_str::<Value>(result.get()).unwrap_or(Value::Null);
    serde_json::json!({"jsonrpc": "2.0", "id": id, "result": result})
}

/// A message sent: what came back, and the session the server named when
/// the message opened one (`initialize`).
pub struct Sent {
    pub answer: Answer,
    pub session: Option<String>,
}

/// Why a stream of messages ended without the one the reader waited for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamEnd {
    /// The stream closed and could not be resumed.
    Closed,
    Invalid,
    TooLarge,
}

/// Messages from the server, in order: those linked to one message, or a
/// session's own.
pub trait Messages: Send + Sync {
    /// The next message, or why there is none.
    fn next(&mut self) -> Pending<'_, Result<Value, StreamEnd>>;

    /// Where another reader of this session could pick the stream up
    /// ([`Channel::messages`]): HTTP's last SSE event id. `None` when the
    /// channel cannot resume a stream elsewhere.
    fn resume_point(&self) -> Option<&str>;
}

/// A 2026-07-28 request, outside any session, with what the server reads
/// beside its body: the method, the name (already encoded as a header value)
/// and the tool's `Mcp-Param-*` values. HTTP sends them as headers; a process
/// reads only the body.
pub struct Stateless<'a> {
    pub method: &'a str,
    pub name: Option<&'a str>,
    /// (`mcp-param-…` header name, value), from the tool's annotations.
    pub params: &'a [(String, String)],
    pub body: &'a [u8],
}

/// An upstream instance's message channel: a legacy server's sessions, or
/// a 2026 server's stateless requests.
pub trait Channel: Send + Sync {
    /// Writes `message` (one JSON-RPC message, serialised) on `session`; an
    /// unnamed session (no id) means `message` is the `initialize` that
    /// opens one.
    fn send<'a>(
        &'a self,
        session: &'a SessionWire,
        message: &'a [u8],
    ) -> Pending<'a, Result<Sent, SendError>>;

    /// [`Channel::send`] for a request whose server messages that name no
    /// request (questions, log lines) are its own: a channel that links
    /// only responses and progress to a request (stdio) gives it a process
    /// of the session to itself until its response. HTTP links them all
    /// (each on the POST's stream), so this is `send`.
    fn send_alone<'a>(
        &'a self,
        session: &'a SessionWire,
        message: &'a [u8],
    ) -> Pending<'a, Result<Sent, SendError>> {
        self.send(session, message)
    }

    /// Whether every message the server links to a request reaches it
    /// ([`Channel::send_alone`] is then `send`).
    fn links_all(&self) -> bool {
        true
    }

    /// Writes a 2026-07-28 request; what the server links to it.
    fn send_stateless<'a>(&'a self, request: &'a Stateless<'a>) -> Pending<'a, Result<Sent, SendError>>;

    /// The session's own messages (a server may ask `roots/list` there, and
    /// announce list changes); from `resume` on, where a stream of this
    /// session broke off (a [`Messages::resume_point`]).
    fn messages<'a>(
        &'a self,
        session: &'a SessionWire,
        resume: Option<&'a str>,
    ) -> Pending<'a, Result<Box<dyn Messages>, SendError>>;

    /// Ends `session` on the server; best effort.
    fn close<'a>(&'a self, session: &'a SessionWire) -> Pending<'a, ()>;

    /// An answer to a message that was not sent arrived: nothing already
    /// open that carried it is used again.
    fn distrust(&self);

    /// The instance's name, sealed into tokens that must come back to it.
    fn instance(&self) -> &str;

    /// Whether `other` is this very channel (not one rebuilt by a reload).
    fn same(&self, other: &dyn Channel) -> bool {
        std::ptr::addr_eq(self.identity(), other.identity())
    }

    /// What [`Channel::same`] compares: the address of the shared state.
    fn identity(&self) -> *const ();

    /// A handle to this very channel that a session can keep.
    fn handle(&self) -> std::sync::Arc<dyn Channel>;

    fn health(&self) -> &Health;

    /// The upstream's configuration (its version, its timeouts).
    fn upstream(&self) -> &Upstream;
}

/// Serialises `message` and sends it on `session`.
pub async fn post<T: serde::Serialize + ?Sized>(
    channel: &dyn Channel,
    session: &SessionWire,
    message: &T,
) -> Result<Sent, SendError> {
    let bytes = serde_json::to_vec(message).map_err(|_| SendError::Invalid("encode"))?;
    channel.send(session, &bytes).await
}

/// Runs `attempt`, once more if it was not sent while `health` says the
/// instance is up (a kept connection the server had closed, say).
pub async fn once_more<T, F, Fut>(health: &Health, attempt: F) -> Result<T, SendError>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<T, SendError>>,
{
    match attempt().await {
        Err(SendError::NotSent) if health.is_up() => attempt().await,
        other => other,
    }
}
