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
    let stolen = retry("mallory").send().await;
    stolen.assert_error(400, -32602, &stolen.body["id"].clone());
    assert_eq!(stolen.reason(), Some("wrong_principal"));
    assert_eq!(up.calls().len(), before, "nothing sent upstream for another principal");

    let done = retry("alice").send().await;
    assert_eq!(done.result()["content"][0]["text"], format!("state back: {UPSTREAM_STATE}"), "{}", done.raw);
    assert_eq!(up.calls().last().unwrap().body["params"]["requestState"], UPSTREAM_STATE);
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
    assert_eq!(status, 503, "{readyz}");
    assert!(readyz.contains("refused (speaks 2027-06-01)"), "{readyz}");
}
