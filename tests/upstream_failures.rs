//! Upstreams that expire sessions, break streams, vanish, stall, or talk
//! nonsense (DESIGN.md §6): clear errors, nothing resent, the gateway stays up.

mod support;
use support::single_route;

use http::Method;
use serde_json::json;
use support::{closed_port_url, Answer, FakeUpstream, Gateway, Step};

#[tokio::test]
async fn expired_session_is_reinitialised_and_the_request_resent_once() {
    let up = FakeUpstream::new().expire_sessions_after(1).start().await;
    let gw = Gateway::start(up.url()).await;

    let first = gw.request("tools/list").id(json!(1)).send().await;
    assert_eq!(first.status, 200, "{}", first.raw);
    let second = gw.request("tools/list").id(json!(2)).send().await;
    assert_eq!(second.status, 200, "{}", second.raw);
    assert_eq!(second.body["id"], 2);
    assert_eq!(second.result()["resultType"], "complete");

    assert_eq!(up.initializes(), 2, "{}", up.dump());
    let lists = up.calls("tools/list");
    let statuses: Vec<u16> = lists.iter().map(|s| s.status).collect();
    assert_eq!(statuses, [200, 404, 200], "{}", up.dump());
    assert_eq!(lists[0].session(), lists[1].session());
    assert_ne!(lists[1].session(), lists[2].session(), "resent on a new session");
    assert_eq!(gw.metric("sessionless_upstream_sessions_open").await, 1.0);
    assert_eq!(gw.metric("sessionless_upstream_sessions_expired_total").await, 1.0);
    assert_eq!(gw.metric("sessionless_upstream_sessions_reinitialized_total").await, 1.0);
}

#[tokio::test]
async fn stream_closed_after_event_ids_is_resumed_with_last_event_id() {
    let up = FakeUpstream::new()
        .on("tools/call", Answer::Sse(vec![Step::prime("ev-1"), Step::progress(0.5).with_id("ev-2")]))
        .on_resume(
            "tools/call",
            vec![Step::result(json!({"content": [{"type": "text", "text": "resumed"}]})).with_id("ev-3")],
        )
        .start()
        .await;
    let gw = Gateway::start(up.url()).await;

    let reply = gw
        .request("tools/call")
        .id(json!("resume-me"))
        .params(json!({"name": "long", "arguments": {}}))
        .send()
        .await;

    assert_eq!(reply.status, 200, "{}", reply.raw);
    assert_eq!(reply.body["id"], "resume-me");
    assert_eq!(reply.result()["content"][0]["text"], "resumed");
    let call = up.calls("tools/call");
    assert_eq!(call.len(), 1, "{}", up.dump());
    let gets = up.http(Method::GET);
    assert_eq!(gets.len(), 1, "{}", up.dump());
    assert_eq!(gets[0].header("last-event-id"), Some("ev-2"));
    assert_eq!(gets[0].session(), call[0].session());
}

#[tokio::test]
async fn stream_broken_without_ids_is_an_unknown_outcome_never_resent() {
    let up = FakeUpstream::new()
        .on("tools/call", Answer::Sse(vec![Step::log("info", "started"), Step::sleep_ms(20), Step::abort()]))
        .start()
        .await;
    let gw = Gateway::start(up.url()).await;

    let reply = gw
        .request("tools/call")
        .id(json!(5))
        .params(json!({"name": "fragile", "arguments": {}}))
        .send()
        .await;

    reply.assert_error(502, -32603, &json!(5));
    assert_eq!(reply.reason(), Some("outcome_unknown"));
    assert_eq!(up.calls("tools/call").len(), 1, "{}", up.dump());
    assert!(up.http(Method::GET).is_empty(), "{}", up.dump());
    gw.assert_healthy().await;
}

#[tokio::test]
async fn unreachable_upstream_is_a_502() {
    let url = closed_port_url().await;
    let gw = Gateway::start(&url).await;

    let reply =
        gw.request("tools/call").id(json!(8)).params(json!({"name": "any", "arguments": {}})).send().await;

    reply.assert_error(502, -32603, &json!(8));
    assert_eq!(reply.reason(), Some("upstream_unreachable"));
    gw.assert_healthy().await;
}

fn small_timeout() -> String {
    single_route("response_timeout_ms = 200", "")
}

