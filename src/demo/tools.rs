//! The demo tools. `echo`, `add`, `counter` and `fail` answer at once (echo is
//! the benchmark fast path: it borrows its text from the request body);
//! `slow` and `ask_user` become a [`Job`] that streams progress, log messages
//! or an `elicitation/create` request on the POST's SSE stream before the
//! result.

use std::borrow::Cow;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{json, Value};

use super::rpc::{self, Message, RpcError, Sink};
use super::session::{Session, INFO};

/// How long `ask_user` waits for the client's answer.
pub(super) const ANSWER_WAIT: Duration = Duration::from_secs(300);
pub(super) const MAX_STEPS: u64 = 1_000;
pub(super) const MAX_DELAY_MS: u64 = 60_000;

/// `tools/list` entries, in a fixed order.
pub(super) fn definitions() -> Value {
    let obj = |properties: Value, required: &[&str]| json!({ "type": "object", "properties": properties, "required": required });
    json!([
        { "name": "echo", "description": "Returns its text unchanged.",
          "inputSchema": obj(json!({ "text": { "type": "string" } }), &["text"]) },
        { "name": "add", "description": "Adds two integers.",
          "inputSchema": obj(json!({ "a": { "type": "integer" }, "b": { "type": "integer" } }), &["a", "b"]),
          "outputSchema": obj(json!({ "sum": { "type": "integer" } }), &["sum"]) },
        { "name": "counter", "description": "Increments and returns a per-session counter.",
          "inputSchema": obj(json!({}), &[]) },
        { "name": "slow", "description": "Takes `steps` × `delay_ms`, reporting progress and logs.",
          "inputSchema": obj(json!({
              "steps": { "type": "integer", "default": 3, "minimum": 0, "maximum": MAX_STEPS },
              "delay_ms": { "type": "integer", "default": 100, "minimum": 0, "maximum": MAX_DELAY_MS }
          }), &[]) },
        { "name": "fail", "description": "Always returns an error result.",
          "inputSchema": obj(json!({}), &[]) },
        { "name": "ask_user", "description": "Asks the user a question (form elicitation).",
          "inputSchema": obj(json!({ "question": { "type": "string" } }), &[]) },
    ])
}

#[derive(Serialize)]
struct TextContent<'t> {
    #[serde(rename = "type")]
    kind: &'static str,
    text: Cow<'t, str>,
}

/// A `CallToolResult` with one text content.
#[derive(Serialize)]
pub(super) struct ToolResult<'t> {
    content: [TextContent<'t>; 1],
    #[serde(rename = "structuredContent", skip_serializing_if = "Option::is_none")]
    structured: Option<Value>,
    #[serde(rename = "isError", skip_serializing_if = "is_false")]
    is_error: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl<'t> ToolResult<'t> {
    pub(super) fn text(text: impl Into<Cow<'t, str>>) -> Self {
        let content = [TextContent { kind: "text", text: text.into() }];
        Self { content, structured: None, is_error: false }
    }

    pub(super) fn error(text: impl Into<Cow<'t, str>>) -> Self {
        Self { is_error: true, ..Self::text(text) }
    }
}

/// A tool's answer: complete now, or a job to stream.
pub(super) enum Outcome<'t> {
    Done(ToolResult<'t>),
    Stream(JobKind),
}

/// A streamed tool call, owned so it can move into the stream's task.
pub(super) struct Job {
    pub id: Box<RawValue>,
    pub kind: JobKind,
}

pub(super) enum JobKind {
    Slow { steps: u64, delay_ms: u64, progress_token: Option<Value> },
    AskUser { question: String },
}

#[derive(Deserialize)]
struct CallParams<'a> {
    #[serde(borrow)]
    name: Cow<'a, str>,
    #[serde(borrow, default)]
    arguments: Option<&'a RawValue>,
    #[serde(rename = "_meta", default)]
    meta: Option<CallMeta>,
}

#[derive(Deserialize)]
struct CallMeta {
    #[serde(rename = "progressToken", default)]
    progress_token: Option<Value>,
}

pub(super) fn args<T: DeserializeOwned>(raw: Option<&RawValue>) -> Result<T, RpcError> {
    serde_json::from_str(raw.map_or("{}", RawValue::get))
        .map_err(|e| RpcError::invalid_params(format!("invalid arguments: {e}")))
}

/// `tools/call`.
pub(super) fn call<'m>(session: &Session, msg: &'m Message<'_>) -> Result<Outcome<'m>, RpcError> {
    let params: CallParams<'m> = msg
        .params
        .map(|p| serde_json::from_str(p.get()))
        .ok_or_else(|| RpcError::invalid_params("missing params"))?
        .map_err(|e| RpcError::invalid_params(e.to_string()))?;
    let done = match params.name.as_ref() {
        "echo" => return echo(params.arguments).map(Outcome::Done),
        "add" => add(params.arguments)?,
        "counter" => ToolResult::text(session.bump_counter().to_string()),
        "fail" => ToolResult::error("the fail tool always fails"),
        "slow" => {
            #[derive(Deserialize)]
            struct A {
                steps: Option<u64>,
                delay_ms: Option<u64>,
            }
            let a: A = args(params.arguments)?;
            let steps = a.steps.unwrap_or(3).min(MAX_STEPS);
            let delay_ms = a.delay_ms.unwrap_or(100).min(MAX_DELAY_MS);
            let progress_token = params.meta.and_then(|m| m.progress_token);
            return Ok(Outcome::Stream(JobKind::Slow { steps, delay_ms, progress_token }));
        }
        "ask_user" => {
            #[derive(Deserialize)]
            struct A {
                question: Option<String>,
            }
            let a: A = args(params.arguments)?;
            if !session.elicitation {
                let why = "elicitation is not supported: the client did not declare it at initialize";
                return Ok(Outcome::Done(ToolResult::error(why)));
            }
            let question = a.question.unwrap_or_else(|| "What is your answer?".to_owned());
            return Ok(Outcome::Stream(JobKind::AskUser { question }));
        }
        other => return Err(RpcError::invalid_params(format!("unknown tool: {other}"))),
    };
    Ok(Outcome::Done(done))
}

