use super::*;
use crate::error::code;
use serde_json::json;

fn modern_headers(method: &str, name: Option<&str>) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert("mcp-protocol-version", MODERN_VERSION.parse().unwrap());
    h.insert("mcp-method", method.parse().unwrap());
    if let Some(n) = name {
        h.insert("mcp-name", n.parse().unwrap());
    }
    h
}

fn body(id: Value, method: &str, mut params: Value) -> Vec<u8> {
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": MODERN_VERSION,
        "io.modelcontextprotocol/clientCapabilities": {},
    });
    serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})).unwrap()
}

fn rejected(headers: &HeaderMap, body: &[u8]) -> Rejection {
    match parse(headers, body) {
        Err(r) => r,
        Ok(m) => panic!("expected a rejection, got {m:?}"),
    }
}

fn rpc_code(r: &Rejection) -> i64 {
    r.error.rpc_error(SUPPORTED_VERSIONS)["code"].as_i64().unwrap()
}

#[test]
fn a_valid_tool_call_becomes_a_call() {
    let h = modern_headers("tools/call", Some("echo"));
    let b = body(json!(3), "tools/call", json!({"name": "echo", "arguments": {"text": "hi"}}));
    let Message::Call(call) = parse(&h, &b).unwrap() else { panic!() };
    assert_eq!(call.method, Method::ToolsCall);
    assert_eq!(call.name.as_deref(), Some("echo"));
    assert_eq!(call.id, json!(3));
    assert!(!call.params.contains_key("_meta"));
}

#[test]
fn envelope_errors() {
    let h = modern_headers("tools/list", None);
    let r = rejected(&h, b"{not json");
    assert_eq!((r.error.status().as_u16(), rpc_code(&r)), (400, code::PARSE_ERROR));
    let r = rejected(&h, b"[]");
    assert_eq!((r.error.status().as_u16(), rpc_code(&r)), (400, code::INVALID_REQUEST));
    assert!(r.id.is_none());
    let r = rejected(&h, br#"{"jsonrpc":"2.0","id":1,"result":{}}"#);
    assert_eq!(rpc_code(&r), code::INVALID_REQUEST);
    assert_eq!(r.id, Some(json!(1)));
}

#[test]
fn notifications_are_acknowledged() {
    let h = HeaderMap::new();
    let m = parse(&h, br#"{"jsonrpc":"2.0","method":"notifications/cancelled"}"#).unwrap();
    assert!(matches!(m, Message::Notification));
}

#[test]
fn header_and_meta_rules_in_conformance_order() {
    // Missing header → -32020.
    let b = body(json!(1), "tools/list", json!({}));
    let r = rejected(&HeaderMap::new(), &b);
    assert_eq!(rpc_code(&r), code::HEADER_MISMATCH);
    // Missing _meta capabilities → -32602.
    let h = modern_headers("tools/list", None);
    let raw = json!({"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{
        "io.modelcontextprotocol/protocolVersion": MODERN_VERSION}}});
    let r = rejected(&h, raw.to_string().as_bytes());
    assert_eq!(rpc_code(&r), code::INVALID_PARAMS);
    // Header ≠ body → -32020, even if the header version is unknown.
    let mut h = modern_headers("tools/list", None);
    h.insert("mcp-protocol-version", "1900-01-01".parse().unwrap());
    let r = rejected(&h, &b);
    assert_eq!(rpc_code(&r), code::HEADER_MISMATCH);
    // Both agree on an unsupported version → -32022 with data.
    let raw = json!({"jsonrpc":"2.0","id":"x","method":"tools/list","params":{"_meta":{
        "io.modelcontextprotocol/protocolVersion": "1900-01-01",
        "io.modelcontextprotocol/clientCapabilities": {}}}});
    let r = rejected(&h, raw.to_string().as_bytes());
    assert_eq!(rpc_code(&r), code::UNSUPPORTED_VERSION);
    assert_eq!(r.id, Some(json!("x")));
    // Mcp-Method mismatch → -32020.
    let h = modern_headers("prompts/list", None);
    assert_eq!(rpc_code(&rejected(&h, &b)), code::HEADER_MISMATCH);
}

