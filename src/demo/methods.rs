//! The demo's method table: `initialize`, the request methods answered in
//! one JSON document (or handed to `tools` as a streamed job), notifications,
//! and the fixed catalogue of resources, prompts and completions.

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::rpc::{self, Message, RpcError};
use super::session::{Session, LEVELS};
use super::tools::{self, Job};

/// Protocol versions this server speaks, newest first.
pub(super) const VERSIONS: [&str; 3] = ["2025-11-25", "2025-06-18", "2025-03-26"];
/// The version answered when the client asks for one we do not speak.
pub(super) const LATEST: &str = VERSIONS[0];

const INSTRUCTIONS: &str = "Demo legacy MCP server bundled with sessionless. \
Tools: echo, add, counter (per-session state), slow (progress and logs over SSE), \
fail (an isError result) and ask_user (form elicitation). \
Resources: demo://readme and demo://greeting/{name}. Prompt: greet.";

const README: &str = "sessionless demo server\n\nA legacy (session-based) MCP server \
used to try the sessionless gateway and to test and benchmark it.\n";

const NAMES: [&str; 8] = ["Ada", "Alan", "Alice", "Barbara", "Bob", "Grace", "Linus", "Margaret"];

/// Answers that never change, serialised once per server.
pub(super) struct Catalog {
    tools: Box<RawValue>,
    resources: Box<RawValue>,
    templates: Box<RawValue>,
    prompts: Box<RawValue>,
}

fn raw(value: &Value) -> Box<RawValue> {
    serde_json::value::to_raw_value(value).unwrap_or_else(|_| RawValue::NULL.to_owned())
}

impl Catalog {
    pub(super) fn new() -> Self {
        Self {
            tools: raw(&json!({ "tools": tools::definitions() })),
            resources: raw(&json!({ "resources": [{
                "uri": "demo://readme", "name": "readme", "title": "Demo README",
                "description": "What this demo server is.", "mimeType": "text/plain"
            }]})),
            templates: raw(&json!({ "resourceTemplates": [{
                "uriTemplate": "demo://greeting/{name}", "name": "greeting",
                "description": "A greeting for {name}.", "mimeType": "text/plain"
            }]})),
            prompts: raw(&json!({ "prompts": [{
                "name": "greet", "description": "Greet someone by name.",
                "arguments": [{ "name": "name", "description": "Who to greet", "required": true }]
            }]})),
        }
    }
}

/// How a request is answered.
pub(super) enum Reply {
    /// A complete JSON-RPC response envelope.
    Json(Vec<u8>),
    /// A call that streams messages before its result (SSE).
    Stream(Job),
}

#[derive(Deserialize)]
struct InitParams {
    #[serde(rename = "protocolVersion", default)]
    protocol_version: Option<String>,
    #[serde(default)]
    capabilities: Value,
}

/// Negotiates the version and opens a session; the caller stores it.
pub(super) fn initialize(
    id: &RawValue,
    msg: &Message<'_>,
    parent: &CancellationToken,
) -> Result<(Vec<u8>, Session), Vec<u8>> {
    let params: InitParams =
        msg.params_as().map_err(|e| rpc::error_bytes(Some(id), &RpcError::invalid_params(e.to_string())))?;
    let requested = params.protocol_version.as_deref().unwrap_or(LATEST);
    let version = VERSIONS.into_iter().find(|v| *v == requested).unwrap_or(LATEST);
    let session = Session::new(version, declares_form_elicitation(&params.capabilities), parent);
    let result = json!({
        "protocolVersion": version,
        "capabilities": {
            "tools": {}, "resources": {}, "prompts": {}, "logging": {}, "completions": {}
        },
        "serverInfo": { "name": "sessionless-demo", "version": env!("CARGO_PKG_VERSION") },
        "instructions": INSTRUCTIONS,
    });
    Ok((rpc::result_bytes(id, &result), session))
}

/// `elicitation: {}` (2025-06-18) or `elicitation: {form: …}` (2025-11-25).
pub(super) fn declares_form_elicitation(capabilities: &Value) -> bool {
    match capabilities.get("elicitation") {
        Some(Value::Object(modes)) => modes.is_empty() || modes.contains_key("form"),
        _ => false,
    }
}

/// Answers one request on an established session.
pub(super) fn dispatch(
    catalog: &Catalog,
    session: &Session,
    id: &RawValue,
    method: &str,
    msg: &Message<'_>,
) -> Reply {
    let answer = match method {
        "ping" => Ok(rpc::result_bytes(id, &json!({}))),
        "logging/setLevel" => set_level(session, msg).map(|v| rpc::result_bytes(id, &v)),
        "tools/list" => Ok(rpc::result_bytes(id, &catalog.tools)),
        "tools/call" => match tools::call(session, msg) {
            Ok(tools::Outcome::Done(result)) => Ok(rpc::result_bytes(id, &result)),
            Ok(tools::Outcome::Stream(kind)) => {
                return Reply::Stream(Job { id: id.to_owned(), kind });
            }
            Err(e) => Err(e),
        },
        "resources/list" => Ok(rpc::result_bytes(id, &catalog.resources)),
        "resources/templates/list" => Ok(rpc::result_bytes(id, &catalog.templates)),
        "resources/read" => read_resource(msg).map(|v| rpc::result_bytes(id, &v)),
        "prompts/list" => Ok(rpc::result_bytes(id, &catalog.prompts)),
        "prompts/get" => get_prompt(msg).map(|v| rpc::result_bytes(id, &v)),
        "completion/complete" => complete(msg).map(|v| rpc::result_bytes(id, &v)),
        _ => Err(RpcError::new(rpc::METHOD_NOT_FOUND, format!("method not found: {method}"))),
    };
    Reply::Json(answer.unwrap_or_else(|e| rpc::error_bytes(Some(id), &e)))
}

