//! Questions a legacy upstream asks mid-call (elicitation): declined when the
//! client cannot answer, an `input_required` round when it can, declined
//! upstream when no flow can be parked or the client never comes back.

mod support;
use support::single_route;

use serde_json::{json, Value};
use support::{Answer, FakeUpstream, Gateway, Step, Upstream};

const ASK_CITY: &str = "Which city?";

/// A tool that asks for a city (elicitation id `q-1`), waits for the answer,
/// then finishes.
async fn asking_upstream() -> Upstream {
    FakeUpstream::new()
        .on(
            "tools/call",
            Answer::Sse(vec![
                Step::ask(
                    json!("q-1"),
                    "elicitation/create",
                    json!({"message": ASK_CITY, "requestedSchema": {"type": "object",
                        "properties": {"city": {"type": "string"}}}}),
                ),
                Step::await_response(json!("q-1")),
                Step::result(json!({"content": [{"type": "text", "text": "carried on"}]})),
            ]),
        )
        .start()
        .await
}

fn call_params() -> Value {
    json!({"name": "weather", "arguments": {"when": "today"}})
}

/// The gateway's POSTed answer to the upstream question `q-1`.
async fn answer_to_q1(up: &Upstream) -> Value {
    up.wait_for("the answer to q-1", |s| s.is_response() && s.rpc_id() == Some(&json!("q-1"))).await.body
}

#[tokio::test]
async fn undeclared_elicitation_is_declined_upstream_and_reported_as_missing_capability() {
    let up = asking_upstream().await;
    let gw = Gateway::start(up.url()).await;

    let reply = gw.request("tools/call").id(json!(11)).params(call_params()).send().await;

    reply.assert_error(400, -32021, &json!(11));
    assert_eq!(reply.body["error"]["data"]["requiredCapabilities"], json!({"elicitation": {}}));
    assert_eq!(answer_to_q1(&up).await["result"]["action"], "cancel");
    let call = up.calls("tools/call").remove(0);
    let cancelled =
        up.wait_for("notifications/cancelled", |s| s.rpc_method() == Some("notifications/cancelled")).await;
    assert_eq!(cancelled.body["params"]["requestId"], call.body["id"]);
}

fn no_parking() -> String {
    single_route("", "[limits]\nmax_parked_flows = 0")
}

#[tokio::test]
async fn elicitation_with_no_room_to_park_is_declined_upstream_and_the_client_is_told() {
    let up = asking_upstream().await;
    let gw = Gateway::from_toml(&no_parking(), up.url()).await;

    let reply = gw
        .request("tools/call")
        .id(json!(12))
        .params(call_params())
        .capabilities(json!({"elicitation": {}}))
        .send()
        .await;

    reply.assert_error(503, -31000, &json!(12));
    assert_eq!(reply.reason(), Some("too_many_paused_calls"), "{}", reply.raw);
    assert_eq!(reply.body["error"]["data"]["questionDeclined"], true);
    assert!(!reply.raw.contains(ASK_CITY), "{}", reply.raw);
    assert!(!reply.raw.contains("carried on"), "not an answer shaped by a decline: {}", reply.raw);
    assert_eq!(answer_to_q1(&up).await["result"]["action"], "cancel");
}

