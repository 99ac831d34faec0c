//! The benchmark's fast upstream (`examples/fast_upstream.rs`) speaks MCP the
//! way the figures in BENCHMARKS.md assume: the gateway finds each
//! generation by probing it, and serves a 2026 client's `tools/call echo`
//! through it (translated onto a legacy session, or passed through). Its
//! session rules are checked directly.

mod support;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use serde_json::{json, Value};
use support::Gateway;

/// The example's binary, built by `cargo test` beside this test's.
fn binary() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's path");
    let dir = exe.parent().and_then(|deps| deps.parent()).expect("target/<profile>/deps");
    let path = dir.join("examples").join(format!("fast_upstream{}", std::env::consts::EXE_SUFFIX));
    assert!(path.exists(), "{} is missing: `cargo test` builds the examples", path.display());
    path
}

/// A running fast upstream on 127.0.0.1, stopped when dropped.
struct Fast {
    child: Child,
    url: String,
}

impl Fast {
    fn start(generation: &str) -> Fast {
        let mut child = Command::new(binary())
            .args(["--listen", "127.0.0.1:0", "--generation", generation])
            .stderr(Stdio::piped())
            .spawn()
            .expect("the fast upstream starts");
        let mut line = String::new();
        BufReader::new(child.stderr.take().unwrap()).read_line(&mut line).unwrap();
        let url = line.split_whitespace().last().unwrap_or_default().to_string();
        assert!(url.starts_with("http://127.0.0.1:"), "{line}");
        Fast { child, url }
    }
}

impl Drop for Fast {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn echo_through(gw: &Gateway) -> Value {
    let reply = gw
        .request("tools/call")
        .params(json!({"name": "echo", "arguments": {"text": "hi \"there\""}}))
        .send()
        .await;
    assert_eq!(reply.status, 200, "{}", reply.raw);
    reply.result().clone()
}

#[tokio::test]
async fn the_gateway_probes_each_generation_and_serves_echo_through_it() {
    for generation in ["legacy", "modern"] {
        let fast = Fast::start(generation);
        let gw = Gateway::start_auto(&fast.url).await;
        let result = echo_through(&gw).await;
        assert_eq!(result["content"][0]["text"], "hi \"there\"", "{generation}: {result}");
        assert_eq!(result["resultType"], "complete", "{generation}: {result}");
        let (_, readyz) = gw.get("/readyz").await;
        assert!(readyz.contains(generation), "{generation}: {readyz}");
    }
}

#[tokio::test]
async fn a_legacy_fast_upstream_keeps_sessions_as_a_legacy_server_does() {
    let fast = Fast::start("legacy");
    let client = support::client::http_client();
    let post = |session: Option<&str>, body: Value| {
        let mut req = hyper::Request::post(&fast.url).header("content-type", "application/json");
        if let Some(s) = session {
            req = req.header("mcp-session-id", s);
        }
        req.body(http_body_util::Full::new(bytes::Bytes::from(body.to_string()))).unwrap()
    };
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}});
    let resp = support::client::send(&client, post(None, init)).await;
    let session = resp.headers()["mcp-session-id"].to_str().unwrap().to_string();
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "echo", "arguments": {"text": "x"}}});
    assert_eq!(support::client::send(&client, post(None, call.clone())).await.status(), 400, "no session");
    assert_eq!(support::client::send(&client, post(Some("nope"), call.clone())).await.status(), 404);
    let reply = support::client::Reply::read(
        support::client::send(&client, post(Some(&session), call.clone())).await,
    )
    .await;
    assert_eq!(
        reply.body,
        json!({"jsonrpc": "2.0", "id": 2, "result": {"content": [{"type": "text", "text": "x"}]}})
    );
    let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    assert_eq!(support::client::send(&client, post(Some(&session), note)).await.status(), 202);
    let delete = hyper::Request::delete(&fast.url)
        .header("mcp-session-id", session.as_str())
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    assert_eq!(support::client::send(&client, delete).await.status(), 200);
    assert_eq!(support::client::send(&client, post(Some(&session), call)).await.status(), 404, "ended");
}

