//! The demo server as a 2026-07-28 (stateless) MCP server:
//! `sessionless demo-upstream --generation modern`.
//!
//! No sessions: every POST carries the 2026 markers (`MCP-Protocol-Version`,
//! `Mcp-Method`, `Mcp-Name` and `params._meta`) and is answered on its own.
//! It speaks only 2026-07-28, so it also stands in for a 2026-ONLY upstream:
//! a request without the markers (a legacy client's `initialize`) is refused
//! 400 -32022 with `data.supported`, `initialize`/`ping` with the markers are
//! 404 -32601, GET/DELETE 405. Methods: `server/discover`, `tools/list`,
//! `tools/call` (`echo`, `add`, `slow` with progress over SSE, `fail`, and
//! `ask_user` as a multi round-trip request: `input_required` with an
//! HMAC'd `requestState`, completed by the retry's `inputResponses`).
//!
//! It is a benchmark upstream: `echo` reads its envelope and params borrowed,
//! with the arguments left raw, and writes the answer in one buffer around
//! precomputed parts.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use hmac::{Hmac, Mac};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderName, HeaderValue, ALLOW};
use hyper::{HeaderMap, Method, Request, Response, StatusCode};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{json, Value};

use super::http::{self as legacy_http, MAX_BODY};
use super::methods;
use super::rpc::{self, DemoBody, Kind, Message, RpcError, Sink};
use super::session::{INFO, LEVELS};
use super::tools::{self, ToolResult};
use super::Server;

/// The one protocol revision this mode speaks.
pub(super) const VERSION: &str = "2026-07-28";
/// 2026-07-28 error codes.
const HEADER_MISMATCH: i64 = -32020;
const MISSING_CAPABILITY: i64 = -32021;
const UNSUPPORTED_VERSION: i64 = -32022;
/// The key of `ask_user`'s one input request (the gateway's own choice too).
const ASK_KEY: &str = "elicitation_1";
/// How long an `ask_user` `requestState` is accepted.
const STATE_TTL: Duration = Duration::from_secs(600);
/// `ttlMs` of cacheable results (discover, tools/list).
const TTL_MS: u64 = 3_600_000;
const INSTRUCTIONS: &str = "Demo MCP server bundled with sessionless, speaking 2026-07-28 (stateless). \
Tools: echo, add, slow (progress over SSE), fail (an isError result) and ask_user \
(a multi round-trip request: input_required, then the retry with inputResponses and requestState).";

const PROTOCOL_VERSION: HeaderName = HeaderName::from_static("mcp-protocol-version");
const MCP_METHOD: HeaderName = HeaderName::from_static("mcp-method");
const MCP_NAME: HeaderName = HeaderName::from_static("mcp-name");

type HmacSha256 = Hmac<sha2::Sha256>;

/// What a modern server computes once: the fixed answers and the key its
/// `requestState`s are authenticated with.
pub(super) struct Modern {
    discover: Box<RawValue>,
    tools: Box<RawValue>,
    /// `{"io.modelcontextprotocol/serverInfo":{…}}`, put on every result.
    meta: Box<RawValue>,
    key: [u8; 32],
}

fn raw(value: &Value) -> Box<RawValue> {
    serde_json::value::to_raw_value(value).unwrap_or_else(|_| RawValue::NULL.to_owned())
}

impl Modern {
    pub(super) fn new() -> Self {
        let meta = json!({ "io.modelcontextprotocol/serverInfo":
            { "name": "sessionless-demo", "version": env!("CARGO_PKG_VERSION") } });
        // `counter` is per-session state: there are no sessions here.
        let mut list = tools::definitions();
        if let Value::Array(all) = &mut list {
            all.retain(|t| t["name"] != "counter");
        }
        Self {
            discover: raw(&json!({
                "resultType": "complete",
                "supportedVersions": [VERSION],
                "capabilities": { "tools": {} },
                "instructions": INSTRUCTIONS,
                "_meta": meta,
                "ttlMs": TTL_MS,
                "cacheScope": "public",
            })),
            tools: raw(&json!({
                "resultType": "complete", "tools": list, "_meta": meta,
                "ttlMs": TTL_MS, "cacheScope": "public",
            })),
            meta: raw(&meta),
            key: rand::random(),
        }
    }
}

