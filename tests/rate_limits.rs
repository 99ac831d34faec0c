//! Rate limits (429 with `Retry-After`), the per-upstream concurrency limit
//! and the circuit breaker (503), through the gateway: exact counts, what
//! reaches the upstream, and what is never refused (the retry of a paused
//! call, a legacy client's notifications).

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use sessionless::Config;
use support::legacy::Legacy;
use support::{
    legacy_upstreams, single_route, Answer, FakeUpstream, Gateway, ModernRequest, Reply, Step, Upstream,
};

const RATE_LIMITED: i64 = -31029;
const OVERLOADED: i64 = -31000;
const BREAKER: &str = "sessionless_upstream_breaker_open";

fn text(text: &str) -> Value {
    json!({"content": [{"type": "text", "text": text}]})
}

fn echoing() -> FakeUpstream {
    FakeUpstream::new()
        .on("tools/call", Answer::Result(text("hi")))
        .on("tools/list", Answer::Result(json!({"tools": []})))
}

async fn echo() -> Upstream {
    echoing().start().await
}

/// A gateway in front of `up` with `keys` on its `/mcp` route.
async fn limited(up: &Upstream, keys: &str) -> Gateway {
    let toml =
        single_route("", "").replace("upstream = \"up\"\n\n", &format!("upstream = \"up\"\n{keys}\n\n"));
    Gateway::from_toml(&toml, up.url()).await
}

fn call(gw: &Gateway, id: u64, tool: &str, token: &str) -> ModernRequest {
    gw.request("tools/call").id(json!(id)).params(json!({"name": tool, "arguments": {}})).bearer(token)
}

/// A 429 from a rate limit: the id echoed, the limit named, `Retry-After`
/// as the body says.
fn assert_limited(reply: &Reply, id: Value, limit: &str, retry_after: u64) {
    reply.assert_error(429, RATE_LIMITED, &id);
    assert_eq!(reply.reason(), Some("rate_limited"), "{}", reply.raw);
    assert_eq!(reply.body["error"]["data"]["limit"], limit, "{}", reply.raw);
    assert_eq!(reply.body["error"]["data"]["retryAfter"], retry_after, "{}", reply.raw);
    assert_eq!(reply.header("retry-after"), Some(retry_after.to_string().as_str()), "{}", reply.raw);
}

#[tokio::test]
async fn a_burst_passes_and_the_next_request_is_told_when_to_come_back() {
    let up = echo().await;
    // One request every 10 s, three at once.
    let gw = limited(&up, "rate_limit = { per_minute = 6, burst = 3 }").await;

    for id in 1..=3 {
        let reply = call(&gw, id, "echo", "alice").send().await;
        assert_eq!(reply.status, 200, "request {id} of the burst: {}", reply.raw);
    }
    let fourth = call(&gw, 4, "echo", "alice").send().await;
    assert_limited(&fourth, json!(4), "principal", 10);
    assert!(!fourth.raw.contains("alice"), "{}", fourth.raw);
    // Any method counts, not only tool calls.
    let list = gw.request("tools/list").id(json!(5)).bearer("alice").send().await;
    assert_limited(&list, json!(5), "principal", 10);
    assert_eq!(up.calls("tools/call").len(), 3, "refused calls never reach the upstream");

    // Another principal has its own allowance.
    for id in 6..=8 {
        assert_eq!(call(&gw, id, "echo", "bob").send().await.status, 200);
    }
    assert_limited(&call(&gw, 9, "echo", "bob").send().await, json!(9), "principal", 10);
    assert_eq!(up.calls("tools/call").len(), 6);
    assert_eq!(gw.metric("sessionless_rate_limited_total").await, 3.0);
    let (_, metrics) = gw.get("/metrics").await;
    assert!(metrics.contains("outcome=\"rate_limited\"} 3"), "{metrics}");
}

#[tokio::test]
async fn a_tool_limit_counts_only_that_tool() {
    let up = echo().await;
    let gw = limited(&up, "tool_rate_limits = { slow = { per_minute = 10, burst = 2 } }").await;

    for id in 1..=2 {
        assert_eq!(call(&gw, id, "slow", "alice").send().await.status, 200);
    }
    // 10 a minute: the next one in 6 s.
    assert_limited(&call(&gw, 3, "slow", "alice").send().await, json!(3), "tool", 6);
    for id in 4..=8 {
        let reply = call(&gw, id, "fast", "alice").send().await;
        assert_eq!(reply.status, 200, "other tools are not limited: {}", reply.raw);
    }
    assert_eq!(gw.request("tools/list").id(json!(9)).bearer("alice").send().await.status, 200);
    assert_eq!(call(&gw, 10, "slow", "bob").send().await.status, 200, "per principal");
    let slow = up.calls("tools/call").iter().filter(|c| c.body["params"]["name"] == "slow").count();
    assert_eq!(slow, 3);
}

/// A tool that asks one question, then finishes.
async fn asking() -> Upstream {
    FakeUpstream::asking_each_call().start().await
}

