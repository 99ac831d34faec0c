//! The demo server's 2026-07-28 mode on a real socket: direct, and behind
//! the gateway (probed as modern, passed through, `ask_user`'s
//! `requestState` sealed by the gateway and handed back).

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::Generation;

const V: &str = "2026-07-28";

struct Demo {
    url: String,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<std::io::Result<()>>,
}

async fn start() -> Demo {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    let (stop, stopped) = oneshot::channel::<()>();
    let shutdown = async move {
        let _ = stopped.await;
    };
    let task = tokio::spawn(super::serve_generation(listener, shutdown, Generation::Modern));
    Demo { url, stop: Some(stop), task }
}

impl Demo {
    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let served = tokio::time::timeout(Duration::from_secs(10), self.task).await;
        served.expect("serve returns after shutdown").unwrap().unwrap();
    }
}

/// One answer: status, content type, body text, and the JSON-RPC message
/// (the body, or the last SSE event carrying a result or an error).
struct Answer {
    status: StatusCode,
    content_type: String,
    raw: String,
    msg: Value,
    /// SSE notifications before the message.
    notes: Vec<Value>,
}

fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

async fn send(url: &str, method: Method, headers: &[(&str, &str)], body: String) -> Answer {
    let mut req = Request::builder()
        .method(method)
        .uri(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = client().request(req.body(Full::new(Bytes::from(body))).unwrap()).await.unwrap();
    let status = resp.status();
    let content_type =
        resp.headers().get("content-type").map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default();
    let raw = String::from_utf8(resp.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap();
    let (mut msg, mut notes) = (Value::Null, Vec::new());
    if content_type.starts_with("text/event-stream") {
        for event in raw.split("\n\n").filter(|e| !e.trim().is_empty()) {
            assert!(!event.contains("id:"), "2026 SSE events carry no id: {event}");
            let data = event.lines().find_map(|l| l.strip_prefix("data: ")).unwrap();
            let v: Value = serde_json::from_str(data).unwrap();
            if v.get("result").is_some() || v.get("error").is_some() {
                msg = v;
            } else {
                notes.push(v);
            }
        }
    } else if content_type.starts_with("application/json") {
        msg = serde_json::from_str(&raw).unwrap();
    }
    Answer { status, content_type, raw, msg, notes }
}

fn meta(caps: Value) -> Value {
    json!({"io.modelcontextprotocol/protocolVersion": V, "io.modelcontextprotocol/clientCapabilities": caps})
}

/// A well-formed 2026 request: headers mirrored from the body.
async fn modern(url: &str, id: Value, method: &str, mut params: Value, extra: &[(&str, &str)]) -> Answer {
    if params.get("_meta").is_none() {
        params["_meta"] = meta(json!({}));
    }
    let name = params["name"].as_str().map(str::to_owned);
    let mut headers = vec![("mcp-protocol-version", V), ("mcp-method", method)];
    if let Some(name) = name.as_deref() {
        headers.push(("mcp-name", name));
    }
    // An extra header replaces the mirrored one of the same name.
    headers.retain(|(k, _)| !extra.iter().any(|(e, _)| e == k));
    headers.extend_from_slice(extra);
    let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string();
    send(url, Method::POST, &headers, body).await
}

/// `ask_user`'s params for a client that declared elicitation, with `extra` members.
fn ask(extra: Value) -> Value {
    let mut params = json!({"name": "ask_user", "arguments": {"question": "colour?"},
        "_meta": meta(json!({"elicitation": {}}))});
    if let Value::Object(m) = extra {
        params.as_object_mut().unwrap().extend(m);
    }
    params
}

fn assert_error(a: &Answer, status: u16, code: i64) {
    assert_eq!(a.status.as_u16(), status, "{}", a.raw);
    assert_eq!(a.msg["error"]["code"], code, "{}", a.raw);
}

#[tokio::test]
async fn answers_discover_and_tools_without_a_session() {
    let demo = start().await;
    let url = &demo.url;

    let d = modern(url, json!("d"), "server/discover", json!({}), &[]).await;
    assert_eq!(d.status, StatusCode::OK, "{}", d.raw);
    assert_eq!(d.content_type, "application/json");
    let r = &d.msg["result"];
    assert_eq!(d.msg["id"], "d");
    assert_eq!(r["resultType"], "complete");
    assert_eq!(r["supportedVersions"], json!([V]));
    assert!(r["capabilities"]["tools"].is_object());
    assert_eq!(r["_meta"]["io.modelcontextprotocol/serverInfo"]["name"], "sessionless-demo");
    assert_eq!(r["cacheScope"], "public");
    assert!(r["ttlMs"].as_u64().unwrap() > 0);

    let list = modern(url, json!(1), "tools/list", json!({}), &[]).await;
    assert_eq!(list.msg["result"]["resultType"], "complete");
    let names: Vec<&str> =
        list.msg["result"]["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["echo", "add", "slow", "fail", "ask_user"]);

    let echo =
        modern(url, json!(2), "tools/call", json!({"name": "echo", "arguments": {"text": "hé \"q\""}}), &[])
            .await;
    assert_eq!(echo.status, StatusCode::OK, "{}", echo.raw);
    assert!(echo.raw.contains(r#""resultType":"complete""#), "{}", echo.raw);
    assert_eq!(echo.msg["id"], 2);
    assert_eq!(echo.msg["result"]["content"], json!([{"type": "text", "text": "hé \"q\""}]));
    assert_eq!(echo.msg["result"]["_meta"]["io.modelcontextprotocol/serverInfo"]["name"], "sessionless-demo");

    let add =
        modern(url, json!(3), "tools/call", json!({"name": "add", "arguments": {"a": 2, "b": 40}}), &[])
            .await;
    assert_eq!(add.msg["result"]["structuredContent"], json!({"sum": 42}));
    assert_eq!(add.msg["result"]["resultType"], "complete");
    let failed = modern(url, json!(4), "tools/call", json!({"name": "fail", "arguments": {}}), &[]).await;
    assert_eq!(failed.msg["result"]["isError"], true);
    let unknown = modern(url, json!(5), "tools/call", json!({"name": "counter", "arguments": {}}), &[]).await;
    assert_error(&unknown, 200, -32602);
    let bad_args = modern(url, json!(6), "tools/call", json!({"name": "echo", "arguments": {}}), &[]).await;
    assert_error(&bad_args, 200, -32602);
    // A stale session id is ignored, never echoed.
    let stale = modern(url, json!(7), "tools/list", json!({}), &[("mcp-session-id", "old")]).await;
    assert_eq!(stale.status, StatusCode::OK);
    demo.stop().await;
}

#[tokio::test]
async fn refuses_what_a_2026_only_server_refuses() {
    let demo = start().await;
    let url = &demo.url;

    // A legacy client: no 2026 markers at all.
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}});
    let legacy = send(url, Method::POST, &[], init.to_string()).await;
    assert_error(&legacy, 400, -32022);
    assert_eq!(legacy.msg["id"], 0);
    assert_eq!(legacy.msg["error"]["data"]["supported"], json!([V]));
    assert_eq!(legacy.msg["error"]["data"]["requested"], "2025-11-25");
    let old_header = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).to_string();
    let old = send(url, Method::POST, &[("mcp-protocol-version", "2025-11-25")], old_header).await;
    assert_error(&old, 400, -32022);
    assert_eq!(old.msg["error"]["data"]["supported"], json!([V]));

    // Removed methods, with the markers.
    for method in ["initialize", "ping", "logging/setLevel", "resources/subscribe"] {
        let gone = modern(url, json!(2), method, json!({}), &[]).await;
        assert_error(&gone, 404, -32601);
    }
    for method in [Method::GET, Method::DELETE] {
        let a = send(url, method, &[("mcp-protocol-version", V)], String::new()).await;
        assert_eq!(a.status, StatusCode::METHOD_NOT_ALLOWED);
    }

    // `_meta` missing, or without capabilities.
    let no_meta = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list", "params": {}}).to_string();
    let headers = [("mcp-protocol-version", V), ("mcp-method", "tools/list")];
    assert_error(&send(url, Method::POST, &headers, no_meta).await, 400, -32602);
    let no_caps = json!({"jsonrpc": "2.0", "id": 4, "method": "tools/list", "params": {"_meta": {
        "io.modelcontextprotocol/protocolVersion": V}}})
    .to_string();
    assert_error(&send(url, Method::POST, &headers, no_caps).await, 400, -32602);

    // Header mismatches: Mcp-Method, Mcp-Name, versions; base64 names decode.
    let wrong_method = modern(url, json!(5), "tools/list", json!({}), &[("mcp-method", "tools/call")]).await;
    assert_error(&wrong_method, 400, -32020);
    let twice = [("mcp-protocol-version", V), ("mcp-method", "tools/list"), ("mcp-method", "tools/list")];
    let body =
        json!({"jsonrpc": "2.0", "id": 5, "method": "tools/list", "params": {"_meta": meta(json!({}))}});
    assert_error(&send(url, Method::POST, &twice, body.to_string()).await, 400, -32020);
    let body =
        json!({"jsonrpc": "2.0", "id": 6, "method": "tools/list", "params": {"_meta": meta(json!({}))}});
    let no_method = send(url, Method::POST, &[("mcp-protocol-version", V)], body.to_string()).await;
    assert_error(&no_method, 400, -32020);
    let no_header = send(url, Method::POST, &[("mcp-method", "tools/list")], body.to_string()).await;
    assert_error(&no_header, 400, -32020);
    let versions = send(
        url,
        Method::POST,
        &[("mcp-protocol-version", "2027-01-01"), ("mcp-method", "tools/list")],
        body.to_string(),
    )
    .await;
    assert_error(&versions, 400, -32020);
    let call = json!({"name": "echo", "arguments": {"text": "x"}});
    let wrong_name = modern(url, json!(7), "tools/call", call.clone(), &[("mcp-name", "add")]).await;
    assert_error(&wrong_name, 400, -32020);
    let b64 = modern(url, json!(8), "tools/call", call, &[("mcp-name", "=?base64?ZWNobw==?=")]).await;
    assert_eq!(b64.status, StatusCode::OK, "{}", b64.raw);
    let batch = send(url, Method::POST, &headers, format!("[{body}]")).await;
    assert_error(&batch, 400, -32600);
    demo.stop().await;
}

#[tokio::test]
async fn ask_user_is_a_multi_round_trip_request() {
    let demo = start().await;
    let url = &demo.url;

    let first = modern(url, json!(1), "tools/call", ask(json!({})), &[]).await;
    let r = &first.msg["result"];
    assert_eq!(r["resultType"], "input_required", "{}", first.raw);
    assert_eq!(r["inputRequests"]["elicitation_1"]["method"], "elicitation/create");
    assert_eq!(r["inputRequests"]["elicitation_1"]["params"]["message"], "colour?");
    let state = r["requestState"].as_str().unwrap().to_owned();

    let answer = json!({"elicitation_1": {"action": "accept", "content": {"answer": "blue"}}});
    let done = modern(
        url,
        json!(2),
        "tools/call",
        ask(json!({"requestState": state, "inputResponses": answer})),
        &[],
    )
    .await;
    assert_eq!(done.msg["result"]["resultType"], "complete", "{}", done.raw);
    assert_eq!(done.msg["result"]["content"][0]["text"], "you answered: blue");

    // Without the answer: asked again (a new round).
    let again = modern(url, json!(3), "tools/call", ask(json!({"requestState": state})), &[]).await;
    assert_eq!(again.msg["result"]["resultType"], "input_required");
    // Tampered, or for another question: an error.
    let tampered = format!("{}x", &state[..state.len() - 1]);
    let bad = modern(
        url,
        json!(4),
        "tools/call",
        ask(json!({"requestState": tampered, "inputResponses": answer})),
        &[],
    )
    .await;
    assert_error(&bad, 200, -32602);
    let mut other = ask(json!({"requestState": state, "inputResponses": answer}));
    other["arguments"]["question"] = json!("size?");
    assert_error(&modern(url, json!(5), "tools/call", other, &[]).await, 200, -32602);
    // No elicitation capability declared: -32021.
    let mut undeclared = ask(json!({}));
    undeclared["_meta"] = meta(json!({}));
    let refused = modern(url, json!(6), "tools/call", undeclared, &[]).await;
    assert_error(&refused, 400, -32021);
    assert_eq!(refused.msg["error"]["data"]["requiredCapabilities"], json!({"elicitation": {}}));
    demo.stop().await;
}

#[tokio::test]
async fn slow_streams_progress_without_event_ids() {
    let demo = start().await;
    let mut m = meta(json!({}));
    m["progressToken"] = json!("p");
    m["io.modelcontextprotocol/logLevel"] = json!("info");
    let params = json!({"name": "slow", "arguments": {"steps": 2, "delay_ms": 1}, "_meta": m});
    let a = modern(&demo.url, json!("s"), "tools/call", params, &[]).await;
    assert_eq!(a.content_type, "text/event-stream");
    let methods: Vec<&str> = a.notes.iter().map(|n| n["method"].as_str().unwrap()).collect();
    assert_eq!(
        methods,
        [
            "notifications/progress",
            "notifications/message",
            "notifications/progress",
            "notifications/message"
        ]
    );
    assert_eq!(a.msg["id"], "s");
    assert_eq!(a.msg["result"]["resultType"], "complete");
    assert_eq!(a.msg["result"]["content"][0]["text"], "slow finished 2 steps");
    demo.stop().await;
}

/// The gateway in front of the modern demo: probed as modern, `echo` passed
/// through, `ask_user`'s state sealed on the way out and opened on the retry.
#[tokio::test]
async fn the_gateway_passes_modern_clients_through() {
    let demo = start().await;
    let config = crate::config::Config::single(&demo.url, "127.0.0.1:0".parse().unwrap()).unwrap();
    let gw = crate::run(config).await.unwrap();
    let url = gw.url("/mcp");

    let echo =
        modern(&url, json!("e"), "tools/call", json!({"name": "echo", "arguments": {"text": "hi"}}), &[])
            .await;
    assert_eq!(echo.status, StatusCode::OK, "{}", echo.raw);
    assert_eq!(echo.msg["id"], "e");
    assert_eq!(echo.msg["result"]["resultType"], "complete");
    assert_eq!(echo.msg["result"]["content"][0]["text"], "hi");
    let readyz = client().get(gw.url("/readyz").parse().unwrap()).await.unwrap();
    let readyz = String::from_utf8(readyz.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap();
    assert!(readyz.contains("/mcp default: modern"), "{readyz}");
    let metrics = client().get(gw.url("/metrics").parse().unwrap()).await.unwrap();
    let metrics =
        String::from_utf8(metrics.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap();
    assert!(metrics.contains(r#"generation="modern",upstream="modern""#), "{metrics}");

    let first =
        modern(&url, json!(1), "tools/call", ask(json!({})), &[("authorization", "Bearer alice")]).await;
    assert_eq!(first.msg["result"]["resultType"], "input_required", "{}", first.raw);
    assert_eq!(first.msg["result"]["inputRequests"]["elicitation_1"]["params"]["message"], "colour?");
    let sealed = first.msg["result"]["requestState"].as_str().unwrap().to_owned();
    // The demo's own state is `<expiry>.<tag>`; the client sees the gateway's envelope.
    let (head, _) = sealed.split_once('.').unwrap_or((&sealed, ""));
    assert!(head.parse::<u64>().is_err(), "the upstream's state is sealed: {sealed}");

    let answer = json!({"elicitation_1": {"action": "accept", "content": {"answer": "x"}}});
    let retry = |who: &'static str| {
        let params = ask(json!({"requestState": sealed, "inputResponses": answer}));
        let url = url.clone();
        async move { modern(&url, json!(2), "tools/call", params, &[("authorization", who)]).await }
    };
    let stolen = retry("Bearer mallory").await;
    assert_error(&stolen, 400, -32602);
    let done = retry("Bearer alice").await;
    assert_eq!(done.status, StatusCode::OK, "{}", done.raw);
    assert_eq!(done.msg["result"]["resultType"], "complete");
    assert_eq!(done.msg["result"]["content"][0]["text"], "you answered: x");

    gw.shutdown().await;
    demo.stop().await;
}
