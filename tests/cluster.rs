//! Cluster mode: any replica continues the call. Two (or three) gateways on
//! loopback share a sealing key and the internal-listener secret, in front of
//! one fake legacy upstream. Round 1 of a call lands on one replica, the retry
//! on another: forwarded to the owner over the internal listener; when the
//! owner is gone, the upstream's stream is resumed with `Last-Event-ID` (or
//! the client told `flow_lost`); replay mode parks nothing; draining keeps
//! serving retries.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::cluster::{free_port, ClusterEnv, Internal, Replica, TlsFiles};
use support::{Answer, FakeUpstream, ModernRequest, Reply, Seen, Step, Upstream};

// ---------------------------------------------------------------- helpers

const REQUESTS: &str = "sessionless_requests_total";
const PARKED: &str = "sessionless_parked_flows_open";
const REFUSED: &str = "sessionless_internal_refused_total";

fn elicitation() -> Value {
    json!({"elicitation": {}})
}

fn call(flow: u64) -> Value {
    json!({"name": "weather", "arguments": {"flow": flow}})
}

fn answer(flow: u64) -> Value {
    json!({"action": "accept", "content": {"city": format!("city-{flow}")}})
}

/// The upstream question of the `n`-th `tools/call` the fake received for `flow`.
fn question_id(flow: &Value, n: usize) -> String {
    format!("q-{flow}-{n}")
}

/// A tool that asks one question (id `q-<flow>-<n>`, with an SSE event id
/// `ev-<flow>-<n>` when `event_ids`), waits for its answer, then finishes
/// with "done <flow>" after `work_ms`.
fn asking(event_ids: bool, work_ms: u64) -> FakeUpstream {
    let n = Arc::new(AtomicUsize::new(1));
    FakeUpstream::new().on_fn("tools/call", move |req| {
        let i = n.fetch_add(1, Ordering::SeqCst);
        let flow = req.pointer("/params/arguments/flow").cloned().unwrap_or(json!(0));
        let qid = question_id(&flow, i);
        let mut ask = Step::ask(
            json!(qid),
            "elicitation/create",
            json!({"message": "Which city?", "requestedSchema": {"type": "object",
                "properties": {"city": {"type": "string"}}}}),
        );
        if event_ids {
            ask = ask.with_id(&format!("ev-{flow}-{i}"));
        }
        let mut steps = vec![ask, Step::await_response(json!(qid))];
        if work_ms > 0 {
            steps.push(Step::sleep_ms(work_ms));
        }
        steps.push(Step::result(json!({"content": [{"type": "text", "text": format!("done {flow}")}]})));
        Answer::Sse(steps)
    })
}

/// Round 1 of `flow` on `r`: the `input_required` round's state and key.
async fn round1(r: &Replica, flow: u64) -> (String, String) {
    let reply = r
        .request("tools/call")
        .id(json!(flow * 10 + 1))
        .params(call(flow))
        .capabilities(elicitation())
        .send()
        .await;
    round_of(&reply, &format!("round 1 of flow {flow} on {}", r.instance))
}

fn round_of(reply: &Reply, what: &str) -> (String, String) {
    assert_eq!(reply.status, 200, "{what}: {}", reply.raw);
    let round = reply.result();
    assert_eq!(round["resultType"], "input_required", "{what}: {}", reply.raw);
    let requests = round["inputRequests"].as_object().expect("inputRequests");
    assert_eq!(requests.len(), 1, "{what}: one question: {}", reply.raw);
    let key = requests.keys().next().unwrap().clone();
    let state = round["requestState"].as_str().expect("requestState").to_string();
    (state, key)
}

fn retry_params(flow: u64, state: &str, key: &str) -> Value {
    let mut p = call(flow);
    p["requestState"] = json!(state);
    p["inputResponses"] = json!({key: answer(flow)});
    p
}

/// The retry of `flow` (with its answer) to `r`, not sent yet.
fn retry_request(r: &Replica, flow: u64, state: &str, key: &str) -> ModernRequest {
    r.request("tools/call")
        .id(json!(flow * 10 + 2))
        .params(retry_params(flow, state, key))
        .capabilities(elicitation())
}

/// The retry of `flow` (with its answer) sent to `r`.
async fn retry(r: &Replica, flow: u64, state: &str, key: &str) -> Reply {
    retry_request(r, flow, state, key).send().await
}

fn assert_done(reply: &Reply, flow: u64, what: &str) {
    assert_eq!(reply.status, 200, "{what}: {}", reply.raw);
    assert_eq!(reply.body["id"], flow * 10 + 2, "{what}: {}", reply.raw);
    assert_eq!(reply.result()["resultType"], "complete", "{what}: {}", reply.raw);
    assert_eq!(reply.result()["content"][0]["text"], format!("done {flow}"), "{what}: {}", reply.raw);
}

/// The `tools/call` requests the fake received for `flow`.
fn calls_of(up: &Upstream, flow: u64) -> Vec<Seen> {
    up.calls("tools/call")
        .into_iter()
        .filter(|s| s.body.pointer("/params/arguments/flow") == Some(&json!(flow)))
        .collect()
}

/// The answers the gateway posted upstream to `flow`'s questions.
fn answers_of(up: &Upstream, flow: u64) -> Vec<Seen> {
    let prefix = format!("q-{flow}-");
    up.responses()
        .into_iter()
        .filter(|s| s.rpc_id().and_then(Value::as_str).is_some_and(|id| id.starts_with(&prefix)))
        .collect()
}

/// `flow` ran once upstream and its one answer was the client's, posted on
/// the session of round 1.
fn assert_answered_once_on_round1_session(up: &Upstream, flow: u64) {
    let calls = calls_of(up, flow);
    assert_eq!(calls.len(), 1, "flow {flow} ran once upstream:\n{}", up.dump());
    let answers = answers_of(up, flow);
    assert_eq!(answers.len(), 1, "flow {flow}: one answer upstream:\n{}", up.dump());
    assert_eq!(answers[0].body["result"], answer(flow), "flow {flow}: the client's answer");
    assert!(calls[0].session().is_some());
    assert_eq!(answers[0].session(), calls[0].session(), "flow {flow}: answer on the session of round 1");
}

/// Two replicas `gw-a` and `gw-b` in front of `up`, with `route` lines.
async fn pair(env: &ClusterEnv, up: &Upstream, route: &str) -> (Replica, Replica) {
    let a = Replica::start(&env.replica("gw-a", up.url()).route(route)).await;
    let b = Replica::start(&env.replica("gw-b", up.url()).route(route)).await;
    (a, b)
}

// ---------------------------------------------------------------- forwarding

#[tokio::test]
async fn a_retry_on_the_other_replica_is_forwarded_to_the_owner_and_completes() {
    let up = asking(false, 0).start().await;
    let env = ClusterEnv::new("forwarded");
    let (a, b) = pair(&env, &up, "").await;

    let (state, key) = round1(&a, 1).await;
    assert_eq!(a.metric(PARKED).await, 1.0, "parked on the replica of round 1");
    assert_eq!(b.metric(PARKED).await, 0.0);

    let done = retry(&b, 1, &state, &key).await;

    assert_done(&done, 1, "retry through gw-b");
    assert_answered_once_on_round1_session(&up, 1);
    assert_eq!(a.metric(PARKED).await, 0.0);
    assert_eq!(b.metric(PARKED).await, 0.0);
    assert_eq!(b.metric_where(REQUESTS, "outcome=\"forwarded\"").await, 1.0, "gw-b forwarded it");
    assert_eq!(a.metric_where(REQUESTS, "outcome=\"ok\"").await, 2.0, "gw-a answered both rounds");
    assert_eq!(up.initializes(), 1, "gw-b never opened a session for it: {}", up.dump());

    // The state is single-use across replicas too.
    let again = retry(&a, 1, &state, &key).await;
    again.assert_error(400, -32602, &json!(12));
    assert_eq!(again.reason(), Some("flow_finished"), "{}", again.raw);
    let again = retry(&b, 1, &state, &key).await;
    again.assert_error(400, -32602, &json!(12));
    assert_eq!(again.reason(), Some("flow_finished"), "{}", again.raw);
    assert_eq!(answers_of(&up, 1).len(), 1, "replays never reach the upstream");
}