pub(super) fn echo(arguments: Option<&RawValue>) -> Result<ToolResult<'_>, RpcError> {
    #[derive(Deserialize)]
    struct A<'a> {
        #[serde(borrow)]
        text: Cow<'a, str>,
    }
    let raw = arguments.map_or("{}", RawValue::get);
    let a: A<'_> =
        serde_json::from_str(raw).map_err(|e| RpcError::invalid_params(format!("invalid arguments: {e}")))?;
    Ok(ToolResult::text(a.text))
}

pub(super) fn add(arguments: Option<&RawValue>) -> Result<ToolResult<'static>, RpcError> {
    #[derive(Deserialize)]
    struct A {
        a: i64,
        b: i64,
    }
    let A { a, b } = args(arguments)?;
    let sum = a.checked_add(b).ok_or_else(|| RpcError::invalid_params("sum overflows i64"))?;
    let mut result = ToolResult::text(sum.to_string());
    result.structured = Some(json!({ "sum": sum }));
    Ok(result)
}

/// Runs a streamed call to its end on `sink`, then sends its result. It stops
/// without a result when the client cancels it, the session ends, or the
/// client closes the stream.
pub(super) async fn run_job(session: &Session, job: Job, sink: &mut Sink) {
    let guard = session.track(rpc::canonical_id(&job.id), sink.stream());
    let watcher = sink.watcher();
    let result = tokio::select! {
        biased;
        () = guard.token.cancelled() => None,
        () = watcher.closed() => None,
        result = run_kind(session, &job.kind, sink) => result,
    };
    if let Some(result) = result {
        sink.event(&rpc::result_bytes(&job.id, &result)).await;
    }
}

async fn run_kind(session: &Session, kind: &JobKind, sink: &mut Sink) -> Option<ToolResult<'static>> {
    match kind {
        JobKind::Slow { steps, delay_ms, progress_token } => {
            slow(session, *steps, *delay_ms, progress_token.as_ref(), sink).await
        }
        JobKind::AskUser { question } => ask_user(session, question, sink).await,
    }
}

async fn slow(
    session: &Session,
    steps: u64,
    delay_ms: u64,
    progress_token: Option<&Value>,
    sink: &mut Sink,
) -> Option<ToolResult<'static>> {
    for step in 1..=steps {
        tokio::time::sleep(Duration::from_millis(delay_ms)).await;
        let message = format!("step {step} of {steps}");
        if let Some(token) = progress_token {
            let note = json!({ "jsonrpc": "2.0", "method": "notifications/progress", "params": {
                "progressToken": token, "progress": step, "total": steps, "message": message } });
            if !sink.event(&rpc::message_bytes(&note)).await {
                return None;
            }
        }
        if session.logs(INFO) {
            let note = json!({ "jsonrpc": "2.0", "method": "notifications/message", "params": {
                "level": "info", "logger": "slow", "data": message } });
            if !sink.event(&rpc::message_bytes(&note)).await {
                return None;
            }
        }
    }
    Some(ToolResult::text(format!("slow finished {steps} steps")))
}

async fn ask_user(session: &Session, question: &str, sink: &mut Sink) -> Option<ToolResult<'static>> {
    let (server_id, answer, _pending) = session.expect_answer();
    let request = json!({ "jsonrpc": "2.0", "id": server_id, "method": "elicitation/create",
        "params": { "mode": "form", "message": question, "requestedSchema": {
            "type": "object", "properties": { "answer": { "type": "string" } },
            "required": ["answer"] } } });
    if !sink.event(&rpc::message_bytes(&request)).await {
        return None;
    }
    match tokio::time::timeout(ANSWER_WAIT, answer).await {
        Err(_) => Some(ToolResult::error("timed out waiting for the user's answer")),
        Ok(Err(_)) => None,
        Ok(Ok(Ok(result))) => Some(elicitation_result(&result)),
        Ok(Ok(Err(error))) => {
            let why = error["message"].as_str().unwrap_or("unknown error");
            Some(ToolResult::error(format!("elicitation failed: {why}")))
        }
    }
}

/// Turns an `ElicitResult` into the tool's text.
pub(super) fn elicitation_result(result: &Value) -> ToolResult<'static> {
    let action = result["action"].as_str().unwrap_or("cancel");
    if action != "accept" {
        return ToolResult::text(format!("no answer ({action})"));
    }
    match &result["content"]["answer"] {
        Value::String(answer) => ToolResult::text(format!("you answered: {answer}")),
        Value::Null => ToolResult::error("accepted without an answer"),
        other => ToolResult::text(format!("you answered: {other}")),
    }
}
