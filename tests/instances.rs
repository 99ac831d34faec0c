//! Several instances per upstream (`urls`): new work goes round-robin to the
//! instances that are up; a legacy client's session and a 2026 upstream's
//! MRTR retry stay on the instance that created them; an instance that
//! cannot be reached is skipped until a probe finds it answering, and what
//! it held ends with a clear error.

mod support;

use serde_json::{json, Value};
use sessionless::Config;
use support::legacy::Legacy;
use support::modern::ModernUpstream;
use support::{Answer, FakeUpstream, Gateway, Upstream};

const UP: &str = "sessionless_upstream_instance_up";

fn config(urls: &[&str], generation: &str) -> Config {
    let urls: Vec<String> = urls.iter().map(|u| format!("\"{u}\"")).collect();
    let text = format!(
        "[[upstreams]]\nname = \"u\"\nurls = [{}]\ngeneration = \"{generation}\"\n\
         [[routes]]\npath = \"/mcp\"\nupstream = \"u\"\n",
        urls.join(", ")
    );
    Config::from_toml(&text).expect("valid config")
}

fn echo() -> FakeUpstream {
    FakeUpstream::new().on("tools/call", Answer::Result(json!({"content": [{"type": "text", "text": "hi"}]})))
}

/// Which of `ups` saw a `tools/call` with this JSON-RPC id.
fn holder(ups: &[&Upstream], id: &Value) -> Vec<usize> {
    (0..ups.len()).filter(|&i| ups[i].calls("tools/call").iter().any(|s| s.rpc_id() == Some(id))).collect()
}

async fn modern_call(gw: &Gateway, id: &str) {
    let reply =
        gw.request("tools/call").id(json!(id)).params(json!({"name": "echo", "arguments": {}})).send().await;
    assert_eq!(reply.status, 200, "{}", reply.raw);
    assert!(reply.body.get("result").is_some(), "{}", reply.raw);
}

#[tokio::test]
async fn new_work_is_spread_and_sessions_stay_on_their_instance() {
    let (a, b) = (echo().start().await, echo().start().await);
    let gw = Gateway::with_config(config(&[a.url(), b.url()], "legacy")).await;

    for i in 0..4 {
        modern_call(&gw, &format!("m{i}")).await;
    }
    let (on_a, on_b) = (a.calls("tools/call").len(), b.calls("tools/call").len());
    assert_eq!((on_a, on_b), (2, 2), "stateless calls go round-robin\nA {}\nB {}", a.dump(), b.dump());

    let client = Legacy::new(&gw);
    let mut sessions = Vec::new();
    for _ in 0..4 {
        sessions.push(client.open().await);
    }
    for (i, session) in sessions.iter().enumerate() {
        for k in 0..3 {
            let reply = client.call(session, json!(format!("s{i}-{k}")), "echo").await;
            assert_eq!(reply.status, 200, "{}", reply.raw);
        }
    }
    let mut per_instance = [0, 0];
    for i in 0..sessions.len() {
        let holders: Vec<Vec<usize>> =
            (0..3).map(|k| holder(&[&a, &b], &json!(format!("s{i}-{k}")))).collect();
        assert_eq!(holders[0].len(), 1, "each call reached exactly one instance");
        assert!(holders.iter().all(|h| *h == holders[0]), "session {i} moved between instances: {holders:?}");
        per_instance[holders[0][0]] += 1;
    }
    assert!(per_instance.iter().all(|n| *n > 0), "sessions spread over both: {per_instance:?}");
    assert_eq!(gw.metric(UP).await, 2.0);
}

#[tokio::test]
async fn an_instance_that_goes_away_is_skipped_and_its_sessions_end_clearly() {
    let (a, b) = (echo().start().await, echo().start().await);
    let a_addr = a.url().trim_start_matches("http://").trim_end_matches("/mcp").to_string();
    let gw = Gateway::with_config(config(&[a.url(), b.url()], "legacy")).await;
    let client = Legacy::new(&gw);
    let sessions = [client.open().await, client.open().await];
    for (i, s) in sessions.iter().enumerate() {
        assert_eq!(client.call(s, json!(format!("before-{i}")), "echo").await.status, 200);
    }
    let on_a = (0..2).find(|i| holder(&[&a, &b], &json!(format!("before-{i}"))) == [0]).expect("one on a");
    let on_b = 1 - on_a;

    drop(a); // the instance dies, its connections with it

    let gone = client.call(&sessions[on_a], json!("after-a"), "echo").await;
    gone.assert_error(404, -32001, &json!("after-a"));
    assert!(!gone.raw.contains("127.0.0.1"), "no upstream internals: {}", gone.raw);
    let kept = client.call(&sessions[on_b], json!("after-b"), "echo").await;
    assert_eq!(kept.status, 200, "the other instance's sessions go on: {}", kept.raw);

    // New work goes to the instance that is up: a call that finds the dead
    // one refused is sent to the other (nothing reached the dead one).
    for i in 0..4 {
        modern_call(&gw, &format!("new-{i}")).await;
    }
    let fresh = client.open().await;
    assert_eq!(client.call(&fresh, json!("fresh"), "echo").await.status, 200);
    assert_eq!(holder(&[&b], &json!("fresh")), [0]);
    assert_eq!(gw.metric(UP).await, 1.0, "the dead instance is marked down");
    let (_, readyz) = gw.get("/readyz").await;
    assert!(readyz.contains(&format!("{a_addr}/mcp down")), "{readyz}");
    let (_, metrics) = gw.get("/metrics").await;
    assert!(metrics
        .contains("legacy_session_tokens_rejected_total{route=\"/mcp\",reason=\"instance_unreachable\"} 1"));

    // Back on its port: the health probe takes it into service again.
    let a = echo().start_at(&a_addr).await;
    assert_eq!(gw.settled_metric(UP, 2.0).await, 2.0, "a probe finds the instance answering");
    for i in 0..4 {
        modern_call(&gw, &format!("back-{i}")).await;
    }
    assert_eq!(a.calls("tools/call").len(), 2, "it takes new work again");
}