/// Two replicas `gw-a` and `gw-b` with, beside `/mcp`, a federated route
/// `/fed` whose one member is `up` (taken as legacy).
async fn federated_pair(env: &ClusterEnv, up: &Upstream) -> (Replica, Replica) {
    let replica = |name: &str| {
        let mut config = env.replica(name, up.url()).upstream("generation = \"legacy\"");
        config.extra = "[[routes]]\npath = \"/fed\"\nmembers = [\"up\"]\n".into();
        config
    };
    (Replica::start(&replica("gw-a")).await, Replica::start(&replica("gw-b")).await)
}

#[tokio::test]
async fn a_retry_on_a_federated_route_reaches_the_owner_of_its_members_flow() {
    let up = asking(false, 0).start().await;
    let env = ClusterEnv::new("federated");
    let (a, b) = federated_pair(&env, &up).await;
    let advertised = |flow: u64| json!({"name": "up__weather", "arguments": {"flow": flow}});

    let first =
        a.request_to("/fed", "tools/call").id(json!(11)).params(advertised(1)).capabilities(elicitation());
    let (state, key) = round_of(&first.send().await, "round 1 on gw-a's federated route");
    assert_eq!(a.metric(PARKED).await, 1.0, "parked on the replica of round 1");

    let mut params = advertised(1);
    params["requestState"] = json!(state);
    params["inputResponses"] = json!({&key: answer(1)});
    let done = b
        .request_to("/fed", "tools/call")
        .id(json!(12))
        .params(params)
        .capabilities(elicitation())
        .send()
        .await;

    assert_done(&done, 1, "the retry through gw-b's federated route");
    assert_answered_once_on_round1_session(&up, 1);
    assert_eq!(calls_of(&up, 1)[0].body["params"]["name"], "weather", "the member saw its own name");
    assert_eq!(a.metric(PARKED).await, 0.0);
    assert_eq!(b.metric_where(REQUESTS, "outcome=\"forwarded\"").await, 1.0, "gw-b forwarded it");
}

#[tokio::test]
async fn a_federated_lists_cursor_is_followed_on_the_other_replica() {
    let up = FakeUpstream::new().paged_tools(&["first", "second"]).start().await;
    let env = ClusterEnv::new("federated-cursor");
    let (a, b) = federated_pair(&env, &up).await;

    let first = a.request_to("/fed", "tools/list").send().await;
    assert_eq!(first.status, 200, "{}", first.raw);
    assert_eq!(first.result()["tools"][0]["name"], "up__first", "{}", first.raw);
    let cursor = first.result()["nextCursor"].clone();
    let second = b.request_to("/fed", "tools/list").params(json!({"cursor": cursor})).send().await;
    assert_eq!(second.status, 200, "{}", second.raw);
    assert_eq!(second.result()["tools"][0]["name"], "up__second", "{}", second.raw);
    assert!(second.result().get("nextCursor").is_none(), "{}", second.raw);
    let lists = up.calls("tools/list");
    assert_eq!(lists.len(), 2, "{}", up.dump());
    assert_eq!(lists[1].session(), lists[0].session(), "page 2 on page 1's upstream session");
}

/// Round 1 of `n` flows alternating over the two replicas (concurrently),
/// then every retry on the other replica (concurrently).
async fn alternating_flows(a: &Replica, b: &Replica, n: u64) -> Vec<Reply> {
    let replicas = [a, b];
    let rounds = futures_util::future::join_all((1..=n).map(|f| round1(replicas[(f % 2) as usize], f))).await;
    futures_util::future::join_all(
        rounds
            .iter()
            .zip(1..=n)
            .map(|((state, key), f)| retry(replicas[((f + 1) % 2) as usize], f, state, key)),
    )
    .await
}

#[tokio::test]
async fn twenty_alternating_flows_all_complete() {
    let up = asking(false, 0).start().await;
    let env = ClusterEnv::new("twenty");
    let (a, b) = pair(&env, &up, "").await;

    let replies = alternating_flows(&a, &b, 20).await;

    for (reply, f) in replies.iter().zip(1..) {
        assert_done(reply, f, &format!("flow {f}"));
        assert_answered_once_on_round1_session(&up, f);
    }
    assert_eq!(a.metric(PARKED).await, 0.0);
    assert_eq!(b.metric(PARKED).await, 0.0);
    assert_eq!(a.metric_where(REQUESTS, "outcome=\"forwarded\"").await, 10.0);
    assert_eq!(b.metric_where(REQUESTS, "outcome=\"forwarded\"").await, 10.0);
}

#[tokio::test]
async fn a_second_round_is_forwarded_too_and_the_call_completes() {
    let ask = |id: &str, message: &str| {
        Step::ask(
            json!(id),
            "elicitation/create",
            json!({"message": message, "requestedSchema": {"type": "object",
            "properties": {"city": {"type": "string"}}}}),
        )
    };
    let up = FakeUpstream::new()
        .on(
            "tools/call",
            Answer::Sse(vec![
                ask("q-1-a", "Which city?"),
                Step::await_response(json!("q-1-a")),
                ask("q-1-b", "Which other city?"),
                Step::await_response(json!("q-1-b")),
                Step::result(json!({"content": [{"type": "text", "text": "done 1"}]})),
            ]),
        )
        .start()
        .await;
    let env = ClusterEnv::new("two_rounds");
    let (a, b) = pair(&env, &up, "").await;

    let (state, key) = round1(&a, 1).await;
    let second = retry(&b, 1, &state, &key).await;
    let (state2, key2) = round_of(&second, "round 2, forwarded");
    assert_ne!(key2, key, "a new question, a new key");
    assert_eq!(a.metric(PARKED).await, 1.0, "still parked on gw-a");
    let done = retry(&b, 1, &state2, &key2).await;

    assert_done(&done, 1, "round 3 through gw-b");
    let answers = answers_of(&up, 1);
    assert_eq!(answers.len(), 2, "{}", up.dump());
    let session = calls_of(&up, 1)[0].session().map(str::to_string);
    assert!(answers.iter().all(|s| s.session().map(str::to_string) == session), "{}", up.dump());
    assert_eq!(b.metric_where(REQUESTS, "outcome=\"forwarded\"").await, 2.0);
    // The round-1 state is now stale or finished everywhere.
    let stale = retry(&b, 1, &state, &key).await;
    assert_eq!(stale.status, 400, "{}", stale.raw);
}

#[tokio::test]
async fn another_callers_state_is_refused_by_the_receiving_replica_before_any_forwarding() {
    let up = asking(false, 0).start().await;
    let env = ClusterEnv::new("principal");
    let (a, b) = pair(&env, &up, "").await;

    let first = a
        .request("tools/call")
        .id(json!(11))
        .params(call(1))
        .capabilities(elicitation())
        .bearer("alice-token")
        .send()
        .await;
    let (state, key) = round_of(&first, "alice's round 1");
    let mallory = b
        .request("tools/call")
        .id(json!(12))
        .params(retry_params(1, &state, &key))
        .capabilities(elicitation())
        .bearer("mallory-token")
        .send()
        .await;

    mallory.assert_error(400, -32602, &json!(12));
    assert_eq!(mallory.reason(), Some("wrong_principal"), "{}", mallory.raw);
    assert_eq!(a.metric(REQUESTS).await, 1.0, "nothing forwarded to gw-a");
    assert!(up.responses().is_empty(), "{}", up.dump());

    let alice = b
        .request("tools/call")
        .id(json!(12))
        .params(retry_params(1, &state, &key))
        .capabilities(elicitation())
        .bearer("alice-token")
        .send()
        .await;
    assert_done(&alice, 1, "alice's retry through gw-b");
}

