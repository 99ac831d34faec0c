//! Upstream sessions over their life: the handshake, the negotiated version,
//! one pool per principal, eviction, idling out, shutdown, and the metrics
//! that count them.

mod support;
use support::single_route;

use http::Method;
use serde_json::json;
use support::{Answer, FakeUpstream, Gateway, Step};

const SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";

#[tokio::test]
async fn the_gateway_does_the_legacy_handshake_before_anything_else() {
    let up = FakeUpstream::new().start().await;
    let gw = Gateway::start(up.url()).await;

    let reply = gw.request("tools/list").send().await;

    assert_eq!(reply.status, 200, "{}", reply.raw);
    let seen = up.seen();
    let steps: Vec<(Option<&str>, u16)> = seen.iter().map(|s| (s.rpc_method(), s.status)).collect();
    assert_eq!(
        steps,
        [(Some("initialize"), 200), (Some("notifications/initialized"), 202), (Some("tools/list"), 200)],
        "{}",
        up.dump()
    );
    assert!(seen[0].session().is_none(), "initialize carries no session");
    assert_eq!(seen[0].body["params"]["clientInfo"]["name"], "sessionless");
    assert!(seen[1].session().is_some() && seen[1].session() == seen[2].session());
    assert!(seen[1..].iter().all(|s| s.header("accept") == Some("application/json, text/event-stream")));
}

#[tokio::test]
async fn an_initialize_answered_on_sse_opens_the_session() {
    let up = FakeUpstream::new().sse_initialize().start().await;
    let gw = Gateway::start(up.url()).await;

    let reply = gw.request("server/discover").send().await;

    assert_eq!(reply.status, 200, "{}", reply.raw);
    assert_eq!(reply.result()["_meta"][SERVER_INFO]["name"], "fake-upstream");
    let listed = gw.request("tools/list").send().await;
    assert_eq!(listed.status, 200, "{}", listed.raw);
    assert_eq!(up.initializes(), 1);
}

#[tokio::test]
async fn the_negotiated_version_goes_on_every_later_request() {
    let up = FakeUpstream::new().protocol_version("2025-06-18").start().await;
    let gw = Gateway::start(up.url()).await;

    let reply = gw.request("tools/list").send().await;

    assert_eq!(reply.status, 200, "{}", reply.raw);
    let init = up.calls("initialize").remove(0);
    assert_eq!(init.body["params"]["protocolVersion"], "2025-11-25");
    assert_eq!(init.body["params"]["capabilities"], json!({}));
    for seen in up.seen().iter().filter(|s| s.rpc_method() != Some("initialize")) {
        assert_eq!(seen.header("mcp-protocol-version"), Some("2025-06-18"), "{seen:?}");
    }
}