/// Handles a client notification; unknown ones are ignored, as the spec asks.
pub(super) fn notify(session: &Session, method: &str, msg: &Message<'_>) {
    #[derive(Deserialize)]
    struct Cancelled<'a> {
        #[serde(rename = "requestId", borrow)]
        request_id: &'a RawValue,
    }
    if method == "notifications/cancelled" {
        if let Ok(params) = msg.params_as::<Cancelled<'_>>() {
            session.cancel(&rpc::canonical_id(params.request_id));
        }
    }
}

/// A JSON-RPC response posted by the client to one of our requests.
pub(super) fn deliver(session: &Session, id: &RawValue, msg: &Message<'_>) {
    let Ok(id) = serde_json::from_str::<Value>(id.get()) else {
        return;
    };
    let parse = |raw: &RawValue| serde_json::from_str::<Value>(raw.get()).unwrap_or(Value::Null);
    let answer = match (msg.result, msg.error) {
        (Some(result), _) => Ok(parse(result)),
        (None, Some(error)) => Err(parse(error)),
        (None, None) => return,
    };
    session.deliver(&id, answer);
}

fn set_level(session: &Session, msg: &Message<'_>) -> Result<Value, RpcError> {
    #[derive(Deserialize)]
    struct P {
        level: String,
    }
    let p: P = msg.params_as().map_err(|e| RpcError::invalid_params(e.to_string()))?;
    let level = LEVELS
        .iter()
        .position(|l| *l == p.level)
        .ok_or_else(|| RpcError::invalid_params(format!("unknown log level: {}", p.level)))?;
    session.set_level(u8::try_from(level).unwrap_or(0));
    Ok(json!({}))
}

#[derive(Deserialize)]
struct UriParams {
    uri: String,
}

fn read_resource(msg: &Message<'_>) -> Result<Value, RpcError> {
    let p: UriParams = msg.params_as().map_err(|e| RpcError::invalid_params(e.to_string()))?;
    let text = match p.uri.strip_prefix("demo://greeting/") {
        _ if p.uri == "demo://readme" => README.to_owned(),
        Some(name) if !name.is_empty() => format!("Hello, {name}!"),
        _ => {
            let err = RpcError::new(rpc::RESOURCE_NOT_FOUND, "resource not found");
            return Err(err.with_data(json!({ "uri": p.uri })));
        }
    };
    Ok(json!({ "contents": [{ "uri": p.uri, "mimeType": "text/plain", "text": text }] }))
}

fn get_prompt(msg: &Message<'_>) -> Result<Value, RpcError> {
    #[derive(Deserialize)]
    struct P {
        name: String,
        #[serde(default)]
        arguments: Option<serde_json::Map<String, Value>>,
    }
    let p: P = msg.params_as().map_err(|e| RpcError::invalid_params(e.to_string()))?;
    if p.name != "greet" {
        return Err(RpcError::invalid_params(format!("unknown prompt: {}", p.name)));
    }
    let who = p.arguments.as_ref().and_then(|a| a.get("name")).and_then(Value::as_str);
    let who = who.ok_or_else(|| RpcError::invalid_params("missing required argument: name"))?;
    Ok(json!({
        "description": "Greet someone by name.",
        "messages": [{
            "role": "user",
            "content": { "type": "text", "text": format!("Please greet {who} warmly.") }
        }]
    }))
}

fn complete(msg: &Message<'_>) -> Result<Value, RpcError> {
    let p: Value = msg.params_as().map_err(|e| RpcError::invalid_params(e.to_string()))?;
    let reference = &p["ref"];
    let known = match reference["type"].as_str() {
        Some("ref/prompt") => reference["name"] == "greet",
        Some("ref/resource") => reference["uri"] == "demo://greeting/{name}",
        _ => false,
    };
    if !known {
        return Err(RpcError::invalid_params("unknown completion reference"));
    }
    let values: Vec<&str> = if p["argument"]["name"] == "name" {
        let prefix = p["argument"]["value"].as_str().unwrap_or("").to_lowercase();
        NAMES.into_iter().filter(|n| n.to_lowercase().starts_with(&prefix)).collect()
    } else {
        Vec::new()
    };
    Ok(json!({ "completion": { "values": values, "total": values.len(), "hasMore": false } }))
}