#[tokio::test]
async fn concurrent_retries_of_one_round_on_both_replicas_deliver_one_answer() {
    let up = asking(false, 0).start().await;
    let env = ClusterEnv::new("concurrent_retries");
    let (a, b) = pair(&env, &up, "").await;

    let (state, key) = round1(&a, 1).await;
    let (on_a, on_b) = tokio::join!(retry(&a, 1, &state, &key), retry(&b, 1, &state, &key));

    let (ok, refused) = if on_a.status == 200 { (on_a, on_b) } else { (on_b, on_a) };
    assert_done(&ok, 1, "the retry that won");
    refused.assert_error(400, -32602, &json!(12));
    assert_eq!(refused.reason(), Some("flow_finished"), "{}", refused.raw);
    assert_answered_once_on_round1_session(&up, 1);
}

/// A tool that reports progress before and after its question (`q-1`, with
/// SSE event ids), the resumption replaying what follows the question.
fn progressing() -> FakeUpstream {
    let ask = Step::ask(
        json!("q-1"),
        "elicitation/create",
        json!({"message": "Which city?",
        "requestedSchema": {"type": "object", "properties": {"city": {"type": "string"}}}}),
    );
    let after = || {
        vec![
            Step::progress(0.75).with_id("ev-3"),
            Step::result(json!({"content": [{"type": "text", "text": "done 1"}]})).with_id("ev-4"),
        ]
    };
    let mut steps =
        vec![Step::progress(0.25).with_id("ev-1"), ask.with_id("ev-2"), Step::await_response(json!("q-1"))];
    steps.extend(after());
    FakeUpstream::new().on("tools/call", Answer::Sse(steps)).on_resume("tools/call", after())
}

async fn progress_round1(r: &Replica) -> (String, String) {
    let first = r
        .request("tools/call")
        .id(json!(11))
        .params(call(1))
        .capabilities(elicitation())
        .progress_token(json!("p-1"))
        .send()
        .await;
    let progress: Vec<&Value> =
        first.notes.iter().filter(|n| n["method"] == "notifications/progress").collect();
    assert_eq!(progress.len(), 1, "{}", first.raw);
    assert_eq!(progress[0]["params"]["progressToken"], "p-1");
    round_of(&first, "round 1 with progress")
}

async fn progress_retry(r: &Replica, state: &str, key: &str, what: &str) {
    let done = r
        .request("tools/call")
        .id(json!(12))
        .params(retry_params(1, state, key))
        .capabilities(elicitation())
        .progress_token(json!("p-2"))
        .send()
        .await;
    assert_done(&done, 1, what);
    assert!(done.is_sse(), "{what}: streamed: {}", done.raw);
    let progress: Vec<&Value> =
        done.notes.iter().filter(|n| n["method"] == "notifications/progress").collect();
    assert_eq!(progress.len(), 1, "{what}: {}", done.raw);
    assert_eq!(progress[0]["params"]["progressToken"], "p-2", "{what}: the retry's token: {}", done.raw);
    assert_eq!(progress[0]["params"]["progress"], 0.75);
}

#[tokio::test]
async fn progress_of_a_forwarded_retry_is_relayed_with_the_retry_token() {
    let up = progressing().start().await;
    let env = ClusterEnv::new("forwarded_progress");
    let (a, b) = pair(&env, &up, "").await;

    let (state, key) = progress_round1(&a).await;
    progress_retry(&b, &state, &key, "forwarded retry with progress").await;
}

#[tokio::test]
async fn progress_of_a_taken_over_call_carries_the_retry_token() {
    let up = progressing().start().await;
    let env = ClusterEnv::new("orphan_progress");
    let (a, b) = pair(&env, &up, "").await;

    let (state, key) = progress_round1(&a).await;
    a.kill().await;
    progress_retry(&b, &state, &key, "resumed by gw-b with progress").await;
    assert_eq!(up.http(http::Method::GET)[0].header("last-event-id"), Some("ev-2"));
}

// ---------------------------------------------------------------- replay mode

#[tokio::test]
async fn replay_mode_reruns_the_call_on_the_other_replica_with_the_sealed_answers() {
    let up = asking(false, 0).start().await;
    let env = ClusterEnv::new("replay");
    let (a, b) = pair(&env, &up, "continuity = \"replay\"").await;

    let (state, key) = round1(&a, 1).await;
    assert_eq!(a.metric(PARKED).await, 0.0, "replay mode parks nothing");
    let first = calls_of(&up, 1);
    assert_eq!(first.len(), 1);
    // The question of the first run was declined, the call cancelled.
    let declined = up
        .wait_for("the declined first question", |s| s.is_response() && s.rpc_id() == Some(&json!("q-1-1")))
        .await;
    assert_eq!(declined.body["result"]["action"], "cancel", "{}", up.dump());
    up.wait_for("the first run cancelled", |s| {
        s.rpc_method() == Some("notifications/cancelled")
            && s.body["params"]["requestId"] == first[0].body["id"]
            && s.session() == first[0].session()
    })
    .await;

    let done = retry(&b, 1, &state, &key).await;

    assert_done(&done, 1, "replayed on gw-b");
    let calls = calls_of(&up, 1);
    assert_eq!(calls.len(), 2, "the call ran again: {}", up.dump());
    assert_ne!(calls[1].session(), calls[0].session(), "the re-run is gw-b's, on its own session");
    let second =
        up.wait_for("the sealed answer", |s| s.is_response() && s.rpc_id() == Some(&json!("q-1-2"))).await;
    assert_eq!(second.body["result"], answer(1), "the re-run's question is answered from the sealed answers");
    assert_eq!(second.session(), calls[1].session());
    assert_eq!(b.metric_where(REQUESTS, "outcome=\"forwarded\"").await, 0.0, "nothing to forward");
    assert_eq!(a.metric(PARKED).await + b.metric(PARKED).await, 0.0);

    // Documented: a replay state is not single-use; its reuse re-runs the tool.
    let reuse = retry(&a, 1, &state, &key).await;
    assert_done(&reuse, 1, "a reused replay state");
    assert_eq!(calls_of(&up, 1).len(), 3, "the reuse re-ran the tool: {}", up.dump());
}

#[tokio::test]
async fn twenty_alternating_flows_complete_in_replay_mode() {
    let up = asking(false, 0).start().await;
    let env = ClusterEnv::new("replay_twenty");
    let (a, b) = pair(&env, &up, "continuity = \"replay\"").await;

    let replies = alternating_flows(&a, &b, 20).await;

    for (reply, f) in replies.iter().zip(1..) {
        assert_done(reply, f, &format!("replayed flow {f}"));
        assert_eq!(calls_of(&up, f).len(), 2, "flow {f} ran twice");
        let accepted: Vec<Seen> =
            answers_of(&up, f).into_iter().filter(|s| s.body["result"]["action"] == "accept").collect();
        assert_eq!(accepted.len(), 1, "flow {f}: one accepted answer: {}", up.dump());
        assert_eq!(accepted[0].body["result"], answer(f));
    }
    assert_eq!(a.metric(PARKED).await + b.metric(PARKED).await, 0.0);
}

// ---------------------------------------------------------------- owner gone

