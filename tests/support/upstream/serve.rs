//! The fake upstream's HTTP side: the handshake, scripted answers, SSE
//! streams written step by step, resumption, the GET stream and DELETE.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::{Answer, Msg, Seen, Session, Shared, Step, WAIT};

type Body = BoxBody<Bytes, std::io::Error>;

pub(super) async fn accept(listener: TcpListener, shared: Arc<Shared>) {
    let mut connections = JoinSet::new();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let shared = shared.clone();
        connections.spawn(async move {
            let service = hyper::service::service_fn(move |req| handle(shared.clone(), req));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
        while connections.try_join_next().is_some() {}
    }
}

async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let (parts, body) = req.into_parts();
    let bytes = body.collect().await.map(|c| c.to_bytes()).unwrap_or_default();
    let json: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let resp = match parts.method {
        Method::POST => post(&shared, &parts, json).await,
        Method::GET => get(&shared, &parts),
        Method::DELETE => delete(&shared, &parts),
        _ => {
            shared.record(&parts, &json, 405);
            status(405)
        }
    };
    Ok(resp)
}

async fn post(shared: &Arc<Shared>, parts: &http::request::Parts, msg: Value) -> Response<Body> {
    let method = msg.get("method").and_then(Value::as_str).map(str::to_string);
    let is_request = method.is_some() && msg.get("id").is_some();
    if method.as_deref() == Some("initialize") {
        if let Some(h) = shared.script.handlers.get("initialize") {
            let answer = h(&msg);
            shared.record(parts, &msg, answer.status());
            return respond(shared, &msg, "initialize", answer).await;
        }
        return initialize(shared, parts, &msg);
    }
    if let Err(code) = shared.check_session(&parts.headers, is_request) {
        shared.record(parts, &msg, code);
        return status(code);
    }
    if method.as_deref() == Some("notifications/initialized") {
        shared.mark_initialized(&parts.headers);
    }
    let Some(method) = method.filter(|_| is_request) else {
        // A notification or a response: taken.
        shared.record(parts, &msg, 202);
        return status(202);
    };
    let answer = match shared.script.handlers.get(&method) {
        Some(h) => h(&msg),
        None if method == "tools/list" => Answer::Result(json!({"tools": []})),
        None => Answer::Error(-32601, format!("Method not found: {method}")),
    };
    shared.record(parts, &msg, answer.status());
    respond(shared, &msg, &method, answer).await
}

fn initialize(shared: &Arc<Shared>, parts: &http::request::Parts, msg: &Value) -> Response<Body> {
    shared.record(parts, msg, 200);
    let requested = msg.pointer("/params/protocolVersion").and_then(Value::as_str).unwrap_or("");
    let version = if let Some(v) = &shared.script.version {
        v.as_str()
    } else if ["2025-11-25", "2025-06-18", "2025-03-26"].contains(&requested) {
        requested
    } else {
        "2025-11-25"
    };
    let result = json!({
        "protocolVersion": version,
        "capabilities": shared.script.capabilities,
        "serverInfo": shared.script.server_info,
    });
    let mut resp = if shared.script.sse_initialize {
        sse(shared.clone(), msg.clone(), vec![Step::prime("init-0"), Step::result(result)])
    } else {
        json_response(json!({"jsonrpc": "2.0", "id": msg["id"], "result": result}))
    };
    if shared.script.session_ids {
        let id = format!("fake-session-{}", shared.next_session.fetch_add(1, Ordering::SeqCst));
        shared.sessions.lock().unwrap().insert(id.clone(), Session::default());
        resp.headers_mut().insert("mcp-session-id", id.parse().unwrap());
    }
    resp
}

fn get(shared: &Arc<Shared>, parts: &http::request::Parts) -> Response<Body> {
    if let Err(code) = shared.check_session(&parts.headers, false) {
        shared.record(parts, &Value::Null, code);
        return status(code);
    }
    let last = parts.headers.get("last-event-id").and_then(|v| v.to_str().ok());
    let script = match last {
        Some(last) => {
            let origin = shared.event_origin.lock().unwrap().get(last).cloned();
            origin.and_then(|request| {
                let method = request["method"].as_str().unwrap_or("").to_string();
                let steps = shared.script.resume.get(&method)?.clone();
                Some((request, steps))
            })
        }
        None => shared.script.get_stream.clone().map(|steps| (Value::Null, steps)),
    };
    let Some((request, steps)) = script else {
        shared.record(parts, &Value::Null, 405);
        return status(405);
    };
    shared.record(parts, &Value::Null, 200);
    sse(shared.clone(), request, steps)
}

