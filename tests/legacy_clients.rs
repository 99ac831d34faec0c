//! Legacy (2025 session) clients on the same endpoint as modern ones: the
//! relay cell. The client's `initialize` opens an upstream session, the
//! gateway's `Mcp-Session-Id` is a sealed token, later requests are relayed
//! to the upstream session it names; bad tokens are 404s that reach nothing.

mod support;

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use serde_json::json;
use support::legacy::{init_body, Legacy, LEGACY};
use support::{Answer, Events, FakeUpstream, Gateway, Step, Upstream};

async fn setup(up: FakeUpstream) -> (Upstream, Gateway) {
    let up = up.start().await;
    let gw = Gateway::start(up.url()).await;
    (up, gw)
}

/// The echo upstream behind a gateway whose routing file has this `[legacy]` section.
async fn with_legacy_section(keys: &str) -> (Upstream, Gateway) {
    let up = echo().start().await;
    let toml = format!(
        "[[upstreams]]\nname = \"u\"\nurl = \"{{upstream}}\"\n[[routes]]\npath = \"/mcp\"\nupstream = \"u\"\n[legacy]\n{keys}\n"
    );
    let gw = Gateway::from_toml(&toml, up.url()).await;
    (up, gw)
}

fn echo() -> FakeUpstream {
    FakeUpstream::new().on("tools/call", Answer::Result(json!({"content": [{"type": "text", "text": "hi"}]})))
}

#[tokio::test]
async fn initialize_opens_an_upstream_session_with_the_clients_own_params() {
    let (up, gw) = setup(echo()).await;
    let client = Legacy::new(&gw).bearer("secret-token");

    let session = client.open().await;

    let inits = up.calls("initialize");
    assert_eq!(inits.len(), 1, "{}", up.dump());
    let params = &inits[0].body["params"];
    assert_eq!(params["clientInfo"]["name"], "old-client");
    assert_eq!(params["capabilities"]["elicitation"], json!({}));
    assert_eq!(params["protocolVersion"], LEGACY);
    assert_eq!(up.seen()[0].status, 200);
    // The gateway's id is not the upstream's, and credentials never go upstream.
    let theirs = up.calls("notifications/initialized")[0].session().unwrap().to_string();
    assert_ne!(session, theirs);
    assert!(up.seen().iter().all(|s| s.header("authorization").is_none()), "{}", up.dump());
    assert!(session.bytes().all(|b| (0x21..=0x7e).contains(&b)));
    assert_eq!(gw.metric("sessionless_legacy_sessions_opened_total").await, 1.0);
}

#[tokio::test]
async fn requests_reach_the_upstream_session_as_sent() {
    let (up, gw) = setup(echo()).await;
    let client = Legacy::new(&gw);
    let session = client.open().await;

    let reply = client.call(&session, json!("call-7"), "echo").await;

    assert_eq!(reply.status, 200, "{}", reply.raw);
    assert_eq!(reply.body["id"], "call-7", "ids untouched");
    assert_eq!(reply.result()["content"][0]["text"], "hi");
    assert!(reply.result().get("resultType").is_none(), "relayed, not translated");
    let call = &up.calls("tools/call")[0];
    let theirs = up.calls("initialize").len();
    assert_eq!(theirs, 1);
    assert_eq!(call.rpc_id(), Some(&json!("call-7")));
    assert_eq!(call.header("mcp-protocol-version"), Some(LEGACY));
    assert_eq!(call.session(), up.calls("notifications/initialized")[0].session());
    assert_eq!(gw.metric("sessionless_requests_total").await, 3.0);
    let (_, text) = gw.get("/metrics").await;
    assert!(text.contains("generation=\"legacy\""), "{text}");
}

#[tokio::test]
async fn sse_answers_are_relayed_event_by_event_and_server_requests_answered_by_post() {
    let up = FakeUpstream::new().on(
        "tools/call",
        Answer::Sse(vec![
            Step::prime("e-1"),
            Step::progress(0.5),
            Step::ask(
                json!("srv-1"),
                "elicitation/create",
                json!({"message": "name?", "requestedSchema": {}}),
            ),
            Step::await_response(json!("srv-1")),
            Step::result(json!({"content": []})),
        ]),
    );
    let (up, gw) = setup(up).await;
    let client = Legacy::new(&gw);
    let session = client.open().await;
    let body = json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call",
        "params": {"name": "ask", "arguments": {}, "_meta": {"progressToken": "p"}}});
    let mut events = client.stream(&session, body.to_string()).await;
    assert_eq!(events.status, 200);

    let progress = events.next().await.unwrap();
    assert_eq!(progress["method"], "notifications/progress");
    let ask = events.next().await.unwrap();
    assert_eq!(ask["id"], "srv-1", "server request ids untouched");
    // The client's answer is a POST of its own (it may reach any replica).
    let answer = json!({"jsonrpc": "2.0", "id": "srv-1", "result": {"action": "decline"}}).to_string();
    let ack = client.post(Some(&session), answer).await;
    assert_eq!(ack.status, 202, "{}", ack.raw);
    let done = events.next().await.unwrap();
    assert_eq!(done["id"], 5);
    assert!(up.responses().iter().any(|r| r.rpc_id() == Some(&json!("srv-1"))), "{}", up.dump());
}