#[tokio::test]
async fn owner_killed_with_a_resumable_upstream_stream_the_other_replica_resumes_it() {
    let up = asking(true, 0)
        .on_resume(
            "tools/call",
            vec![Step::result(json!({"content": [{"type": "text", "text": "done 1"}]})).with_id("ev-1-end")],
        )
        .start()
        .await;
    let env = ClusterEnv::new("killed_resumable");
    let (a, b) = pair(&env, &up, "").await;

    let (state, key) = round1(&a, 1).await;
    a.kill().await;

    let started = Instant::now();
    let done = retry(&b, 1, &state, &key).await;

    assert_done(&done, 1, "resumed by gw-b");
    assert!(started.elapsed() < Duration::from_secs(3), "no long wait: {:?}", started.elapsed());
    assert_answered_once_on_round1_session(&up, 1);
    let session = calls_of(&up, 1)[0].session().map(str::to_string);
    let resumed: Vec<Seen> = up.http(http::Method::GET);
    assert_eq!(resumed.len(), 1, "one resumption GET: {}", up.dump());
    assert_eq!(resumed[0].header("last-event-id"), Some("ev-1-1"));
    assert_eq!(resumed[0].session().map(str::to_string), session, "on the session of round 1");
    let answer_at = up.seen().iter().position(Seen::is_response).unwrap();
    let get_at = up.seen().iter().position(|s| s.method == http::Method::GET).unwrap();
    assert!(
        answer_at < get_at,
        "the answer is posted before the stream is resumed (so kept events hold the rest)"
    );
    assert_eq!(b.metric(PARKED).await, 0.0);
}

#[tokio::test]
async fn after_taking_a_call_over_the_new_owner_parks_its_next_question() {
    let up = asking(true, 0)
        .on_resume(
            "tools/call",
            vec![
                Step::ask(
                    json!("q-1-next"),
                    "elicitation/create",
                    json!({"message": "Which other city?",
                    "requestedSchema": {"type": "object", "properties": {"city": {"type": "string"}}}}),
                )
                .with_id("ev-1-next"),
                Step::await_response(json!("q-1-next")),
                Step::result(json!({"content": [{"type": "text", "text": "done 1"}]})),
            ],
        )
        .start()
        .await;
    let env = ClusterEnv::new("takeover_round");
    let a = Replica::start(&env.replica("gw-a", up.url())).await;
    let b = Replica::start(&env.replica("gw-b", up.url())).await;
    let c = Replica::start(&env.replica("gw-c", up.url())).await;

    let (state, key) = round1(&a, 1).await;
    a.kill().await;
    let second = retry(&b, 1, &state, &key).await;
    let (state2, key2) = round_of(&second, "the next question after gw-b took over");
    assert_eq!(b.metric(PARKED).await, 1.0, "parked on gw-b now");

    let done = retry(&c, 1, &state2, &key2).await;

    assert_done(&done, 1, "round 3 through gw-c, forwarded to gw-b");
    assert_eq!(c.metric_where(REQUESTS, "outcome=\"forwarded\"").await, 1.0);
    assert_eq!(b.metric(PARKED).await, 0.0);
    let answers: Vec<Value> = up.responses().iter().map(|s| s.body["id"].clone()).collect();
    assert_eq!(answers, vec![json!("q-1-1"), json!("q-1-next")], "{}", up.dump());
}

#[tokio::test]
async fn owner_killed_without_event_ids_is_flow_lost_and_nothing_is_posted_upstream() {
    let up = asking(false, 0).start().await;
    let env = ClusterEnv::new("killed_no_ids");
    let (a, b) = pair(&env, &up, "").await;

    let (state, key) = round1(&a, 1).await;
    a.kill().await;

    let lost = retry(&b, 1, &state, &key).await;

    lost.assert_error(400, -32602, &json!(12));
    assert_eq!(lost.reason(), Some("flow_lost"), "{}", lost.raw);
    assert!(up.responses().is_empty(), "nothing posted upstream: {}", up.dump());
    assert!(up.http(http::Method::GET).is_empty(), "no resumption attempted: {}", up.dump());
    assert_eq!(calls_of(&up, 1).len(), 1, "never re-run");
    assert_eq!(b.metric_where("sessionless_request_state_rejected_total", "flow_lost").await, 1.0);
}

#[tokio::test]
async fn owner_killed_in_front_of_the_demo_upstream_is_flow_lost() {
    // The built-in demo upstream numbers its SSE events but keeps none: a
    // GET with Last-Event-ID is refused, so the call cannot be taken over.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let demo_url = format!("http://{}/mcp", listener.local_addr().unwrap());
    let demo = tokio::spawn(sessionless::demo::serve(listener, std::future::pending()));
    let env = ClusterEnv::new("killed_demo");
    let a = Replica::start(&env.replica("gw-a", &demo_url)).await;
    let b = Replica::start(&env.replica("gw-b", &demo_url)).await;

    let params = json!({"name": "ask_user", "arguments": {"question": "colour?"}});
    let first =
        a.request("tools/call").id(json!(1)).params(params.clone()).capabilities(elicitation()).send().await;
    let (state, key) = round_of(&first, "ask_user round 1");
    a.kill().await;
    let mut p = params;
    p["requestState"] = json!(state);
    p["inputResponses"] = json!({key: {"action": "accept", "content": {"answer": "blue"}}});
    let lost = b.request("tools/call").id(json!(2)).params(p).capabilities(elicitation()).send().await;

    lost.assert_error(400, -32602, &json!(2));
    assert_eq!(lost.reason(), Some("flow_lost"), "{}", lost.raw);
    demo.abort();
}

#[tokio::test]
async fn owner_killed_upstream_with_event_ids_but_no_kept_events_is_flow_lost() {
    // The stream carried event ids, but the upstream refuses the resumption
    // (no `on_resume`: GET with Last-Event-ID is 405). The answer was posted
    // first (a server that keeps events stores what follows it, see the
    // resumable test), and the client is told `flow_lost`: start again.
    let up = asking(true, 0).start().await;
    let env = ClusterEnv::new("killed_no_events");
    let (a, b) = pair(&env, &up, "").await;

    let (state, key) = round1(&a, 1).await;
    a.kill().await;
    let lost = retry(&b, 1, &state, &key).await;

    lost.assert_error(400, -32602, &json!(12));
    assert_eq!(lost.reason(), Some("flow_lost"), "{}", lost.raw);
    assert_eq!(up.responses().len(), 1, "the answer, posted before the refused resumption:\n{}", up.dump());
    assert_eq!(up.http(http::Method::GET).len(), 1, "one resumption attempt: {}", up.dump());
}

#[tokio::test]
async fn owner_unreachable_nothing_listening_is_handled_as_gone() {
    // gw-a advertises an address nothing listens on: its retries cannot be
    // forwarded, and without event ids they cannot be resumed either.
    let up = asking(false, 0).start().await;
    let env = ClusterEnv::new("unreachable");
    let nowhere = format!("127.0.0.1:{}", free_port());
    let a = Replica::start(&env.replica("gw-a", up.url()).advertise(&nowhere)).await;
    let b = Replica::start(&env.replica("gw-b", up.url())).await;

    let (state, key) = round1(&a, 1).await;
    let started = Instant::now();
    let lost = retry(&b, 1, &state, &key).await;

    lost.assert_error(400, -32602, &json!(12));
    assert_eq!(lost.reason(), Some("flow_lost"), "{}", lost.raw);
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
    assert!(up.responses().is_empty(), "nothing posted upstream: {}", up.dump());
    assert_eq!(a.metric(PARKED).await, 1.0, "the flow is still parked on gw-a");
}

