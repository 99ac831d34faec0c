//! More MRTR rounds against fake legacy upstreams: several rounds, decline
//! and cancel, sampling, malformed answers, -32042 URL elicitation, an
//! upstream that dies while a flow is parked, progress on the retry,
//! prompts/get and resources/read, `requestState` rejections, TTL and cap.

mod support;
use support::single_route;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use support::{Answer, FakeUpstream, Gateway, ModernRequest, Reply, Step, Upstream};

fn elicit(id: &str, message: &str) -> Step {
    Step::ask(
        json!(id),
        "elicitation/create",
        json!({"message": message, "requestedSchema": {"type": "object",
            "properties": {"value": {"type": "string"}}}}),
    )
}

fn done_text(text: &str) -> Step {
    Step::result(json!({"content": [{"type": "text", "text": text}]}))
}

fn call_params() -> Value {
    json!({"name": "weather", "arguments": {"when": "today"}})
}

fn elicitation() -> Value {
    json!({"elicitation": {}})
}

/// A tool that asks one question (`q-1`), waits for its answer, then finishes.
async fn asking_upstream() -> Upstream {
    FakeUpstream::new()
        .on(
            "tools/call",
            Answer::Sse(vec![
                elicit("q-1", "Which city?"),
                Step::await_response(json!("q-1")),
                done_text("carried on"),
            ]),
        )
        .start()
        .await
}

/// The `input_required` result of `reply`, checked; with its single key.
fn round_of(reply: &Reply) -> (Value, String) {
    assert_eq!(reply.status, 200, "{}", reply.raw);
    let round = reply.result().clone();
    assert_eq!(round["resultType"], "input_required", "{}", reply.raw);
    assert!(round["requestState"].is_string(), "{round}");
    let requests = round["inputRequests"].as_object().expect("inputRequests");
    assert_eq!(requests.len(), 1, "one question: {round}");
    let key = requests.keys().next().unwrap().clone();
    (round, key)
}

/// A retry of `method` with `params`, the round's `requestState` and `responses`.
fn retry(
    gw: &Gateway,
    method: &str,
    params: Value,
    round: &Value,
    responses: Value,
    id: i64,
    caps: Value,
) -> ModernRequest {
    let mut p = params;
    p["requestState"] = round["requestState"].clone();
    p["inputResponses"] = responses;
    gw.request(method).id(json!(id)).params(p).capabilities(caps)
}

/// The gateway's POSTed JSON-RPC response to the upstream request `id`.
async fn response_to(up: &Upstream, id: Value) -> Value {
    up.wait_for(&format!("the response to {id}"), |s| s.is_response() && s.rpc_id() == Some(&id)).await.body
}

