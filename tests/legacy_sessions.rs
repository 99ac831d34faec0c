//! Legacy (2025 session) clients translated onto pooled legacy sessions
//! (`legacy_clients = "translate"` on a legacy upstream, DESIGN §10): the
//! legacy-client half over the legacy-session upstream half. The client's
//! session is a sealed token; its calls run on the gateway's own pooled
//! upstream sessions; the upstream's questions, pushed on a session stream,
//! become rounds pushed on the client's SSE answer. This is the composition
//! federated and stdio routes are built on.

mod support;

use serde_json::{json, Value};
use support::legacy::{Legacy, LEGACY};
use support::{Events, FakeUpstream, Gateway, Step};

/// The demo server in its session-era mode on 127.0.0.1:0, stopped with the
/// test's runtime.
async fn legacy_upstream() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    tokio::spawn(sessionless::demo::serve(listener, std::future::pending()));
    url
}

async fn translating(tables: &str) -> Gateway {
    let toml = support::single_route("legacy_clients = \"translate\"", tables);
    Gateway::from_toml(&toml, &legacy_upstream().await).await
}

/// A client that answers elicitations but declares no roots (a call of one
/// that does runs on a session of its own, DESIGN §2).
fn init_without_roots() -> String {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": LEGACY, "capabilities": {"elicitation": {}},
        "clientInfo": {"name": "old-client", "version": "1.2.3"}}})
    .to_string()
}

fn call(id: Value, tool: &str, args: Value) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": tool, "arguments": args}})
        .to_string()
}

#[tokio::test]
async fn a_legacy_client_runs_on_the_gateways_pooled_sessions() {
    let gw = translating("").await;
    let client = Legacy::new(&gw);

    let init = client.post(None, init_without_roots()).await;
    assert_eq!(init.status, 200, "{}", init.raw);
    assert_eq!(init.result()["protocolVersion"], LEGACY);
    assert!(init.result()["capabilities"]["tools"].is_object(), "{}", init.raw);
    assert!(init.result().get("resultType").is_none(), "{}", init.raw);
    let session = init.header("mcp-session-id").expect("a session id").to_string();
    let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"}).to_string();
    assert_eq!(client.post(Some(&session), note).await.status, 202);

    let list = client
        .post(Some(&session), json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}).to_string())
        .await;
    assert_eq!(list.status, 200, "{}", list.raw);
    assert!(list.result()["tools"].as_array().is_some_and(|t| t.len() > 3), "{}", list.raw);
    assert!(list.result().get("resultType").is_none(), "no 2026-only fields: {}", list.raw);
    assert!(list.result().get("ttlMs").is_none(), "{}", list.raw);

    let echo = client.post(Some(&session), call(json!("e"), "echo", json!({"text": "hi"}))).await;
    assert_eq!(echo.status, 200, "{}", echo.raw);
    assert_eq!(echo.body["id"], "e");
    assert!(echo.raw.contains("hi"), "{}", echo.raw);
    assert!(echo.result().get("resultType").is_none(), "{}", echo.raw);

    // A second client session of the same principal and capabilities runs
    // on the same pooled upstream session: no upstream session more.
    let opened = gw.metric("sessionless_upstream_sessions_initialized_total").await;
    let init = client.post(None, init_without_roots()).await;
    let other = init.header("mcp-session-id").expect("a session id").to_string();
    assert_ne!(other, session);
    let again = client.post(Some(&other), call(json!("e2"), "echo", json!({"text": "again"}))).await;
    assert!(again.raw.contains("again"), "{}", again.raw);
    assert_eq!(gw.metric("sessionless_upstream_sessions_initialized_total").await, opened);

    // A tool error is the upstream's, inside the session.
    let failed = client.post(Some(&session), call(json!("f"), "fail", json!({}))).await;
    assert_eq!(failed.status, 200, "{}", failed.raw);
    assert_eq!(failed.result()["isError"], true, "{}", failed.raw);

    let unknown = client
        .post(Some(&session), json!({"jsonrpc": "2.0", "id": 7, "method": "no/such"}).to_string())
        .await;
    assert_eq!(unknown.status, 200, "{}", unknown.raw);
    assert_eq!(unknown.error_code(), Some(-32601), "{}", unknown.raw);

    let forged = client.post(Some("not-a-token"), call(json!(5), "echo", json!({"text": "x"}))).await;
    forged.assert_error(404, -32001, &json!(5));
    let delete = client.verb(http::Method::DELETE, Some(&session)).await;
    assert_eq!(delete.status(), 200);

    let (_, metrics) = gw.get("/metrics").await;
    assert!(
        metrics.contains(
            r#"{route="/mcp",method="tools/call",generation="legacy",upstream="legacy",outcome="ok"} 3"#
        ),
        "{metrics}"
    );
}

