//! An upstream answer whose JSON-RPC id is not the one sent is never
//! delivered (issue 22): connections to an upstream are shared by callers,
//! so a response written for another request (late, or by a confused
//! upstream) would otherwise reach whoever asks next on that connection,
//! possibly another principal. Each path refuses it with a gateway error,
//! counts it, and drops the upstream's idle connections; the ids the gateway
//! mints are random, so a stray answer cannot be aimed at the next one.

mod support;

use serde_json::{json, Value};
use support::legacy::Legacy;
use support::modern::ModernUpstream;
use support::upstream::Msg;
use support::{Answer, FakeUpstream, Gateway, Step};

const SECRET: &str = "another caller's secret";

fn stray_result(id: Value) -> Answer {
    let body = json!({"jsonrpc": "2.0", "id": id, "result": {"content": [{"type": "text", "text": SECRET}]}});
    Answer::Raw { status: 200, content_type: "application/json".into(), body: body.to_string() }
}

/// Tools that answer something other than the request: a result for the
/// next id, an error for the previous one, a stream carrying another id's
/// result; and `echo`, which answers properly.
fn confused() -> FakeUpstream {
    let next = |req: &Value| match &req["id"] {
        Value::Number(n) => json!(n.as_u64().unwrap() + 1),
        other => json!(format!("{other}-next")),
    };
    FakeUpstream::new().on_fn("tools/call", move |req| match req["params"]["name"].as_str() {
        Some("next") => stray_result(next(req)),
        Some("previous") => {
            let body = json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32000, "message": SECRET}});
            Answer::Raw { status: 200, content_type: "application/json".into(), body: body.to_string() }
        }
        Some("stream") => Answer::Sse(vec![Step::Message {
            id: None,
            msg: Msg::Verbatim(json!({"jsonrpc": "2.0", "id": next(req), "result": {"content": [{"type": "text", "text": SECRET}]}})),
        }]),
        _ => Answer::Result(json!({"content": [{"type": "text", "text": "echo"}]})),
    })
}

fn foreign_count(metrics: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with("sessionless_upstream_requests_total{") && l.contains("foreign_answer"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test]
async fn a_2026_client_never_gets_an_answer_to_another_request() {
    let up = confused().start().await;
    let gw = Gateway::start(up.url()).await;
    for tool in ["next", "previous", "stream"] {
        let reply =
            gw.request("tools/call").id(json!(1)).params(json!({"name": tool, "arguments": {}})).send().await;
        assert!(!reply.raw.contains(SECRET), "{tool}: {}", reply.raw);
        assert_eq!(reply.status, 502, "{tool}: {}", reply.raw);
    }
    let (_, metrics) = gw.get("/metrics").await;
    assert_eq!(foreign_count(&metrics), 2.0, "whole answers counted (a stream's ends with it): {metrics}");
    // The calls still work; the ids the upstream saw follow no sequence.
    for _ in 0..3 {
        let ok = gw.request("tools/call").params(json!({"name": "echo", "arguments": {}})).send().await;
        assert_eq!(ok.status, 200, "{}", ok.raw);
    }
    let ids: Vec<u64> = up.calls("tools/call").iter().filter_map(|s| s.rpc_id()?.as_u64()).collect();
    assert_eq!(ids.len(), 6);
    assert!(ids.windows(2).all(|w| w[1] != w[0] + 1), "minted ids are not consecutive: {ids:?}");
}

#[tokio::test]
async fn the_relay_never_passes_an_answer_to_another_request() {
    let up = confused().start().await;
    let gw = Gateway::start(up.url()).await;
    let client = Legacy::new(&gw);
    let session = client.open().await;
    for (id, tool) in [(5, "next"), (6, "previous"), (7, "stream")] {
        let reply = client.call(&session, json!(id), tool).await;
        assert!(!reply.raw.contains(SECRET), "{tool}: {}", reply.raw);
        assert!(reply.raw.contains("upstream_invalid"), "{tool}: {}", reply.raw);
    }
    let ok = client.call(&session, json!(8), "echo").await;
    assert_eq!(ok.body["id"], 8, "{}", ok.raw);
    let (_, metrics) = gw.get("/metrics").await;
    assert_eq!(foreign_count(&metrics), 3.0, "{metrics}");
}

/// A gateway in front of the 2026 fake, its generation as configured.
async fn modern_gateway(up: &ModernUpstream, keys: &str) -> Gateway {
    let text = support::single_route(keys, "").replace("{upstream}", &up.url);
    Gateway::with_config(sessionless::Config::from_toml(&text).unwrap()).await
}

#[tokio::test]
async fn a_2026_upstream_answer_to_another_request_is_never_passed_on() {
    let up = ModernUpstream::start().await;
    let gw = modern_gateway(&up, "generation = \"modern\"").await;
    for tool in ["stray", "stray_sse"] {
        let reply = gw.request("tools/call").params(json!({"name": tool, "arguments": {}})).send().await;
        assert!(!reply.raw.contains(SECRET), "{tool}: {}", reply.raw);
        assert!(reply.raw.contains("upstream_invalid"), "{tool}: {}", reply.raw);
    }
}

#[tokio::test]
async fn a_translated_legacy_client_never_gets_an_answer_to_another_request() {
    let up = ModernUpstream::start().await;
    let keys = "generation = \"modern\"\nlegacy_clients = \"translate\"";
    let gw = modern_gateway(&up, keys).await;
    let client = Legacy::new(&gw);
    let init = client.post(None, support::legacy::init_body(json!(1))).await;
    let session = init.header("mcp-session-id").expect("a session").to_string();
    for tool in ["stray", "stray_sse"] {
        let reply = client.call(&session, json!(3), tool).await;
        assert!(!reply.raw.contains(SECRET), "{tool}: {}", reply.raw);
        assert!(reply.raw.contains("upstream_invalid"), "{tool}: {}", reply.raw);
    }
    // What the upstream was sent carries the gateway's id, not the client's.
    let sent: Vec<Value> = up.calls().iter().map(|r| r.body["id"].clone()).collect();
    assert!(sent.iter().all(|id| id != &json!(3)), "{sent:?}");
}