#[tokio::test]
async fn slow_upstream_is_a_504() {
    let up = FakeUpstream::new()
        .on("tools/call", Answer::delayed(3_000, Answer::Result(json!({"content": []}))))
        .start()
        .await;
    let gw = Gateway::from_toml(&small_timeout(), up.url()).await;

    let started = std::time::Instant::now();
    let reply = gw
        .request("tools/call")
        .id(json!("slow-1"))
        .params(json!({"name": "sleepy", "arguments": {}}))
        .send()
        .await;

    reply.assert_error(504, -32603, &json!("slow-1"));
    assert_eq!(reply.reason(), Some("upstream_timeout"));
    assert!(started.elapsed() < std::time::Duration::from_secs(2));
    assert_eq!(up.calls("tools/call").len(), 1, "never resent: {}", up.dump());
    gw.assert_healthy().await;
}

#[tokio::test]
async fn garbage_from_upstream_is_a_502_that_leaks_nothing() {
    let up = FakeUpstream::new()
        .on(
            "tools/call",
            Answer::Raw {
                status: 200,
                content_type: "application/json".into(),
                body: "<html>upstream-internal stack trace</html>".into(),
            },
        )
        .start()
        .await;
    let gw = Gateway::start(up.url()).await;

    let reply = gw
        .request("tools/call")
        .id(json!(13))
        .params(json!({"name": "broken", "arguments": {}}))
        .send()
        .await;

    reply.assert_error(502, -32603, &json!(13));
    assert_eq!(reply.reason(), Some("upstream_invalid"));
    assert!(!reply.raw.contains("upstream-internal"), "{}", reply.raw);
    assert!(!reply.raw.contains("html"), "{}", reply.raw);
    gw.assert_healthy().await;
}

fn small_responses() -> String {
    single_route("", "[limits]\nmax_upstream_response_bytes = 2048")
}

#[tokio::test]
async fn oversized_upstream_answer_is_a_502() {
    let huge = "x".repeat(16 * 1024);
    let up = FakeUpstream::new()
        .on("tools/call", Answer::Result(json!({"content": [{"type": "text", "text": huge}]})))
        .start()
        .await;
    let gw = Gateway::from_toml(&small_responses(), up.url()).await;

    let reply =
        gw.request("tools/call").id(json!(14)).params(json!({"name": "huge", "arguments": {}})).send().await;

    reply.assert_error(502, -32603, &json!(14));
    assert_eq!(reply.reason(), Some("upstream_too_large"));
    assert!(!reply.raw.contains("xxxx"));
    gw.assert_healthy().await;
}

#[tokio::test]
async fn oversized_sse_event_is_a_502() {
    let huge = "y".repeat(16 * 1024);
    let up = FakeUpstream::new()
        .on(
            "tools/call",
            Answer::Sse(vec![Step::result(json!({"content": [{"type": "text", "text": huge}]}))]),
        )
        .start()
        .await;
    let gw = Gateway::from_toml(&small_responses(), up.url()).await;

    let reply =
        gw.request("tools/call").id(json!(15)).params(json!({"name": "huge", "arguments": {}})).send().await;

    reply.assert_error(502, -32603, &json!(15));
    assert_eq!(reply.reason(), Some("upstream_too_large"));
    gw.assert_healthy().await;
}

#[tokio::test]
async fn cursor_of_an_expired_session_asks_the_client_to_start_over() {
    let up = FakeUpstream::new()
        .on("tools/list", Answer::Result(json!({"tools": [], "nextCursor": "upstream-page-2"})))
        .expire_sessions_after(1)
        .start()
        .await;
    let gw = Gateway::start(up.url()).await;
    let page1 = gw.request("tools/list").id(json!(1)).send().await;
    let cursor = page1.result()["nextCursor"].as_str().unwrap().to_string();

    let page2 = gw.request("tools/list").id(json!(2)).params(json!({"cursor": cursor})).send().await;

    page2.assert_error(400, -32602, &json!(2));
    assert_eq!(page2.reason(), Some("cursor_expired"));
    assert_eq!(up.initializes(), 1, "a pinned page is not resent elsewhere: {}", up.dump());
}

#[tokio::test]
async fn refused_initialize_is_a_502_and_is_tried_again_later() {
    let up = FakeUpstream::new().on("initialize", Answer::Error(-32603, "not today".into())).start().await;
    let gw = Gateway::start(up.url()).await;

    let first = gw.request("tools/list").id(json!(1)).send().await;
    let second = gw.request("tools/list").id(json!(2)).send().await;

    first.assert_error(502, -32603, &json!(1));
    assert_eq!(first.reason(), Some("upstream_invalid"));
    assert!(!first.raw.contains("not today"), "{}", first.raw);
    second.assert_error(502, -32603, &json!(2));
    assert_eq!(up.initializes(), 2, "a failed handshake is not cached: {}", up.dump());
    gw.assert_healthy().await;
}

