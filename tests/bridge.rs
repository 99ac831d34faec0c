//! The legacy bridge end to end: modern requests in, legacy session traffic
//! out to a fake upstream, modern answers back.

mod support;
use support::single_route;

use serde_json::{json, Value};
use support::{Answer, FakeUpstream, Gateway, Step};

const SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";
const TRACEPARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

#[tokio::test]
async fn tools_call_json_result_is_shaped_and_session_state_stays_hidden() {
    let up = FakeUpstream::new()
        .on("tools/call", Answer::Result(json!({"content": [{"type": "text", "text": "sunny"}]})))
        .start()
        .await;
    let gw = Gateway::start(up.url()).await;

    let reply = gw
        .request("tools/call")
        .id(json!("client-id-42"))
        .params(json!({"name": "weather", "arguments": {"city": "Paris"}}))
        .header("mcp-session-id", "client-stale-session")
        .header("last-event-id", "client-stale-event")
        .bearer("client-secret-token")
        .meta("traceparent", json!(TRACEPARENT))
        .send()
        .await;

    assert_eq!(reply.status, 200, "{}", reply.raw);
    assert_eq!(reply.body["id"], "client-id-42");
    let result = reply.result();
    assert_eq!(result["resultType"], "complete");
    assert_eq!(result["_meta"][SERVER_INFO], json!({"name": "fake-upstream", "version": "9.9.9"}));
    assert_eq!(result["content"][0]["text"], "sunny");
    assert!(result.get("ttlMs").is_none(), "tools/call is not cacheable");
    assert!(reply.header("mcp-session-id").is_none());
    assert!(!reply.raw.contains("fake-session"), "{}", reply.raw);

    let calls = up.calls("tools/call");
    assert_eq!(calls.len(), 1, "{}", up.dump());
    let sent = &calls[0];
    assert_ne!(sent.body["id"], json!("client-id-42"), "the gateway mints ids");
    assert!(sent.body["id"].is_number() || sent.body["id"].is_string());
    assert_eq!(sent.body["params"]["name"], "weather");
    assert_eq!(sent.body["params"]["arguments"], json!({"city": "Paris"}));
    let meta = sent.body["params"]["_meta"].clone();
    assert!(
        meta.get("io.modelcontextprotocol/protocolVersion").is_none()
            && meta.get("io.modelcontextprotocol/clientCapabilities").is_none(),
        "modern-only _meta keys are stripped: {meta}"
    );
    // The client's trace, with the gateway's hop as the parent (tests/observability.rs).
    let sent_trace = meta["traceparent"].as_str().unwrap_or_default();
    assert_eq!(sent_trace[..36], TRACEPARENT[..36], "traceparent is propagated: {meta}");
    assert_ne!(sent_trace, TRACEPARENT, "with the gateway's span id");
    assert_eq!(sent.header("traceparent"), Some(sent_trace), "and as a header");
    assert!(sent.session().unwrap().starts_with("fake-session-"));
    for seen in up.seen() {
        assert_ne!(seen.session(), Some("client-stale-session"), "{seen:?}");
        assert!(seen.header("last-event-id").is_none(), "{seen:?}");
        assert!(seen.header("authorization").is_none(), "{seen:?}");
    }
}

#[tokio::test]
async fn tools_list_result_carries_cache_fields() {
    let up = FakeUpstream::new()
        .on(
            "tools/list",
            Answer::Result(json!({"tools": [{"name": "echo", "inputSchema": {"type": "object"}}]})),
        )
        .start()
        .await;
    let gw = Gateway::start(up.url()).await;

    let reply = gw.request("tools/list").id(json!(3)).send().await;

    assert_eq!(reply.status, 200, "{}", reply.raw);
    assert_eq!(reply.body["id"], 3);
    let result = reply.result();
    assert_eq!(result["resultType"], "complete");
    assert_eq!(result["ttlMs"], 0);
    assert_eq!(result["cacheScope"], "private");
    assert_eq!(result["tools"][0]["name"], "echo");
    assert_eq!(result["_meta"][SERVER_INFO]["name"], "fake-upstream");
    let sent = &up.calls("tools/list")[0];
    assert_ne!(sent.body["id"], json!(3), "the gateway mints ids");
}

