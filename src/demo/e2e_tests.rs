//! End-to-end tests: the demo server on a real socket (127.0.0.1:0), driven
//! by hyper-util's client the way the gateway drives a legacy upstream.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

struct Demo {
    url: String,
    client: Client<HttpConnector, Full<Bytes>>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<std::io::Result<()>>,
}

async fn start(max_sessions: usize) -> Demo {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    let (stop, stopped) = oneshot::channel::<()>();
    let shutdown = async move {
        let _ = stopped.await;
    };
    let idle = Duration::from_secs(60);
    let task = tokio::spawn(super::serve_with(listener, shutdown, max_sessions, idle));
    let client = Client::builder(TokioExecutor::new()).build_http();
    Demo { url, client, stop: Some(stop), task }
}

impl Demo {
    async fn send(&self, method: Method, session: Option<&str>, body: &str) -> Response<Incoming> {
        let mut req = Request::builder()
            .method(method)
            .uri(&self.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        if let Some(id) = session {
            req = req.header("mcp-session-id", id).header("mcp-protocol-version", "2025-11-25");
        }
        let req = req.body(Full::new(Bytes::from(body.to_owned()))).unwrap();
        self.client.request(req).await.unwrap()
    }

    async fn post(&self, session: Option<&str>, body: Value) -> Response<Incoming> {
        self.send(Method::POST, session, &body.to_string()).await
    }

    /// Initializes a session and sends `notifications/initialized`.
    async fn session(&self, version: &str, capabilities: Value) -> String {
        let init = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{
            "protocolVersion":version,"capabilities":capabilities,"clientInfo":{"name":"e2e","version":"1"}}});
        let resp = self.post(None, init).await;
        assert_eq!(resp.status(), StatusCode::OK);
        let id = resp.headers()["mcp-session-id"].to_str().unwrap().to_owned();
        assert_eq!(json_of(resp).await["result"]["protocolVersion"], version);
        let note = json!({"jsonrpc":"2.0","method":"notifications/initialized"});
        assert_eq!(self.post(Some(&id), note).await.status(), StatusCode::ACCEPTED);
        id
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let served = tokio::time::timeout(Duration::from_secs(10), self.task).await;
        served.expect("serve returns after shutdown").unwrap().unwrap();
    }
}

async fn json_of(resp: Response<Incoming>) -> Value {
    assert_eq!(resp.headers()["content-type"], "application/json");
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&bytes).unwrap()
}

/// Reads SSE `data:` events off a response body, skipping comments.
struct Events {
    body: Incoming,
    buf: String,
}

impl Events {
    fn of(resp: Response<Incoming>) -> Self {
        assert_eq!(resp.headers()["content-type"], "text/event-stream");
        Self { body: resp.into_body(), buf: String::new() }
    }

    async fn next(&mut self) -> Option<Value> {
        loop {
            while let Some(end) = self.buf.find("\n\n") {
                let event: String = self.buf.drain(..end + 2).collect();
                if let Some(data) = event.lines().find_map(|l| l.strip_prefix("data: ")) {
                    assert!(event.starts_with("id: "), "event without id: {event}");
                    return Some(serde_json::from_str(data).unwrap());
                }
            }
            let frame = self.body.frame().await?.ok()?;
            if let Ok(data) = frame.into_data() {
                self.buf.push_str(std::str::from_utf8(&data).unwrap());
            }
        }
    }
}

fn call(id: u64, name: &str, arguments: Value) -> Value {
    json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{"name":name,"arguments":arguments}})
}

#[tokio::test]
async fn session_lifecycle_with_elicitation() {
    let demo = start(100).await;
    let sid = demo.session("2025-11-25", json!({"elicitation":{"form":{}}})).await;

    let echo = demo.post(Some(&sid), call(1, "echo", json!({"text":"hi"}))).await;
    assert_eq!(echo.status(), StatusCode::OK);
    assert_eq!(json_of(echo).await["result"]["content"][0]["text"], "hi");

    let asked = demo.post(Some(&sid), call(2, "ask_user", json!({"question":"colour?"}))).await;
    let mut events = Events::of(asked);
    let request = events.next().await.unwrap();
    assert_eq!(request["method"], "elicitation/create");
    assert_eq!(request["params"]["message"], "colour?");
    let answer =
        json!({"jsonrpc":"2.0","id":request["id"],"result":{"action":"accept","content":{"answer":"blue"}}});
    assert_eq!(demo.post(Some(&sid), answer).await.status(), StatusCode::ACCEPTED);
    let result = events.next().await.unwrap();
    assert_eq!(result["id"], 2);
    assert_eq!(result["result"]["content"][0]["text"], "you answered: blue");
    assert!(events.next().await.is_none(), "stream ends after the result");

    assert_eq!(demo.send(Method::DELETE, Some(&sid), "").await.status(), StatusCode::OK);
    let gone = demo.post(Some(&sid), call(3, "echo", json!({"text":"hi"}))).await;
    assert_eq!(gone.status(), StatusCode::NOT_FOUND);
    demo.stop().await;
}