fn ask(gw: &Gateway, id: u64) -> ModernRequest {
    gw.request("tools/call")
        .id(json!(id))
        .params(json!({"name": "weather", "arguments": {}}))
        .capabilities(json!({"elicitation": {}}))
        .bearer("alice")
}

fn answer(gw: &Gateway, id: u64, round: &Value) -> ModernRequest {
    let key = round["inputRequests"].as_object().expect("a question").keys().next().unwrap().clone();
    gw.request("tools/call")
        .id(json!(id))
        .params(json!({"name": "weather", "arguments": {}, "requestState": round["requestState"],
            "inputResponses": {key: {"action": "accept", "content": {}}}}))
        .capabilities(json!({"elicitation": {}}))
        .bearer("alice")
}

#[tokio::test]
async fn the_retry_of_a_paused_call_is_never_refused_by_a_spent_limit() {
    let up = asking().await;
    let limits = "tool_rate_limits = { weather = { per_minute = 1, burst = 1 } }\n\
                  rate_limit = { per_minute = 2, burst = 2 }";
    let gw = limited(&up, limits).await;

    let first = ask(&gw, 1).send().await;
    assert_eq!(first.result()["resultType"], "input_required", "{}", first.raw);
    // The tool's allowance is spent: a new call waits a minute...
    assert_limited(&ask(&gw, 2).send().await, json!(2), "tool", 60);
    // ...but the paused call's retry goes through, and does not count.
    let done = answer(&gw, 3, first.result()).send().await;
    assert_eq!(done.status, 200, "{}", done.raw);
    assert_eq!(done.result()["content"][0]["text"], "carried on", "{}", done.raw);
    // Of the route's allowance of 2, only the first call took one (the
    // tool's limit refused the second before the route's was asked).
    assert_eq!(gw.request("tools/list").id(json!(4)).bearer("alice").send().await.status, 200);
    assert_limited(
        &gw.request("tools/list").id(json!(5)).bearer("alice").send().await,
        json!(5),
        "principal",
        30,
    );
    assert_eq!(up.calls("tools/call").len(), 1);
}

#[tokio::test]
async fn a_replayed_retry_counts_because_it_runs_the_tool_again() {
    let up = asking().await;
    let limits = "continuity = \"replay\"\ntool_rate_limits = { weather = { per_minute = 1, burst = 1 } }";
    let gw = limited(&up, limits).await;

    let first = ask(&gw, 1).send().await;
    assert_eq!(first.result()["resultType"], "input_required", "{}", first.raw);
    // Nothing is held: refused, the same retry works once the minute is over.
    let retry = answer(&gw, 2, first.result()).send().await;
    assert_limited(&retry, json!(2), "tool", 60);
    assert_eq!(up.calls("tools/call").len(), 1, "the refused retry did not run the tool");
}

#[tokio::test]
async fn legacy_clients_are_limited_per_request_and_their_notifications_are_not() {
    let up = echo().await;
    let gw = limited(&up, "rate_limit = { per_minute = 6, burst = 3 }").await;
    let client = Legacy::new(&gw).bearer("carol");

    // initialize (1) and its notification (free)
    let session = client.open().await;
    assert_eq!(client.call(&session, json!("a"), "echo").await.status, 200); // 2
    assert_eq!(client.call(&session, json!("b"), "echo").await.status, 200); // 3
    let refused = client.call(&session, json!("c"), "echo").await;
    assert_limited(&refused, json!("c"), "principal", 10);
    let note = json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "b"}});
    assert_eq!(
        client.post(Some(&session), note.to_string()).await.status,
        202,
        "notifications are not counted"
    );
    assert_eq!(up.calls("tools/call").len(), 2);
}

/// Two routes: `/slow` to an upstream limited to 2 requests in flight whose
/// calls take `ms`, `/mcp` to another.
async fn two_upstreams(slow: &Upstream, other: &Upstream) -> Gateway {
    let text = format!(
        "[[upstreams]]\nname = \"slow\"\nurl = \"{}\"\nmax_concurrent_requests = 2\n\
         [[upstreams]]\nname = \"other\"\nurl = \"{}\"\n\
         [[routes]]\npath = \"/slow\"\nupstream = \"slow\"\n\
         [[routes]]\npath = \"/mcp\"\nupstream = \"other\"\n",
        slow.url(),
        other.url()
    );
    Gateway::with_config(legacy_upstreams(Config::from_toml(&text).expect("valid"))).await
}

