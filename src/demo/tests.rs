//! Unit tests for the protocol logic: framing, method table, tools, sessions
//! and streamed jobs (driven through the SSE channel, no sockets).

use std::sync::Arc;
use std::time::Duration;

use http_body_util::BodyExt;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::methods::{self, Catalog, Reply};
use super::rpc::{self, Kind, Message, SseBody};
use super::session::{Session, Store};
use super::tools::{self, Job};

fn session(elicitation: bool) -> Session {
    Session::new("2025-11-25", elicitation, &CancellationToken::new())
}

/// Runs one request through the method table; returns the parsed envelope.
fn call(session: &Session, body: &str) -> Value {
    let msg: Message<'_> = serde_json::from_str(body).expect("test message parses");
    let Kind::Request { id, method } = msg.kind() else { panic!("not a request: {body}") };
    match methods::dispatch(&Catalog::new(), session, id, method, &msg) {
        Reply::Json(bytes) => serde_json::from_slice(&bytes).expect("reply is JSON"),
        Reply::Stream(_) => panic!("unexpected stream for {body}"),
    }
}

fn tool(session: &Session, name: &str, args: Value) -> Value {
    let req = json!({"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":name,"arguments":args}});
    call(session, &req.to_string())
}

fn error_code(reply: &Value) -> i64 {
    reply["error"]["code"].as_i64().unwrap_or_default()
}