#[test]
fn mcp_name_is_checked_with_base64() {
    let b = body(json!(1), "tools/call", json!({"name": "日本"}));
    let h = modern_headers("tools/call", Some("=?base64?5pel5pys?="));
    assert!(parse(&h, &b).is_ok());
    let h = modern_headers("tools/call", Some("other"));
    assert_eq!(rpc_code(&rejected(&h, &b)), code::HEADER_MISMATCH);
    let h = modern_headers("tools/call", None);
    assert_eq!(rpc_code(&rejected(&h, &b)), code::HEADER_MISMATCH);
}

#[test]
fn removed_methods_are_not_found() {
    for m in ["initialize", "ping", "logging/setLevel", "resources/subscribe", "resources/unsubscribe", "x/y"]
    {
        let h = modern_headers(m, None);
        let r = rejected(&h, &body(json!(9), m, json!({})));
        assert_eq!((r.error.status().as_u16(), rpc_code(&r)), (404, code::METHOD_NOT_FOUND), "{m}");
        assert_eq!(r.id, Some(json!(9)));
    }
}

#[test]
fn a_legacy_initialize_learns_the_supported_versions() {
    let raw = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{
        "protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"c","version":"1"}}});
    let r = rejected(&HeaderMap::new(), raw.to_string().as_bytes());
    let err = r.error.rpc_error(SUPPORTED_VERSIONS);
    assert_eq!(err["code"], code::UNSUPPORTED_VERSION);
    assert_eq!(err["data"]["supported"], json!([MODERN_VERSION]));
    assert_eq!(r.error.status(), 400);
}

#[test]
fn log_level_and_progress_token_are_read() {
    let h = modern_headers("tools/list", None);
    let raw = json!({"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{
        "io.modelcontextprotocol/protocolVersion": MODERN_VERSION,
        "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}},
        "io.modelcontextprotocol/logLevel": "warning",
        "progressToken": "p1", "traceparent": "00-ab-cd-01"}}});
    let Message::Call(call) = parse(&h, raw.to_string().as_bytes()).unwrap() else { panic!() };
    assert_eq!(call.meta.log_level, Some(LogLevel::Warning));
    assert_eq!(call.meta.progress_token, Some(json!("p1")));
    assert!(call.meta.declares("elicitation"));
    assert_eq!(call.meta.passthrough.len(), 1);
    let bad = raw.to_string().replace("warning", "loud");
    assert_eq!(rpc_code(&rejected(&h, bad.as_bytes())), code::INVALID_PARAMS);
}

#[test]
fn unusual_envelopes_take_the_general_path() {
    let h = modern_headers("tools/list", None);
    let meta = r#"{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}"#;
    // Escapes in the method, other members.
    for ok in [
        format!(r#"{{"jsonrpc":"2.0","id":1,"method":"tools\/list","params":{meta}}}"#),
        format!(r#"{{"jsonrpc":"2.0","id":"a","method":"tools/list","params":{meta},"extra":[1]}}"#),
    ] {
        let Message::Call(call) = parse(&h, ok.as_bytes()).expect(&ok) else { panic!("{ok}") };
        assert_eq!(call.method, Method::ToolsList, "{ok}");
    }
    // A repeated member is refused (parsers differ on which one counts), the id echoed.
    let twice = format!(r#"{{"jsonrpc":"2.0","id":1,"method":"x","method":"tools/list","params":{meta}}}"#);
    let r = rejected(&h, twice.as_bytes());
    assert_eq!((rpc_code(&r), r.id.clone()), (code::INVALID_REQUEST, Some(json!(1))));
    // Out of I-JSON: a parse error.
    let big = format!(r#"{{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{meta},"x":1e400}}"#);
    assert_eq!(rpc_code(&rejected(&h, big.as_bytes())), code::PARSE_ERROR);
    let r = rejected(&h, br#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":null}"#);
    assert_eq!((rpc_code(&r), r.id.clone()), (code::INVALID_PARAMS, Some(json!(1))));
    let r = rejected(&h, br#"{"jsonrpc":"2.0","id":null,"method":"tools/list","params":{}}"#);
    assert_eq!((rpc_code(&r), r.id.clone()), (code::INVALID_REQUEST, None));
    let r = rejected(&h, br#"{"jsonrpc":"1.0","id":2,"method":"tools/list","params":{}}"#);
    assert_eq!((rpc_code(&r), r.id.clone()), (code::INVALID_REQUEST, Some(json!(2))));
}
