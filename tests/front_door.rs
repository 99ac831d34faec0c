//! The front door over real HTTP: what the gateway refuses before anything
//! reaches the upstream (which must see nothing at all).

mod support;

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use serde_json::{json, Value};
use support::{FakeUpstream, Gateway, Upstream, VERSION};

async fn setup() -> (Upstream, Gateway) {
    let up = FakeUpstream::new().start().await;
    let gw = Gateway::start(up.url()).await;
    (up, gw)
}

fn modern_headers(method: &'static str) -> Vec<(&'static str, &'static str)> {
    vec![
        ("content-type", "application/json"),
        ("accept", "application/json, text/event-stream"),
        ("mcp-protocol-version", VERSION),
        ("mcp-method", method),
    ]
}

fn modern_body(id: Value, method: &str) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": {"_meta": {
        "io.modelcontextprotocol/protocolVersion": VERSION,
        "io.modelcontextprotocol/clientCapabilities": {}}}})
    .to_string()
}

#[tokio::test]
async fn get_is_405() {
    let (up, gw) = setup().await;
    let req = Request::get(gw.url("/mcp"))
        .header("accept", "text/event-stream")
        .body(Full::new(Bytes::new()))
        .unwrap();

    let reply = gw.raw(req).await;

    assert_eq!(reply.status, 405, "{}", reply.raw);
    assert_eq!(reply.header("allow"), Some("POST, GET, DELETE"));
    assert!(up.seen().is_empty(), "{}", up.dump());
}

#[tokio::test]
async fn text_plain_is_415() {
    let (up, gw) = setup().await;
    let mut headers = modern_headers("tools/list");
    headers[0] = ("content-type", "text/plain");

    let reply = gw.post_raw(&headers, modern_body(json!(1), "tools/list")).await;

    assert_eq!(reply.status, 415, "{}", reply.raw);
    assert!(up.seen().is_empty(), "{}", up.dump());
}

#[tokio::test]
async fn body_over_4_mib_is_413() {
    let (up, gw) = setup().await;
    let padding = "p".repeat(4 * 1024 * 1024);
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {
        "padding": padding, "_meta": {
        "io.modelcontextprotocol/protocolVersion": VERSION,
        "io.modelcontextprotocol/clientCapabilities": {}}}})
    .to_string();
    assert!(body.len() > 4 << 20);

    let reply = gw.post_raw(&modern_headers("tools/list"), body).await;

    assert_eq!(reply.status, 413, "{}", reply.raw);
    assert!(up.seen().is_empty(), "{}", up.dump());
    gw.assert_healthy().await;
}

#[tokio::test]
async fn json_array_is_400_invalid_request_with_null_id() {
    let (up, gw) = setup().await;
    let batch = format!("[{}]", modern_body(json!(1), "tools/list"));

    let reply = gw.post_raw(&modern_headers("tools/list"), batch).await;

    reply.assert_error(400, -32600, &Value::Null);
    assert!(up.seen().is_empty(), "{}", up.dump());
}

#[tokio::test]
async fn notification_is_202_with_no_body() {
    let (up, gw) = setup().await;
    let note = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": 1, "_meta": {
        "io.modelcontextprotocol/protocolVersion": VERSION,
        "io.modelcontextprotocol/clientCapabilities": {}}}})
    .to_string();

    let reply = gw.post_raw(&modern_headers("notifications/cancelled"), note).await;

    assert_eq!(reply.status, 202, "{}", reply.raw);
    assert!(reply.raw.is_empty(), "{}", reply.raw);
    assert!(up.seen().is_empty(), "{}", up.dump());
}

#[tokio::test]
async fn foreign_origin_is_403() {
    let (up, gw) = setup().await;
    let mut headers = modern_headers("tools/list");
    headers.push(("origin", "http://evil.example.com"));

    let reply = gw.post_raw(&headers, modern_body(json!(1), "tools/list")).await;

    assert_eq!(reply.status, 403, "{}", reply.raw);
    assert!(up.seen().is_empty(), "{}", up.dump());
}

#[tokio::test]
async fn initialize_with_a_2026_header_stays_404() {
    let (up, gw) = setup().await;

    let reply = gw
        .request("initialize")
        .id(json!(1))
        .header("mcp-session-id", "stale")
        .params(json!({"protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "confused", "version": "1"}}))
        .send()
        .await;

    reply.assert_error(404, -32601, &json!(1));
    assert!(up.seen().is_empty(), "{}", up.dump());
}

#[tokio::test]
async fn removed_method_ping_is_404() {
    let (up, gw) = setup().await;

    let reply = gw.request("ping").id(json!("p-1")).send().await;

    reply.assert_error(404, -32601, &json!("p-1"));
    assert!(up.seen().is_empty(), "{}", up.dump());
}

#[tokio::test]
async fn mcp_name_that_differs_from_the_body_is_400_header_mismatch() {
    let (up, gw) = setup().await;

    let reply = gw
        .request("tools/call")
        .id(json!(9))
        .params(json!({"name": "get_weather", "arguments": {}}))
        .header("mcp-name", "delete_everything")
        .send()
        .await;

    reply.assert_error(400, -32020, &json!(9));
    assert!(up.seen().is_empty(), "{}", up.dump());
}

#[tokio::test]
async fn missing_client_capabilities_is_400_invalid_params() {
    let (up, gw) = setup().await;
    let body = json!({"jsonrpc": "2.0", "id": 10, "method": "tools/list", "params": {"_meta": {
        "io.modelcontextprotocol/protocolVersion": VERSION}}})
    .to_string();

    let reply = gw.post_raw(&modern_headers("tools/list"), body).await;

    reply.assert_error(400, -32602, &json!(10));
    assert!(up.seen().is_empty(), "{}", up.dump());
}

#[tokio::test]
async fn unsupported_modern_version_is_400_with_the_supported_list() {
    let (up, gw) = setup().await;
    let body = json!({"jsonrpc": "2.0", "id": 11, "method": "tools/list", "params": {"_meta": {
        "io.modelcontextprotocol/protocolVersion": "1900-01-01",
        "io.modelcontextprotocol/clientCapabilities": {}}}})
    .to_string();
    let mut headers = modern_headers("tools/list");
    headers[2] = ("mcp-protocol-version", "1900-01-01");

    let reply = gw.post_raw(&headers, body).await;

    reply.assert_error(400, -32022, &json!(11));
    assert_eq!(reply.body["error"]["data"]["supported"], json!(["2026-07-28"]));
    assert!(up.seen().is_empty(), "{}", up.dump());
}

#[tokio::test]
async fn foreign_host_is_403() {
    let (up, gw) = setup().await;
    let mut headers = modern_headers("tools/list");
    headers.push(("host", "evil.example.com"));

    let reply = gw.post_raw(&headers, modern_body(json!(1), "tools/list")).await;

    assert_eq!(reply.status, 403, "{}", reply.raw);
    assert!(up.seen().is_empty(), "{}", up.dump());
}

#[tokio::test]
async fn health_and_readiness_answer_without_an_upstream() {
    let gw = Gateway::start(&support::closed_port_url().await).await;

    assert_eq!(gw.get("/healthz").await.0, 200);
    assert_eq!(gw.get("/readyz").await.0, 200);
    assert_eq!(gw.get("/nowhere").await.0, 404);
}