#[tokio::test]
async fn sse_answer_forwards_only_what_the_client_asked_for() {
    let up = FakeUpstream::new()
        .on(
            "tools/call",
            Answer::Sse(vec![
                Step::prime("ev-0"),
                Step::progress(0.25),
                Step::log("info", "chatter below the requested level"),
                Step::log("error", "disk almost full"),
                Step::notify("notifications/resources/list_changed", json!({})),
                Step::ask(json!(900), "ping", json!({})),
                Step::await_response(json!(900)),
                Step::result(json!({"content": [{"type": "text", "text": "done"}]})),
            ]),
        )
        .start()
        .await;
    let gw = Gateway::start(up.url()).await;

    let reply = gw
        .request("tools/call")
        .id(json!(7))
        .params(json!({"name": "slow", "arguments": {}}))
        .progress_token(json!("client-token"))
        .log_level("warning")
        .send()
        .await;

    assert_eq!(reply.status, 200, "{}", reply.raw);
    assert!(reply.is_sse(), "{:?}", reply.headers);
    assert_eq!(reply.header("x-accel-buffering"), Some("no"));
    assert_eq!(reply.notes.len(), 2, "notes: {:#?}", reply.notes);
    let progress = &reply.notes[0];
    assert_eq!(progress["method"], "notifications/progress");
    assert_eq!(progress["params"]["progressToken"], "client-token");
    assert_eq!(progress["params"]["progress"], 0.25);
    let log = &reply.notes[1];
    assert_eq!(log["method"], "notifications/message");
    assert_eq!(log["params"]["level"], "error");
    assert_eq!(log["params"]["data"], "disk almost full");
    assert_eq!(reply.body["id"], 7);
    assert_eq!(reply.result()["resultType"], "complete");
    assert_eq!(reply.result()["content"][0]["text"], "done");

    let call = up.calls("tools/call").remove(0);
    let upstream_token = &call.body["params"]["_meta"]["progressToken"];
    assert!(!upstream_token.is_null(), "a progress token goes upstream");
    assert_ne!(upstream_token, &json!("client-token"), "the gateway mints tokens");
    let pong = up
        .responses()
        .into_iter()
        .find(|r| r.body["id"] == json!(900))
        .unwrap_or_else(|| panic!("the gateway answers the upstream ping:\n{}", up.dump()));
    assert_eq!(pong.body["result"], json!({}));
    assert_eq!(pong.session(), call.session());
}

#[tokio::test]
async fn client_disconnect_cancels_the_upstream_request() {
    let up = FakeUpstream::new()
        .on("tools/call", Answer::Sse(vec![Step::progress(0.1), Step::hang()]))
        .start()
        .await;
    let gw = Gateway::start(up.url()).await;

    let mut events = gw
        .request("tools/call")
        .id(json!("will-leave"))
        .params(json!({"name": "forever", "arguments": {}}))
        .progress_token(json!(1))
        .open()
        .await;
    assert_eq!(events.status, 200);
    let first = events.next().await.expect("a progress event");
    assert_eq!(first["method"], "notifications/progress");
    drop(events);

    let cancelled =
        up.wait_for("notifications/cancelled", |s| s.rpc_method() == Some("notifications/cancelled")).await;
    let call = up.calls("tools/call").remove(0);
    assert_eq!(cancelled.body["params"]["requestId"], call.body["id"]);
    assert_ne!(cancelled.body["params"]["requestId"], json!("will-leave"));
    assert_eq!(cancelled.session(), call.session());
    assert_eq!(gw.settled_metric("sessionless_upstream_cancellations_total", 1.0).await, 1.0);
    gw.assert_healthy().await;
}

#[tokio::test]
async fn resource_not_found_maps_to_invalid_params() {
    let up = FakeUpstream::new()
        .on("resources/read", Answer::Error(-32002, "Resource not found".into()))
        .start()
        .await;
    let gw = Gateway::start(up.url()).await;

    let reply = gw
        .request("resources/read")
        .id(json!("r-1"))
        .params(json!({"uri": "file:///missing.txt"}))
        .send()
        .await;

    reply.assert_error(200, -32602, &json!("r-1"));
    assert_eq!(up.calls("resources/read").len(), 1);
}

#[tokio::test]
async fn a_missing_capability_error_in_its_shape_reaches_the_client_with_its_code_data_and_status() {
    let needs = json!({"requiredCapabilities": {"sampling": {}}});
    let up = FakeUpstream::new()
        .on("tools/call", Answer::ErrorData(-32021, "This tool samples".into(), needs.clone()))
        .on("prompts/get", Answer::Sse(vec![Step::error_data(-32021, "This prompt samples", needs.clone())]))
        .start()
        .await;
    let gw = Gateway::start(up.url()).await;

    let reply = gw.request("tools/call").id(json!(31)).params(json!({"name": "summarise"})).send().await;
    reply.assert_error(400, -32021, &json!(31));
    assert_eq!(reply.body["error"]["message"], "This tool samples");
    assert_eq!(reply.body["error"]["data"], needs);
    // The same on the upstream's SSE answer.
    let reply = gw.request("prompts/get").id(json!(32)).params(json!({"name": "p"})).send().await;
    reply.assert_error(400, -32021, &json!(32));
    assert_eq!(reply.body["error"]["data"], needs);
}