#[tokio::test]
async fn a_slow_upstream_gets_only_its_share_of_the_gateway() {
    let slow = FakeUpstream::new()
        .on("tools/call", Answer::Sse(vec![Step::sleep_ms(600), Step::result(text("late"))]))
        .start()
        .await;
    let other = echo().await;
    let gw = two_upstreams(&slow, &other).await;
    let slow_call = |id: u64| {
        ModernRequest::new(support::client::http_client(), gw.url("/slow"), "tools/call")
            .id(json!(id))
            .params(json!({"name": "wait", "arguments": {}}))
    };

    let held: Vec<_> = (1..=2).map(|id| tokio::spawn(slow_call(id).send())).collect();
    while slow.calls("tools/call").len() < 2 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let third = slow_call(3).send().await;
    third.assert_error(503, OVERLOADED, &json!(3));
    assert_eq!(third.reason(), Some("upstream_busy"), "{}", third.raw);
    assert_eq!(third.header("retry-after"), Some("1"));
    assert_eq!(slow.calls("tools/call").len(), 2, "the third never reached it");
    // The other upstream is served meanwhile.
    let fast = call(&gw, 4, "echo", "x").send().await;
    assert_eq!(fast.status, 200, "{}", fast.raw);
    assert_eq!(gw.metric("sessionless_upstream_busy_total").await, 1.0);

    for h in held {
        assert_eq!(h.await.unwrap().status, 200);
    }
    // Their slots are back.
    assert_eq!(slow_call(5).send().await.status, 200);
}

fn addr_of(url: &str) -> String {
    url.trim_start_matches("http://").trim_end_matches("/mcp").to_string()
}

#[tokio::test]
async fn the_breaker_opens_once_a_probe_confirms_the_upstream_down_and_closes_when_it_answers() {
    let up = echo().await;
    let addr = addr_of(up.url());
    let gw = Gateway::start(up.url()).await;
    assert_eq!(call(&gw, 1, "echo", "x").send().await.status, 200);
    assert_eq!(gw.metric(BREAKER).await, 0.0);

    drop(up);
    // The first call finds it gone, as before: a connection attempt, 502.
    let first = call(&gw, 2, "echo", "x").send().await;
    first.assert_error(502, -32603, &json!(2));
    assert_eq!(first.reason(), Some("upstream_unreachable"));
    // Within a probe interval, the health task's probe fails too: open.
    assert_eq!(gw.settled_metric(BREAKER, 1.0).await, 1.0);
    let attempts = gw.metric("sessionless_upstream_requests_total").await;
    for id in 3..=5 {
        let refused = call(&gw, id, "echo", "x").send().await;
        refused.assert_error(503, OVERLOADED, &json!(id));
        assert_eq!(refused.reason(), Some("circuit_open"), "{}", refused.raw);
        assert_eq!(refused.header("retry-after"), Some("1"));
    }
    // Legacy clients too.
    let legacy = Legacy::new(&gw).post(None, support::legacy::init_body(json!("i"))).await;
    legacy.assert_error(503, OVERLOADED, &json!("i"));
    let probes = 2.0; // at most a probe or two meanwhile (one a second)
    let sent = gw.metric("sessionless_upstream_requests_total").await - attempts;
    assert!(sent <= probes, "no connection attempt per request: {sent} upstream requests");

    // Back on its port: the next probe closes the breaker.
    let up = echoing().start_at(&addr).await;
    assert_eq!(gw.settled_metric(BREAKER, 0.0).await, 0.0);
    assert_eq!(call(&gw, 6, "echo", "x").send().await.status, 200);
    assert!(!up.calls("tools/call").is_empty(), "it takes new work again");
}

#[tokio::test]
async fn with_several_instances_the_breaker_opens_only_when_all_are_down() {
    let (a, b) = (echo().await, echo().await);
    let (a_addr, b_addr) = (addr_of(a.url()), addr_of(b.url()));
    let text = format!(
        "[[upstreams]]\nname = \"u\"\nurls = [\"{}\", \"{}\"]\ngeneration = \"legacy\"\n\
         [[routes]]\npath = \"/mcp\"\nupstream = \"u\"\n",
        a.url(),
        b.url()
    );
    let gw = Gateway::with_config(Config::from_toml(&text).unwrap()).await;
    drop(a);
    for id in 1..=4 {
        assert_eq!(call(&gw, id, "echo", "x").send().await.status, 200, "b serves");
    }
    tokio::time::sleep(Duration::from_millis(1500)).await; // a's probe has failed by now
    assert_eq!(gw.metric(BREAKER).await, 0.0, "b is up");
    drop(b);
    let _ = call(&gw, 5, "echo", "x").send().await; // finds b gone
    assert_eq!(gw.settled_metric(BREAKER, 1.0).await, 1.0);
    let refused = call(&gw, 6, "echo", "x").send().await;
    assert_eq!(refused.reason(), Some("circuit_open"), "{}", refused.raw);

    let b = echoing().start_at(&b_addr).await;
    assert_eq!(gw.settled_metric(BREAKER, 0.0).await, 0.0, "one instance back closes it");
    assert_eq!(call(&gw, 7, "echo", "x").send().await.status, 200);
    assert!(!b.calls("tools/call").is_empty(), "it takes new work again");
    let (_, readyz) = gw.get("/readyz").await;
    assert!(readyz.contains(&format!("{a_addr}/mcp down")), "{readyz}");
}
