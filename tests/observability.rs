//! Observability: the trace context a client sends reaches the upstream as
//! the gateway's hop (header and `_meta`), request ids, `/readyz` policies,
//! the per-tool latency histogram and `sessionless_build_info`, and the
//! binary's JSON access log.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use support::modern::ModernUpstream;
use support::{closed_port_url, metric_sum, Answer, FakeUpstream, Gateway};

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

fn traceparent() -> String {
    format!("00-{TRACE}-{CLIENT_SPAN}-01")
}

/// The trace id and span id of a `traceparent` the gateway sent.
fn sent(value: Option<&str>) -> (String, String) {
    let value = value.expect("a traceparent went upstream");
    let parts: Vec<&str> = value.split('-').collect();
    assert_eq!((parts.len(), parts[0], parts[3]), (4, "00", "01"), "{value}");
    (parts[1].to_string(), parts[2].to_string())
}

fn echo_upstream() -> FakeUpstream {
    FakeUpstream::new().on("tools/call", Answer::Result(json!({"content": []})))
}

#[tokio::test]
async fn a_modern_clients_trace_reaches_a_legacy_upstream_as_the_gateways_hop() {
    let up = echo_upstream().start().await;
    let gw = Gateway::start(up.url()).await;
    let call = gw
        .request("tools/call")
        .params(json!({"name": "echo", "arguments": {}}))
        .header("traceparent", &traceparent())
        .header("tracestate", "congo=t61rcWkgMzE");
    assert_eq!(call.send().await.status, 200);
    let seen = up.calls("tools/call").pop().unwrap();
    let (trace, span) = sent(seen.header("traceparent"));
    assert_eq!(trace, TRACE, "the client's trace");
    assert_ne!(span, CLIENT_SPAN, "a span of the gateway's own");
    assert_eq!(seen.header("tracestate"), Some("congo=t61rcWkgMzE"));
    let meta = &seen.body["params"]["_meta"];
    assert_eq!(meta["traceparent"].as_str(), seen.header("traceparent"), "the same hop in _meta: {meta}");
    assert_eq!(meta["tracestate"], "congo=t61rcWkgMzE");

    // `_meta.traceparent` (the 2026 place) wins over the header; each request a hop of its own.
    let in_meta = format!("00-{}-{CLIENT_SPAN}-01", "1".repeat(32));
    let call = gw
        .request("tools/call")
        .params(json!({"name": "echo", "arguments": {}}))
        .meta("traceparent", json!(in_meta))
        .header("traceparent", &traceparent());
    assert_eq!(call.send().await.status, 200);
    let seen = up.calls("tools/call").pop().unwrap();
    let (trace, second) = sent(seen.header("traceparent"));
    assert_eq!(trace, "1".repeat(32));
    assert_ne!(second, span);
    assert_eq!(seen.body["params"]["_meta"]["traceparent"].as_str(), seen.header("traceparent"));
}

#[tokio::test]
async fn an_invalid_traceparent_is_not_propagated() {
    let up = echo_upstream().start().await;
    let gw = Gateway::start(up.url()).await;
    for bad in [
        traceparent().to_uppercase(),
        format!("00-{}-{CLIENT_SPAN}-01", "0".repeat(32)),
        format!("00-{TRACE}-{}-01", "0".repeat(16)),
        format!("{}-x", traceparent()),
        traceparent()[..54].to_string(),
    ] {
        let call = gw
            .request("tools/call")
            .params(json!({"name": "echo", "arguments": {}}))
            .meta("traceparent", json!(bad))
            .header("traceparent", &bad);
        assert_eq!(call.send().await.status, 200);
        let seen = up.calls("tools/call").pop().unwrap();
        assert_eq!(seen.header("traceparent"), None, "{bad}");
        assert_eq!(seen.body["params"]["_meta"]["traceparent"], json!(bad), "passed on as it came");
    }
}

#[tokio::test]
async fn the_pass_through_sends_the_gateways_hop_in_header_and_meta() {
    let up = ModernUpstream::start().await;
    let text = format!(
        "[[upstreams]]\nname = \"m\"\nurl = \"{}\"\ngeneration = \"modern\"\n\n[[routes]]\npath = \"/mcp\"\nupstream = \"m\"\n",
        up.url
    );
    let gw = Gateway::with_config(sessionless::Config::from_toml(&text).unwrap()).await;
    let call = gw
        .request("tools/call")
        .params(json!({"name": "ask", "arguments": {"text": "hi"}}))
        .meta("traceparent", json!(traceparent()));
    assert_eq!(call.send().await.status, 200);
    let seen = up.calls().pop().unwrap();
    let header = seen.headers.get("traceparent").and_then(|v| v.to_str().ok());
    let (trace, span) = sent(header);
    assert_eq!(trace, TRACE);
    assert_ne!(span, CLIENT_SPAN);
    assert_eq!(seen.body["params"]["_meta"]["traceparent"].as_str(), header, "the body's _meta too");
    assert_eq!(seen.body["params"]["arguments"], json!({"text": "hi"}), "the rest as received");
}