#[tokio::test]
async fn owner_that_accepts_but_never_answers_is_outcome_unknown_after_the_timeout() {
    // gw-a advertises a port whose listener accepts connections (kernel
    // backlog) but never answers: the forwarded retry may have been
    // delivered, so its outcome is unknown; nothing is posted upstream by gw-b.
    let up = asking(false, 0).start().await;
    let env = ClusterEnv::new("hung_owner");
    let hole = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let hole_addr = hole.local_addr().unwrap().to_string();
    let a = Replica::start(
        &env.replica("gw-a", up.url()).advertise(&hole_addr).upstream("response_timeout_ms = 1000"),
    )
    .await;
    // A forwarded retry may legitimately take as long as the call itself, so
    // the wait for a hung owner is bounded by the call timeout.
    let b = Replica::start(
        &env.replica("gw-b", up.url()).upstream("response_timeout_ms = 1000\ncall_timeout_ms = 2000"),
    )
    .await;

    let (state, key) = round1(&a, 1).await;
    let started = Instant::now();
    let broken = retry(&b, 1, &state, &key).await;

    broken.assert_error(502, -32603, &json!(12));
    assert_eq!(broken.reason(), Some("outcome_unknown"), "{}", broken.raw);
    assert!(started.elapsed() < Duration::from_secs(5), "bounded: {:?}", started.elapsed());
    assert!(up.responses().is_empty(), "nothing posted upstream: {}", up.dump());
    drop(hole);
}

#[tokio::test]
async fn wrong_secret_on_the_owner_is_a_clear_error_and_nothing_reaches_the_upstream() {
    let up = asking(false, 0).start().await;
    let env = ClusterEnv::new("wrong_secret");
    let other = env.other_secret();
    let a = Replica::start(&env.replica("gw-a", up.url()).secret_from(&other)).await;
    let b = Replica::start(&env.replica("gw-b", up.url())).await;

    let (state, key) = round1(&a, 1).await;
    let refused = retry(&b, 1, &state, &key).await;

    // The owner's 401 refusal is a cluster misconfiguration, said as such.
    refused.assert_error(502, -32603, &json!(12));
    assert_eq!(refused.reason(), Some("replica_refused"), "{}", refused.raw);
    assert!(up.responses().is_empty(), "nothing posted upstream: {}", up.dump());
    assert_eq!(a.metric(PARKED).await, 1.0, "the flow is still parked on gw-a");
    assert_eq!(a.metric(REQUESTS).await, 1.0, "gw-a's MCP side saw only round 1");

    // The internal listener itself: unsigned, or signed with another secret, is 401, marked refused.
    let direct = Internal::of(&a, &retry_request(&a, 1, &state, &key));
    for signature in [None, Some(direct.signature(&env.secret))] {
        let reply = a.raw(direct.request(signature.as_deref())).await;
        assert_eq!(reply.status, 401, "signature {signature:?}: {}", reply.raw);
        assert_eq!(reply.header("x-sessionless-refused"), Some("1"));
    }
    assert_eq!(a.metric_where(REFUSED, "reason=\"bad_signature\"").await, 2.0, "gw-b's and ours");
    assert_eq!(a.metric_where(REFUSED, "reason=\"unsigned\"").await, 1.0);

    // The owner still completes the flow when the retry reaches it directly.
    assert_done(&retry(&a, 1, &state, &key).await, 1, "retry on the owner");
    assert_answered_once_on_round1_session(&up, 1);
}

#[tokio::test]
async fn owner_restarted_with_the_flow_gone_answers_flow_finished() {
    let up = asking(false, 0).start().await;
    let env = ClusterEnv::new("restarted");
    let a_config = env.replica("gw-a", up.url()).drain_ms(100);
    let a = Replica::start(&a_config).await;
    let b = Replica::start(&env.replica("gw-b", up.url())).await;

    let (state, key) = round1(&a, 1).await;
    a.stop().await;
    let declined = up
        .wait_for("the question declined at shutdown", |s| {
            s.is_response() && s.rpc_id() == Some(&json!("q-1-1"))
        })
        .await;
    assert_eq!(declined.body["result"]["action"], "cancel");
    let a2 = Replica::start(&a_config).await;
    assert_eq!(a2.internal.port(), a_config.internal_port);

    let gone = retry(&b, 1, &state, &key).await;

    gone.assert_error(400, -32602, &json!(12));
    assert_eq!(gone.reason(), Some("flow_finished"), "{}", gone.raw);
    assert_eq!(b.metric_where(REQUESTS, "outcome=\"forwarded\"").await, 1.0, "answered by the new gw-a");
    assert_eq!(answers_of(&up, 1).len(), 1, "only the shutdown's decline: {}", up.dump());
    let direct = retry(&a2, 1, &state, &key).await;
    assert_eq!(direct.reason(), Some("flow_finished"), "{}", direct.raw);
}

#[tokio::test]
async fn a_forwarded_retry_is_never_forwarded_again() {
    // gw-c seals gw-a's internal address as its own (a misconfiguration): a
    // retry forwarded by gw-b reaches gw-a, which does not own the flow and
    // must not forward it again (to itself: a loop).
    let up = asking(false, 0).start().await;
    let env = ClusterEnv::new("no_second_hop");
    let a = Replica::start(&env.replica("gw-a", up.url())).await;
    let b = Replica::start(&env.replica("gw-b", up.url())).await;
    let c = Replica::start(&env.replica("gw-c", up.url()).advertise(&a.internal.to_string())).await;

    let (state, key) = round1(&c, 1).await;
    let started = Instant::now();
    let refused = retry(&b, 1, &state, &key).await;

    // gw-a does not own the flow: it refuses (it neither forwards nor takes
    // the call over while its owner may be alive), and gw-b says so.
    refused.assert_error(502, -32603, &json!(12));
    assert_eq!(refused.reason(), Some("replica_refused"), "{}", refused.raw);
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
    assert_eq!(a.metric(REQUESTS).await, 0.0, "gw-a ran nothing");
    assert_eq!(a.metric_where(REFUSED, "reason=\"not_owner\"").await, 1.0);
    assert!(up.responses().is_empty(), "{}", up.dump());
    assert_eq!(c.metric(PARKED).await, 1.0, "gw-c still holds the flow");
    assert_done(&retry(&c, 1, &state, &key).await, 1, "retry on gw-c itself");
}

#[tokio::test]
async fn a_forwarded_retry_may_take_as_long_as_a_direct_one() {
    // The tool works 2.5 s after the answer; the upstream's response timeout
    // (time until it starts answering) is 1 s, the call timeout the default.
    // A direct retry waits for the result; so must a forwarded one.
    let up = asking(false, 2500).start().await;
    let env = ClusterEnv::new("slow_after_answer");
    let a = Replica::start(&env.replica("gw-a", up.url()).upstream("response_timeout_ms = 1000")).await;
    let b = Replica::start(&env.replica("gw-b", up.url()).upstream("response_timeout_ms = 1000")).await;

    let (s1, k1) = round1(&a, 1).await;
    let (s2, k2) = round1(&a, 2).await;
    let (direct, forwarded) = tokio::join!(retry(&a, 1, &s1, &k1), retry(&b, 2, &s2, &k2));

    assert_done(&direct, 1, "direct retry on the owner");
    // The answer did reach the upstream through the owner, and the tool finished there.
    assert_answered_once_on_round1_session(&up, 2);
    assert_done(&forwarded, 2, "forwarded retry");
}

// ---------------------------------------------------------------- draining