#[tokio::test]
async fn upstream_http_error_page_is_a_502_that_leaks_nothing() {
    let up = FakeUpstream::new()
        .on(
            "tools/call",
            Answer::Raw {
                status: 500,
                content_type: "text/plain".into(),
                body: "panic at src/secret.rs:42".into(),
            },
        )
        .start()
        .await;
    let gw = Gateway::start(up.url()).await;

    let reply = gw
        .request("tools/call")
        .id(json!(16))
        .params(json!({"name": "crashy", "arguments": {}}))
        .send()
        .await;

    reply.assert_error(502, -32603, &json!(16));
    assert_eq!(reply.reason(), Some("upstream_invalid"));
    assert!(!reply.raw.contains("secret"), "{}", reply.raw);
    assert_eq!(up.calls("tools/call").len(), 1);
    gw.assert_healthy().await;
}

#[tokio::test]
async fn client_hanging_up_before_any_answer_cancels_the_upstream_request() {
    let up = FakeUpstream::new().on("tools/call", Answer::Sse(vec![Step::hang()])).start().await;
    let gw = Gateway::start(up.url()).await;
    let call =
        gw.request("tools/call").id(json!("impatient")).params(json!({"name": "forever", "arguments": {}}));

    gw.hang_up_after(call, std::time::Duration::from_millis(200)).await;

    let cancelled =
        up.wait_for("notifications/cancelled", |s| s.rpc_method() == Some("notifications/cancelled")).await;
    let sent = up.calls("tools/call").remove(0);
    assert_eq!(cancelled.body["params"]["requestId"], sent.body["id"]);
}

fn one_at_a_time() -> String {
    single_route("", "[limits]\nmax_concurrent_requests = 1")
}

#[tokio::test]
async fn overload_is_a_503_with_retry_after() {
    let up = FakeUpstream::new()
        .on("tools/call", Answer::Sse(vec![Step::sleep_ms(500), Step::result(json!({"content": []}))]))
        .start()
        .await;
    let gw = Gateway::from_toml(&one_at_a_time(), up.url()).await;
    let busy = gw.request("tools/call").id(json!(1)).params(json!({"name": "busy", "arguments": {}})).send();
    let turned_away = async {
        up.wait_for("the first call", |s| s.rpc_method() == Some("tools/call")).await;
        gw.request("tools/list").id(json!(2)).send().await
    };

    let (busy, reply) = tokio::join!(busy, turned_away);

    assert_eq!(busy.status, 200, "{}", busy.raw);
    reply.assert_error(503, -31000, &json!(2));
    assert!(
        reply.header("retry-after").is_some(),
        "DESIGN.md §6: 503 with Retry-After; headers: {:?}",
        reply.headers
    );
    gw.assert_healthy().await;
}

fn short_calls() -> String {
    single_route("call_timeout_ms = 300", "")
}

#[tokio::test]
async fn a_call_past_its_deadline_is_cancelled_upstream_and_reported_uncertain() {
    let up = FakeUpstream::new()
        .on("tools/call", Answer::Sse(vec![Step::prime("ev-1"), Step::hang()]))
        .start()
        .await;
    let gw = Gateway::from_toml(&short_calls(), up.url()).await;

    let reply = gw
        .request("tools/call")
        .id(json!(17))
        .params(json!({"name": "endless", "arguments": {}}))
        .send()
        .await;

    reply.assert_error(502, -32603, &json!(17));
    assert_eq!(reply.reason(), Some("outcome_unknown"));
    let sent = up.calls("tools/call").remove(0);
    let cancelled =
        up.wait_for("notifications/cancelled", |s| s.rpc_method() == Some("notifications/cancelled")).await;
    assert_eq!(cancelled.body["params"]["requestId"], sent.body["id"]);
    assert_eq!(up.calls("tools/call").len(), 1);
    gw.assert_healthy().await;
}

#[tokio::test]
async fn many_small_progress_events_are_not_a_too_large_answer() {
    // 60 progress events of ~150 bytes: each is far below the 2 KiB limit,
    // together they are over it.
    let mut steps: Vec<Step> = (1..=60).map(|n| Step::progress(n as f64 / 60.0)).collect();
    steps.push(Step::result(json!({"content": [{"type": "text", "text": "done"}]})));
    let up = FakeUpstream::new().on("tools/call", Answer::Sse(steps)).start().await;
    let gw = Gateway::from_toml(&small_responses(), up.url()).await;

    let reply = gw
        .request("tools/call")
        .id(json!(18))
        .params(json!({"name": "chatty", "arguments": {}}))
        .progress_token(json!("p"))
        .send()
        .await;

    assert_eq!(reply.status, 200, "{}", reply.raw);
    assert_eq!(reply.notes.len(), 60, "every progress event arrives");
    assert_eq!(reply.body["result"]["content"][0]["text"], "done", "the stream was cut: {}", reply.body);
}