#[tokio::test]
async fn request_ids_are_echoed_when_sane_and_minted_otherwise() {
    let up = echo_upstream().start().await;
    let gw = Gateway::start(up.url()).await;
    let list = |id: &str| gw.request("tools/list").header("x-request-id", id);
    assert_eq!(list("req-42.a_b:c").send().await.header("x-request-id"), Some("req-42.a_b:c"));
    let long = "x".repeat(129);
    for bad in ["has space", "quote\"d", long.as_str()] {
        let minted = list(bad).send().await;
        let id = minted.header("x-request-id").unwrap();
        assert_ne!(id, bad);
        assert!(id.len() == 24 && id.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
    }
    let refused = gw.post_raw(&[("content-type", "application/json")], "{").await;
    assert!(refused.header("x-request-id").is_some(), "on errors too");
}

async fn readyz_with(policy: &str, urls: &[&str]) -> (Gateway, String) {
    let mut text = format!("[server]\nreadiness = \"{policy}\"\n");
    for (i, url) in urls.iter().enumerate() {
        text.push_str(&format!(
            "\n[[upstreams]]\nname = \"u{i}\"\nurl = \"{url}\"\n\n[[routes]]\npath = \"/r{i}\"\nupstream = \"u{i}\"\n"
        ));
    }
    // Generation `auto`: probed at start, so a closed port is found down.
    let gw = Gateway::with_config(sessionless::Config::from_toml(&text).unwrap()).await;
    (gw, text)
}

/// `/readyz`'s status once the start-up probes have run.
async fn settled_readyz(gw: &Gateway, expected: u16) -> u16 {
    let until = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let (status, _) = gw.get("/readyz").await;
        if status.as_u16() == expected || tokio::time::Instant::now() > until {
            return status.as_u16();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn readiness_follows_its_policy_with_an_upstream_down() {
    let live = ModernUpstream::start().await;
    let down = closed_port_url().await;
    for (policy, urls, expected) in [
        ("always", vec![live.url.as_str(), down.as_str()], 200),
        ("any_upstream", vec![live.url.as_str(), down.as_str()], 200),
        ("any_upstream", vec![down.as_str()], 503),
        ("all_upstreams", vec![live.url.as_str(), down.as_str()], 503),
        ("all_upstreams", vec![live.url.as_str()], 200),
    ] {
        let (gw, _) = readyz_with(policy, &urls).await;
        // Give the probe of the down upstream its time before judging.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(settled_readyz(&gw, expected).await, expected, "{policy} {urls:?}");
        let (_, body) = gw.get("/readyz").await;
        if urls.contains(&down.as_str()) {
            assert!(body.contains("unreachable"), "{policy}: {body}");
        }
    }
    let bad = sessionless::Config::from_toml(
        "[server]\nreadiness = \"sometimes\"\n[[upstreams]]\nname = \"u\"\nurl = \"http://127.0.0.1:1/mcp\"\n[[routes]]\npath = \"/mcp\"\nupstream = \"u\"\n",
    );
    assert!(bad.unwrap_err().to_string().contains("line 2"), "names the line");
}

#[tokio::test]
async fn allowlisted_tools_have_a_latency_histogram_and_others_no_label() {
    let up = echo_upstream().start().await;
    let text = support::single_route("", "[telemetry]\nlatency_tools = [\"echo\"]\n");
    let gw = Gateway::from_toml(&text, up.url()).await;
    for tool in ["echo", "echo", "secret_tool"] {
        let call = gw.request("tools/call").params(json!({"name": tool, "arguments": {}}));
        assert_eq!(call.send().await.status, 200);
    }
    let (_, text) = gw.get("/metrics").await;
    let echo =
        metric_sum(&text, "sessionless_tool_call_duration_seconds_count{route=\"/mcp\",tool=\"echo\"}");
    assert_eq!(echo, 2.0, "{text}");
    assert!(!text.contains("secret_tool"), "a tool off the list is no label");
    let info = text.lines().find(|l| l.starts_with("sessionless_build_info{")).expect("build_info");
    assert!(
        info.contains(&format!("version=\"{}\"", env!("CARGO_PKG_VERSION"))) && info.ends_with(" 1"),
        "{info}"
    );
}

#[test]
fn the_binary_writes_one_json_access_line_per_request_without_colours() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let up = rt.block_on(echo_upstream().start());
    let port = support::cluster::free_port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_sessionless"))
        .args([
            "--upstream",
            up.url(),
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--log-format",
            "json",
            "--access-log",
        ])
        .env_remove("SESSIONLESS_LOG")
        .stderr(Stdio::piped())
        .spawn()
        .expect("the gateway binary starts");
    let guard = KillOnDrop(&mut child);
    let stderr = guard.0.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let next = || rx.recv_timeout(Duration::from_secs(10)).expect("a log line");
    while !next().contains("listening on") {}
    let reply = rt.block_on(async {
        let client = support::client::http_client();
        let url = format!("http://127.0.0.1:{port}/mcp");
        let req = support::ModernRequest::new(client, url, "tools/call")
            .params(json!({"name": "echo", "arguments": {}}))
            .header("x-request-id", "obs-test-1")
            .header("traceparent", &traceparent())
            .header("authorization", "Bearer secret-token-value");
        req.send().await
    });
    assert_eq!(reply.status, 200);
    let access = loop {
        let line = next();
        assert!(!line.contains('\u{1b}'), "no colour codes on a pipe: {line}");
        assert!(!line.contains("secret-token-value"), "no token in logs");
        let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        if v["target"] == "sessionless::access" {
            break v;
        }
    };
    assert_eq!(access["request_id"], "obs-test-1", "{access}");
    assert_eq!(access["route"], "/mcp");
    assert_eq!(access["method"], "tools/call");
    assert_eq!(access["generation"], "modern");
    assert_eq!(access["upstream"], "legacy");
    assert_eq!(access["outcome"], "ok");
    assert_eq!(access["status"], 200);
    assert_eq!(access["principal"], "bearer");
    assert_eq!(access["trace_id"], TRACE);
    assert!(access["micros"].as_u64().is_some(), "{access}");
}

struct KillOnDrop<'c>(&'c mut std::process::Child);

impl Drop for KillOnDrop<'_> {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