/// `params`, read borrowed: only what this server looks at.
#[derive(Deserialize, Default)]
struct Params<'a> {
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    arguments: Option<&'a RawValue>,
    #[serde(rename = "_meta", borrow, default)]
    meta: Option<Meta<'a>>,
    #[serde(rename = "requestState", borrow, default)]
    request_state: Option<Cow<'a, str>>,
    #[serde(rename = "inputResponses", borrow, default)]
    input_responses: Option<&'a RawValue>,
    /// A legacy `initialize`'s version, named back in the -32022 refusal.
    #[serde(rename = "protocolVersion", borrow, default)]
    protocol_version: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct Meta<'a> {
    #[serde(rename = "io.modelcontextprotocol/protocolVersion", borrow, default)]
    version: Option<Cow<'a, str>>,
    #[serde(rename = "io.modelcontextprotocol/clientCapabilities", borrow, default)]
    capabilities: Option<&'a RawValue>,
    #[serde(rename = "io.modelcontextprotocol/logLevel", borrow, default)]
    log_level: Option<Cow<'a, str>>,
    #[serde(rename = "progressToken", default)]
    progress_token: Option<Value>,
}

/// A complete result: `resultType`, the tool's own members, `_meta`.
#[derive(Serialize)]
struct Complete<'a, T> {
    #[serde(rename = "resultType")]
    result_type: &'static str,
    #[serde(flatten)]
    inner: T,
    #[serde(rename = "_meta")]
    meta: &'a RawValue,
}

/// Routes one HTTP request.
pub(super) async fn handle(server: Arc<Server>, req: Request<Incoming>) -> Response<DemoBody> {
    if req.uri().path() != "/mcp" {
        return legacy_http::plain(StatusCode::NOT_FOUND, "not found: the MCP endpoint is /mcp");
    }
    if req.method() != Method::POST {
        // No GET stream and no sessions to DELETE in 2026-07-28.
        let mut resp = legacy_http::plain(StatusCode::METHOD_NOT_ALLOWED, "method not allowed: POST only");
        resp.headers_mut().insert(ALLOW, HeaderValue::from_static("POST"));
        return resp;
    }
    let Some(modern) = server.modern.as_ref() else {
        return legacy_http::plain(StatusCode::INTERNAL_SERVER_ERROR, "not a modern server");
    };
    let (parts, body) = req.into_parts();
    let body = match Limited::new(body, MAX_BODY).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            return fail(
                StatusCode::PAYLOAD_TOO_LARGE,
                None,
                RpcError::new(rpc::INVALID_REQUEST, "body too large"),
            );
        }
        Err(_) => return legacy_http::plain(StatusCode::BAD_REQUEST, "could not read the request body"),
    };
    let Ok(text) = std::str::from_utf8(&body) else {
        return fail(StatusCode::BAD_REQUEST, None, RpcError::new(rpc::PARSE_ERROR, "body is not UTF-8"));
    };
    // A batch (a JSON array) fails here as an invalid request: none in 2026-07-28.
    let msg: Message<'_> = match serde_json::from_str(text) {
        Ok(msg) => msg,
        Err(e) => return legacy_http::unparsable(&e),
    };
    match msg.kind() {
        Kind::Request { id, method } => request(&server, modern, &parts.headers, id, method, &msg),
        Kind::Notification { .. } => {
            let version = header(&parts.headers, &PROTOCOL_VERSION).ok().flatten();
            if version != Some(VERSION) {
                return unsupported(None, version);
            }
            legacy_http::empty(StatusCode::ACCEPTED)
        }
        Kind::Response { .. } | Kind::Invalid => fail(
            StatusCode::BAD_REQUEST,
            None,
            RpcError::new(rpc::INVALID_REQUEST, "expected one JSON-RPC request or notification"),
        ),
    }
}

/// A header's value, trimmed of optional whitespace: `Ok(None)` when absent,
/// an error when not visible ASCII or given more than once.
fn header<'h>(headers: &'h HeaderMap, name: &HeaderName) -> Result<Option<&'h str>, ()> {
    let mut values = headers.get_all(name).iter();
    match (values.next(), values.next()) {
        (None, _) => Ok(None),
        (Some(v), None) => v.to_str().map(|v| Some(v.trim_matches([' ', '\t']))).map_err(|_| ()),
        (Some(_), Some(_)) => Err(()),
    }
}