#[tokio::test]
async fn every_single_character_change_of_a_session_id_is_404_and_reaches_nothing() {
    let (up, gw) = setup(echo()).await;
    let client = Legacy::new(&gw);
    let session = client.open().await;
    let before = up.seen().len();

    let mut refused = 0;
    for i in 0..session.len() {
        let mut bad = session.clone().into_bytes();
        bad[i] = if bad[i] == b'A' { b'B' } else { b'A' };
        let bad = String::from_utf8(bad).unwrap();
        let reply = client.call(&bad, json!(i), "echo").await;
        // A change in the last character's spare bits may decode to the same token.
        if reply.status == 200 {
            assert_eq!(i, session.len() - 1, "position {i} was accepted");
            continue;
        }
        reply.assert_error(404, -32001, &json!(i));
        refused += 1;
    }

    assert!(refused >= session.len() - 1);
    assert_eq!(up.seen().len(), before + (session.len() - refused), "{}", up.dump());
    assert!(gw.metric("sessionless_legacy_session_tokens_rejected_total").await >= refused as f64);
}

#[tokio::test]
async fn a_session_of_another_principal_is_404() {
    let (up, gw) = setup(echo()).await;
    let alice = Legacy::new(&gw).bearer("alice");
    let session = alice.open().await;
    let before = up.seen().len();

    let reply = Legacy::new(&gw).bearer("mallory").call(&session, json!(1), "echo").await;
    reply.assert_error(404, -32001, &json!(1));
    let anonymous = Legacy::new(&gw).call(&session, json!(2), "echo").await;
    anonymous.assert_error(404, -32001, &json!(2));

    assert_eq!(up.seen().len(), before, "{}", up.dump());
    assert_eq!(alice.call(&session, json!(3), "echo").await.status, 200, "the owner still gets through");
}

#[tokio::test]
async fn an_expired_upstream_session_is_404_and_the_client_starts_over() {
    // Each upstream session serves one call.
    let (up, gw) = setup(echo().expire_sessions_after(1)).await;
    let client = Legacy::new(&gw);
    let session = client.open().await;
    assert_eq!(client.call(&session, json!(1), "echo").await.status, 200);

    let gone = client.call(&session, json!(2), "echo").await;

    gone.assert_error(404, -32001, &json!(2));
    assert_eq!(up.initializes(), 1, "no re-initialise behind the client's back");
    let fresh = client.open().await;
    assert_ne!(fresh, session);
    assert_eq!(client.call(&fresh, json!(3), "echo").await.status, 200);
    assert_eq!(up.initializes(), 2);
}

#[tokio::test]
async fn an_expired_session_token_is_404() {
    let (_up, gw) = with_legacy_section("session_ttl_ms = 1000").await;
    let client = Legacy::new(&gw);
    let session = client.open().await;
    assert_eq!(client.call(&session, json!(1), "echo").await.status, 200);

    tokio::time::sleep(Duration::from_millis(2100)).await;

    client.call(&session, json!(2), "echo").await.assert_error(404, -32001, &json!(2));
}

#[tokio::test]
async fn status_codes_follow_the_2025_rules() {
    let (up, gw) = setup(echo()).await;
    let client = Legacy::new(&gw);

    // A legacy request without a session id: 400.
    let b = client.request(http::Method::POST, None).header("mcp-protocol-version", LEGACY);
    let body = json!({"jsonrpc": "2.0", "id": 9, "method": "tools/list"}).to_string();
    let reply = gw.raw(b.body(Full::new(Bytes::from(body))).unwrap()).await;
    reply.assert_error(400, -32600, &json!(9));
    // GET and DELETE without one: 405.
    assert_eq!(client.verb(http::Method::GET, None).await.status(), 405);
    assert_eq!(client.verb(http::Method::DELETE, None).await.status(), 405);
    // A session id that does not open: 404 whatever the verb.
    assert_eq!(client.verb(http::Method::GET, Some("nonsense")).await.status(), 404);
    assert_eq!(client.verb(http::Method::DELETE, Some("nonsense")).await.status(), 404);
    let reinit = client.post(Some("nonsense"), init_body(json!(1))).await;
    reinit.assert_error(404, -32001, &json!(1));
    assert!(up.http(http::Method::GET).is_empty() && up.http(http::Method::DELETE).is_empty());
}