/// What `bench/run.sh` part `streams` holds by the thousand: through the
/// gateway, a legacy session's GET stream and a 2026 client's
/// `subscriptions/listen` on either generation stay open and quiet.
#[tokio::test]
async fn held_streams_stay_open_through_the_gateway() {
    use std::time::Duration;
    let quiet = Duration::from_millis(300);

    let legacy = Fast::start("legacy");
    let gw = Gateway::start_auto(&legacy.url).await;
    let client = support::legacy::Legacy::new(&gw);
    let session = client.open().await;
    let get = client.request(http::Method::GET, Some(&session)).body(Default::default()).unwrap();
    let http = support::client::http_client();
    let mut events = support::Events::of(support::client::send(&http, get).await);
    assert_eq!(events.status, 200);
    assert_eq!(events.headers["content-type"], "text/event-stream");
    assert!(events.next_within(quiet).await.is_err(), "open, nothing sent");

    for fast in [&legacy, &Fast::start("modern")] {
        let gw = Gateway::start_auto(&fast.url).await;
        let mut listen = gw
            .request("subscriptions/listen")
            .params(json!({"notifications": {"toolsListChanged": true}}))
            .open()
            .await;
        assert_eq!(listen.status, 200, "{}", fast.url);
        let ack = listen.next().await.expect("an acknowledgement");
        assert_eq!(ack["method"], "notifications/subscriptions/acknowledged", "{ack}");
        assert!(listen.next_within(quiet).await.is_err(), "open, nothing more sent");
    }
}

/// `--stdio` (what `bench/run.sh` part `stdio` spawns): the legacy server on
/// stdin/stdout, one message per line, with the same answers as over HTTP;
/// notifications unanswered; it ends with its input.
#[test]
fn the_stdio_mode_answers_a_line_per_request() {
    use std::io::Write;
    let mut child = Command::new(binary())
        .arg("--stdio")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the fast upstream starts");
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut ask = |msg: Value| -> Option<Value> {
        writeln!(stdin, "{msg}").unwrap();
        stdin.flush().unwrap();
        // A notification: no answer.
        msg.get("id")?;
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        Some(serde_json::from_str(&line).unwrap())
    };
    let init = ask(json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}))
    .unwrap();
    assert_eq!(init["result"]["protocolVersion"], "2025-11-25", "{init}");
    assert_eq!(ask(json!({"jsonrpc": "2.0", "method": "notifications/initialized"})), None);
    let call = json!({"jsonrpc": "2.0", "id": "c", "method": "tools/call", "params": {"name": "echo", "arguments": {"text": "x\ny"}}});
    assert_eq!(
        ask(call).unwrap(),
        json!({"jsonrpc": "2.0", "id": "c", "result": {"content": [{"type": "text", "text": "x\ny"}]}})
    );
    let list = ask(json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"})).unwrap();
    assert_eq!(list["result"]["tools"][0]["name"], "echo", "{list}");
    let unknown = ask(json!({"jsonrpc": "2.0", "id": 4, "method": "nope"})).unwrap();
    assert_eq!(unknown["error"]["code"], -32601, "{unknown}");
    drop(stdin);
    let status = child.wait().unwrap();
    assert!(status.success(), "ends with its input: {status}");
}

/// The same program as a stdio upstream: the gateway spawns it and serves
/// a 2026 client's `echo` through it, as over HTTP.
#[tokio::test]
async fn the_gateway_serves_echo_through_the_stdio_mode() {
    let toml = format!(
        "[[upstreams]]\nname = \"fast\"\ncommand = [{:?}, \"--stdio\"]\n\n[[routes]]\npath = \"/mcp\"\nupstream = \"fast\"\n",
        binary().to_str().unwrap()
    );
    let gw = Gateway::from_toml(&toml, "").await;
    let result = echo_through(&gw).await;
    assert_eq!(result["content"][0]["text"], "hi \"there\"", "{result}");
    assert_eq!(result["resultType"], "complete", "{result}");
}
