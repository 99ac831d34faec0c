//! Per-principal quotas and bounded keys: one caller cannot fill the parking
//! lot or the session pool for the others, and unique capability objects do
//! not make unique upstream sessions.

mod support;

use serde_json::{json, Value};
use support::{single_route, Answer, FakeUpstream, Gateway, Step, Upstream};

/// A tool whose question is named after the call's upstream id.
async fn asking_upstream() -> Upstream {
    FakeUpstream::asking_each_call().on("tools/list", Answer::Result(json!({"tools": []}))).start().await
}

fn ask(gw: &Gateway, id: u64, token: &str) -> support::ModernRequest {
    gw.request("tools/call")
        .id(json!(id))
        .params(json!({"name": "weather", "arguments": {"n": id}}))
        .capabilities(json!({"elicitation": {}}))
        .bearer(token)
}

#[tokio::test]
async fn a_caller_at_its_paused_call_cap_is_told_and_another_caller_still_gets_its_round() {
    let up = asking_upstream().await;
    let toml = single_route("", "[limits]\nmax_parked_flows_per_principal = 2\nmax_parked_flows = 100");
    let gw = Gateway::from_toml(&toml, up.url()).await;

    for id in 1..=2 {
        let reply = ask(&gw, id, "greedy").send().await;
        assert_eq!(reply.result()["resultType"], "input_required", "{}", reply.raw);
    }
    let third = ask(&gw, 3, "greedy").send().await;
    third.assert_error(429, -31000, &json!(3));
    assert_eq!(third.reason(), Some("too_many_paused_calls"));
    assert_eq!(third.body["error"]["data"]["questionDeclined"], true);
    assert!(third.header("retry-after").is_some());
    // The third call's question was declined upstream, so the upstream finished it.
    let calls = up.calls("tools/call");
    let q3 = json!(format!("q-{}", calls[2].body["id"]));
    let declined = up.wait_for("the decline", |s| s.is_response() && s.rpc_id() == Some(&q3)).await;
    assert_eq!(declined.body["result"]["action"], "cancel");

    let other = ask(&gw, 4, "someone-else").send().await;
    assert_eq!(other.result()["resultType"], "input_required", "{}", other.raw);
    assert_eq!(gw.metric("sessionless_parked_flows_open").await, 3.0);
    assert_eq!(gw.metric("sessionless_quota_exceeded_total").await, 1.0);
}

#[tokio::test]
async fn unique_capability_objects_share_one_upstream_session() {
    let up = asking_upstream().await;
    let gw = Gateway::start(up.url()).await;
    let padding = "x".repeat(10_000);
    for i in 0..200 {
        let caps =
            json!({"sampling": {format!("invented{i}"): {"padding": padding}}, "experimental": {"n": i}});
        let reply = gw.request("tools/list").id(json!(i)).capabilities(caps).send().await;
        assert_eq!(reply.status, 200, "{}", reply.raw);
    }
    assert_eq!(up.calls("initialize").len(), 1, "one session for one capability fingerprint");
    let init = &up.calls("initialize")[0].body;
    assert_eq!(init["params"]["capabilities"], json!({"sampling": {}}), "only what matters reaches upstream");
    assert_eq!(gw.metric("sessionless_upstream_sessions_open").await, 1.0);
}

/// A tool that takes 1.5 s: its session stays busy meanwhile.
async fn slow_upstream() -> Upstream {
    FakeUpstream::new()
        .on("tools/call", Answer::Sse(vec![Step::sleep_ms(1500), Step::result(json!({"content": []}))]))
        .start()
        .await
}

async fn calls_reach(up: &Upstream, n: usize) {
    let until = tokio::time::Instant::now() + support::PATIENCE;
    while up.calls("tools/call").len() < n {
        assert!(tokio::time::Instant::now() < until, "the upstream never saw {n} calls: {}", up.dump());
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

fn call_with(gw: &Gateway, id: u64, token: &str, caps: Value) -> support::ModernRequest {
    gw.request("tools/call")
        .id(json!(id))
        .params(json!({"name": "slow", "arguments": {}}))
        .capabilities(caps)
        .bearer(token)
}

#[tokio::test]
async fn a_caller_at_its_session_cap_reuses_its_own_idle_sessions_and_is_refused_when_all_are_busy() {
    let up = slow_upstream().await;
    let toml = single_route("", "[limits]\nmax_sessions_per_principal = 2");
    let gw = Gateway::from_toml(&toml, up.url()).await;
    let fingerprints = [json!({}), json!({"sampling": {}}), json!({"elicitation": {}})];

    // Two busy sessions (two fingerprints), then a third fingerprint while both are busy.
    let busy = futures_util::future::join(
        call_with(&gw, 1, "greedy", fingerprints[0].clone()).send(),
        call_with(&gw, 2, "greedy", fingerprints[1].clone()).send(),
    );
    let refused = async {
        calls_reach(&up, 2).await;
        call_with(&gw, 3, "greedy", fingerprints[2].clone()).send().await
    };
    let other = async {
        calls_reach(&up, 2).await;
        call_with(&gw, 4, "someone-else", fingerprints[2].clone()).send().await
    };
    let ((first, second), refused, other) = tokio::join!(busy, refused, other);
    assert_eq!(first.status, 200, "{}", first.raw);
    assert_eq!(second.status, 200, "{}", second.raw);
    refused.assert_error(429, -31000, &json!(3));
    assert_eq!(refused.reason(), Some("too_many_sessions"));
    assert_eq!(other.status, 200, "another caller is not limited by the first one's share: {}", other.raw);

    // Now idle: the third fingerprint takes the place of the least recently used one.
    let third = call_with(&gw, 5, "greedy", fingerprints[2].clone()).send().await;
    assert_eq!(third.status, 200, "{}", third.raw);
    assert_eq!(up.calls("initialize").len(), 4, "greedy ×3 and someone-else ×1");
    let closed = gw.wait_metric("sessionless_upstream_sessions_closed_total", 1.0).await;
    assert_eq!(closed, 1.0, "one of greedy's own sessions evicted");
    assert_eq!(gw.metric("sessionless_upstream_sessions_open").await, 3.0);
}