fn delete(shared: &Arc<Shared>, parts: &http::request::Parts) -> Response<Body> {
    let id = parts.headers.get("mcp-session-id").and_then(|v| v.to_str().ok());
    let known = id.is_some_and(|id| shared.sessions.lock().unwrap().remove(id).is_some());
    let code = if known { 200 } else { 404 };
    shared.record(parts, &Value::Null, code);
    status(code)
}

async fn respond(shared: &Arc<Shared>, request: &Value, method: &str, answer: Answer) -> Response<Body> {
    let id = request["id"].clone();
    match answer {
        Answer::Result(r) => json_response(json!({"jsonrpc": "2.0", "id": id, "result": r})),
        Answer::Error(code, message) => {
            json_response(json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}))
        }
        Answer::ErrorData(code, message, data) => json_response(
            json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message, "data": data}}),
        ),
        Answer::Sse(steps) => sse(shared.clone(), request.clone(), steps),
        Answer::Raw { status: s, content_type, body } => {
            Response::builder().status(s).header("content-type", content_type).body(full(body)).unwrap()
        }
        Answer::Status(s) => status(s),
        Answer::Delayed(pause, inner) => {
            tokio::time::sleep(pause).await;
            Box::pin(respond(shared, request, method, *inner)).await
        }
    }
}

type Frames = mpsc::Sender<Result<Frame<Bytes>, std::io::Error>>;

/// An SSE response whose events are written by a task running `steps`.
fn sse(shared: Arc<Shared>, request: Value, steps: Vec<Step>) -> Response<Body> {
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(run_steps(shared, request, steps, tx));
    let stream =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|item| (item, rx)) });
    Response::builder()
        .status(200)
        .header("content-type", "text/event-stream")
        .header("cache-control", "no-cache")
        .body(BodyExt::boxed(StreamBody::new(stream)))
        .unwrap()
}

async fn run_steps(shared: Arc<Shared>, request: Value, steps: Vec<Step>, tx: Frames) {
    for step in steps {
        let text = match step {
            Step::Prime { id, retry_ms } => {
                shared.remember_event(&id, &request);
                let retry = retry_ms.map(|ms| format!("retry: {ms}\n")).unwrap_or_default();
                format!("id: {id}\n{retry}data:\n\n")
            }
            Step::Message { id, msg } => {
                let id_line = match id {
                    Some(id) => {
                        shared.remember_event(&id, &request);
                        format!("id: {id}\n")
                    }
                    None => String::new(),
                };
                format!("{id_line}event: message\ndata: {}\n\n", render(&request, msg))
            }
            Step::Sleep(d) => {
                tokio::time::sleep(d).await;
                continue;
            }
            Step::AwaitResponse(id) => {
                let pred = |s: &Seen| s.is_response() && s.rpc_id() == Some(&id);
                shared.wait_for(&pred, WAIT).await;
                continue;
            }
            Step::Hang => {
                tx.closed().await;
                return;
            }
            Step::Abort => {
                let _ = tx.send(Err(std::io::Error::other("fake upstream broke the stream"))).await;
                return;
            }
        };
        if tx.send(Ok(Frame::data(Bytes::from(text)))).await.is_err() {
            return;
        }
    }
}

fn render(request: &Value, msg: Msg) -> Value {
    let id = request["id"].clone();
    match msg {
        Msg::Result(r) => json!({"jsonrpc": "2.0", "id": id, "result": r}),
        Msg::Error(code, message) => {
            json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
        }
        Msg::ErrorData(code, message, data) => {
            json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message, "data": data}})
        }
        Msg::Progress(p) => json!({"jsonrpc": "2.0", "method": "notifications/progress",
            "params": {"progressToken": request.pointer("/params/_meta/progressToken"),
                       "progress": p, "total": 1.0}}),
        Msg::Verbatim(v) => v,
    }
}

fn full(body: impl Into<Bytes>) -> Body {
    Full::new(body.into()).map_err(|never| match never {}).boxed()
}

fn status(code: u16) -> Response<Body> {
    Response::builder().status(StatusCode::from_u16(code).unwrap()).body(full(Bytes::new())).unwrap()
}

fn json_response(v: Value) -> Response<Body> {
    Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .body(full(serde_json::to_vec(&v).unwrap()))
        .unwrap()
}