#[tokio::test]
async fn a_draining_replica_serves_retries_and_refuses_new_calls() {
    let up = asking(false, 0).start().await;
    let env = ClusterEnv::new("draining");
    let mut a = Replica::start(&env.replica("gw-a", up.url()).drain_ms(10_000)).await;
    let b = Replica::start(&env.replica("gw-b", up.url())).await;

    let (s1, k1) = round1(&a, 1).await;
    let (s2, k2) = round1(&a, 2).await;
    let (s3, k3) = round1(&b, 3).await;
    a.begin_shutdown();
    let deadline = Instant::now() + Duration::from_secs(3);
    while a.get("/readyz").await.0 != 503 {
        assert!(Instant::now() < deadline, "/readyz never turned 503");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(b.get("/readyz").await.0, 200);

    let refused =
        a.request("tools/call").id(json!(99)).params(call(9)).capabilities(elicitation()).send().await;
    refused.assert_error(503, -31000, &json!(99));
    assert!(refused.header("retry-after").is_some(), "503 with Retry-After: {:?}", refused.headers);
    assert!(calls_of(&up, 9).is_empty(), "a refused call never reaches the upstream");

    assert_done(&retry(&a, 1, &s1, &k1).await, 1, "direct retry on the draining owner");
    assert_done(&retry(&a, 3, &s3, &k3).await, 3, "retry of gw-b's flow through the draining replica");
    let (s4, k4) = round1(&b, 4).await;
    assert_done(&retry(&b, 2, &s2, &k2).await, 2, "retry forwarded to the draining owner");
    for f in [1, 2, 3] {
        assert_answered_once_on_round1_session(&up, f);
    }

    let took = a.stopped_within(Duration::from_secs(5)).await;
    assert!(took.is_some(), "gw-a exits once no flow is left, well before its 10 s drain deadline");
    assert_done(&retry(&b, 4, &s4, &k4).await, 4, "gw-b carries on");
}

#[tokio::test]
async fn a_draining_replica_exits_at_its_deadline_declining_what_is_left() {
    let up = asking(false, 0).start().await;
    let env = ClusterEnv::new("drain_deadline");
    let mut a = Replica::start(&env.replica("gw-a", up.url()).drain_ms(600)).await;
    let b = Replica::start(&env.replica("gw-b", up.url())).await;

    let (state, key) = round1(&a, 1).await;
    a.begin_shutdown();
    let took = a.stopped_within(Duration::from_secs(8)).await.expect("gw-a exits at its drain deadline");
    assert!(took >= Duration::from_millis(500), "it waited for the retry: {took:?}");
    let declined =
        up.wait_for("the decline", |s| s.is_response() && s.rpc_id() == Some(&json!("q-1-1"))).await;
    assert_eq!(declined.body["result"]["action"], "cancel");

    let late = retry(&b, 1, &state, &key).await;
    late.assert_error(400, -32602, &json!(12));
    assert_eq!(late.reason(), Some("flow_lost"), "{}", late.raw);
    assert_eq!(answers_of(&up, 1).len(), 1, "{}", up.dump());
}

#[tokio::test]
async fn a_draining_replica_keeps_serving_a_flow_whose_retry_led_to_another_question() {
    // The upstream asks a second question 300 ms after the first answer. While
    // gw-a (draining) resumes the flow, it is not in the parking lot; it is
    // parked again for round 2. The drain must not end in between: the round-2
    // retry (through gw-b, forwarded to gw-a) has to complete.
    let ask = |id: &str| {
        Step::ask(
            json!(id),
            "elicitation/create",
            json!({"message": "Which city?", "requestedSchema":
            {"type": "object", "properties": {"city": {"type": "string"}}}}),
        )
    };
    let up = FakeUpstream::new()
        .on(
            "tools/call",
            Answer::Sse(vec![
                ask("q-1-a"),
                Step::await_response(json!("q-1-a")),
                Step::sleep_ms(300),
                ask("q-1-b"),
                Step::await_response(json!("q-1-b")),
                Step::result(json!({"content": [{"type": "text", "text": "done 1"}]})),
            ]),
        )
        .start()
        .await;
    let env = ClusterEnv::new("drain_mid_resume");
    let mut a = Replica::start(&env.replica("gw-a", up.url()).drain_ms(10_000)).await;
    let b = Replica::start(&env.replica("gw-b", up.url())).await;

    let (state, key) = round1(&a, 1).await;
    a.begin_shutdown();
    let second = retry(&a, 1, &state, &key).await;
    let (state2, key2) = round_of(&second, "round 2 from the draining owner");
    tokio::time::sleep(Duration::from_millis(200)).await;

    let done = retry(&b, 1, &state2, &key2).await;

    assert_done(&done, 1, "round-2 retry through gw-b, forwarded to the draining gw-a");
    assert!(a.stopped_within(Duration::from_secs(5)).await.is_some(), "gw-a exits once the flow is done");
}

// ---------------------------------------------------------------- the internal listener

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Asserts `reply` is the internal listener's refusal with `status`.
fn assert_refused(reply: &Reply, status: u16, what: &str) {
    assert_eq!(reply.status, status, "{what}: {}", reply.raw);
    assert_eq!(reply.header("x-sessionless-refused"), Some("1"), "{what}: marked refused");
}

/// Round 1 of flow 1 on gw-a, and its retry forwarded to gw-a, signed as gw-b would.
async fn parked_and_signed(env: &ClusterEnv, up: &Upstream) -> (Replica, Replica, Internal) {
    let (a, b) = pair(env, up, "").await;
    let (state, key) = round1(&a, 1).await;
    let signed = Internal::of(&a, &retry_request(&b, 1, &state, &key));
    (a, b, signed)
}

/// Nothing of flow 1's retry reached the upstream, and gw-a still holds it.
async fn assert_untouched(a: &Replica, up: &Upstream, what: &str) {
    assert!(up.responses().is_empty(), "{what}: nothing posted upstream: {}", up.dump());
    assert_eq!(calls_of(up, 1).len(), 1, "{what}: only round 1 ran");
    assert_eq!(a.metric(PARKED).await, 1.0, "{what}: still parked");
}

#[tokio::test]
async fn a_retry_signed_as_a_replica_signs_it_completes_once_and_its_replay_is_refused() {
    let up = asking(false, 0).start().await;
    let env = ClusterEnv::new("signed_replay");
    let (a, _b, signed) = parked_and_signed(&env, &up).await;
    let signature = signed.signature(&env.secret);

    let done = a.raw(signed.request(Some(&signature))).await;
    let again = a.raw(signed.request(Some(&signature))).await;

    assert_done(&done, 1, "a signed retry sent straight to the owner");
    assert_refused(&again, 401, "the same signed request again");
    assert_eq!(a.metric_where(REFUSED, "reason=\"replayed\"").await, 1.0);
    assert_answered_once_on_round1_session(&up, 1);
}

#[tokio::test]
async fn a_signature_under_another_secret_is_refused_and_nothing_reaches_the_upstream() {
    let up = asking(false, 0).start().await;
    let env = ClusterEnv::new("forged");
    let (a, b, signed) = parked_and_signed(&env, &up).await;

    for secret in
        ["not the cluster secret at all".to_string(), format!("{} ", env.secret), hex(env.secret.as_bytes())]
    {
        let forged = a.raw(signed.request(Some(&signed.signature(&secret)))).await;
        assert_refused(&forged, 401, &format!("signed with {secret:?}"));
    }
    let garbage = a.raw(signed.request(Some("AAAA"))).await;
    assert_refused(&garbage, 401, "a signature of the wrong length");

    assert_eq!(a.metric_where(REFUSED, "reason=\"bad_signature\"").await, 4.0);
    assert_eq!(a.metric(REQUESTS).await, 1.0, "gw-a's MCP side saw only round 1");
    assert_untouched(&a, &up, "forged").await;
    // Refused attempts do not use the nonce up: the genuine request still completes.
    assert_done(&a.raw(signed.request(Some(&signed.signature(&env.secret)))).await, 1, "the genuine retry");
    assert_eq!(b.metric(REQUESTS).await, 0.0);
}

/// `req`'s head as raw HTTP/1.1, with `content-length: len`.
fn raw_head(
    req: &http::Request<http_body_util::Full<bytes::Bytes>>,
    to: std::net::SocketAddr,
    len: usize,
) -> String {
    let mut head = format!("POST {} HTTP/1.1\r\nhost: {to}\r\ncontent-length: {len}\r\n", req.uri().path());
    for (k, v) in req.headers() {
        head.push_str(&format!("{k}: {}\r\n", v.to_str().unwrap()));
    }
    head + "\r\n"
}

#[tokio::test]
async fn a_forged_request_is_refused_before_its_body_is_read_and_a_swapped_body_after() {
    let up = asking(false, 0).start().await;
    let env = ClusterEnv::new("unread");
    let (a, _b, signed) = parked_and_signed(&env, &up).await;

    // A forged signature and a body that never comes: refused at once, not at
    // the body timeout (30 s).
    let forged = signed.request(Some(&signed.signature("not the cluster secret at all")));
    let started = Instant::now();
    let status = exchange(signed.to, raw_head(&forged, signed.to, 100_000).as_bytes()).await;
    assert!(status.starts_with("HTTP/1.1 401"), "{status}");
    assert!(started.elapsed() < Duration::from_secs(3), "answered without waiting for the body");

    // The genuine head (its signed body digest) with another body of the same length.
    let genuine = signed.request(Some(&signed.signature(&env.secret)));
    let text = String::from_utf8(signed.body.clone()).unwrap();
    let swapped = text.replace("city-1", "city-9");
    assert_eq!(swapped.len(), signed.body.len());
    let request = raw_head(&genuine, signed.to, swapped.len()) + &swapped;
    let status = exchange(signed.to, request.as_bytes()).await;
    assert!(status.starts_with("HTTP/1.1 401"), "{status}");
    assert_eq!(a.metric_where(REFUSED, "reason=\"bad_signature\"").await, 2.0);
    assert_untouched(&a, &up, "forged or swapped").await;
}

#[tokio::test]
async fn a_request_altered_after_signing_is_refused() {
    let up = asking(false, 0).start().await;
    let env = ClusterEnv::new("altered");
    let (a, b, signed) = parked_and_signed(&env, &up).await;
    let signature = signed.signature(&env.secret);

    let mut alterations: Vec<(&str, Internal)> = Vec::new();
    let mut body = signed.clone();
    let text = String::from_utf8(body.body.clone()).unwrap();
    body.body = text.replace("city-1", "city-9").into_bytes();
    assert_ne!(body.body, signed.body);
    alterations.push(("the body", body));
    let mut route = signed.clone();
    route.route = "/other".into();
    alterations.push(("the route header", route));
    let mut principal = signed.clone();
    principal.principal = "b:0000000000000000".into();
    alterations.push(("the principal header", principal));
    let mut name = signed.clone();
    for (k, v) in name.headers.iter_mut() {
        if k == "mcp-name" {
            *v = "other_tool".into();
        }
    }
    alterations.push(("the mcp-name header", name));
    let mut added = signed.clone();
    added.headers.push(("mcp-param-region".into(), "eu".into()));
    alterations.push(("an added MCP header", added));
    let mut stamped = signed.clone();
    stamped.timestamp_ms += 1;
    alterations.push(("the timestamp", stamped));
    let mut nonce = signed.clone();
    nonce.nonce[0] ^= 1;
    alterations.push(("the nonce", nonce));
    let mut audience = signed.clone();
    audience.to = b.internal;
    alterations.push(("the replica it is sent to", audience));

    for (what, altered) in &alterations {
        let reply = a.raw(altered.request(Some(&signature))).await;
        assert_refused(&reply, 401, what);
    }

    assert_eq!(a.metric_where(REFUSED, "reason=\"bad_signature\"").await, 7.0);
    assert_eq!(b.metric_where(REFUSED, "reason=\"bad_signature\"").await, 1.0);
    assert_untouched(&a, &up, "altered").await;
    assert_done(&a.raw(signed.request(Some(&signature))).await, 1, "the request as signed");
}

#[tokio::test]
async fn a_timestamp_outside_the_window_is_refused() {
    let up = asking(false, 0).start().await;
    let env = ClusterEnv::new("stale");
    let (a, _b, signed) = parked_and_signed(&env, &up).await;
    let window = sessionless::cluster::sign::WINDOW_MS;

    for (what, shift) in [("too old", -(window as i64) - 5_000), ("from the future", window as i64 + 5_000)] {
        let mut stale = signed.clone();
        stale.timestamp_ms = stale.timestamp_ms.checked_add_signed(shift).unwrap();
        let reply = a.raw(stale.request(Some(&stale.signature(&env.secret)))).await;
        assert_refused(&reply, 401, what);
    }

    assert_eq!(a.metric_where(REFUSED, "reason=\"stale\"").await, 2.0);
    assert_untouched(&a, &up, "stale").await;
}

#[tokio::test]
async fn a_signed_request_that_is_not_a_retry_is_refused_and_the_upstream_sees_nothing() {
    // With the secret, a request to the internal listener must still be the
    // retry of a call paused there: not a new call, not a list, not discover.
    let up = asking(false, 0).start().await;
    let env = ClusterEnv::new("not_a_retry");
    let (a, b) = pair(&env, &up, "").await;

    let new_call = b.request("tools/call").id(json!(5)).params(call(5)).capabilities(elicitation());
    let as_alice = {
        let mut s = Internal::of(&a, &new_call);
        s.principal = "b:alice".into();
        s
    };
    let list = b.request("tools/list").id(json!(6));
    let discover = b.request("server/discover").id(json!(7));
    let mut bad_state = call(8);
    bad_state["requestState"] = json!("not a sealed state");
    let forged_state = b.request("tools/call").id(json!(8)).params(bad_state).capabilities(elicitation());
    let requests = [
        Internal::of(&a, &new_call),
        as_alice,
        Internal::of(&a, &list),
        Internal::of(&a, &discover),
        Internal::of(&a, &forged_state),
    ];
    for (i, req) in requests.iter().enumerate() {
        let reply = a.raw(req.request(Some(&req.signature(&env.secret)))).await;
        assert_refused(&reply, 403, &format!("request {i}"));
    }

    assert_eq!(a.metric_where(REFUSED, "reason=\"not_a_retry\"").await, 5.0);
    assert!(up.seen().is_empty(), "the upstream saw nothing, not even a session: {}", up.dump());
    assert_eq!(a.metric(REQUESTS).await, 0.0);
}

#[tokio::test]
async fn a_retry_of_a_flow_owned_by_another_replica_is_refused() {
    let up = asking(false, 0).start().await;
    let env = ClusterEnv::new("not_owner");
    let (a, b) = pair(&env, &up, "").await;
    let (state, key) = round1(&b, 1).await;

    let to_a = Internal::of(&a, &retry_request(&a, 1, &state, &key));
    let refused = a.raw(to_a.request(Some(&to_a.signature(&env.secret)))).await;

    assert_refused(&refused, 403, "gw-b's flow at gw-a");
    assert_eq!(a.metric_where(REFUSED, "reason=\"not_owner\"").await, 1.0);
    assert!(up.responses().is_empty(), "{}", up.dump());
    assert_eq!(b.metric(PARKED).await, 1.0, "gw-b still holds it");
    // Another caller's retry of a flow that is parked here is refused too.
    let (state, key) = round1(&a, 2).await;
    let mut mallory = Internal::of(&a, &retry_request(&b, 2, &state, &key));
    mallory.principal = "b:mallory".into();
    let refused = a.raw(mallory.request(Some(&mallory.signature(&env.secret)))).await;
    assert_refused(&refused, 403, "another principal");
    assert_eq!(a.metric_where(REFUSED, "reason=\"wrong_principal\"").await, 1.0);
    assert!(up.responses().is_empty(), "{}", up.dump());
    assert_done(&retry(&b, 2, &state, &key).await, 2, "the genuine retry of flow 2, forwarded by gw-b");
}
// ---------------------------------------------------------------- configuration

#[test]
fn an_advertised_address_the_other_replicas_cannot_reach_is_refused_at_startup() {
    // Without `advertise` (nor $SESSIONLESS_ADVERTISE_ADDR), the advertised
    // address is `internal_listen`. A wildcard or port 0 there is sealed into
    // every requestState and cannot reach this replica from another one
    // (0.0.0.0:8081 even connects each replica to itself, as config/cluster.toml
    // would do with the variable unset). Expected: a configuration error.
    let env = ClusterEnv::new("advertise");
    std::env::remove_var("SESSIONLESS_ADVERTISE_ADDR");
    for listen in ["0.0.0.0:8081", "[::]:8081", "127.0.0.1:0"] {
        let mut config = env.replica("gw-a", "http://127.0.0.1:9/mcp");
        config.internal_port = 0;
        let text = config.toml().replace(
            &format!("internal_listen = \"127.0.0.1:0\"\nadvertise = \"{}\"", config.advertise),
            &format!("internal_listen = \"{listen}\""),
        );
        assert!(!text.contains("advertise ="), "{text}");
        let parsed = sessionless::Config::from_toml(&text);
        assert!(
            parsed.is_err(),
            "internal_listen = {listen} without advertise was accepted: advertised as {:?}",
            parsed.as_ref().ok().and_then(|c| c.cluster.as_ref()).map(|c| c.advertise.clone())
        );
    }
}

/// A TCP relay to `to` that records every byte its clients send.
async fn recording_relay(to: String) -> (std::net::SocketAddr, Arc<std::sync::Mutex<Vec<u8>>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let captured = Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = captured.clone();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = tokio::net::TcpStream::connect(&to).await else { continue };
            let record = record.clone();
            tokio::spawn(async move {
                let (mut cr, mut cw) = client.into_split();
                let (mut sr, mut sw) = server.into_split();
                let up = async {
                    let mut buf = [0u8; 4096];
                    while let Ok(n) = cr.read(&mut buf).await {
                        if n == 0 || sw.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                        record.lock().unwrap().extend_from_slice(&buf[..n]);
                    }
                    let _ = sw.shutdown().await;
                };
                let down = async {
                    let _ = tokio::io::copy(&mut sr, &mut cw).await;
                    let _ = cw.shutdown().await;
                };
                tokio::join!(up, down);
            });
        }
    });
    (addr, captured)
}