#[tokio::test]
async fn declared_elicitation_becomes_an_input_required_round() {
    let up = asking_upstream().await;
    let gw = Gateway::start(up.url()).await;

    let first = gw
        .request("tools/call")
        .id(json!(1))
        .params(call_params())
        .capabilities(json!({"elicitation": {}}))
        .send()
        .await;

    assert_eq!(first.status, 200, "{}", first.raw);
    assert_eq!(first.body["id"], 1);
    let round = first.result();
    assert_eq!(round["resultType"], "input_required", "{round}");
    let requests = round["inputRequests"].as_object().expect("inputRequests");
    assert_eq!(requests.len(), 1, "{round}");
    let (key, question) = requests.iter().next().unwrap();
    assert_eq!(question["method"], "elicitation/create");
    assert_eq!(question["params"]["message"], ASK_CITY);
    assert!(question.get("id").is_none(), "no JSON-RPC id in an input request");
    let state = round["requestState"].as_str().expect("requestState");
    assert!(up.responses().is_empty(), "nothing answered upstream yet");
    assert_eq!(gw.metric("sessionless_parked_flows_open").await, 1.0);

    let mut params = call_params();
    params["requestState"] = json!(state);
    params["inputResponses"] = json!({key: {"action": "accept", "content": {"city": "Paris"}}});
    let retry = gw
        .request("tools/call")
        .id(json!(2))
        .params(params.clone())
        .capabilities(json!({"elicitation": {}}))
        .send()
        .await;

    assert_eq!(retry.status, 200, "{}", retry.raw);
    assert_eq!(retry.body["id"], 2);
    assert_eq!(retry.result()["resultType"], "complete");
    assert_eq!(retry.result()["content"][0]["text"], "carried on");
    let answer = answer_to_q1(&up).await;
    assert_eq!(answer["result"], json!({"action": "accept", "content": {"city": "Paris"}}));
    assert_eq!(up.calls("tools/call").len(), 1, "the call ran once");
    assert_eq!(gw.metric("sessionless_parked_flows_open").await, 0.0);

    let replay = gw
        .request("tools/call")
        .id(json!(3))
        .params(params)
        .capabilities(json!({"elicitation": {}}))
        .send()
        .await;
    replay.assert_error(400, -32602, &json!(3));
    assert_eq!(replay.reason(), Some("flow_finished"));
    assert_eq!(up.responses().len(), 1, "a replay never reaches the upstream");
}

fn short_parking() -> String {
    single_route("", "[limits]\nparked_flow_ttl_ms = 200")
}

#[tokio::test]
async fn abandoned_round_is_declined_upstream_when_it_expires() {
    let up = asking_upstream().await;
    let gw = Gateway::from_toml(&short_parking(), up.url()).await;

    let first = gw
        .request("tools/call")
        .id(json!(1))
        .params(call_params())
        .capabilities(json!({"elicitation": {}}))
        .send()
        .await;
    assert_eq!(first.result()["resultType"], "input_required", "{}", first.raw);
    let state = first.result()["requestState"].as_str().unwrap().to_string();
    let key = first.result()["inputRequests"].as_object().unwrap().keys().next().unwrap().clone();

    assert_eq!(answer_to_q1(&up).await["result"]["action"], "cancel");

    let mut params = call_params();
    params["requestState"] = json!(state);
    params["inputResponses"] = json!({key: {"action": "accept", "content": {"city": "Oslo"}}});
    let late = gw
        .request("tools/call")
        .id(json!(2))
        .params(params)
        .capabilities(json!({"elicitation": {}}))
        .send()
        .await;
    late.assert_error(400, -32602, &json!(2));
    assert_eq!(late.reason(), Some("expired"));
    assert_eq!(gw.metric("sessionless_parked_flows_open").await, 0.0);
    assert_eq!(gw.metric("sessionless_parked_flows_expired_total").await, 1.0);
    assert_eq!(up.responses().len(), 1, "{}", up.dump());
    gw.assert_healthy().await;
}

#[tokio::test]
async fn request_state_is_bound_to_its_caller_and_arguments() {
    let up = asking_upstream().await;
    let gw = Gateway::start(up.url()).await;
    let first = gw
        .request("tools/call")
        .params(call_params())
        .capabilities(json!({"elicitation": {}}))
        .bearer("alice")
        .send()
        .await;
    let round = first.result().clone();
    let key = round["inputRequests"].as_object().unwrap().keys().next().unwrap().clone();
    let retry = |params: Value, token: &str, id: i64| {
        let mut p = params;
        p["requestState"] = round["requestState"].clone();
        p["inputResponses"] = json!({&key: {"action": "accept", "content": {"city": "Rome"}}});
        gw.request("tools/call")
            .id(json!(id))
            .params(p)
            .capabilities(json!({"elicitation": {}}))
            .bearer(token)
    };

    let bob = retry(call_params(), "bob", 2).send().await;
    bob.assert_error(400, -32602, &json!(2));
    assert_eq!(bob.reason(), Some("wrong_principal"));

    let other_args = json!({"name": "weather", "arguments": {"when": "tomorrow"}});
    let changed = retry(other_args, "alice", 3).send().await;
    changed.assert_error(400, -32602, &json!(3));
    assert_eq!(changed.reason(), Some("wrong_request"));

    let mut forged = call_params();
    forged["requestState"] = json!("AAAA-not-a-sealed-state");
    let forged = gw
        .request("tools/call")
        .id(json!(4))
        .params(forged)
        .capabilities(json!({"elicitation": {}}))
        .bearer("alice")
        .send()
        .await;
    forged.assert_error(400, -32602, &json!(4));
    assert!(forged.reason().is_some(), "{}", forged.raw);
    assert!(up.responses().is_empty(), "no rejected retry reaches the upstream");
    assert!(gw.metric("sessionless_request_state_rejected_total").await >= 3.0);

    let alice = retry(call_params(), "alice", 5).send().await;
    assert_eq!(alice.status, 200, "{}", alice.raw);
    assert_eq!(alice.result()["content"][0]["text"], "carried on");
    assert_eq!(answer_to_q1(&up).await["result"]["content"]["city"], "Rome");
}