#[tokio::test]
async fn a_modern_retry_goes_to_the_instance_that_asked() {
    let (m1, m2) = (ModernUpstream::start().await, ModernUpstream::start().await);
    let gw = Gateway::with_config(config(&[&m1.url, &m2.url], "modern")).await;
    let ask = || gw.request("tools/call").params(json!({"name": "ask", "arguments": {}}));
    let retry = |state: &str| {
        gw.request("tools/call").params(json!({"name": "ask", "arguments": {}, "requestState": state,
            "inputResponses": {"name": {"action": "accept", "content": {"n": "Ada"}}}}))
    };
    let asked = |up: &ModernUpstream| {
        up.calls().iter().filter(|c| c.body["params"]["requestState"].is_null()).count()
    };
    let retried = |up: &ModernUpstream| {
        up.calls().iter().filter(|c| c.body["params"]["requestState"].is_string()).count()
    };

    let saw = |up: &ModernUpstream, id: &str| up.calls().iter().any(|c| c.body["id"] == id);
    for id in ["q1", "q2"] {
        let reply = ask().id(json!(id)).send().await;
        let state = reply.result()["requestState"].as_str().expect("a sealed state").to_string();
        let (up, other) = if saw(&m1, id) { (&m1, &m2) } else { (&m2, &m1) };
        let before = (retried(up), retried(other));
        // Several retries: each goes where the state was issued, whatever
        // the round-robin position.
        for _ in 0..3 {
            let done = retry(&state).send().await;
            assert_eq!(done.result()["resultType"], "complete", "{}", done.raw);
        }
        assert_eq!((retried(up), retried(other)), (before.0 + 3, before.1));
    }
    assert_eq!((asked(&m1), asked(&m2)), (1, 1), "new calls spread over both");

    // The instance holding a paused call dies: the retry says so, clearly.
    let state = ask().send().await.result()["requestState"].as_str().unwrap().to_string();
    let holder_is_m1 = asked(&m1) == 2;
    let survivor = if holder_is_m1 {
        drop(m1);
        m2
    } else {
        drop(m2);
        m1
    };
    let lost = retry(&state).id(json!("lost")).send().await;
    lost.assert_error(400, -32602, &json!("lost"));
    assert_eq!(lost.reason(), Some("instance_unreachable"), "{}", lost.raw);
    let before = asked(&survivor);
    let again = ask().send().await;
    assert_eq!(again.result()["resultType"], "input_required", "new calls reach the survivor: {}", again.raw);
    assert_eq!(asked(&survivor), before + 1);
}

#[test]
fn urls_are_checked() {
    let bad = |upstream: &str| {
        let text = format!(
            "[[upstreams]]\nname = \"u\"\n{upstream}\n[[routes]]\npath = \"/mcp\"\nupstream = \"u\"\n"
        );
        Config::from_toml(&text).err().map(|e| e.0).unwrap_or_default()
    };
    assert!(bad("url = \"http://a/mcp\"\nurls = [\"http://b/mcp\"]").contains("not both"));
    assert!(bad("urls = []").contains("non-empty"));
    assert!(bad("").contains("needs `url`"));
    assert!(bad("urls = [\"http://a/mcp\", \"http://a/mcp\"]").contains("listed twice"));
    assert!(bad("urls = [\"http://a/mcp\", \"ftp://b/mcp\"]").contains("needs http:// or https://"));
    assert!(bad("urls = [\"http://user:secret@a/mcp\"]").contains("no credentials"));
    assert!(bad("urls = [\"http://a/mcp?api_key=secret\"]").contains("no query"));
    assert!(!bad("urls = [\"http://user:secret@a/mcp\"]").contains("secret"), "secrets are not echoed");
}