#[tokio::test]
async fn a_missing_capability_error_out_of_shape_is_an_internal_error_as_before() {
    let up = FakeUpstream::new()
        .on("tools/call", Answer::ErrorData(-32021, "needs sampling".into(), json!("sampling")))
        .on("prompts/get", Answer::Error(-32021, "needs something".into()))
        .start()
        .await;
    let gw = Gateway::start(up.url()).await;

    let reply = gw.request("tools/call").id(json!(33)).params(json!({"name": "summarise"})).send().await;
    reply.assert_error(200, -32603, &json!(33));
    assert_eq!(reply.body["error"]["data"], "sampling", "data kept: {}", reply.raw);
    let reply = gw.request("prompts/get").id(json!(34)).params(json!({"name": "p"})).send().await;
    reply.assert_error(200, -32603, &json!(34));
}

#[tokio::test]
async fn upstream_method_not_found_is_a_404() {
    // The fake answers methods it has no script for with -32601.
    let up = FakeUpstream::new().start().await;
    let gw = Gateway::start(up.url()).await;

    let reply = gw.request("prompts/list").id(json!(21)).send().await;

    reply.assert_error(404, -32601, &json!(21));
    assert_eq!(up.calls("prompts/list").len(), 1);
}

fn paged_tools(req: &Value) -> Answer {
    match req.pointer("/params/cursor").and_then(Value::as_str) {
        None => Answer::Result(json!({"tools": [{"name": "a", "inputSchema": {"type": "object"}}],
            "nextCursor": "upstream-page-2"})),
        Some("upstream-page-2") => {
            Answer::Result(json!({"tools": [{"name": "b", "inputSchema": {"type": "object"}}]}))
        }
        Some(_) => Answer::Error(-32602, "Invalid cursor".into()),
    }
}

#[tokio::test]
async fn pagination_cursors_are_sealed_and_pinned_to_their_session() {
    let up = FakeUpstream::new().on_fn("tools/list", paged_tools).start().await;
    let gw = Gateway::start(up.url()).await;

    let page1 = gw.request("tools/list").id(json!(1)).send().await;
    assert_eq!(page1.status, 200, "{}", page1.raw);
    assert_eq!(page1.result()["tools"][0]["name"], "a");
    let sealed = page1.result()["nextCursor"].as_str().expect("a next cursor").to_string();
    assert_ne!(sealed, "upstream-page-2");
    assert!(!sealed.contains("upstream-page-2"));

    let page2 = gw.request("tools/list").id(json!(2)).params(json!({"cursor": sealed})).send().await;
    assert_eq!(page2.status, 200, "{}", page2.raw);
    assert_eq!(page2.body["id"], 2);
    assert_eq!(page2.result()["tools"][0]["name"], "b");
    assert!(page2.result().get("nextCursor").is_none());

    let lists = up.calls("tools/list");
    assert_eq!(lists.len(), 2, "{}", up.dump());
    assert_eq!(lists[1].body["params"]["cursor"], "upstream-page-2");
    assert_eq!(lists[1].session(), lists[0].session());

    let tampered = tamper(&sealed);
    let reply = gw.request("tools/list").id(json!(3)).params(json!({"cursor": tampered})).send().await;
    reply.assert_error(400, -32602, &json!(3));
    assert_eq!(up.calls("tools/list").len(), 2, "a bad cursor never goes upstream");
}

/// Changes one character in the middle of a base64url string.
fn tamper(sealed: &str) -> String {
    let mut chars: Vec<char> = sealed.chars().collect();
    let mid = chars.len() / 2;
    chars[mid] = if chars[mid] == 'A' { 'B' } else { 'A' };
    chars.into_iter().collect()
}

#[tokio::test]
async fn discover_is_answered_from_the_cached_initialize_result() {
    let up = FakeUpstream::new().start().await;
    let gw = Gateway::start(up.url()).await;

    let first = gw.request("server/discover").id(json!("d-1")).send().await;
    let second = gw.request("server/discover").id(json!("d-2")).send().await;

    assert_eq!(first.status, 200, "{}", first.raw);
    assert_eq!(first.body["id"], "d-1");
    let result = first.result();
    assert_eq!(result["resultType"], "complete");
    assert_eq!(result["supportedVersions"], json!(["2026-07-28"]));
    assert_eq!(result["capabilities"]["tools"], json!({"listChanged": true}));
    assert_eq!(result["_meta"][SERVER_INFO]["name"], "fake-upstream");
    assert!(result["ttlMs"].is_u64() && result["cacheScope"].is_string(), "{result}");
    assert_eq!(second.status, 200);
    assert_eq!(second.body["id"], "d-2");
    assert_eq!(up.initializes(), 1, "{}", up.dump());
    assert_eq!(up.seen().len(), 2, "initialize + initialized only: {}", up.dump());
}