#[tokio::test]
async fn an_upstream_question_on_a_pooled_session_is_asked_on_the_clients_stream() {
    let gw = translating("").await;
    let client = Legacy::new(&gw);
    let session = client.open().await;

    let mut events =
        client.stream(&session, call(json!("ask"), "ask_user", json!({"question": "Your name?"}))).await;
    assert_eq!(events.status, 200);
    let question = events.next().await.expect("a question");
    assert_eq!(question["method"], "elicitation/create", "{question}");
    assert_eq!(question["params"]["message"], "Your name?", "{question}");
    let qid = question["id"].as_str().expect("a string id minted by the gateway").to_string();

    let answer = json!({"jsonrpc": "2.0", "id": qid,
        "result": {"action": "accept", "content": {"answer": "Ada"}}});
    let taken = client.post(Some(&session), answer.to_string()).await;
    assert_eq!(taken.status, 202, "{}", taken.raw);

    let done = events.next().await.expect("the result");
    assert_eq!(done["id"], "ask", "{done}");
    assert!(done.to_string().contains("Ada"), "{done}");
    assert!(done["result"].get("resultType").is_none(), "{done}");
    // The round parked the call on its upstream session, and the retry resumed it.
    assert_eq!(gw.metric("sessionless_mrtr_rounds_total").await, 1.0);
    assert_eq!(gw.metric("sessionless_parked_flows_open").await, 0.0);
    assert_eq!(gw.metric("sessionless_legacy_questions_pushed_total").await, 1.0);
}

#[tokio::test]
async fn a_declined_question_reaches_the_upstream_as_declined() {
    let gw = translating("").await;
    let client = Legacy::new(&gw);
    let session = client.open().await;
    let mut events = client.stream(&session, call(json!(9), "ask_user", json!({"question": "Sure?"}))).await;
    let question = events.next().await.expect("a question");
    let qid = question["id"].as_str().unwrap().to_string();
    let decline = json!({"jsonrpc": "2.0", "id": qid, "result": {"action": "decline"}});
    assert_eq!(client.post(Some(&session), decline.to_string()).await.status, 202);
    let done = events.next().await.expect("the result");
    assert_eq!(done["id"], 9, "{done}");
    assert!(done.to_string().contains("decline"), "{done}");
}

#[tokio::test]
async fn deny_rules_hold_on_the_translated_path() {
    let rules = "[[routes.rules]]\neffect = \"deny\"\ntools = [\"ech*\"]\n";
    let toml = format!(
        "[[upstreams]]\nname = \"up\"\nurl = \"{{upstream}}\"\nlegacy_clients = \"translate\"\n\n[[routes]]\npath = \"/mcp\"\nupstream = \"up\"\n{rules}"
    );
    let gw = Gateway::from_toml(&toml, &legacy_upstream().await).await;
    let client = Legacy::new(&gw);
    let session = client.open().await;
    let denied = client.post(Some(&session), call(json!(1), "echo", json!({"text": "no"}))).await;
    assert_eq!(denied.status, 200, "{}", denied.raw);
    assert!(denied.body.get("error").is_some(), "{}", denied.raw);
    let list = client
        .post(Some(&session), json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}).to_string())
        .await;
    let names: Vec<&str> =
        list.result()["tools"].as_array().unwrap().iter().filter_map(|t| t["name"].as_str()).collect();
    assert!(!names.contains(&"echo"), "a denied tool is not listed: {names:?}");
    assert!(names.contains(&"add"), "{names:?}");
}

#[tokio::test]
async fn the_get_stream_carries_list_changes_of_a_session_of_its_own() {
    let up = FakeUpstream::new()
        .get_stream(vec![
            Step::notify("notifications/prompts/list_changed", json!({})),
            Step::notify("notifications/tools/list_changed", json!({})),
            Step::hang(),
        ])
        .start()
        .await;
    let gw = Gateway::from_toml(&support::single_route("legacy_clients = \"translate\"", ""), up.url()).await;
    let client = Legacy::new(&gw);
    let session = client.open().await;

    let mut events = Events::of(client.verb(http::Method::GET, Some(&session)).await);
    assert_eq!(events.status, 200);
    let first = events.next().await.expect("a list change");
    assert_eq!(first["method"], "notifications/prompts/list_changed", "{first}");
    assert!(first.pointer("/params/_meta").is_none(), "no subscription id for a legacy client: {first}");
    let second = events.next().await.expect("another");
    assert_eq!(second["method"], "notifications/tools/list_changed", "{second}");
    assert_eq!(gw.metric("sessionless_listen_streams_open").await, 1.0);

    // The client leaves: the stream's own upstream session is closed.
    let get = up.http(http::Method::GET).remove(0);
    let listened_on = get.session().expect("the GET names its session").to_string();
    drop(events);
    up.wait_for("a DELETE of the stream's session", |s| {
        s.method == http::Method::DELETE && s.session() == Some(listened_on.as_str())
    })
    .await;
    assert_eq!(gw.settled_metric("sessionless_listen_streams_open", 0.0).await, 0.0);
}
