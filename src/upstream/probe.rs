//! Which generation an upstream speaks, found by asking it (DESIGN §9): a
//! `server/discover` POST with the 2026-07-28 header and `_meta`. A discover
//! result listing 2026-07-28 is modern; a -32022 whose `data.supported` lacks
//! it is a modern server of another revision, refused (never sent
//! `initialize`); anything else is legacy. A session the answer minted is
//! deleted, so a probe leaves nothing behind.

use serde_json::{json, Value};

use super::channel::{SendError, SessionWire};
use super::transport::Transport;
use crate::front::MODERN_VERSION;

/// What the probe found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    Legacy,
    /// A 2026-07-28 server; `legacy_too` when its discover result also
    /// lists a 2025 version (it serves the session era as well).
    Modern {
        legacy_too: bool,
    },
    /// A 2026-era server that does not speak our revision; what it does speak.
    OtherRevision(Vec<String>),
}

impl std::fmt::Display for Found {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Found::Legacy => f.write_str("legacy"),
            Found::Modern { legacy_too: true } => f.write_str("modern+legacy"),
            Found::Modern { legacy_too: false } => f.write_str("modern"),
            Found::OtherRevision(v) => write!(f, "another revision ({})", v.join(", ")),
        }
    }
}

/// Asks the upstream. `Err` when it could not be asked (unreachable, timed
/// out, or an answer too broken to read): nothing is known yet. Never with
/// a client's token, even when a request's task runs it: the answer is
/// shared by every caller of the route.
pub async fn probe(upstream: &Transport) -> Result<Found, SendError> {
    super::credentials::without_client_token(ask(upstream)).await
}

async fn ask(upstream: &Transport) -> Result<Found, SendError> {
    let body = json!({"jsonrpc": "2.0", "id": "sessionless-probe", "method": "server/discover", "params": {
    "_meta": {
        "io.modelcontextprotocol/protocolVersion": MODERN_VERSION,
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "sessionless", "version": env!("CARGO_PKG_VERSION")}
    }}});
    let headers = [
        ("mcp-protocol-version", MODERN_VERSION),
        ("mcp-method", "server/discover"),
        ("accept", "application/json, text/event-stream"),
        ("content-type", "application/json"),
    ];
    let bytes = serde_json::to_vec(&body).expect("serialises");
    // Safe to send again: a probe changes nothing upstream.
    let resp = match upstream.send_headers("POST", &headers, &bytes).await {
        Err(SendError::NotSent | SendError::Broken) => {
            upstream.send_headers("POST", &headers, &bytes).await?
        }
        other => other?,
    };
    let status = resp.status;
    let minted = resp.header("mcp-session-id").map(str::to_string);
    let sse = resp.is_sse();
    let text = upstream.read_body(resp.body).await;
    if let Some(id) = minted {
        // A legacy server answered the probe with a fresh session (some do,
        // even on a 400): end it.
        upstream.delete(&SessionWire { id: Some(id), version: None, owner: None }).await;
    }
    let text = text?;
    match classify(status, &message(&text, sse))? {
        // A discover result that names no 2025 version may still come from
        // a server that serves the session era (the SDK v2 servers list only
        // their 2026 versions): ask it the way a 2025 client would.
        Found::Modern { legacy_too: false } => {
            Ok(Found::Modern { legacy_too: serves_legacy(upstream).await })
        }
        found => Ok(found),
    }
}

/// Whether the upstream takes a 2025 client's `initialize` (the session it
/// opens is deleted at once). A 2026-only server refuses it (-32022).
async fn serves_legacy(upstream: &Transport) -> bool {
    let body = json!({"jsonrpc": "2.0", "id": "sessionless-probe-legacy", "method": "initialize", "params": {
        "protocolVersion": crate::config::LEGACY_VERSIONS[0],
        "capabilities": {},
        "clientInfo": {"name": "sessionless", "version": env!("CARGO_PKG_VERSION")}}});
    let headers = [("accept", "application/json, text/event-stream"), ("content-type", "application/json")];
    let bytes = serde_json::to_vec(&body).expect("serialises");
    let Ok(resp) = upstream.send_headers("POST", &headers, &bytes).await else {
        return false;
    };
    let (status, sse) = (resp.status, resp.is_sse());
    let minted = resp.header("mcp-session-id").map(str::to_string);
    let text = upstream.read_body(resp.body).await;
    if let Some(id) = minted {
        upstream.delete(&SessionWire { id: Some(id), version: None, owner: None }).await;
    }
    let Ok(text) = text else { return false };
    let msg = message(&text, sse);
    (200..300).contains(&status) && msg.pointer("/result/protocolVersion").is_some()
}