/// Echoes the call's arguments back after a pause, so that calls overlap.
fn echo_slowly(req: &Value) -> Answer {
    Answer::Sse(vec![
        Step::progress(0.5),
        Step::sleep_ms(100),
        Step::result(json!({"content": [], "structuredContent": req["params"]["arguments"]})),
    ])
}

#[tokio::test]
async fn concurrent_calls_on_one_session_get_their_own_answers() {
    let up = FakeUpstream::new().on_fn("tools/call", echo_slowly).start().await;
    let gw = Gateway::start(up.url()).await;

    let calls = (0..5).map(|n| {
        gw.request("tools/call")
            .id(json!(n))
            .params(json!({"name": "echo", "arguments": {"n": n}}))
            .progress_token(json!(format!("tok-{n}")))
            .send()
    });
    let replies = futures_util::future::join_all(calls).await;

    for (n, reply) in replies.iter().enumerate() {
        assert_eq!(reply.status, 200, "{}", reply.raw);
        assert_eq!(reply.body["id"], n);
        assert_eq!(reply.result()["structuredContent"]["n"], n);
        assert_eq!(reply.notes.len(), 1, "{:#?}", reply.notes);
        assert_eq!(reply.notes[0]["params"]["progressToken"], format!("tok-{n}"));
    }
    let sent = up.calls("tools/call");
    assert_eq!(sent.len(), 5);
    let mut ids: Vec<String> = sent.iter().map(|s| s.body["id"].to_string()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 5, "minted ids are unique on the session");
    assert!(sent.iter().all(|s| s.session() == sent[0].session()));
    assert_eq!(up.initializes(), 1, "{}", up.dump());
}

fn quick_keepalive() -> String {
    single_route("", "[server]\nkeepalive_interval_ms = 50")
}

#[tokio::test]
async fn long_calls_are_kept_alive_with_sse_comments() {
    let up = FakeUpstream::new()
        .on(
            "tools/call",
            Answer::Sse(vec![
                Step::sleep_ms(300),
                Step::result(json!({"content": [{"type": "text", "text": "late"}]})),
            ]),
        )
        .start()
        .await;
    let gw = Gateway::from_toml(&quick_keepalive(), up.url()).await;

    let reply =
        gw.request("tools/call").id(json!(4)).params(json!({"name": "slow", "arguments": {}})).send().await;

    assert_eq!(reply.status, 200, "{}", reply.raw);
    assert!(reply.is_sse(), "{:?}", reply.headers);
    assert!(reply.raw.contains(": keep-alive"), "{}", reply.raw);
    assert!(reply.notes.is_empty(), "{:#?}", reply.notes);
    assert_eq!(reply.body["id"], 4);
    assert_eq!(reply.result()["content"][0]["text"], "late");
}

#[tokio::test]
async fn a_cursor_is_refused_to_another_principal() {
    let up = FakeUpstream::new().on_fn("tools/list", paged_tools).start().await;
    let gw = Gateway::start(up.url()).await;
    let page1 = gw.request("tools/list").bearer("alice").send().await;
    let cursor = page1.result()["nextCursor"].as_str().unwrap().to_string();

    let stolen = gw
        .request("tools/list")
        .id(json!("bob-2"))
        .bearer("bob")
        .params(json!({"cursor": cursor}))
        .send()
        .await;

    stolen.assert_error(400, -32602, &json!("bob-2"));
    assert_eq!(up.calls("tools/list").len(), 1, "{}", up.dump());
}

/// A tool whose `region` argument must be mirrored in `Mcp-Param-Region`.
const REGION_TOOL: &str = "regional";

#[tokio::test]
async fn mcp_param_headers_are_checked_against_the_tool_schema() {
    let up = FakeUpstream::new()
        .on(
            "tools/list",
            Answer::Result(json!({"tools": [{"name": REGION_TOOL, "inputSchema": {
                "type": "object",
                "properties": {"region": {"type": "string", "x-mcp-header": "Region"}}}}]})),
        )
        .on("tools/call", Answer::Result(json!({"content": []})))
        .start()
        .await;
    let gw = Gateway::start(up.url()).await;
    let call = |id: i64| {
        gw.request("tools/call")
            .id(json!(id))
            .params(json!({"name": REGION_TOOL, "arguments": {"region": "eu-west"}}))
    };

    let missing = call(1).send().await;
    let wrong = call(2).header("mcp-param-region", "us-east").send().await;
    let right = call(3).header("mcp-param-region", "eu-west").send().await;

    missing.assert_error(400, -32020, &json!(1));
    wrong.assert_error(400, -32020, &json!(2));
    assert_eq!(right.status, 200, "{}", right.raw);
    assert_eq!(right.body["id"], 3);
    assert_eq!(up.calls("tools/call").len(), 1, "{}", up.dump());
}