#[tokio::test]
async fn delete_ends_the_upstream_session() {
    let (up, gw) = setup(echo()).await;
    let client = Legacy::new(&gw);
    let session = client.open().await;
    assert_eq!(up.calls("initialize")[0].status, 200);

    let resp = client.verb(http::Method::DELETE, Some(&session)).await;

    assert_eq!(resp.status(), 200);
    let deleted = up.http(http::Method::DELETE);
    assert_eq!(deleted.len(), 1, "{}", up.dump());
    assert_eq!(deleted[0].session(), up.calls("notifications/initialized")[0].session());
}

#[tokio::test]
async fn the_get_stream_is_relayed_and_ends_when_the_replica_drains() {
    let up = echo().get_stream(vec![Step::notify("notifications/tools/list_changed", json!({})), Step::Hang]);
    let (up, gw) = setup(up).await;
    let client = Legacy::new(&gw);
    let session = client.open().await;

    let mut events = Events::of(client.verb(http::Method::GET, Some(&session)).await);
    assert_eq!(events.status, 200);
    let note = events.next().await.unwrap();
    assert_eq!(note["method"], "notifications/tools/list_changed");
    assert_eq!(up.http(http::Method::GET)[0].session(), up.calls("notifications/initialized")[0].session());

    gw.begin_shutdown();
    assert_eq!(events.next_within(Duration::from_secs(3)).await, Ok(None), "the stream ends at drain");
}

#[tokio::test]
async fn a_modern_request_with_a_gateway_session_id_is_modern_and_the_id_dropped() {
    let (up, gw) = setup(echo()).await;
    let session = Legacy::new(&gw).open().await;

    let reply = gw
        .request("tools/call")
        .params(json!({"name": "echo", "arguments": {}}))
        .header("mcp-session-id", &session)
        .send()
        .await;

    assert_eq!(reply.status, 200, "{}", reply.raw);
    assert_eq!(reply.result()["resultType"], "complete", "translated: the modern path");
    assert_eq!(gw.metric("sessionless_stale_session_headers_dropped_total").await, 1.0);
    assert_eq!(up.initializes(), 2, "the modern call ran on a pooled session of its own");
}

#[tokio::test]
async fn new_sessions_are_bounded_per_principal() {
    let (up, gw) = with_legacy_section("max_new_sessions_per_principal_per_minute = 2").await;
    let alice = Legacy::new(&gw).bearer("alice");
    alice.open().await;
    alice.open().await;

    let third = alice.post(None, init_body(json!(3))).await;

    third.assert_error(429, -31000, &json!(3));
    assert_eq!(third.header("retry-after"), Some("1"));
    assert_eq!(up.initializes(), 2);
    Legacy::new(&gw).bearer("bob").open().await;
}

#[tokio::test]
async fn what_is_not_a_json_rpc_message_becomes_a_gateway_error() {
    let up = FakeUpstream::new().on(
        "tools/call",
        Answer::Raw {
            status: 500,
            content_type: "text/html".into(),
            body: "<h1>upstream internals</h1>".into(),
        },
    );
    let (_up, gw) = setup(up).await;
    let client = Legacy::new(&gw);
    let session = client.open().await;

    let reply = client.call(&session, json!("x"), "boom").await;

    reply.assert_error(502, -32603, &json!("x"));
    assert!(!reply.raw.contains("internals"), "{}", reply.raw);
}

#[tokio::test]
async fn an_upstream_json_rpc_error_passes_as_it_is() {
    let up = FakeUpstream::new().on("tools/call", Answer::Error(-32602, "Unknown tool".into()));
    let (_up, gw) = setup(up).await;
    let client = Legacy::new(&gw);
    let session = client.open().await;

    let reply = client.call(&session, json!(4), "nope").await;

    assert_eq!(reply.status, 200);
    assert_eq!(reply.body["error"]["code"], -32602);
    assert_eq!(reply.body["error"]["message"], "Unknown tool");
}