/// The answer's JSON-RPC message (the first one carrying a result or an
/// error, on SSE), or `Null`.
fn message(body: &[u8], sse: bool) -> Value {
    if super::event_limit::too_many_values(body, body.len().max(1 << 16)) {
        return Value::Null;
    }
    if !sse {
        return serde_json::from_slice(body).unwrap_or(Value::Null);
    }
    super::transport::sse_data(&String::from_utf8_lossy(body))
        .filter_map(|data| serde_json::from_str::<Value>(&data).ok())
        .find(|m| m.get("result").is_some() || m.get("error").is_some())
        .unwrap_or(Value::Null)
}

/// What an answer says; `Err` when it says nothing about the protocol (an
/// upstream that wants credentials, is overloaded or failing, or answered
/// something that is not MCP): nothing is known yet, the probe is repeated.
fn classify(status: u16, msg: &Value) -> Result<Found, SendError> {
    // Only version-shaped strings, a few: they end up in logs and `/readyz`.
    let versions = |v: Option<&Value>| -> Vec<String> {
        let shaped = |s: &&str| s.len() == 10 && s.bytes().all(|b| b.is_ascii_digit() || b == b'-');
        v.and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).filter(shaped).take(8).map(str::to_string).collect())
            .unwrap_or_default()
    };
    if (200..300).contains(&status) {
        let supported = versions(msg.pointer("/result/supportedVersions"));
        if supported.iter().any(|v| v == MODERN_VERSION) {
            let legacy_too =
                supported.iter().any(|v| crate::front::generation::LEGACY_VERSIONS.contains(&v.as_str()));
            return Ok(Found::Modern { legacy_too });
        }
    }
    if msg.pointer("/error/code").and_then(Value::as_i64) == Some(crate::error::code::UNSUPPORTED_VERSION) {
        let supported = versions(msg.pointer("/error/data/supported"));
        if !supported.is_empty() && !supported.iter().any(|v| v == MODERN_VERSION) {
            // Only a server of the stateless era names versions this way;
            // a legacy one would have taken `initialize`.
            if supported.iter().all(|v| !crate::front::generation::LEGACY_VERSIONS.contains(&v.as_str())) {
                return Ok(Found::OtherRevision(supported));
            }
        }
    }
    // What a session server answers a request it does not understand: a
    // client error about the request, or a JSON-RPC error. Anything else
    // (401/403/429/5xx, a page that is not MCP) is no answer at all.
    // A 404 without one is a path that serves nothing (a wrong URL), not a
    // legacy server: those answer a request without a session 400.
    let rpc_error = msg.get("jsonrpc").is_some() && msg.get("error").is_some();
    match status {
        400 | 405 | 406 | 415 => Ok(Found::Legacy),
        200..=299 | 404 if rpc_error => Ok(Found::Legacy),
        _ => Err(SendError::Status(status)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_classified() {
        let discover = json!({"jsonrpc": "2.0", "id": 1, "result": {"resultType": "complete",
            "supportedVersions": ["2026-07-28", "2025-11-25"], "capabilities": {}}});
        assert_eq!(classify(200, &discover), Ok(Found::Modern { legacy_too: true }));
        let future = json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32022, "message": "no",
            "data": {"supported": ["2027-03-01"], "requested": "2026-07-28"}}});
        assert_eq!(classify(400, &future), Ok(Found::OtherRevision(vec!["2027-03-01".into()])));
        let legacy_with_versions = json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32022,
            "message": "no", "data": {"supported": ["2025-11-25"]}}});
        assert_eq!(classify(400, &legacy_with_versions), Ok(Found::Legacy));
        let not_found = json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32601, "message": "nope"}});
        assert_eq!(classify(200, &not_found), Ok(Found::Legacy));
        assert_eq!(classify(400, &Value::Null), Ok(Found::Legacy));
        assert_eq!(classify(404, &Value::Null), Err(SendError::Status(404)), "a wrong path");
        assert_eq!(classify(404, &not_found), Ok(Found::Legacy), "a JSON-RPC error on a 404");
        for status in [401, 403, 429, 500, 503] {
            assert_eq!(classify(status, &Value::Null), Err(SendError::Status(status)), "{status}");
        }
        assert_eq!(classify(200, &Value::Null), Err(SendError::Status(200)), "a page that is not MCP");
        let hostile = json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32022, "message": "no",
            "data": {"supported": ["2027-03-01\nready", "9999-99-99", "x"]}}});
        assert_eq!(classify(400, &hostile), Ok(Found::OtherRevision(vec!["9999-99-99".into()])));
        let discover_old =
            json!({"jsonrpc": "2.0", "id": 1, "result": {"supportedVersions": ["2027-03-01"]}});
        assert_eq!(classify(200, &discover_old), Err(SendError::Status(200)));
    }

    #[test]
    fn the_message_is_found_in_sse_too() {
        let body = b"id: 1\ndata: \n\nevent: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"supportedVersions\":[\"2026-07-28\"]}}\n\n";
        assert_eq!(classify(200, &message(body, true)), Ok(Found::Modern { legacy_too: false }));
    }
}