#[tokio::test]
async fn slow_reports_progress_over_sse() {
    let demo = start(100).await;
    let sid = demo.session("2025-06-18", json!({})).await;
    let mut req = call(1, "slow", json!({"steps":2,"delay_ms":1}));
    req["params"]["_meta"] = json!({"progressToken": 77});
    let mut events = Events::of(demo.post(Some(&sid), req).await);
    let mut progress = Vec::new();
    let last = loop {
        let event = events.next().await.unwrap();
        if event["method"] == "notifications/progress" {
            progress.push(event["params"]["progress"].as_u64().unwrap());
        } else if event.get("result").is_some() {
            break event;
        }
    };
    assert_eq!(progress, [1, 2]);
    assert_eq!(last["result"]["content"][0]["text"], "slow finished 2 steps");
    demo.stop().await;
}

#[tokio::test]
async fn transport_errors_use_legacy_statuses() {
    let demo = start(100).await;
    let ping = json!({"jsonrpc":"2.0","id":1,"method":"ping"});
    let missing = demo.post(None, ping.clone()).await;
    assert_eq!(missing.status(), StatusCode::BAD_REQUEST);
    assert!(json_of(missing).await["error"]["code"].is_i64());
    assert_eq!(demo.post(Some("nope"), ping).await.status(), StatusCode::NOT_FOUND);
    let garbage = demo.send(Method::POST, None, "{not json").await;
    assert_eq!(garbage.status(), StatusCode::BAD_REQUEST);
    assert_eq!(json_of(garbage).await["error"]["code"], -32700);
    assert_eq!(demo.send(Method::PUT, None, "").await.status(), StatusCode::METHOD_NOT_ALLOWED);
    let sid = demo.session("2025-11-25", json!({})).await;
    let unknown = demo.post(Some(&sid), json!({"jsonrpc":"2.0","id":4,"method":"nope"})).await;
    assert_eq!(json_of(unknown).await["error"]["code"], -32601);
    demo.stop().await;
}

#[tokio::test]
async fn batches_on_2025_03_26_and_eviction() {
    let demo = start(1).await;
    let sid = demo.session("2025-03-26", json!({})).await;
    let batch = json!([{"jsonrpc":"2.0","id":1,"method":"ping"}, call(2, "add", json!({"a":1,"b":2})),
        {"jsonrpc":"2.0","method":"notifications/progress","params":{}}]);
    let resp = demo.post(Some(&sid), batch).await;
    let replies = json_of(resp).await;
    assert_eq!(replies[0]["id"], 1);
    assert_eq!(replies[1]["result"]["structuredContent"]["sum"], 3);
    assert_eq!(replies.as_array().unwrap().len(), 2);
    // A second session pushes the first out (the store holds one here).
    let _second = demo.session("2025-03-26", json!({})).await;
    let evicted = demo.post(Some(&sid), json!({"jsonrpc":"2.0","id":1,"method":"ping"})).await;
    assert_eq!(evicted.status(), StatusCode::NOT_FOUND);
    demo.stop().await;
}

#[tokio::test]
async fn get_stream_ends_on_delete_and_shutdown_drains() {
    let demo = start(100).await;
    let sid = demo.session("2025-11-25", json!({})).await;
    let get = demo.send(Method::GET, Some(&sid), "").await;
    assert_eq!(get.status(), StatusCode::OK);
    let mut stream = Events::of(get);
    assert_eq!(demo.send(Method::DELETE, Some(&sid), "").await.status(), StatusCode::OK);
    let ended = tokio::time::timeout(Duration::from_secs(5), stream.next()).await;
    assert!(ended.expect("GET stream ends").is_none());

    let sid = demo.session("2025-11-25", json!({})).await;
    let mut open = Events::of(demo.send(Method::GET, Some(&sid), "").await);
    demo.stop().await;
    let ended = tokio::time::timeout(Duration::from_secs(5), open.next()).await;
    assert!(ended.expect("GET stream ends at shutdown").is_none());
}