fn bad_header(id: &RawValue, name: &HeaderName) -> Response<DemoBody> {
    let err = RpcError::new(HEADER_MISMATCH, format!("{name} header is not one visible-ASCII value"));
    fail(StatusCode::BAD_REQUEST, Some(id), err)
}

/// Decodes the `=?base64?…?=` form of a header value; anything else is literal.
fn decoded(raw: &str) -> Option<Cow<'_, str>> {
    match raw.strip_prefix("=?base64?").and_then(|rest| rest.strip_suffix("?=")) {
        None => Some(Cow::Borrowed(raw)),
        Some(inner) => {
            let bytes = base64::engine::general_purpose::STANDARD.decode(inner).ok()?;
            String::from_utf8(bytes).ok().map(Cow::Owned)
        }
    }
}

fn request(
    server: &Server,
    modern: &Modern,
    headers: &HeaderMap,
    id: &RawValue,
    method: &str,
    msg: &Message<'_>,
) -> Response<DemoBody> {
    let params: Params<'_> = match msg.params {
        None => Params::default(),
        Some(raw) => match serde_json::from_str(raw.get()) {
            Ok(p) => p,
            Err(e) => {
                return fail(StatusCode::BAD_REQUEST, Some(id), RpcError::invalid_params(e.to_string()))
            }
        },
    };
    let Ok(in_header) = header(headers, &PROTOCOL_VERSION) else {
        return bad_header(id, &PROTOCOL_VERSION);
    };
    let meta = params.meta.as_ref();
    let in_body = meta.and_then(|m| m.version.as_deref());
    // The order conformance implies: the two versions disagree → -32020;
    // neither is 2026-07-28 (a legacy client, or an unknown revision) →
    // -32022; then a missing `_meta` field → -32602; then the headers.
    if let (Some(h), Some(b)) = (in_header, in_body) {
        if h != b {
            let why = "MCP-Protocol-Version header does not match params._meta's protocolVersion";
            return fail(StatusCode::BAD_REQUEST, Some(id), RpcError::new(HEADER_MISMATCH, why));
        }
    }
    if in_header != Some(VERSION) && in_body != Some(VERSION) {
        let requested = in_header.or(in_body).or(params.protocol_version.as_deref());
        return unsupported(Some(id), requested);
    }
    let Some(meta) = meta.filter(|m| m.version.is_some()) else {
        let why = "params._meta must carry io.modelcontextprotocol/protocolVersion";
        return fail(StatusCode::BAD_REQUEST, Some(id), RpcError::invalid_params(why));
    };
    let Some(capabilities) = meta.capabilities.filter(|c| c.get().starts_with('{')) else {
        let why = "params._meta must carry io.modelcontextprotocol/clientCapabilities (an object)";
        return fail(StatusCode::BAD_REQUEST, Some(id), RpcError::invalid_params(why));
    };
    if in_header.is_none() {
        let err = RpcError::new(HEADER_MISMATCH, "missing MCP-Protocol-Version header");
        return fail(StatusCode::BAD_REQUEST, Some(id), err);
    }
    match header(headers, &MCP_METHOD) {
        Err(()) => return bad_header(id, &MCP_METHOD),
        Ok(Some(h)) if h == method => {}
        Ok(Some(_)) => {
            let err = RpcError::new(HEADER_MISMATCH, "Mcp-Method header does not match the body's method");
            return fail(StatusCode::BAD_REQUEST, Some(id), err);
        }
        Ok(None) => {
            let err = RpcError::new(HEADER_MISMATCH, "missing Mcp-Method header");
            return fail(StatusCode::BAD_REQUEST, Some(id), err);
        }
    }
    match method {
        "server/discover" => ok(rpc::result_bytes(id, &modern.discover)),
        "tools/list" => ok(rpc::result_bytes(id, &modern.tools)),
        "tools/call" => call(server, modern, headers, id, &params, meta, capabilities),
        _ => fail(
            StatusCode::NOT_FOUND,
            Some(id),
            RpcError::new(rpc::METHOD_NOT_FOUND, format!("method not found: {method}")),
        ),
    }
}

