//! What each upstream speaks, found by probing, and modern clients passed
//! through to a modern upstream (its `requestState` sealed in the gateway's
//! envelope).

mod support;

use serde_json::json;
use support::modern::{ModernUpstream, UPSTREAM_STATE};
use support::{Answer, FakeUpstream, Gateway};

#[tokio::test]
async fn a_modern_upstream_is_found_and_calls_pass_through_as_received() {
    let up = ModernUpstream::start().await;
    let gw = Gateway::start_auto(&up.url).await;

    let reply = gw
        .request("tools/call")
        .id(json!("c-1"))
        .params(json!({"name": "stream", "arguments": {"x": 1}}))
        .progress_token(json!("p"))
        .bearer("alice-token")
        .header("mcp-session-id", "stale")
        .send()
        .await;

    assert_eq!(reply.status, 200, "{}", reply.raw);
    assert_eq!(reply.body["id"], "c-1");
    assert_eq!(reply.notes[0]["method"], "notifications/progress", "SSE passed event by event");
    let call = &up.calls()[0];
    assert_eq!(call.headers.get("mcp-method").unwrap(), "tools/call");
    assert_eq!(call.headers.get("mcp-name").unwrap(), "stream");
    assert!(call.headers.get("authorization").is_none(), "credentials never go upstream");
    assert!(call.headers.get("mcp-session-id").is_none());
    let (_, readyz) = gw.get("/readyz").await;
    assert!(readyz.contains("/mcp default: modern"), "{readyz}");
    let (_, metrics) = gw.get("/metrics").await;
    assert!(metrics.contains(r#"generation="modern",upstream="modern""#), "{metrics}");
}

#[tokio::test]
async fn the_upstream_state_travels_sealed_and_comes_back_byte_for_byte() {
    let up = ModernUpstream::start().await;
    let gw = Gateway::start_auto(&up.url).await;
    let ask = || gw.request("tools/call").params(json!({"name": "ask", "arguments": {}})).bearer("alice");

    let first = ask().send().await;
    assert_eq!(first.result()["resultType"], "input_required", "{}", first.raw);
    let sealed = first.result()["requestState"].as_str().unwrap().to_string();
    assert_ne!(sealed, UPSTREAM_STATE, "the client never sees the upstream's own state");
    assert!(!first.raw.contains(UPSTREAM_STATE));

    let retry = |who: &str| {
        gw.request("tools/call")
            .params(json!({"name": "ask", "arguments": {}, "requestState": sealed,
                "inputResponses": {"name": {"action": "accept", "content": {"n": "Ada"}}}}))
            .bearer(who)
    };
    let before = up.calls().len();
    let stolen = retry("mallory").id(json!("steal")).send().await;
    stolen.assert_error(400, -32602, &json!("steal"));
    assert_eq!(stolen.reason(), Some("wrong_principal"));
    assert_eq!(up.calls().len(), before, "nothing sent upstream for another principal");

    let done = retry("alice").send().await;
    assert_eq!(done.result()["content"][0]["text"], format!("state back: {UPSTREAM_STATE}"), "{}", done.raw);
    assert_eq!(up.calls().last().unwrap().body["params"]["requestState"], UPSTREAM_STATE);
}

#[tokio::test]
async fn a_modern_upstreams_own_errors_pass_with_their_code_data_and_status() {
    let up = ModernUpstream::start().await;
    let gw = Gateway::start_auto(&up.url).await;
    let needs = json!({"requiredCapabilities": {"sampling": {}}});
    let fail = |id: i64, code: i64, data: &serde_json::Value| {
        gw.request("tools/call").id(json!(id)).params(json!({"name": "fail", "arguments": {
            "code": code, "message": "as told", "data": data, "status": 400}}))
    };

    let reply = fail(1, -32021, &needs).send().await;
    reply.assert_error(400, -32021, &json!(1));
    assert_eq!(reply.body["error"]["data"], needs);
    let version = json!({"supported": ["2026-07-28"], "requested": "2026-07-28"});
    let reply = fail(2, -32022, &version).send().await;
    reply.assert_error(400, -32022, &json!(2));
    assert_eq!(reply.body["error"]["data"], version);
}

#[tokio::test]
async fn a_legacy_upstream_is_found_legacy_with_one_probe() {
    // The fake answers a request without a session 400, as mcp 1.x does.
    let up = FakeUpstream::new().on("tools/call", Answer::Result(json!({"content": []}))).start().await;
    let gw = Gateway::start_auto(up.url()).await;

    let reply = gw.request("tools/call").params(json!({"name": "x", "arguments": {}})).send().await;

    assert_eq!(reply.status, 200, "{}", reply.raw);
    assert_eq!(reply.result()["resultType"], "complete", "translated onto a legacy session");
    let probes: Vec<_> =
        up.seen().into_iter().filter(|s| s.rpc_method() == Some("server/discover")).collect();
    assert_eq!(probes.len(), 1, "probed once: {}", up.dump());
    assert_eq!(probes[0].status, 400);
    let (_, readyz) = gw.get("/readyz").await;
    assert!(readyz.contains("/mcp default: legacy"), "{readyz}");
}

#[tokio::test]
async fn a_modern_server_of_another_revision_is_refused_and_never_initialized() {
    let up = FakeUpstream::new()
        .on(
            "server/discover",
            Answer::Raw {
                status: 400,
                content_type: "application/json".into(),
                body: json!({"jsonrpc": "2.0", "id": "sessionless-probe", "error": {"code": -32022,
                    "message": "Unsupported protocol version",
                    "data": {"supported": ["2027-06-01"], "requested": "2026-07-28"}}})
                .to_string(),
            },
        )
        .without_session_ids()
        .start()
        .await;
    let gw = Gateway::start_auto(up.url()).await;

    let reply = gw.request("tools/list").id(json!(3)).send().await;

    reply.assert_error(502, -32603, &json!(3));
    assert_eq!(reply.reason(), Some("upstream_refused"));
    assert_eq!(up.initializes(), 0, "never sent initialize");
    let (status, readyz) = gw.get("/readyz").await;
    assert_eq!(status, 200, "one refused route does not take the others out: {readyz}");
    assert!(readyz.contains("refused (speaks 2027-06-01)"), "{readyz}");
}

#[tokio::test]
async fn a_retry_reaches_the_upstream_as_the_client_wrote_it_but_for_the_state() {
    let up = ModernUpstream::start().await;
    let gw = Gateway::start_auto(&up.url).await;
    let first = gw.request("tools/call").params(json!({"name": "ask", "arguments": {}})).send().await;
    let sealed = first.result()["requestState"].as_str().unwrap().to_string();

    // A number no f64 holds, and members in an order of the client's own.
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{{"requestState":"{sealed}","name":"ask","arguments":{{"big":12345678901234567890123,"b":1,"a":2}},"_meta":{{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{{"elicitation":{{}}}}}},"inputResponses":{{"name":{{"action":"decline"}}}}}}}}"#
    );
    let headers = [
        ("content-type", "application/json"),
        ("accept", "application/json, text/event-stream"),
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", "tools/call"),
        ("mcp-name", "ask"),
    ];
    let reply = gw.post_raw(&headers, body.clone()).await;

    assert_eq!(reply.status, 200, "{}", reply.raw);
    let sent = String::from_utf8(up.calls().last().unwrap().raw.to_vec()).unwrap();
    assert_eq!(sent, body.replace(&sealed, UPSTREAM_STATE), "every other byte as the client sent it");
}

#[tokio::test]
async fn a_state_on_sse_or_under_an_escaped_name_is_sealed_too() {
    let up = ModernUpstream::start().await;
    let gw = Gateway::start_auto(&up.url).await;

    for tool in ["ask_sse", "ask_escaped"] {
        let reply = gw.request("tools/call").params(json!({"name": tool, "arguments": {}})).send().await;
        assert_eq!(reply.status, 200, "{tool}: {}", reply.raw);
        assert!(
            !reply.raw.contains(UPSTREAM_STATE),
            "{tool}: the upstream's state reached the client: {}",
            reply.raw
        );
        assert_eq!(reply.result()["resultType"], "input_required", "{tool}");
        assert_eq!(reply.is_sse(), tool == "ask_sse", "{tool}: answered the way the upstream did");
    }
}