/// Writes `request` on a new connection to `to`; what came back until the
/// end of the response head (or the connection's end).
async fn exchange(to: std::net::SocketAddr, request: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(to).await.unwrap();
    s.write_all(request).await.unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while !out.windows(4).any(|w| w == b"\r\n\r\n") {
        match tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => out.extend_from_slice(&buf[..n]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn what_crosses_the_internal_link_neither_holds_the_secret_nor_forges_another_request() {
    use base64::Engine;
    let up = asking(false, 0).start().await;
    let env = ClusterEnv::new("eavesdropper");
    let a_config = env.replica("gw-a", up.url());
    let (relay, captured) = recording_relay(format!("127.0.0.1:{}", a_config.internal_port)).await;
    let a = Replica::start(&a_config.advertise(&relay.to_string())).await;
    let b = Replica::start(&env.replica("gw-b", up.url())).await;
    let (state, key) = round1(&a, 1).await;

    assert_done(&retry(&b, 1, &state, &key).await, 1, "forwarded through the relay");

    let wire = captured.lock().unwrap().clone();
    let text = String::from_utf8_lossy(&wire).into_owned();
    assert!(text.contains("x-sessionless-signature"), "{text}");
    let secret = env.secret.as_bytes();
    for leak in [
        env.secret.clone(),
        hex(secret),
        base64::engine::general_purpose::STANDARD.encode(secret),
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(secret),
    ] {
        assert!(!text.to_lowercase().contains(&leak.to_lowercase()), "the secret crossed the wire: {text}");
    }
    // The captured request, sent again as it is: refused.
    let again = exchange(a.internal, &wire).await;
    assert!(again.starts_with("HTTP/1.1 401"), "{again}");
    // Its headers around a new call (any tool, no requestState): refused, and nothing runs.
    let head = &text[..text.find("\r\n\r\n").expect("one whole request captured")];
    let body = json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"name": "weather",
        "arguments": {"flow": 9}, "_meta": {"io.modelcontextprotocol/protocolVersion": support::VERSION}}})
    .to_string();
    let head: Vec<&str> = head.lines().filter(|l| !l.to_lowercase().starts_with("content-length:")).collect();
    let forged = format!("{}\r\ncontent-length: {}\r\n\r\n{body}", head.join("\r\n"), body.len());
    let forged = exchange(a.internal, forged.as_bytes()).await;
    assert!(forged.starts_with("HTTP/1.1 401"), "{forged}");
    assert!(calls_of(&up, 9).is_empty(), "{}", up.dump());
    // Both reuse the captured nonce: refused as replays once the head's MAC
    // checks out, before their bodies are read.
    assert_eq!(a.metric_where(REFUSED, "reason=\"replayed\"").await, 2.0);
}