fn oldest_version() -> String {
    single_route(r#"protocol_version = "2025-03-26""#, "")
}

#[tokio::test]
async fn a_2025_03_26_upstream_gets_no_version_header() {
    let up = FakeUpstream::new().start().await;
    let gw = Gateway::from_toml(&oldest_version(), up.url()).await;

    let reply = gw.request("tools/list").send().await;

    assert_eq!(reply.status, 200, "{}", reply.raw);
    assert_eq!(up.calls("initialize")[0].body["params"]["protocolVersion"], "2025-03-26");
    assert!(up.seen().iter().all(|s| s.header("mcp-protocol-version").is_none()), "{}", up.dump());
}

#[tokio::test]
async fn an_upstream_without_session_ids_is_served_without_them() {
    let up = FakeUpstream::new()
        .without_session_ids()
        .on("tools/call", Answer::Result(json!({"content": []})))
        .start()
        .await;
    let gw = Gateway::start(up.url()).await;

    let reply = gw.request("tools/call").params(json!({"name": "x", "arguments": {}})).send().await;

    assert_eq!(reply.status, 200, "{}", reply.raw);
    assert!(up.seen().iter().all(|s| s.session().is_none()), "{}", up.dump());
}

#[tokio::test]
async fn principals_get_their_own_upstream_sessions() {
    let up = FakeUpstream::new().start().await;
    let gw = Gateway::start(up.url()).await;

    for (id, token) in [(1, "alice-token"), (2, "bob-token"), (3, "alice-token")] {
        let reply = gw.request("tools/list").id(json!(id)).bearer(token).send().await;
        assert_eq!(reply.status, 200, "{}", reply.raw);
        assert_eq!(reply.body["id"], id);
    }

    assert_eq!(up.initializes(), 2, "{}", up.dump());
    let sessions: Vec<_> = up.calls("tools/list").iter().map(|s| s.session().map(str::to_string)).collect();
    assert_eq!(sessions.len(), 3);
    assert_ne!(sessions[0], sessions[1], "alice and bob share nothing");
    assert_eq!(sessions[0], sessions[2], "alice's session is reused");
    assert!(up.seen().iter().all(|s| s.header("authorization").is_none()));
}

fn one_session() -> String {
    single_route("", "[pool]\nmax_sessions = 1")
}

#[tokio::test]
async fn a_full_pool_closes_its_least_recently_used_idle_session() {
    let up = FakeUpstream::new().start().await;
    let gw = Gateway::from_toml(&one_session(), up.url()).await;

    let alice = gw.request("tools/list").bearer("alice").send().await;
    assert_eq!(alice.status, 200, "{}", alice.raw);
    let alice_session = up.calls("tools/list")[0].session().unwrap().to_string();
    let bob = gw.request("tools/list").bearer("bob").send().await;
    assert_eq!(bob.status, 200, "{}", bob.raw);

    up.wait_for("a DELETE of alice's session", |s| {
        s.method == Method::DELETE && s.session() == Some(alice_session.as_str())
    })
    .await;
    assert_eq!(up.initializes(), 2);
}

fn quick_idle() -> String {
    single_route("", "[pool]\nidle_timeout_ms = 100")
}

#[tokio::test]
async fn idle_sessions_are_closed_upstream() {
    let up = FakeUpstream::new().start().await;
    let gw = Gateway::from_toml(&quick_idle(), up.url()).await;
    let reply = gw.request("tools/list").send().await;
    assert_eq!(reply.status, 200, "{}", reply.raw);
    let session = up.calls("tools/list")[0].session().unwrap().to_string();

    up.wait_for("a DELETE of the idle session", |s| {
        s.method == Method::DELETE && s.session() == Some(session.as_str())
    })
    .await;

    assert_eq!(gw.settled_metric("sessionless_upstream_sessions_open", 0.0).await, 0.0);
    let again = gw.request("tools/list").send().await;
    assert_eq!(again.status, 200, "{}", again.raw);
    assert_eq!(up.initializes(), 2, "a new session after the idle one: {}", up.dump());
}

#[tokio::test]
async fn shutdown_closes_upstream_sessions() {
    let up = FakeUpstream::new().start().await;
    let gw = Gateway::start(up.url()).await;
    let reply = gw.request("tools/list").send().await;
    assert_eq!(reply.status, 200, "{}", reply.raw);
    let session = up.calls("tools/list")[0].session().unwrap().to_string();

    gw.stop().await;

    let deletes = up.http(Method::DELETE);
    assert_eq!(deletes.len(), 1, "{}", up.dump());
    assert_eq!(deletes[0].session(), Some(session.as_str()));
}

#[tokio::test]
async fn shutdown_lets_a_call_in_flight_finish() {
    let up = FakeUpstream::new()
        .on(
            "tools/call",
            Answer::Sse(vec![
                Step::sleep_ms(300),
                Step::result(json!({"content": [{"type": "text", "text": "finished"}]})),
            ]),
        )
        .start()
        .await;
    let gw = Gateway::start(up.url()).await;
    let call = gw.request("tools/call").id(json!(1)).params(json!({"name": "slow", "arguments": {}})).send();
    let shut = async {
        up.wait_for("the call", |s| s.rpc_method() == Some("tools/call")).await;
        gw.begin_shutdown();
    };

    let (reply, ()) = tokio::join!(call, shut);

    assert_eq!(reply.status, 200, "{}", reply.raw);
    assert_eq!(reply.result()["content"][0]["text"], "finished");
    up.wait_for("the session to be closed at shutdown", |s| s.method == Method::DELETE).await;
}

#[tokio::test]
async fn metrics_count_requests_and_sessions() {
    let up = FakeUpstream::new().on("tools/call", Answer::Result(json!({"content": []}))).start().await;
    let gw = Gateway::start(up.url()).await;
    let stale_before = gw.metric("sessionless_stale_session_headers_dropped_total").await;
    let requests_before = gw.metric("sessionless_requests_total").await;
    let sessions_before = gw.metric("sessionless_upstream_sessions_initialized_total").await;

    let reply = gw
        .request("tools/call")
        .params(json!({"name": "noop", "arguments": {}}))
        .header("mcp-session-id", "stale")
        .send()
        .await;
    assert_eq!(reply.status, 200, "{}", reply.raw);

    let requests = gw.wait_metric("sessionless_requests_total", requests_before + 1.0).await;
    assert_eq!(requests, requests_before + 1.0);
    let sessions = gw.metric("sessionless_upstream_sessions_initialized_total").await;
    assert_eq!(sessions, sessions_before + 1.0);
    let stale = gw.metric("sessionless_stale_session_headers_dropped_total").await;
    assert_eq!(stale, stale_before + 1.0);
    let (_, text) = gw.get("/metrics").await;
    assert!(text.contains("sessionless_requests_total{"), "{text}");
    assert!(text.contains("sessionless_upstream_sessions_initialized_total{"), "{text}");
}
