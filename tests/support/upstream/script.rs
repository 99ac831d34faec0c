//! The fake upstream's script: what it answers to a request ([`Answer`]),
//! and the steps of an SSE stream ([`Step`]).

use std::time::Duration;

use serde_json::{json, Value};

/// What the fake answers to one JSON-RPC request.
#[derive(Clone, Debug)]
pub enum Answer {
    /// `200 application/json` with `{"result": …}` for the request's id.
    Result(Value),
    /// `200 application/json` with a JSON-RPC error for the request's id.
    Error(i64, String),
    /// [`Answer::Error`] with a `data` member.
    ErrorData(i64, String, Value),
    /// `200 text/event-stream`: the steps in order, then the stream ends.
    Sse(Vec<Step>),
    /// Any status, content type and body, as given.
    Raw { status: u16, content_type: String, body: String },
    /// A bare status with an empty body.
    Status(u16),
    /// The inner answer, after a pause (before any header is sent).
    Delayed(Duration, Box<Answer>),
}

impl Answer {
    pub fn delayed(ms: u64, inner: Answer) -> Answer {
        Answer::Delayed(Duration::from_millis(ms), Box::new(inner))
    }

    pub(super) fn status(&self) -> u16 {
        match self {
            Answer::Result(_) | Answer::Error(..) | Answer::ErrorData(..) | Answer::Sse(_) => 200,
            Answer::Raw { status, .. } | Answer::Status(status) => *status,
            Answer::Delayed(_, inner) => inner.status(),
        }
    }
}

/// One step of a scripted SSE stream.
#[derive(Clone, Debug)]
pub enum Step {
    /// An event with an id and empty data (2025-11-25 priming), with an
    /// optional `retry:` in milliseconds.
    Prime {
        id: String,
        retry_ms: Option<u64>,
    },
    /// A JSON-RPC message, with an optional SSE event id.
    Message {
        id: Option<String>,
        msg: Msg,
    },
    Sleep(Duration),
    /// Waits (up to [`WAIT`]) until the gateway POSTs the response to the
    /// server request with this JSON-RPC id.
    AwaitResponse(Value),
    /// Keeps the stream open until the reader goes away.
    Hang,
    /// Breaks the connection mid-body (no clean end of stream).
    Abort,
}

/// A message the fake writes on a stream; ids and progress tokens are taken
/// from the request the stream answers.
#[derive(Clone, Debug)]
pub enum Msg {
    Result(Value),
    Error(i64, String),
    ErrorData(i64, String, Value),
    Progress(f64),
    /// A message written as it is (notification or server request).
    Verbatim(Value),
}

impl Step {
    /// Priming event with `retry: 20` so that resumption is quick.
    pub fn prime(id: &str) -> Step {
        Step::Prime { id: id.into(), retry_ms: Some(20) }
    }
    pub fn result(result: Value) -> Step {
        Step::message(Msg::Result(result))
    }
    pub fn error(code: i64, message: &str) -> Step {
        Step::message(Msg::Error(code, message.into()))
    }
    pub fn error_data(code: i64, message: &str, data: Value) -> Step {
        Step::message(Msg::ErrorData(code, message.into(), data))
    }
    /// `notifications/progress` with the request's own progress token.
    pub fn progress(progress: f64) -> Step {
        Step::message(Msg::Progress(progress))
    }
    /// `notifications/message` at `level`.
    pub fn log(level: &str, text: &str) -> Step {
        Step::notify("notifications/message", json!({"level": level, "logger": "fake", "data": text}))
    }
    pub fn notify(method: &str, params: Value) -> Step {
        Step::message(Msg::Verbatim(json!({"jsonrpc": "2.0", "method": method, "params": params})))
    }
    /// A server-initiated request (ping, elicitation/create, …) with id `id`.
    pub fn ask(id: Value, method: &str, params: Value) -> Step {
        Step::message(Msg::Verbatim(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})))
    }
    pub fn await_response(id: Value) -> Step {
        Step::AwaitResponse(id)
    }
    pub fn sleep_ms(ms: u64) -> Step {
        Step::Sleep(Duration::from_millis(ms))
    }
    pub fn hang() -> Step {
        Step::Hang
    }
    pub fn abort() -> Step {
        Step::Abort
    }
    /// Gives a message step an SSE event id.
    pub fn with_id(self, event_id: &str) -> Step {
        match self {
            Step::Message { msg, .. } => Step::Message { id: Some(event_id.into()), msg },
            other => panic!("only messages take an event id, not {other:?}"),
        }
    }

    fn message(msg: Msg) -> Step {
        Step::Message { id: None, msg }
    }
}
