//! Legacy (2025 session) clients in front of a 2026-only upstream (the demo
//! server's modern mode): the gateway answers `initialize` from discover,
//! each request goes upstream as a stateless 2026 call, and the upstream's
//! `input_required` questions are pushed on the client's SSE answer.

mod support;

use serde_json::{json, Value};
use sessionless::demo::Generation as DemoGeneration;
use support::cluster::{ClusterEnv, Internal, Replica};
use support::legacy::{Legacy, LEGACY};
use support::Gateway;

/// A 2026-only demo upstream on 127.0.0.1:0, stopped with the test's runtime.
async fn modern_only() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    tokio::spawn(sessionless::demo::serve_generation(
        listener,
        std::future::pending(),
        DemoGeneration::Modern,
    ));
    url
}

fn call(id: Value, tool: &str, args: Value) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": tool, "arguments": args}})
        .to_string()
}

#[tokio::test]
async fn a_legacy_session_becomes_stateless_calls() {
    let gw = Gateway::start_auto(&modern_only().await).await;
    let client = Legacy::new(&gw);

    let init = client.post(None, support::legacy::init_body(json!(1))).await;
    assert_eq!(init.status, 200, "{}", init.raw);
    let result = init.result();
    assert_eq!(result["protocolVersion"], LEGACY);
    assert!(result["capabilities"]["tools"].is_object(), "{}", init.raw);
    assert!(result["capabilities"].get("logging").is_none(), "setLevel is not offered");
    assert!(result["serverInfo"]["name"].is_string(), "{}", init.raw);
    assert!(result.get("resultType").is_none());
    let session = init.header("mcp-session-id").expect("a session id").to_string();
    let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"}).to_string();
    assert_eq!(client.post(Some(&session), note).await.status, 202);

    let list = client
        .post(Some(&session), json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}).to_string())
        .await;
    assert_eq!(list.status, 200, "{}", list.raw);
    assert!(list.result()["tools"].as_array().is_some_and(|t| !t.is_empty()), "{}", list.raw);
    assert!(list.result().get("resultType").is_none(), "no 2026-only fields: {}", list.raw);
    assert!(list.result().get("ttlMs").is_none());

    let echo = client.post(Some(&session), call(json!("e"), "echo", json!({"text": "hi"}))).await;
    assert_eq!(echo.status, 200, "{}", echo.raw);
    assert_eq!(echo.body["id"], "e");
    assert!(echo.raw.contains("hi"), "{}", echo.raw);
    assert!(echo.result().get("resultType").is_none());

    let ping =
        client.post(Some(&session), json!({"jsonrpc": "2.0", "id": 3, "method": "ping"}).to_string()).await;
    assert_eq!(ping.result(), &json!({}));
    let set_level =
        json!({"jsonrpc": "2.0", "id": 4, "method": "logging/setLevel", "params": {"level": "info"}});
    let refused = client.post(Some(&session), set_level.to_string()).await;
    assert_eq!(refused.error_code(), Some(-32601), "{}", refused.raw);

    let get = client.verb(http::Method::GET, Some(&session)).await;
    assert_eq!(get.status(), 405);
    let delete = client.verb(http::Method::DELETE, Some(&session)).await;
    assert_eq!(delete.status(), 200);

    let forged = client.post(Some("not-a-token"), call(json!(5), "echo", json!({"text": "x"}))).await;
    forged.assert_error(404, -32001, &json!(5));
    let (_, metrics) = gw.get("/metrics").await;
    assert!(
        metrics.contains(
            r#"{route="/mcp",method="tools/call",generation="legacy",upstream="modern",outcome="ok"} 1"#
        ),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_question_is_pushed_on_the_stream_and_the_answer_goes_back_upstream() {
    let gw = Gateway::start_auto(&modern_only().await).await;
    let client = Legacy::new(&gw);
    let session = client.open().await;

    let mut events =
        client.stream(&session, call(json!("ask"), "ask_user", json!({"question": "Your name?"}))).await;
    assert_eq!(events.status, 200);
    let question = events.next().await.expect("a question");
    assert_eq!(question["method"], "elicitation/create", "{question}");
    assert_eq!(question["params"]["message"], "Your name?");
    let qid = question["id"].as_str().expect("a string id minted by the gateway").to_string();

    let answer = json!({"jsonrpc": "2.0", "id": qid,
        "result": {"action": "accept", "content": {"answer": "Ada"}}});
    let taken = client.post(Some(&session), answer.to_string()).await;
    assert_eq!(taken.status, 202, "{}", taken.raw);

    let done = events.next().await.expect("the result");
    assert_eq!(done["id"], "ask", "{done}");
    assert!(done.to_string().contains("you answered: Ada"), "{done}");
    assert!(done["result"].get("resultType").is_none());
    let (_, metrics) = gw.get("/metrics").await;
    assert!(
        metrics.contains(
            "sessionless_legacy_questions_pushed_total{route=\"/mcp\",method=\"elicitation/create\"} 1"
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains("sessionless_legacy_answers_routed_total{route=\"/mcp\",reason=\"here\"} 1"),
        "{metrics}"
    );

    // Another caller's answer to the same id goes nowhere.
    let other = Legacy::new(&gw).bearer("mallory");
    let theirs = other.open().await;
    let stolen = other.post(Some(&theirs), answer.to_string()).await;
    assert_eq!(stolen.status, 202);
}

#[tokio::test]
async fn an_answer_on_another_session_of_the_same_principal_is_refused() {
    let up = support::modern::ModernUpstream::start().await;
    let gw = Gateway::start_auto(&up.url).await;
    let client = Legacy::new(&gw);
    let (session_a, session_b) = (client.open().await, client.open().await);
    assert_ne!(session_a, session_b);

    let mut events = client.stream(&session_a, call(json!("ask"), "ask", json!({}))).await;
    let question = events.next().await.expect("a question");
    assert_eq!(question["method"], "elicitation/create", "{question}");
    let answer = |name: &str| {
        json!({"jsonrpc": "2.0", "id": question["id"],
            "result": {"action": "accept", "content": {"name": name}}})
        .to_string()
    };
    let refused = client.post(Some(&session_b), answer("from B")).await;
    assert_eq!(refused.status, 202, "{}", refused.raw);
    let routed = |reason: &str| {
        format!("sessionless_legacy_answers_routed_total{{route=\"/mcp\",reason=\"{reason}\"}} 1")
    };
    let (_, metrics) = gw.get("/metrics").await;
    assert!(metrics.contains(&routed("other_session")), "{metrics}");
    assert!(!metrics.contains("reason=\"here\""), "nothing delivered: {metrics}");

    let taken = client.post(Some(&session_a), answer("from A")).await;
    assert_eq!(taken.status, 202, "{}", taken.raw);
    let done = events.next().await.expect("the result");
    assert_eq!(done["id"], "ask", "{done}");
    assert!(done["result"]["content"].is_array(), "{done}");
    let retries: Vec<_> =
        up.calls().into_iter().filter(|c| !c.body["params"]["inputResponses"].is_null()).collect();
    assert_eq!(retries.len(), 1, "one retry upstream");
    assert_eq!(retries[0].body["params"]["inputResponses"]["name"]["content"]["name"], "from A");
    let (_, metrics) = gw.get("/metrics").await;
    assert!(metrics.contains(&routed("here")), "{metrics}");
}

#[tokio::test]
async fn a_client_without_the_capability_gets_a_clear_error() {
    let gw = Gateway::start_auto(&modern_only().await).await;
    let client = Legacy::new(&gw);
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": "bare", "version": "1"}}});
    let reply = client.post(None, init.to_string()).await;
    let session = reply.header("mcp-session-id").unwrap().to_string();

    let asked = client.post(Some(&session), call(json!(9), "ask_user", json!({}))).await;
    assert_eq!(asked.status, 200, "{}", asked.raw);
    assert_eq!(asked.error_code(), Some(-32600), "{}", asked.raw);
    assert_eq!(
        asked.body["error"]["data"]["requiredCapabilities"],
        json!({"elicitation": {}}),
        "{}",
        asked.raw
    );
}

#[tokio::test]
async fn a_legacy_client_never_gets_a_code_of_the_2026_reserved_range() {
    let up = support::modern::ModernUpstream::start().await;
    let gw = Gateway::start_auto(&up.url).await;
    let client = Legacy::new(&gw);
    let session = client.open().await;
    let needs = json!({"requiredCapabilities": {"sampling": {}}});
    for (code, data, expected) in [
        (-32021, needs.clone(), -32600),
        (-32022, json!({"supported": ["2026-07-28"], "requested": "2026-07-28"}), -32603),
        (-32042, json!({"elicitations": [{"mode": "url", "url": "https://x"}]}), -32603),
        (-32050, Value::Null, -32603),
        (-32002, Value::Null, -32002),
    ] {
        let args = json!({"code": code, "message": "as told", "data": data, "status": 400});
        let reply = client.post(Some(&session), call(json!(code), "fail", args)).await;
        assert_eq!(reply.status, 200, "inside a live session: {}", reply.raw);
        assert_eq!(reply.error_code(), Some(expected), "{code}: {}", reply.raw);
        assert_eq!(reply.body["error"]["data"], data, "data kept: {}", reply.raw);
    }
}

#[tokio::test]
async fn an_answer_reaching_another_replica_is_forwarded_to_the_one_holding_the_stream() {
    let upstream = modern_only().await;
    let env = ClusterEnv::new("legacy-modern");
    let translate = |mut c: support::cluster::ReplicaConfig| {
        c.upstream_extra = "generation = \"modern\"\nlegacy_clients = \"translate\"".into();
        c
    };
    let a = Replica::start(&translate(env.replica("gw-a", &upstream))).await;
    let b = Replica::start(&translate(env.replica("gw-b", &upstream))).await;
    let (on_a, on_b) = (Legacy::at(a.url("/mcp")), Legacy::at(b.url("/mcp")));
    let session = on_a.open().await;
    let listed = on_b
        .post(Some(&session), json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).to_string())
        .await;
    assert_eq!(listed.status, 200, "the session is good on any replica: {}", listed.raw);

    let mut events =
        on_a.stream(&session, call(json!("ask"), "ask_user", json!({"question": "City?"}))).await;
    let question = events.next().await.expect("a question");
    let answer = json!({"jsonrpc": "2.0", "id": question["id"],
        "result": {"action": "accept", "content": {"answer": "Lyon"}}});
    let routed = "sessionless_legacy_answers_routed_total";

    // Posted on another session of the same caller: refused where it lands.
    let other = on_b.open().await;
    let wrong = json!({"jsonrpc": "2.0", "id": question["id"],
        "result": {"action": "accept", "content": {"answer": "Oslo"}}});
    assert_eq!(on_b.post(Some(&other), wrong.to_string()).await.status, 202);
    assert_eq!(b.metric_where(routed, r#"reason="other_session""#).await, 1.0);
    assert_eq!(b.metric_where(routed, r#"reason="forwarded""#).await, 0.0, "not forwarded");
    // Forwarded (signed) without its session, or with another: refused by the owner.
    for session in [None, Some("not-the-session".to_string())] {
        let forwarded = Internal { session, ..Internal::answer(&a, &wrong) };
        let reply = a.raw(forwarded.request(Some(&forwarded.signature(&env.secret)))).await;
        assert_eq!(reply.status, 202, "{}", reply.raw);
    }
    assert_eq!(a.metric_where(routed, r#"reason="other_session""#).await, 2.0);

    let taken = on_b.post(Some(&session), answer.to_string()).await;
    assert_eq!(taken.status, 202, "{}", taken.raw);
    let done = events.next().await.expect("the result, on the stream held by a");
    assert!(done.to_string().contains("you answered: Lyon"), "{done}");
    assert_eq!(b.metric_where(routed, r#"reason="forwarded""#).await, 1.0);
    assert_eq!(a.metric_where(routed, r#"reason="received""#).await, 1.0);
}

#[tokio::test]
async fn an_unanswered_question_is_cancelled_and_a_refusal_declines() {
    let upstream = modern_only().await;
    let text = format!(
        "[[upstreams]]\nname = \"u\"\nurl = \"{upstream}\"\n[[routes]]\npath = \"/mcp\"\nupstream = \"u\"\n\
         [limits]\nparked_flow_ttl_ms = 300\n"
    );
    let gw = Gateway::with_config(sessionless::Config::from_toml(&text).unwrap()).await;
    let client = Legacy::new(&gw);
    let session = client.open().await;

    // No answer in time: the client is told, and the question counts as cancelled.
    let mut events = client.stream(&session, call(json!("late"), "ask_user", json!({}))).await;
    let question = events.next().await.expect("a question");
    let cancelled = events.next().await.expect("a cancellation");
    assert_eq!(cancelled["method"], "notifications/cancelled", "{cancelled}");
    assert_eq!(cancelled["params"]["requestId"], question["id"]);
    let done = events.next().await.expect("the result");
    assert!(done.to_string().contains("no answer (cancel)"), "{done}");

    // A JSON-RPC error for an elicitation is a decline.
    let mut events = client.stream(&session, call(json!("no"), "ask_user", json!({}))).await;
    let question = events.next().await.expect("a question");
    let refusal = json!({"jsonrpc": "2.0", "id": question["id"], "error": {"code": -1, "message": "no"}});
    assert_eq!(client.post(Some(&session), refusal.to_string()).await.status, 202);
    let done = events.next().await.expect("the result");
    assert!(done.to_string().contains("no answer (decline)"), "{done}");
}

#[tokio::test]
async fn a_translated_call_carries_the_2026_headers_the_tool_asks_for() {
    let up = support::modern::ModernUpstream::start().await;
    let gw = Gateway::start_auto(&up.url).await;
    let client = Legacy::new(&gw);
    let session = client.open().await;
    let reply =
        client.post(Some(&session), call(json!(1), "annotated", json!({"region": " eu-west ü"}))).await;
    assert_eq!(reply.status, 200, "{}", reply.raw);
    let seen = up
        .calls()
        .into_iter()
        .find(|c| c.body["params"]["name"] == "annotated")
        .expect("the call went upstream");
    let header = |name: &str| seen.headers.get(name).map(|v| v.to_str().unwrap().to_string());
    assert_eq!(header("mcp-method").as_deref(), Some("tools/call"));
    assert_eq!(header("mcp-name").as_deref(), Some("annotated"));
    assert_eq!(header("mcp-protocol-version").as_deref(), Some("2026-07-28"));
    // Not plain ASCII, with surrounding spaces: sent in the base64 form.
    let region = header("mcp-param-region").expect("the annotated argument's header");
    assert!(region.starts_with("=?base64?"), "{region}");
    assert!(seen.headers.get("mcp-session-id").is_none());
    assert_eq!(seen.body["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"], "2026-07-28");
    assert_eq!(seen.body["params"]["_meta"]["io.modelcontextprotocol/clientInfo"]["name"], "old-client");
}