#[tokio::test]
async fn roots_asked_on_the_get_stream_become_a_round_on_a_session_of_its_own() {
    let up = FakeUpstream::new()
        .get_stream(vec![Step::ask(json!("r-1"), "roots/list", json!({})), Step::hang()])
        .on(
            "tools/call",
            Answer::Sse(vec![
                Step::await_response(json!("r-1")),
                Step::result(json!({"content": [{"type": "text", "text": "listed"}]})),
            ]),
        )
        .start()
        .await;
    let gw = Gateway::start(up.url()).await;
    let roots = json!({"roots": {"listChanged": true}});

    let first =
        gw.request("tools/call").id(json!(1)).params(call_params()).capabilities(roots.clone()).send().await;

    assert_eq!(first.status, 200, "{}", first.raw);
    let round = first.result().clone();
    assert_eq!(round["resultType"], "input_required", "{round}");
    let (key, question) = round["inputRequests"].as_object().unwrap().iter().next().unwrap();
    assert_eq!(question["method"], "roots/list");
    let init = up.calls("initialize").remove(0);
    assert_eq!(
        init.body["params"]["capabilities"],
        json!({"roots": {}}),
        "roots declared without listChanged"
    );

    let mut params = call_params();
    params["requestState"] = round["requestState"].clone();
    params["inputResponses"] = json!({key: {"roots": [{"uri": "file:///home/me", "name": "home"}]}});
    let retry = gw.request("tools/call").id(json!(2)).params(params).capabilities(roots).send().await;

    assert_eq!(retry.status, 200, "{}", retry.raw);
    assert_eq!(retry.result()["content"][0]["text"], "listed");
    let answer =
        up.wait_for("the roots answer", |s| s.is_response() && s.rpc_id() == Some(&json!("r-1"))).await;
    assert_eq!(answer.body["result"]["roots"][0]["uri"], "file:///home/me");
    let session = up.calls("tools/call")[0].session().unwrap().to_string();
    assert_eq!(answer.session(), Some(session.as_str()));
    up.wait_for("the call's own session to be closed", |s| {
        s.method == http::Method::DELETE && s.session() == Some(session.as_str())
    })
    .await;
    assert_eq!(gw.settled_metric("sessionless_upstream_sessions_open", 0.0).await, 0.0);
}

fn short_drain() -> String {
    single_route("", "[server]\ndrain_timeout_ms = 300")
}

#[tokio::test]
async fn draining_serves_retries_and_refuses_new_calls() {
    let up = asking_upstream().await;
    let gw = Gateway::from_toml(&short_drain().replace("300", "10000"), up.url()).await;
    let elicitation = json!({"elicitation": {}});
    let first = gw.request("tools/call").params(call_params()).capabilities(elicitation.clone()).send().await;
    assert_eq!(first.result()["resultType"], "input_required", "{}", first.raw);

    gw.begin_shutdown();
    let (status, _) = gw.get("/readyz").await;
    assert_eq!(status, 503, "not ready while draining");
    let fresh = gw
        .request("tools/call")
        .id(json!(5))
        .params(call_params())
        .capabilities(elicitation.clone())
        .send()
        .await;
    fresh.assert_error(503, -31000, &json!(5));
    assert!(fresh.header("retry-after").is_some());

    let key = first.result()["inputRequests"].as_object().unwrap().keys().next().unwrap().clone();
    let mut params = call_params();
    params["inputResponses"] = json!({key: {"action": "accept", "content": {"city": "Oslo"}}});
    params["requestState"] = first.result()["requestState"].clone();
    let retry = gw.request("tools/call").id(json!(6)).params(params).capabilities(elicitation).send().await;
    assert_eq!(retry.status, 200, "{}", retry.raw);
    assert_eq!(retry.result()["content"][0]["text"], "carried on");
    assert_eq!(answer_to_q1(&up).await["result"]["action"], "accept");
    // Nothing left parked: the drain ends well before its 10 s deadline.
    tokio::time::timeout(std::time::Duration::from_secs(8), gw.stop())
        .await
        .expect("drain ends when no flow is left");
}