#[tokio::test]
async fn a_retry_forwarded_over_tls_completes_and_the_listener_speaks_no_plaintext() {
    let up = asking(false, 0).start().await;
    let env = ClusterEnv::new("tls");
    let files = TlsFiles::generate("tls");
    let a = Replica::start(&env.replica("gw-a", up.url()).tls(&files, &files)).await;
    let b = Replica::start(&env.replica("gw-b", up.url()).tls(&files, &files)).await;
    let (state, key) = round1(&a, 1).await;

    let done = retry(&b, 1, &state, &key).await;

    assert_done(&done, 1, "forwarded over TLS");
    assert_answered_once_on_round1_session(&up, 1);
    assert_eq!(b.metric_where(REQUESTS, "outcome=\"forwarded\"").await, 1.0);
    let plain =
        exchange(a.internal, b"POST /internal/v1/retry HTTP/1.1\r\nhost: a\r\ncontent-length: 0\r\n\r\n")
            .await;
    assert!(!plain.starts_with("HTTP/"), "no plaintext HTTP on a TLS listener: {plain:?}");
}

#[tokio::test]
async fn a_forwarder_that_does_not_trust_the_owners_certificate_sends_nothing_and_says_so() {
    let up = asking(false, 0).start().await;
    let env = ClusterEnv::new("tls_wrong_ca");
    let (owner, other) = (TlsFiles::generate("owner"), TlsFiles::generate("other"));
    let a = Replica::start(&env.replica("gw-a", up.url()).tls(&owner, &owner)).await;
    let b = Replica::start(&env.replica("gw-b", up.url()).tls(&other, &other)).await;
    let (state, key) = round1(&a, 1).await;

    let refused = retry(&b, 1, &state, &key).await;

    // Not "owner gone": gw-b must not take over a call its owner still holds.
    refused.assert_error(502, -32603, &json!(12));
    assert_eq!(refused.reason(), Some("replica_refused"), "{}", refused.raw);
    assert!(up.responses().is_empty(), "{}", up.dump());
    assert!(up.http(http::Method::GET).is_empty(), "no resumption attempted: {}", up.dump());
    assert_eq!(a.metric(PARKED).await, 1.0);
    assert_eq!(a.metric(REQUESTS).await, 1.0, "gw-a's MCP side saw only round 1");
}