fn call(
    server: &Server,
    modern: &Modern,
    headers: &HeaderMap,
    id: &RawValue,
    params: &Params<'_>,
    meta: &Meta<'_>,
    capabilities: &RawValue,
) -> Response<DemoBody> {
    let Some(name) = params.name.as_deref() else {
        return fail(StatusCode::OK, Some(id), RpcError::invalid_params("missing params.name"));
    };
    match header(headers, &MCP_NAME) {
        Err(()) => return bad_header(id, &MCP_NAME),
        Ok(None) => {
            let err = RpcError::new(HEADER_MISMATCH, "missing Mcp-Name header");
            return fail(StatusCode::BAD_REQUEST, Some(id), err);
        }
        Ok(Some(raw)) => {
            if decoded(raw).as_deref() != Some(name) {
                let err = RpcError::new(HEADER_MISMATCH, "Mcp-Name header does not match params.name");
                return fail(StatusCode::BAD_REQUEST, Some(id), err);
            }
        }
    }
    let done = match name {
        "echo" => tools::echo(params.arguments),
        "add" => tools::add(params.arguments),
        "fail" => Ok(ToolResult::error("the fail tool always fails")),
        "slow" => return slow(server, modern, id, params, meta),
        "ask_user" => return ask_user(modern, id, params, capabilities),
        other => Err(RpcError::invalid_params(format!("unknown tool: {other}"))),
    };
    match done {
        Ok(result) => ok(complete(id, &result, &modern.meta)),
        Err(e) => fail(StatusCode::OK, Some(id), e),
    }
}

/// `{"jsonrpc":"2.0","id":…,"result":{"resultType":"complete",…,"_meta":…}}`.
fn complete(id: &RawValue, inner: &impl Serialize, meta: &RawValue) -> Vec<u8> {
    rpc::result_bytes(id, &Complete { result_type: "complete", inner, meta })
}

/// `slow`: progress (with a `progressToken`) and log messages (with a
/// `logLevel` of info or lower) on an SSE answer, then the result. Closing
/// the stream cancels it.
fn slow(
    server: &Server,
    modern: &Modern,
    id: &RawValue,
    params: &Params<'_>,
    meta: &Meta<'_>,
) -> Response<DemoBody> {
    #[derive(Deserialize)]
    struct A {
        steps: Option<u64>,
        delay_ms: Option<u64>,
    }
    let a: A = match tools::args(params.arguments) {
        Ok(a) => a,
        Err(e) => return fail(StatusCode::OK, Some(id), e),
    };
    let steps = a.steps.unwrap_or(3).min(tools::MAX_STEPS);
    let delay = Duration::from_millis(a.delay_ms.unwrap_or(100).min(tools::MAX_DELAY_MS));
    let logs = match meta.log_level.as_deref() {
        None => false,
        Some(level) => match LEVELS.iter().position(|l| *l == level) {
            Some(n) => n <= usize::from(INFO),
            None => {
                let err = RpcError::invalid_params(format!("unknown log level: {level}"));
                return fail(StatusCode::OK, Some(id), err);
            }
        },
    };
    let token = meta.progress_token.clone();
    let id = id.to_owned();
    let result_meta = modern.meta.clone();
    let stop = server.stop.clone();
    let (mut sink, body) = rpc::sse_channel_without_ids();
    tokio::spawn(async move {
        let watcher = sink.watcher();
        tokio::select! {
            () = stop.cancelled() => {}
            () = watcher.closed() => {}
            () = run_slow(&mut sink, &id, steps, delay, token, logs, &result_meta) => {}
        }
    });
    let mut resp = legacy_http::sse(body);
    resp.headers_mut().insert("x-accel-buffering", HeaderValue::from_static("no"));
    resp
}

async fn run_slow(
    sink: &mut Sink,
    id: &RawValue,
    steps: u64,
    delay: Duration,
    token: Option<Value>,
    logs: bool,
    meta: &RawValue,
) {
    for step in 1..=steps {
        tokio::time::sleep(delay).await;
        let message = format!("step {step} of {steps}");
        if let Some(token) = &token {
            let note = json!({ "jsonrpc": "2.0", "method": "notifications/progress", "params": {
                "progressToken": token, "progress": step, "total": steps, "message": message } });
            if !sink.event(&rpc::message_bytes(&note)).await {
                return;
            }
        }
        if logs {
            let note = json!({ "jsonrpc": "2.0", "method": "notifications/message", "params": {
                "level": "info", "logger": "slow", "data": message } });
            if !sink.event(&rpc::message_bytes(&note)).await {
                return;
            }
        }
    }
    let done = ToolResult::text(format!("slow finished {steps} steps"));
    sink.event(&complete(id, &done, meta)).await;
}

