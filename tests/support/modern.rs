//! A fake 2026-07-28 (stateless) upstream: `server/discover`, a tool that
//! asks a question (`input_required` with a `requestState` of its own), a
//! tool answered on SSE, a tool that fails as its arguments say, and a log
//! of every request it received.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::TcpListener;

type Body = BoxBody<Bytes, Infallible>;

/// The state the fake hands out and expects back, byte for byte.
pub const UPSTREAM_STATE: &str = "upstream-state:7f3a";

#[derive(Clone, Debug)]
pub struct Received {
    pub headers: HeaderMap,
    pub raw: Bytes,
    pub body: Value,
}

pub struct ModernUpstream {
    pub url: String,
    seen: Arc<Mutex<Vec<Received>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ModernUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ModernUpstream {
    pub async fn start() -> ModernUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/mcp", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let task = tokio::spawn(async move {
            // Connections end with the server (as when its process is killed).
            let mut connections = tokio::task::JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else { continue };
                let log = log.clone();
                connections.spawn(async move {
                    let service = hyper::service::service_fn(move |req| handle(log.clone(), req));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        ModernUpstream { url, seen, task }
    }

    pub fn seen(&self) -> Vec<Received> {
        self.seen.lock().unwrap().clone()
    }

    /// Requests other than the gateway's probes (`server/discover`, and the
    /// `initialize` that asks whether it serves 2025 clients too).
    pub fn calls(&self) -> Vec<Received> {
        let probe = |r: &Received| {
            r.body["method"] == "server/discover" || r.body["id"] == "sessionless-probe-legacy"
        };
        self.seen().into_iter().filter(|r| !probe(r)).collect()
    }
}

async fn handle(
    log: Arc<Mutex<Vec<Received>>>,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let (parts, body) = req.into_parts();
    let raw = body.collect().await.map(|c| c.to_bytes()).unwrap_or_default();
    let msg: Value = serde_json::from_slice(&raw).unwrap_or(Value::Null);
    log.lock().unwrap().push(Received {
        headers: parts.headers.clone(),
        raw: raw.clone(),
        body: msg.clone(),
    });
    let id = msg["id"].clone();
    let result = |r: Value| json!({"jsonrpc": "2.0", "id": id, "result": r});
    let answer = match (msg["method"].as_str(), msg["params"]["name"].as_str()) {
        (Some("server/discover"), _) => result(json!({"resultType": "complete",
            "supportedVersions": ["2026-07-28"], "capabilities": {"tools": {}},
            "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "fake-modern", "version": "1"}},
            "ttlMs": 0, "cacheScope": "private"})),
        (Some("tools/call"), Some("ask_sse")) if msg["params"]["requestState"].is_null() => {
            let ask = result(json!({"resultType": "input_required",
                "inputRequests": {"name": {"method": "elicitation/create", "params": {"message": "?"}}},
                "requestState": UPSTREAM_STATE}));
            let text = format!("event: message\ndata: {ask}\n\n");
            let mut resp = Response::new(Full::new(Bytes::from(text)).boxed());
            resp.headers_mut().insert("content-type", "text/event-stream".parse().unwrap());
            return Ok(resp);
        }
        (Some("tools/call"), Some("ask" | "ask_sse")) => match msg["params"]["requestState"].as_str() {
            None => result(json!({"resultType": "input_required",
                "inputRequests": {"name": {"method": "elicitation/create",
                    "params": {"mode": "form", "message": "name?", "requestedSchema": {"type": "object"}}}},
                "requestState": UPSTREAM_STATE})),
            Some(state) => result(json!({"resultType": "complete",
                "content": [{"type": "text", "text": format!("state back: {state}")}]})),
        },
        (Some("tools/call"), Some("stray")) => {
            // An answer to some other request: never to be delivered.
            json!({"jsonrpc": "2.0", "id": "someone-else", "result": {"resultType": "complete",
                "content": [{"type": "text", "text": "another caller's secret"}]}})
        }
        (Some("tools/call"), Some("stray_sse")) => {
            let other = json!({"jsonrpc": "2.0", "id": 424242, "result": {"resultType": "complete",
                "content": [{"type": "text", "text": "another caller's secret"}]}});
            let text = format!("event: message\ndata: {other}\n\n");
            let mut resp = Response::new(Full::new(Bytes::from(text)).boxed());
            resp.headers_mut().insert("content-type", "text/event-stream".parse().unwrap());
            return Ok(resp);
        }
        (Some("tools/call"), Some("ask_escaped")) => {
            // The member name written with an escape: still a requestState.
            let text = format!(
                r#"{{"jsonrpc":"2.0","id":{id},"result":{{"resultType":"input_required","inputRequests":{{}},"request\u0053tate":"{UPSTREAM_STATE}"}}}}"#
            );
            let mut resp = Response::new(Full::new(Bytes::from(text)).boxed());
            resp.headers_mut().insert("content-type", "application/json".parse().unwrap());
            return Ok(resp);
        }
        (Some("tools/call"), Some("fail")) => {
            // The JSON-RPC error and HTTP status the arguments name.
            let args = &msg["params"]["arguments"];
            let mut error = json!({"code": args["code"], "message": args["message"]});
            if let Some(data) = args.get("data") {
                error["data"] = data.clone();
            }
            let err = json!({"jsonrpc": "2.0", "id": id, "error": error});
            let mut resp = Response::new(Full::new(Bytes::from(err.to_string())).boxed());
            *resp.status_mut() =
                http::StatusCode::from_u16(args["status"].as_u64().unwrap_or(200) as u16).unwrap();
            resp.headers_mut().insert("content-type", "application/json".parse().unwrap());
            return Ok(resp);
        }
        (Some("tools/list"), _) => {
            result(json!({"resultType": "complete", "ttlMs": 0, "cacheScope": "private",
            "tools": [{"name": "echo", "inputSchema": {"type": "object"}},
                      {"name": "delete_user", "inputSchema": {"type": "object"}},
                      {"name": "annotated", "inputSchema": {"type": "object",
                          "properties": {"region": {"type": "string", "x-mcp-header": "Region"}}}}]}))
        }
        (Some("tools/call"), Some("stream")) => {
            let progress = json!({"jsonrpc": "2.0", "method": "notifications/progress",
                "params": {"progressToken": "p", "progress": 1}});
            let done = result(json!({"resultType": "complete", "content": []}));
            let text = format!("event: message\ndata: {progress}\n\nevent: message\ndata: {done}\n\n");
            let mut resp = Response::new(Full::new(Bytes::from(text)).boxed());
            resp.headers_mut().insert("content-type", "text/event-stream".parse().unwrap());
            return Ok(resp);
        }
        _ => {
            let err =
                json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": "Method not found"}});
            let mut resp = Response::new(Full::new(Bytes::from(err.to_string())).boxed());
            *resp.status_mut() = http::StatusCode::NOT_FOUND;
            resp.headers_mut().insert("content-type", "application/json".parse().unwrap());
            return Ok(resp);
        }
    };
    let mut resp = Response::new(Full::new(Bytes::from(answer.to_string())).boxed());
    resp.headers_mut().insert("content-type", "application/json".parse().unwrap());
    Ok(resp)
}