#[tokio::test]
async fn a_batch_is_relayed_on_the_session() {
    let (up, gw) = setup(echo()).await;
    let client = Legacy::new(&gw);
    let session = client.open().await;
    let batch = json!([{"jsonrpc": "2.0", "method": "notifications/roots/list_changed"}]).to_string();

    let reply = client.post(Some(&session), batch).await;

    assert!(reply.status.is_success(), "{}", reply.raw);
    assert!(up.seen().iter().any(|s| s.body.is_array()), "{}", up.dump());
}

#[tokio::test]
async fn a_draining_replica_finishes_relaying_a_streamed_post() {
    let up = FakeUpstream::new().on(
        "tools/call",
        Answer::Sse(vec![
            Step::progress(0.5),
            Step::Sleep(Duration::from_millis(1500)),
            Step::result(json!({})),
        ]),
    );
    let (_up, gw) = setup(up).await;
    let client = Legacy::new(&gw);
    let session = client.open().await;
    let body = json!({"jsonrpc": "2.0", "id": 8, "method": "tools/call",
        "params": {"name": "slow", "arguments": {}, "_meta": {"progressToken": "p"}}});
    let mut events = client.stream(&session, body.to_string()).await;
    assert_eq!(events.next().await.unwrap()["method"], "notifications/progress");

    gw.begin_shutdown();

    let done = events.next().await.expect("the answer still arrives");
    assert_eq!(done["id"], 8, "{done}");
}

#[tokio::test]
async fn a_streamed_post_gives_its_body_budget_back_once_sent() {
    let up = FakeUpstream::new().on(
        "tools/call",
        Answer::Sse(vec![
            Step::progress(0.5),
            Step::Sleep(Duration::from_millis(1500)),
            Step::result(json!({})),
        ]),
    );
    let up = up.start().await;
    let toml =
        "[[upstreams]]\nname = \"u\"\nurl = \"{upstream}\"\n[[routes]]\npath = \"/mcp\"\nupstream = \"u\"\n\
                [limits]\nmax_body_bytes = 20000\nmax_buffered_body_bytes = 20000\n";
    let gw = Gateway::from_toml(toml, up.url()).await;
    let client = Legacy::new(&gw);
    let session = client.open().await;
    let big = |id: u32| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "slow", "arguments": {"pad": "p".repeat(15_000)}, "_meta": {"progressToken": "p"}}})
        .to_string()
    };
    let mut first = client.stream(&session, big(1)).await;
    assert_eq!(first.next().await.unwrap()["method"], "notifications/progress");

    // While the first answer streams, a second body of the same size fits.
    let second = client.post(Some(&session), big(2)).await;

    assert_eq!(second.status, 200, "{}", second.raw);
    assert_eq!(first.next().await.unwrap()["id"], 1);
}

#[tokio::test]
async fn last_event_id_is_relayed_within_bounds() {
    let up = echo().get_stream(vec![Step::notify("notifications/tools/list_changed", json!({}))]);
    let (up, gw) = setup(up).await;
    let client = Legacy::new(&gw);
    let session = client.open().await;

    let req = client.request(http::Method::GET, Some(&session)).header("last-event-id", "ev-41");
    // The fake has no stream to resume (405): what matters is what it was asked.
    support::client::send(&support::client::http_client(), req.body(Full::new(Bytes::new())).unwrap()).await;
    assert_eq!(up.http(http::Method::GET)[0].header("last-event-id"), Some("ev-41"));

    let long = "x".repeat(2000);
    let req = client.request(http::Method::GET, Some(&session)).header("last-event-id", long.as_str());
    let resp =
        support::client::send(&support::client::http_client(), req.body(Full::new(Bytes::new())).unwrap())
            .await;
    assert_eq!(resp.status(), 400);
    assert_eq!(up.http(http::Method::GET).len(), 1, "nothing more upstream");
}

#[tokio::test]
async fn an_initialize_answer_that_is_not_json_rpc_is_a_gateway_error() {
    let up = FakeUpstream::new().on(
        "initialize",
        Answer::Raw {
            status: 200,
            content_type: "application/json".into(),
            body: "<h1>internals</h1>".into(),
        },
    );
    let (_up, gw) = setup(up).await;

    let reply = Legacy::new(&gw).post(None, init_body(json!("i"))).await;

    reply.assert_error(502, -32603, &json!("i"));
    assert!(!reply.raw.contains("internals"), "{}", reply.raw);
    assert!(reply.header("mcp-session-id").is_none());
}