#[tokio::test]
async fn shutdown_declines_flows_still_parked_at_the_drain_deadline() {
    let up = asking_upstream().await;
    let gw = Gateway::from_toml(&short_drain(), up.url()).await;
    let first =
        gw.request("tools/call").params(call_params()).capabilities(json!({"elicitation": {}})).send().await;
    assert_eq!(first.result()["resultType"], "input_required", "{}", first.raw);

    gw.stop().await;

    assert_eq!(answer_to_q1(&up).await["result"]["action"], "cancel");
}

#[tokio::test]
async fn sibling_questions_share_a_round_and_missing_answers_are_asked_again() {
    let up = FakeUpstream::new()
        .on(
            "tools/call",
            Answer::Sse(vec![
                Step::ask(
                    json!("q-a"),
                    "elicitation/create",
                    json!({"message": "first?", "requestedSchema": {"type": "object", "properties": {}}}),
                ),
                Step::ask(
                    json!("q-b"),
                    "elicitation/create",
                    json!({"message": "second?", "requestedSchema": {"type": "object", "properties": {}}}),
                ),
                Step::await_response(json!("q-a")),
                Step::await_response(json!("q-b")),
                Step::result(json!({"content": [{"type": "text", "text": "both answered"}]})),
            ]),
        )
        .start()
        .await;
    let gw = Gateway::start(up.url()).await;
    let elicitation = json!({"elicitation": {}});

    let round1 = gw
        .request("tools/call")
        .id(json!(1))
        .params(call_params())
        .capabilities(elicitation.clone())
        .send()
        .await;
    let r1 = round1.result().clone();
    let requests = r1["inputRequests"].as_object().expect("inputRequests");
    assert_eq!(requests.len(), 2, "siblings share one round: {r1}");
    let key_of = |message: &str| {
        requests.iter().find(|(_, q)| q["params"]["message"] == message).map(|(k, _)| k.clone()).unwrap()
    };
    let (first, second) = (key_of("first?"), key_of("second?"));

    let mut partial = call_params();
    partial["requestState"] = r1["requestState"].clone();
    partial["inputResponses"] = json!({&first: {"action": "accept", "content": {}}});
    let round2 = gw
        .request("tools/call")
        .id(json!(2))
        .params(partial.clone())
        .capabilities(elicitation.clone())
        .send()
        .await;
    let r2 = round2.result().clone();
    assert_eq!(r2["resultType"], "input_required", "{}", round2.raw);
    let left: Vec<&String> = r2["inputRequests"].as_object().unwrap().keys().collect();
    assert_eq!(left, [&second], "only the unanswered question is asked again");

    let stale =
        gw.request("tools/call").id(json!(3)).params(partial).capabilities(elicitation.clone()).send().await;
    stale.assert_error(400, -32602, &json!(3));
    assert_eq!(stale.reason(), Some("stale_round"));

    let mut rest = call_params();
    rest["requestState"] = r2["requestState"].clone();
    rest["inputResponses"] = json!({&second: {"action": "decline"}});
    let done = gw.request("tools/call").id(json!(4)).params(rest).capabilities(elicitation).send().await;
    assert_eq!(done.status, 200, "{}", done.raw);
    assert_eq!(done.result()["content"][0]["text"], "both answered");
    let answers = up.responses();
    assert_eq!(answers.len(), 2, "{}", up.dump());
    assert_eq!(answers[0].body["id"], "q-a");
    assert_eq!(answers[0].body["result"]["action"], "accept");
    assert_eq!(answers[1].body["id"], "q-b");
    assert_eq!(answers[1].body["result"]["action"], "decline");
}