/// `ask_user` as a multi round-trip request: without a (valid) answer, an
/// `input_required` result asking the question, with a `requestState` that
/// binds the question and an expiry (HMAC-SHA256 under this server's key);
/// the retry carrying that state and the answer completes.
fn ask_user(
    modern: &Modern,
    id: &RawValue,
    params: &Params<'_>,
    capabilities: &RawValue,
) -> Response<DemoBody> {
    #[derive(Deserialize)]
    struct A {
        question: Option<String>,
    }
    let a: A = match tools::args(params.arguments) {
        Ok(a) => a,
        Err(e) => return fail(StatusCode::OK, Some(id), e),
    };
    let declared = serde_json::from_str::<Value>(capabilities.get())
        .is_ok_and(|caps| methods::declares_form_elicitation(&caps));
    if !declared {
        let err = RpcError::new(MISSING_CAPABILITY, "ask_user needs the elicitation (form) capability")
            .with_data(json!({ "requiredCapabilities": { "elicitation": {} } }));
        return fail(StatusCode::BAD_REQUEST, Some(id), err);
    }
    let question = a.question.unwrap_or_else(|| "What is your answer?".to_owned());
    let now = unix_now();
    if let Some(state) = params.request_state.as_deref() {
        if !modern.state_is_valid(state, &question, now) {
            let err = RpcError::invalid_params("invalid or expired requestState");
            return fail(StatusCode::OK, Some(id), err);
        }
        let answer = params
            .input_responses
            .and_then(|r| serde_json::from_str::<Value>(r.get()).ok())
            .and_then(|mut r| r.get_mut(ASK_KEY).map(Value::take));
        if let Some(answer) = answer {
            return ok(complete(id, &tools::elicitation_result(&answer), &modern.meta));
        }
        // A retry without the answer is asked again (MRTR: a new round, not an error).
    }
    let result = json!({
        "resultType": "input_required",
        "inputRequests": { ASK_KEY: { "method": "elicitation/create", "params": {
            "mode": "form", "message": question, "requestedSchema": {
                "type": "object", "properties": { "answer": { "type": "string" } },
                "required": ["answer"] } } } },
        "requestState": modern.state(&question, now + STATE_TTL.as_secs()),
        "_meta": &*modern.meta,
    });
    ok(rpc::result_bytes(id, &result))
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

impl Modern {
    fn mac(&self, question: &str, expires: u64) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(&self.key).expect("any key length");
        mac.update(b"ask_user\0");
        mac.update(expires.to_string().as_bytes());
        mac.update(b"\0");
        mac.update(question.as_bytes());
        mac
    }

    /// `<expiry>.<base64url(HMAC(expiry, question))>`.
    fn state(&self, question: &str, expires: u64) -> String {
        let tag = self.mac(question, expires).finalize().into_bytes();
        format!("{expires}.{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(tag))
    }

    fn state_is_valid(&self, state: &str, question: &str, now: u64) -> bool {
        let Some((expires, tag)) = state.split_once('.') else { return false };
        let (Ok(expires), Ok(tag)) =
            (expires.parse::<u64>(), base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(tag))
        else {
            return false;
        };
        now < expires && self.mac(question, expires).verify_slice(&tag).is_ok()
    }
}

/// -32022: this server speaks only 2026-07-28.
fn unsupported(id: Option<&RawValue>, requested: Option<&str>) -> Response<DemoBody> {
    let mut data = json!({ "supported": [VERSION] });
    if let Some(requested) = requested {
        data["requested"] = json!(requested);
    }
    let err = RpcError::new(UNSUPPORTED_VERSION, "Unsupported protocol version").with_data(data);
    fail(StatusCode::BAD_REQUEST, id, err)
}

fn ok(bytes: Vec<u8>) -> Response<DemoBody> {
    legacy_http::json(StatusCode::OK, bytes)
}

fn fail(status: StatusCode, id: Option<&RawValue>, err: RpcError) -> Response<DemoBody> {
    legacy_http::json(status, rpc::error_bytes(id, &err))
}