/// The sum of the samples of `name` whose labels contain `label`.
async fn metric_where(gw: &Gateway, name: &str, label: &str) -> f64 {
    let (_, text) = gw.get("/metrics").await;
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn assert_complete(reply: &Reply, id: i64, text: &str) {
    assert_eq!(reply.status, 200, "{}", reply.raw);
    assert_eq!(reply.body["id"], id, "{}", reply.raw);
    assert_eq!(reply.result()["resultType"], "complete", "{}", reply.raw);
    assert_eq!(reply.result()["content"][0]["text"], text, "{}", reply.raw);
}

// 1. Two rounds ---------------------------------------------------------------

#[tokio::test]
async fn a_second_question_after_the_first_answer_is_a_second_round() {
    let up = FakeUpstream::new()
        .on(
            "tools/call",
            Answer::Sse(vec![
                elicit("a-1", "Which city?"),
                Step::await_response(json!("a-1")),
                elicit("b-1", "Which day?"),
                Step::await_response(json!("b-1")),
                done_text("two rounds"),
            ]),
        )
        .start()
        .await;
    let gw = Gateway::start(up.url()).await;

    let first =
        gw.request("tools/call").id(json!(1)).params(call_params()).capabilities(elicitation()).send().await;
    let (r1, k1) = round_of(&first);
    assert_eq!(r1["inputRequests"][&k1]["params"]["message"], "Which city?");

    let second = retry(
        &gw,
        "tools/call",
        call_params(),
        &r1,
        json!({&k1: {"action": "accept", "content": {"value": "Paris"}}}),
        2,
        elicitation(),
    )
    .send()
    .await;
    assert_eq!(second.body["id"], 2);
    let (r2, k2) = round_of(&second);
    assert_eq!(r2["inputRequests"][&k2]["params"]["message"], "Which day?");
    assert_ne!(k1, k2, "a new round has a new key");
    assert_ne!(r1["requestState"], r2["requestState"], "and a new state");
    assert_eq!(
        response_to(&up, json!("a-1")).await["result"],
        json!({"action": "accept", "content": {"value": "Paris"}})
    );
    assert_eq!(up.responses().len(), 1, "{}", up.dump());

    // Round 1's state once round 2 has begun.
    let stale = retry(
        &gw,
        "tools/call",
        call_params(),
        &r1,
        json!({&k1: {"action": "accept", "content": {"value": "Lyon"}}}),
        3,
        elicitation(),
    )
    .send()
    .await;
    stale.assert_error(400, -32602, &json!(3));
    assert_eq!(stale.reason(), Some("stale_round"), "{}", stale.raw);
    assert_eq!(up.responses().len(), 1, "nothing more upstream: {}", up.dump());

    let done = retry(
        &gw,
        "tools/call",
        call_params(),
        &r2,
        json!({&k2: {"action": "accept", "content": {"value": "Monday"}}}),
        4,
        elicitation(),
    )
    .send()
    .await;
    assert_complete(&done, 4, "two rounds");
    assert_eq!(
        response_to(&up, json!("b-1")).await["result"],
        json!({"action": "accept", "content": {"value": "Monday"}})
    );
    assert_eq!(up.responses().len(), 2, "{}", up.dump());
    assert_eq!(up.calls("tools/call").len(), 1, "the call ran once");
    assert_eq!(gw.metric("sessionless_parked_flows_open").await, 0.0);

    // After the end, either round's state finds nothing.
    for (round, id) in [(&r1, 5), (&r2, 6)] {
        let late = retry(&gw, "tools/call", call_params(), round, json!({}), id, elicitation()).send().await;
        late.assert_error(400, -32602, &json!(id));
        assert_eq!(late.reason(), Some("flow_finished"), "{}", late.raw);
    }
    assert_eq!(up.responses().len(), 2, "{}", up.dump());
}

// 2. Decline and cancel ------------------------------------------------------

async fn answer_passes_through(action: &str) {
    let up = asking_upstream().await;
    let gw = Gateway::start(up.url()).await;
    let first = gw.request("tools/call").params(call_params()).capabilities(elicitation()).send().await;
    let (round, key) = round_of(&first);

    let done =
        retry(&gw, "tools/call", call_params(), &round, json!({key: {"action": action}}), 2, elicitation())
            .send()
            .await;

    assert_complete(&done, 2, "carried on");
    assert_eq!(
        response_to(&up, json!("q-1")).await,
        json!({"jsonrpc": "2.0", "id": "q-1", "result": {"action": action}}),
        "exactly the client's answer"
    );
    assert_eq!(up.responses().len(), 1, "{}", up.dump());
}

#[tokio::test]
async fn a_declined_elicitation_reaches_the_upstream_as_decline() {
    answer_passes_through("decline").await;
}

#[tokio::test]
async fn a_cancelled_elicitation_reaches_the_upstream_as_cancel() {
    answer_passes_through("cancel").await;
}

// 3. Sampling ----------------------------------------------------------------

#[tokio::test]
async fn sampling_becomes_a_round_and_the_client_result_reaches_the_upstream() {
    let messages = json!([{"role": "user", "content": {"type": "text", "text": "Capital of France?"}}]);
    let up = FakeUpstream::new()
        .on(
            "tools/call",
            Answer::Sse(vec![
                Step::ask(
                    json!(7),
                    "sampling/createMessage",
                    json!({"messages": messages, "maxTokens": 50,
                        "_meta": {"trace": "t-1"}}),
                ),
                Step::await_response(json!(7)),
                done_text("sampled"),
            ]),
        )
        .start()
        .await;
    let gw = Gateway::start(up.url()).await;
    let sampling = json!({"sampling": {}});

    let first = gw
        .request("tools/call")
        .id(json!(1))
        .params(call_params())
        .capabilities(sampling.clone())
        .send()
        .await;
    let (round, key) = round_of(&first);
    assert_eq!(
        round["inputRequests"][&key],
        json!({"method": "sampling/createMessage",
            "params": {"messages": messages, "maxTokens": 50}}),
        "no jsonrpc, id or _meta in an input request"
    );
    assert!(up.responses().is_empty());

    let answer = json!({"role": "assistant", "content": {"type": "text", "text": "Paris."},
        "model": "m", "stopReason": "endTurn"});
    let done =
        retry(&gw, "tools/call", call_params(), &round, json!({&key: answer}), 2, sampling).send().await;

    assert_complete(&done, 2, "sampled");
    assert_eq!(response_to(&up, json!(7)).await, json!({"jsonrpc": "2.0", "id": 7, "result": answer}));
}

// 4. Malformed answers, missing answers --------------------------------------

#[tokio::test]
async fn malformed_answers_are_refused_and_the_flow_waits_for_a_good_one() {
    let up = asking_upstream().await;
    let gw = Gateway::start(up.url()).await;
    let first = gw.request("tools/call").params(call_params()).capabilities(elicitation()).send().await;
    let (round, key) = round_of(&first);

    let bad_answers = [
        json!({&key: {"action": "maybe"}}),
        json!({&key: 12345}),
        json!({&key: {"role": "assistant", "content": {"type": "text", "text": "x"}}}),
        json!({&key: {"action": "accept", "content": "Paris"}}),
        json!("not a map"),
    ];
    for (i, bad) in bad_answers.into_iter().enumerate() {
        let id = 10 + i as i64;
        let reply =
            retry(&gw, "tools/call", call_params(), &round, bad.clone(), id, elicitation()).send().await;
        reply.assert_error(400, -32602, &json!(id));
        assert_eq!(reply.reason(), Some("malformed_input_response"), "{bad}: {}", reply.raw);
    }
    assert!(up.responses().is_empty(), "{}", up.dump());
    assert_eq!(gw.metric("sessionless_parked_flows_open").await, 1.0);

    let done = retry(
        &gw,
        "tools/call",
        call_params(),
        &round,
        json!({&key: {"action": "accept", "content": {"value": "Paris"}}}),
        20,
        elicitation(),
    )
    .send()
    .await;
    assert_complete(&done, 20, "carried on");
    assert_eq!(
        response_to(&up, json!("q-1")).await["result"],
        json!({"action": "accept", "content": {"value": "Paris"}})
    );
    assert_eq!(up.responses().len(), 1, "{}", up.dump());
}

#[tokio::test]
async fn a_retry_without_the_answer_asks_again_and_unknown_keys_are_ignored() {
    let up = asking_upstream().await;
    let gw = Gateway::start(up.url()).await;
    let first = gw.request("tools/call").params(call_params()).capabilities(elicitation()).send().await;
    let (r1, key) = round_of(&first);

    let again = retry(
        &gw,
        "tools/call",
        call_params(),
        &r1,
        json!({"not_asked": {"action": "accept"}}),
        2,
        elicitation(),
    )
    .send()
    .await;
    let (r2, key2) = round_of(&again);
    assert_eq!(key2, key, "the same question, asked again");
    assert_eq!(r2["inputRequests"], r1["inputRequests"]);
    assert_ne!(r2["requestState"], r1["requestState"]);
    assert!(up.responses().is_empty(), "{}", up.dump());

    let done = retry(
        &gw,
        "tools/call",
        call_params(),
        &r2,
        json!({&key: {"action": "accept", "content": {"value": "Rome"}}}),
        3,
        elicitation(),
    )
    .send()
    .await;
    assert_complete(&done, 3, "carried on");
    assert_eq!(up.responses().len(), 1, "{}", up.dump());
}

// 5. -32042 URL elicitation required -----------------------------------------

fn url_required(request: &Value) -> Answer {
    let body = json!({"jsonrpc": "2.0", "id": request["id"], "error": {
        "code": -32042, "message": "URL elicitation required",
        "data": {"elicitations": [{"mode": "url", "elicitationId": "e1",
            "url": "https://example.com/auth", "message": "Sign in"}]}}});
    Answer::Raw { status: 200, content_type: "application/json".into(), body: body.to_string() }
}

#[tokio::test]
async fn url_elicitation_required_becomes_a_url_round_whose_retry_reissues_the_call() {
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    let up = FakeUpstream::new()
        .on_fn("tools/call", move |req| {
            if seen.fetch_add(1, Ordering::SeqCst) == 0 {
                return url_required(req);
            }
            Answer::Sse(vec![
                Step::notify("notifications/elicitation/complete", json!({"elicitationId": "e1"})),
                Step::progress(0.5),
                done_text("signed in"),
            ])
        })
        .start()
        .await;
    let gw = Gateway::start(up.url()).await;
    let caps = json!({"elicitation": {"url": {}}});

    let first =
        gw.request("tools/call").id(json!(1)).params(call_params()).capabilities(caps.clone()).send().await;
    let (round, key) = round_of(&first);
    assert_eq!(
        round["inputRequests"][&key],
        json!({"method": "elicitation/create", "params": {"mode": "url",
            "url": "https://example.com/auth", "message": "Sign in"}}),
        "URL mode, without elicitationId"
    );

    let bad =
        retry(&gw, "tools/call", call_params(), &round, json!({&key: {"action": "maybe"}}), 2, caps.clone())
            .send()
            .await;
    bad.assert_error(400, -32602, &json!(2));
    assert_eq!(up.calls("tools/call").len(), 1, "a bad answer re-issues nothing");

    let done = retry(&gw, "tools/call", call_params(), &round, json!({&key: {"action": "accept"}}), 3, caps)
        .progress_token(json!("p-url"))
        .send()
        .await;

    assert_complete(&done, 3, "signed in");
    let calls = up.calls("tools/call");
    assert_eq!(calls.len(), 2, "the retry re-issued the call: {}", up.dump());
    let again = &calls[1].body["params"];
    assert_eq!(again["name"], "weather");
    assert_eq!(again["arguments"], json!({"when": "today"}));
    assert!(again.get("requestState").is_none(), "{again}");
    assert!(again.get("inputResponses").is_none(), "{again}");
    assert!(up.responses().is_empty(), "nothing is answered upstream");
    assert!(!done.raw.contains("elicitation/complete"), "never passed on: {}", done.raw);
    assert!(done.notes.iter().all(|n| n["method"] == "notifications/progress"), "{:?}", done.notes);
}

#[tokio::test]
async fn url_elicitation_required_without_url_capability_is_missing_capability() {
    let up = FakeUpstream::new().on_fn("tools/call", url_required).start().await;
    let gw = Gateway::start(up.url()).await;

    let reply =
        gw.request("tools/call").id(json!(9)).params(call_params()).capabilities(elicitation()).send().await;

    reply.assert_error(400, -32021, &json!(9));
    assert!(
        reply.body["error"]["data"]["requiredCapabilities"]["elicitation"]["url"].is_object(),
        "{}",
        reply.raw
    );
    assert!(!reply.raw.contains("example.com"), "{}", reply.raw);
    assert_eq!(up.calls("tools/call").len(), 1);
    assert!(up.responses().is_empty());
}

// 6. The upstream dies while a flow is parked ----------------------------------

#[tokio::test]
async fn a_stream_broken_while_parked_makes_the_retry_an_outcome_unknown_error() {
    let up = FakeUpstream::new()
        .on("tools/call", Answer::Sse(vec![elicit("q-1", "Which city?"), Step::sleep_ms(100), Step::abort()]))
        .start()
        .await;
    let gw = Gateway::start(up.url()).await;
    let first = gw.request("tools/call").params(call_params()).capabilities(elicitation()).send().await;
    let (round, key) = round_of(&first);
    tokio::time::sleep(Duration::from_millis(250)).await; // the stream is broken by now

    let reply = retry(
        &gw,
        "tools/call",
        call_params(),
        &round,
        json!({key: {"action": "accept", "content": {"value": "Paris"}}}),
        2,
        elicitation(),
    )
    .send()
    .await;

    reply.assert_error(502, -32603, &json!(2));
    assert_eq!(reply.reason(), Some("outcome_unknown"), "{}", reply.raw);
    assert!(reply.body.get("result").is_none());
    assert_eq!(gw.metric("sessionless_parked_flows_open").await, 0.0);

    let again = retry(&gw, "tools/call", call_params(), &round, json!({}), 3, elicitation()).send().await;
    again.assert_error(400, -32602, &json!(3));
    assert_eq!(again.reason(), Some("flow_finished"), "{}", again.raw);
    gw.assert_healthy().await;
}

#[tokio::test]
async fn a_session_lost_while_parked_makes_the_retry_an_outcome_unknown_error() {
    let up = FakeUpstream::new()
        .on("tools/call", Answer::Sse(vec![elicit("q-1", "Which city?"), Step::hang()]))
        .start()
        .await;
    let gw = Gateway::start(up.url()).await;
    let first = gw.request("tools/call").params(call_params()).capabilities(elicitation()).send().await;
    let (round, key) = round_of(&first);
    up.forget_sessions();

    let reply = retry(
        &gw,
        "tools/call",
        call_params(),
        &round,
        json!({key: {"action": "accept", "content": {"value": "Paris"}}}),
        2,
        elicitation(),
    )
    .send()
    .await;

    reply.assert_error(502, -32603, &json!(2));
    assert_eq!(reply.reason(), Some("outcome_unknown"), "{}", reply.raw);
    let posted = up.wait_for("the answer, refused 404", |s| s.rpc_id() == Some(&json!("q-1"))).await;
    assert_eq!(posted.status, 404, "{}", up.dump());
    assert_eq!(gw.metric("sessionless_parked_flows_open").await, 0.0);
    gw.assert_healthy().await;

    // The pool gets over the lost session: a new call opens a new one.
    let fresh =
        gw.request("tools/call").id(json!(3)).params(call_params()).capabilities(elicitation()).send().await;
    round_of(&fresh);
    assert_eq!(up.initializes(), 2, "{}", up.dump());
}

// 7. Progress during round 2 ---------------------------------------------------

#[tokio::test]
async fn progress_after_the_answer_carries_the_retry_token() {
    let up = FakeUpstream::new()
        .on(
            "tools/call",
            Answer::Sse(vec![
                Step::progress(0.25),
                elicit("q-1", "Which city?"),
                Step::await_response(json!("q-1")),
                Step::progress(0.75),
                done_text("progressed"),
            ]),
        )
        .start()
        .await;
    let gw = Gateway::start(up.url()).await;

    let first = gw
        .request("tools/call")
        .id(json!(1))
        .params(call_params())
        .capabilities(elicitation())
        .progress_token(json!("p-1"))
        .send()
        .await;
    let (round, key) = round_of(&first);
    let progress1: Vec<&Value> =
        first.notes.iter().filter(|n| n["method"] == "notifications/progress").collect();
    assert_eq!(progress1.len(), 1, "{}", first.raw);
    assert_eq!(progress1[0]["params"]["progressToken"], "p-1");
    assert_eq!(progress1[0]["params"]["progress"], 0.25);

    let done = retry(
        &gw,
        "tools/call",
        call_params(),
        &round,
        json!({key: {"action": "accept", "content": {"value": "Paris"}}}),
        2,
        elicitation(),
    )
    .progress_token(json!("p-2"))
    .send()
    .await;

    assert_complete(&done, 2, "progressed");
    let progress2: Vec<&Value> =
        done.notes.iter().filter(|n| n["method"] == "notifications/progress").collect();
    assert_eq!(progress2.len(), 1, "{}", done.raw);
    assert_eq!(progress2[0]["params"]["progressToken"], "p-2", "{}", done.raw);
    assert_eq!(progress2[0]["params"]["progress"], 0.75);
}

// 8. prompts/get and resources/read; none on tools/list ------------------------

async fn round_trip_on(method: &str, params: Value, result: Value) -> (Reply, Upstream) {
    let up = FakeUpstream::new()
        .on(
            method,
            Answer::Sse(vec![
                elicit("q-1", "Which city?"),
                Step::await_response(json!("q-1")),
                Step::result(result),
            ]),
        )
        .start()
        .await;
    let gw = Gateway::start(up.url()).await;
    let first =
        gw.request(method).id(json!(1)).params(params.clone()).capabilities(elicitation()).send().await;
    let (round, key) = round_of(&first);
    assert_eq!(round["inputRequests"][&key]["method"], "elicitation/create");
    assert!(round.get("ttlMs").is_none(), "no cache fields: {round}");

    let done = retry(
        &gw,
        method,
        params,
        &round,
        json!({key: {"action": "accept", "content": {"value": "Oslo"}}}),
        2,
        elicitation(),
    )
    .send()
    .await;
    assert_eq!(response_to(&up, json!("q-1")).await["result"]["content"]["value"], "Oslo");
    assert_eq!(up.calls(method).len(), 1);
    (done, up)
}

#[tokio::test]
async fn prompts_get_gets_input_required_rounds() {
    let (done, _up) = round_trip_on(
        "prompts/get",
        json!({"name": "greet", "arguments": {"who": "me"}}),
        json!({"messages": [{"role": "user", "content": {"type": "text", "text": "hi Oslo"}}]}),
    )
    .await;
    assert_eq!(done.status, 200, "{}", done.raw);
    assert_eq!(done.body["id"], 2);
    assert_eq!(done.result()["resultType"], "complete", "{}", done.raw);
    assert_eq!(done.result()["messages"][0]["content"]["text"], "hi Oslo");
}

#[tokio::test]
async fn resources_read_gets_input_required_rounds() {
    let (done, _up) = round_trip_on(
        "resources/read",
        json!({"uri": "file:///notes.txt"}),
        json!({"contents": [{"uri": "file:///notes.txt", "text": "Oslo notes"}]}),
    )
    .await;
    assert_eq!(done.status, 200, "{}", done.raw);
    assert_eq!(done.body["id"], 2);
    assert_eq!(done.result()["resultType"], "complete", "{}", done.raw);
    assert_eq!(done.result()["contents"][0]["text"], "Oslo notes");
}

#[tokio::test]
async fn a_question_during_tools_list_is_declined_not_a_round() {
    let up = FakeUpstream::new()
        .on(
            "tools/list",
            Answer::Sse(vec![
                elicit("l-1", "Which city?"),
                Step::await_response(json!("l-1")),
                Step::result(json!({"tools": [{"name": "weather",
                    "inputSchema": {"type": "object"}}]})),
            ]),
        )
        .start()
        .await;
    let gw = Gateway::start(up.url()).await;

    let reply = gw.request("tools/list").id(json!(5)).capabilities(elicitation()).send().await;

    assert_eq!(reply.status, 200, "{}", reply.raw);
    assert_eq!(reply.body["id"], 5);
    assert_eq!(reply.result()["resultType"], "complete", "{}", reply.raw);
    assert_eq!(reply.result()["tools"][0]["name"], "weather");
    assert!(!reply.raw.contains("input_required"), "{}", reply.raw);
    assert_eq!(response_to(&up, json!("l-1")).await["result"], json!({"action": "cancel"}));
    assert_eq!(gw.metric("sessionless_parked_flows_open").await, 0.0);
}

// 9. requestState rejections ---------------------------------------------------

#[tokio::test]
async fn request_state_rejections_have_reasons_and_are_counted() {
    let up = asking_upstream().await;
    let gw = Gateway::start(up.url()).await;
    let first = gw
        .request("tools/call")
        .params(call_params())
        .capabilities(elicitation())
        .bearer("alice")
        .send()
        .await;
    let (round, key) = round_of(&first);
    let answer = json!({&key: {"action": "accept", "content": {"value": "Rome"}}});
    let lists_before = up.calls("tools/list").len();
    let rejected = "sessionless_request_state_rejected_total";

    // On a method without MRTR.
    let mut list = json!({});
    list["requestState"] = round["requestState"].clone();
    let reply = gw
        .request("tools/list")
        .id(json!(2))
        .params(list)
        .capabilities(elicitation())
        .bearer("alice")
        .send()
        .await;
    reply.assert_error(400, -32602, &json!(2));
    assert_eq!(reply.reason(), Some("wrong_request"), "{}", reply.raw);
    assert_eq!(up.calls("tools/list").len(), lists_before, "{}", up.dump());

    // From another tool.
    let other_tool = json!({"name": "forecast", "arguments": {"when": "today"}});
    let reply = retry(&gw, "tools/call", other_tool, &round, answer.clone(), 3, elicitation())
        .bearer("alice")
        .send()
        .await;
    reply.assert_error(400, -32602, &json!(3));
    assert_eq!(reply.reason(), Some("wrong_request"), "{}", reply.raw);

    // From another principal.
    let reply = retry(&gw, "tools/call", call_params(), &round, answer.clone(), 4, elicitation())
        .bearer("mallory")
        .send()
        .await;
    reply.assert_error(400, -32602, &json!(4));
    assert_eq!(reply.reason(), Some("wrong_principal"), "{}", reply.raw);

    // Garbage, and not a string.
    for (id, state) in [(5, json!("AAAA-garbage")), (6, json!(42))] {
        let bogus = json!({"requestState": state});
        let reply = retry(&gw, "tools/call", call_params(), &bogus, answer.clone(), id, elicitation())
            .bearer("alice")
            .send()
            .await;
        reply.assert_error(400, -32602, &json!(id));
        assert_eq!(reply.reason(), Some("invalid"), "{}", reply.raw);
    }

    assert!(up.responses().is_empty(), "{}", up.dump());
    assert_eq!(up.calls("tools/call").len(), 1, "{}", up.dump());
    assert_eq!(metric_where(&gw, rejected, "reason=\"wrong_request\"").await, 2.0);
    assert_eq!(metric_where(&gw, rejected, "reason=\"wrong_principal\"").await, 1.0);
    assert_eq!(metric_where(&gw, rejected, "reason=\"invalid\"").await, 2.0);

    // The flow survived all of it.
    let done = retry(&gw, "tools/call", call_params(), &round, answer, 7, elicitation())
        .bearer("alice")
        .send()
        .await;
    assert_complete(&done, 7, "carried on");
}

// 10. TTL and cap ---------------------------------------------------------------

fn ttl_300() -> String {
    single_route("", "[limits]\nparked_flow_ttl_ms = 300")
}

#[tokio::test]
async fn expired_flows_are_declined_upstream_by_kind_and_retries_get_expired() {
    let up = FakeUpstream::new()
        .on_fn("tools/call", |req| {
            if req["params"]["name"] == "summarise" {
                Answer::Sse(vec![
                    Step::ask(
                        json!("s-1"),
                        "sampling/createMessage",
                        json!({"messages": [{"role": "user",
                            "content": {"type": "text", "text": "sum up"}}], "maxTokens": 9}),
                    ),
                    Step::await_response(json!("s-1")),
                    done_text("never seen"),
                ])
            } else {
                Answer::Sse(vec![
                    elicit("e-1", "Which city?"),
                    Step::await_response(json!("e-1")),
                    done_text("never seen"),
                ])
            }
        })
        .start()
        .await;
    let gw = Gateway::from_toml(&ttl_300(), up.url()).await;
    let caps = json!({"elicitation": {}, "sampling": {}});
    let summarise = json!({"name": "summarise", "arguments": {}});

    let (ask, sample) = tokio::join!(
        gw.request("tools/call").params(call_params()).capabilities(caps.clone()).send(),
        gw.request("tools/call").params(summarise.clone()).capabilities(caps.clone()).send(),
    );
    let (ask_round, ask_key) = round_of(&ask);
    let (sample_round, sample_key) = round_of(&sample);
    assert_eq!(gw.metric("sessionless_parked_flows_open").await, 2.0);

    let elicit_answer = response_to(&up, json!("e-1")).await;
    assert_eq!(elicit_answer["result"], json!({"action": "cancel"}));
    let sample_answer = response_to(&up, json!("s-1")).await;
    assert!(sample_answer.get("result").is_none(), "{sample_answer}");
    assert!(sample_answer["error"]["code"].is_i64(), "{sample_answer}");

    let late = retry(
        &gw,
        "tools/call",
        call_params(),
        &ask_round,
        json!({ask_key: {"action": "accept", "content": {"value": "Oslo"}}}),
        3,
        caps.clone(),
    )
    .send()
    .await;
    late.assert_error(400, -32602, &json!(3));
    assert_eq!(late.reason(), Some("expired"), "{}", late.raw);
    let late = retry(
        &gw,
        "tools/call",
        summarise,
        &sample_round,
        json!({sample_key: {"role": "assistant",
            "content": {"type": "text", "text": "done"}, "model": "m"}}),
        4,
        caps,
    )
    .send()
    .await;
    late.assert_error(400, -32602, &json!(4));
    assert_eq!(late.reason(), Some("expired"), "{}", late.raw);

    assert_eq!(gw.metric("sessionless_parked_flows_expired_total").await, 2.0);
    assert_eq!(
        metric_where(&gw, "sessionless_request_state_rejected_total", "reason=\"expired\"").await,
        2.0
    );
    assert_eq!(gw.metric("sessionless_parked_flows_open").await, 0.0);
    assert_eq!(up.responses().len(), 2, "one decline each: {}", up.dump());
}

fn cap_1() -> String {
    single_route("", "[limits]\nmax_parked_flows = 1")
}

#[tokio::test]
async fn with_the_lot_full_a_second_flow_is_declined_and_the_first_still_completes() {
    // Each call's question is named after the call's upstream id.
    let up = FakeUpstream::new()
        .on_fn("tools/call", |req| {
            let q = json!(format!("q-{}", req["id"]));
            let when = req["params"]["arguments"]["when"].as_str().unwrap_or("");
            Answer::Sse(vec![
                Step::ask(
                    q.clone(),
                    "elicitation/create",
                    json!({"message": format!("City for {when}?"),
                        "requestedSchema": {"type": "object", "properties": {}}}),
                ),
                Step::await_response(q),
                done_text("finished"),
            ])
        })
        .start()
        .await;
    let gw = Gateway::from_toml(&cap_1(), up.url()).await;

    let first =
        gw.request("tools/call").id(json!(1)).params(call_params()).capabilities(elicitation()).send().await;
    let (round, key) = round_of(&first);
    assert_eq!(gw.metric("sessionless_parked_flows_open").await, 1.0);

    let tomorrow = json!({"name": "weather", "arguments": {"when": "tomorrow"}});
    let second =
        gw.request("tools/call").id(json!(2)).params(tomorrow).capabilities(elicitation()).send().await;
    second.assert_error(503, -31000, &json!(2));
    assert_eq!(second.reason(), Some("too_many_paused_calls"), "{}", second.raw);
    assert!(!second.raw.contains("City for"), "{}", second.raw);
    let calls = up.calls("tools/call");
    let q = |i: usize| json!(format!("q-{}", calls[i].body["id"]));
    assert_eq!(
        response_to(&up, q(1)).await["result"],
        json!({"action": "cancel"}),
        "the second flow's question was declined"
    );
    assert_eq!(gw.metric("sessionless_parked_flows_open").await, 1.0);

    let done = retry(
        &gw,
        "tools/call",
        call_params(),
        &round,
        json!({key: {"action": "accept", "content": {}}}),
        3,
        elicitation(),
    )
    .send()
    .await;
    assert_complete(&done, 3, "finished");
    assert_eq!(response_to(&up, q(0)).await["result"], json!({"action": "accept", "content": {}}));
    assert_eq!(up.responses().len(), 2, "{}", up.dump());
    assert_eq!(gw.metric("sessionless_parked_flows_open").await, 0.0);
}

// Single use --------------------------------------------------------------------

#[tokio::test]
async fn two_concurrent_retries_of_one_round_deliver_one_answer() {
    let up = FakeUpstream::new()
        .on(
            "tools/call",
            Answer::Sse(vec![
                elicit("q-1", "Which city?"),
                Step::await_response(json!("q-1")),
                Step::sleep_ms(100),
                done_text("once"),
            ]),
        )
        .start()
        .await;
    let gw = Gateway::start(up.url()).await;
    let first = gw.request("tools/call").params(call_params()).capabilities(elicitation()).send().await;
    let (round, key) = round_of(&first);
    let answer = |city: &str| json!({&key: {"action": "accept", "content": {"value": city}}});

    let (a, b) = tokio::join!(
        retry(&gw, "tools/call", call_params(), &round, answer("Oslo"), 2, elicitation()).send(),
        retry(&gw, "tools/call", call_params(), &round, answer("Rome"), 3, elicitation()).send(),
    );

    let (ok, refused) = if a.status == 200 { (a, b) } else { (b, a) };
    assert_eq!(ok.result()["content"][0]["text"], "once", "{}", ok.raw);
    let refused_id = refused.body["id"].clone();
    refused.assert_error(400, -32602, &refused_id);
    assert_eq!(refused.reason(), Some("flow_finished"), "{}", refused.raw);
    assert_eq!(up.responses().len(), 1, "one answer upstream: {}", up.dump());
}

/// The upstream's stream ends (no event ids: nothing to resume) right after
/// it asked: the call can no longer deliver a result, so asking the user is
/// pointless and their answer would go to a dead call. Expected: the first
/// request already fails (502 -32603 `outcome_unknown`), nothing is parked,
/// and no user answer is ever posted upstream.
#[tokio::test]
async fn a_stream_that_ends_right_after_its_question_is_not_parked() {
    let up =
        FakeUpstream::new().on("tools/call", Answer::Sse(vec![elicit("q-1", "Which city?")])).start().await;
    let gw = Gateway::start(up.url()).await;

    let first =
        gw.request("tools/call").id(json!(1)).params(call_params()).capabilities(elicitation()).send().await;

    first.assert_error(502, -32603, &json!(1));
    assert_eq!(first.reason(), Some("outcome_unknown"), "{}", first.raw);
    assert_eq!(gw.metric("sessionless_parked_flows_open").await, 0.0);
    assert!(up.responses().iter().all(|r| r.body["result"]["action"] != "accept"), "{}", up.dump());
}