#[test]
fn envelopes_keep_the_request_id_verbatim() {
    let id = serde_json::from_str::<&serde_json::value::RawValue>(r#""a\"b""#).unwrap();
    let ok: Value = serde_json::from_slice(&rpc::result_bytes(id, &json!({"x":1}))).unwrap();
    assert_eq!(ok, json!({"jsonrpc":"2.0","id":"a\"b","result":{"x":1}}));
    let err = rpc::RpcError::new(rpc::INVALID_PARAMS, "bad").with_data(json!({"k":2}));
    let err: Value = serde_json::from_slice(&rpc::error_bytes(None, &err)).unwrap();
    assert_eq!(
        err,
        json!({"jsonrpc":"2.0","id":null,"error":{"code":-32602,"message":"bad","data":{"k":2}}})
    );
    let spaced = serde_json::from_str::<&serde_json::value::RawValue>(r#""\u0041""#).unwrap();
    assert_eq!(rpc::canonical_id(spaced), r#""A""#);
}

#[test]
fn messages_are_classified() {
    let kind = |s: &str| match serde_json::from_str::<Message<'_>>(s).unwrap().kind() {
        Kind::Request { .. } => "request",
        Kind::Notification { .. } => "notification",
        Kind::Response { .. } => "response",
        Kind::Invalid => "invalid",
    };
    assert_eq!(kind(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#), "request");
    assert_eq!(kind(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#), "notification");
    assert_eq!(kind(r#"{"jsonrpc":"2.0","id":1,"result":{}}"#), "response");
    assert_eq!(kind(r#"{"jsonrpc":"2.0","id":1,"error":{"code":1,"message":"x"}}"#), "response");
    assert_eq!(kind(r#"{"jsonrpc":"2.0","id":1}"#), "invalid");
}

#[test]
fn initialize_negotiates_the_version_and_reads_elicitation() {
    let stop = CancellationToken::new();
    let init = |version: &str, caps: Value| {
        let body = json!({"jsonrpc":"2.0","id":0,"method":"initialize",
            "params":{"protocolVersion":version,"capabilities":caps,"clientInfo":{"name":"t","version":"1"}}});
        let body = body.to_string();
        let msg: Message<'_> = serde_json::from_str(&body).unwrap();
        let id = msg.id.unwrap();
        let (bytes, session) = methods::initialize(id, &msg, &stop).unwrap();
        (serde_json::from_slice::<Value>(&bytes).unwrap(), session)
    };
    let (reply, session) = init("2025-06-18", json!({"elicitation":{}}));
    assert_eq!(reply["result"]["protocolVersion"], "2025-06-18");
    assert_eq!(reply["result"]["serverInfo"]["name"], "sessionless-demo");
    assert!(reply["result"]["capabilities"]["completions"].is_object());
    assert!(session.elicitation);
    assert!(session.id.bytes().all(|b| (0x21..=0x7e).contains(&b)));
    let (reply, session) = init("2024-11-05", json!({}));
    assert_eq!(reply["result"]["protocolVersion"], "2025-11-25");
    assert!(!session.elicitation);
    assert!(!methods::declares_form_elicitation(&json!({"elicitation":{"url":{}}})));
    assert!(methods::declares_form_elicitation(&json!({"elicitation":{"form":{}}})));
}

#[test]
fn plain_methods_answer() {
    let s = session(false);
    assert_eq!(call(&s, r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#)["result"], json!({}));
    let tools = call(&s, r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#);
    let names: Vec<&str> =
        tools["result"]["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["echo", "add", "counter", "slow", "fail", "ask_user"]);
    assert!(tools["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .all(|t| t["inputSchema"]["type"] == "object"));
    assert_eq!(error_code(&call(&s, r#"{"jsonrpc":"2.0","id":1,"method":"nope"}"#)), -32601);
    let set = |level: &str| {
        call(
            &s,
            &json!({"jsonrpc":"2.0","id":1,"method":"logging/setLevel","params":{"level":level}}).to_string(),
        )
    };
    assert_eq!(set("error")["result"], json!({}));
    assert!(!s.logs(super::session::INFO));
    assert_eq!(error_code(&set("loud")), -32602);
}

#[test]
fn tools_answer_at_once() {
    let s = session(false);
    assert_eq!(
        tool(&s, "echo", json!({"text":"hé \"q\""}))["result"],
        json!({"content":[{"type":"text","text":"hé \"q\""}]})
    );
    let add = tool(&s, "add", json!({"a":2,"b":40}));
    assert_eq!(add["result"]["content"][0]["text"], "42");
    assert_eq!(add["result"]["structuredContent"], json!({"sum":42}));
    assert_eq!(error_code(&tool(&s, "add", json!({"a":"x","b":1}))), -32602);
    assert_eq!(error_code(&tool(&s, "echo", json!({}))), -32602);
    assert_eq!(tool(&s, "counter", json!({}))["result"]["content"][0]["text"], "1");
    assert_eq!(tool(&s, "counter", json!({}))["result"]["content"][0]["text"], "2");
    assert_eq!(tool(&s, "fail", json!({}))["result"]["isError"], true);
    assert_eq!(tool(&s, "ask_user", json!({}))["result"]["isError"], true);
    assert_eq!(error_code(&tool(&s, "nope", json!({}))), -32602);
}

#[test]
fn resources_prompts_and_completions() {
    let s = session(false);
    let read = |uri: &str| {
        call(&s, &json!({"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":uri}}).to_string())
    };
    assert_eq!(read("demo://readme")["result"]["contents"][0]["mimeType"], "text/plain");
    assert_eq!(read("demo://greeting/Ada")["result"]["contents"][0]["text"], "Hello, Ada!");
    assert_eq!(error_code(&read("demo://nothing")), -32002);
    let list = call(&s, r#"{"jsonrpc":"2.0","id":1,"method":"resources/templates/list"}"#);
    assert_eq!(list["result"]["resourceTemplates"][0]["uriTemplate"], "demo://greeting/{name}");
    let get = |name: &str| {
        call(&s, &json!({"jsonrpc":"2.0","id":1,"method":"prompts/get","params":{"name":name,"arguments":{"name":"Bob"}}}).to_string())
    };
    assert_eq!(get("greet")["result"]["messages"][0]["role"], "user");
    assert_eq!(error_code(&get("other")), -32602);
    let complete = call(
        &s,
        r#"{"jsonrpc":"2.0","id":1,"method":"completion/complete","params":{"ref":{"type":"ref/prompt","name":"greet"},"argument":{"name":"name","value":"al"}}}"#,
    );
    assert_eq!(complete["result"]["completion"]["values"], json!(["Alan", "Alice"]));
}

#[test]
fn elicitation_results_become_text() {
    let text = |v: Value| serde_json::to_value(tools::elicitation_result(&v)).unwrap();
    let r = text(json!({"action":"accept","content":{"answer":"blue"}}));
    assert_eq!(r["content"][0]["text"], "you answered: blue");
    assert_eq!(text(json!({"action":"decline"}))["content"][0]["text"], "no answer (decline)");
}

#[test]
fn store_evicts_the_oldest_and_expires_idle_sessions() {
    let stop = CancellationToken::new();
    let store = Store::new(2, Duration::from_secs(60));
    let sessions: Vec<Arc<Session>> =
        (0..3).map(|_| Arc::new(Session::new("2025-11-25", false, &stop))).collect();
    for s in &sessions {
        store.insert(Arc::clone(s));
    }
    assert_eq!(store.len(), 2);
    assert!(store.get(&sessions[0].id).is_none());
    assert!(store.get(&sessions[2].id).is_some());
    assert!(store.remove(&sessions[2].id));
    assert!(store.get(&sessions[2].id).is_none());

    let store = Store::new(10, Duration::ZERO);
    store.insert(Arc::new(Session::new("2025-11-25", false, &stop)));
    std::thread::sleep(Duration::from_millis(5));
    store.sweep();
    assert_eq!(store.len(), 0);
}

/// Reads the next SSE event's `data:` JSON; `None` when the stream ended.
async fn next_event(body: &mut SseBody) -> Option<Value> {
    let frame = body.frame().await?.ok()?;
    let bytes = frame.into_data().ok()?;
    let text = std::str::from_utf8(&bytes).ok()?;
    assert!(text.starts_with("id: "), "event without id: {text}");
    let data = text.lines().find_map(|l| l.strip_prefix("data: "))?;
    serde_json::from_str(data).ok()
}

fn job(session: &Session, body: &str) -> Job {
    let msg: Message<'_> = serde_json::from_str(body).unwrap();
    let Kind::Request { id, method } = msg.kind() else { panic!() };
    match methods::dispatch(&Catalog::new(), session, id, method, &msg) {
        Reply::Stream(job) => job,
        Reply::Json(bytes) => panic!("expected a stream: {}", String::from_utf8_lossy(&bytes)),
    }
}

#[tokio::test(start_paused = true)]
async fn slow_streams_progress_logs_then_the_result() {
    let s = Arc::new(session(false));
    let job = job(
        &s,
        r#"{"jsonrpc":"2.0","id":"j","method":"tools/call","params":{"name":"slow","arguments":{"steps":2,"delay_ms":10},"_meta":{"progressToken":"p"}}}"#,
    );
    let (mut sink, mut body) = rpc::sse_channel(s.next_stream());
    let task = tokio::spawn({
        let s = Arc::clone(&s);
        async move { tools::run_job(&s, job, &mut sink).await }
    });
    let mut methods_seen = Vec::new();
    while let Some(event) = next_event(&mut body).await {
        methods_seen.push(event["method"].as_str().unwrap_or("result").to_owned());
        if event["method"] == "notifications/progress" {
            assert_eq!(event["params"]["progressToken"], "p");
            assert_eq!(event["params"]["total"], 2);
        }
        if event.get("result").is_some() {
            assert_eq!(event["id"], "j");
        }
    }
    assert_eq!(
        methods_seen,
        [
            "notifications/progress",
            "notifications/message",
            "notifications/progress",
            "notifications/message",
            "result"
        ]
    );
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn cancelled_notification_stops_a_streamed_call() {
    let s = Arc::new(session(false));
    let job = job(
        &s,
        r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"slow","arguments":{"steps":100,"delay_ms":1000}}}"#,
    );
    let (mut sink, mut body) = rpc::sse_channel(s.next_stream());
    let task = tokio::spawn({
        let s = Arc::clone(&s);
        async move { tools::run_job(&s, job, &mut sink).await }
    });
    assert!(next_event(&mut body).await.is_some());
    let cancel: Message<'_> = serde_json::from_str(
        r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":5}}"#,
    )
    .unwrap();
    methods::notify(&s, "notifications/cancelled", &cancel);
    assert!(next_event(&mut body).await.is_none(), "no result after cancel");
    task.await.unwrap();
    assert!(!s.cancel("5"), "in-flight entry removed");
}

#[tokio::test]
async fn ask_user_waits_for_the_posted_answer_and_abandons_on_close() {
    let s = Arc::new(session(true));
    let body_text = r#"{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"ask_user","arguments":{"question":"colour?"}}}"#;
    let (mut sink, mut body) = rpc::sse_channel(s.next_stream());
    let first = job(&s, body_text);
    let task = tokio::spawn({
        let s = Arc::clone(&s);
        async move { tools::run_job(&s, first, &mut sink).await }
    });
    let request = next_event(&mut body).await.unwrap();
    assert_eq!(request["method"], "elicitation/create");
    assert_eq!(request["params"]["requestedSchema"]["required"], json!(["answer"]));
    assert!(s.deliver(&request["id"], Ok(json!({"action":"accept","content":{"answer":"red"}}))));
    let result = next_event(&mut body).await.unwrap();
    assert_eq!(result["result"]["content"][0]["text"], "you answered: red");
    task.await.unwrap();

    // Closing the stream before answering ends the task and forgets the question.
    let (mut sink, mut body) = rpc::sse_channel(s.next_stream());
    let second = job(&s, body_text);
    let task = tokio::spawn({
        let s = Arc::clone(&s);
        async move { tools::run_job(&s, second, &mut sink).await }
    });
    let request = next_event(&mut body).await.unwrap();
    drop(body);
    tokio::time::timeout(Duration::from_secs(5), task).await.expect("task ends").unwrap();
    assert!(!s.deliver(&request["id"], Ok(json!({"action":"cancel"}))));
}
