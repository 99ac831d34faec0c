//! A 2026-07-28 client for the tests: builds modern requests (headers and
//! `_meta` as the spec wants them) and reads JSON or SSE answers.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Map, Value};

pub const VERSION: &str = "2026-07-28";
/// How long a test waits for the gateway before failing.
pub const PATIENCE: Duration = Duration::from_secs(10);

pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

pub fn http_client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// Sends `req`, failing the test if the gateway does not answer in time.
pub async fn send(client: &HttpClient, req: Request<Full<Bytes>>) -> Response<Incoming> {
    tokio::time::timeout(PATIENCE, client.request(req))
        .await
        .expect("the gateway answers in time")
        .expect("the gateway answers")
}

/// One modern request, built up then sent.
pub struct ModernRequest {
    client: HttpClient,
    url: String,
    id: Value,
    method: String,
    params: Map<String, Value>,
    meta: Map<String, Value>,
    headers: Vec<(HeaderName, HeaderValue)>,
}

impl ModernRequest {
    pub(crate) fn new(client: HttpClient, url: String, method: &str) -> ModernRequest {
        let mut meta = Map::new();
        meta.insert("io.modelcontextprotocol/protocolVersion".into(), json!(VERSION));
        meta.insert("io.modelcontextprotocol/clientCapabilities".into(), json!({}));
        ModernRequest {
            client,
            url,
            id: json!(1),
            method: method.into(),
            params: Map::new(),
            meta,
            headers: Vec::new(),
        }
    }

    pub fn id(mut self, id: Value) -> Self {
        self.id = id;
        self
    }

    /// The params (without `_meta`, which the builder adds).
    pub fn params(mut self, params: Value) -> Self {
        let Value::Object(p) = params else {
            panic!("params must be an object");
        };
        self.params = p;
        self
    }

    pub fn meta(mut self, key: &str, value: Value) -> Self {
        self.meta.insert(key.into(), value);
        self
    }

    /// The declared `clientCapabilities` (default `{}`).
    pub fn capabilities(self, caps: Value) -> Self {
        self.meta("io.modelcontextprotocol/clientCapabilities", caps)
    }

    pub fn progress_token(self, token: Value) -> Self {
        self.meta("progressToken", token)
    }

    pub fn log_level(self, level: &str) -> Self {
        self.meta("io.modelcontextprotocol/logLevel", json!(level))
    }

    /// Adds a header, replacing the builder's default of that name.
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers
            .push((HeaderName::from_bytes(name.as_bytes()).unwrap(), HeaderValue::from_str(value).unwrap()));
        self
    }

    pub fn bearer(self, token: &str) -> Self {
        self.header("authorization", &format!("Bearer {token}"))
    }

    /// The JSON-RPC message this request sends.
    pub fn body(&self) -> Value {
        let mut params = self.params.clone();
        params.insert("_meta".into(), Value::Object(self.meta.clone()));
        json!({"jsonrpc": "2.0", "id": self.id, "method": self.method, "params": params})
    }

    /// Every header this request sends, in order.
    pub fn headers(&self) -> Vec<(String, String)> {
        let mut h: Vec<(String, String)> = [
            ("content-type", "application/json"),
            ("accept", "application/json, text/event-stream"),
            ("mcp-protocol-version", VERSION),
            ("mcp-method", self.method.as_str()),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let name_key = match self.method.as_str() {
            "tools/call" | "prompts/get" => Some("name"),
            "resources/read" => Some("uri"),
            _ => None,
        };
        if let Some(name) = name_key.and_then(|k| self.params.get(k)).and_then(Value::as_str) {
            h.push(("mcp-name".into(), name.into()));
        }
        // A header set by hand replaces the default of the same name.
        h.retain(|(k, _)| !self.headers.iter().any(|(name, _)| name.as_str() == k));
        for (k, v) in &self.headers {
            h.push((k.to_string(), v.to_str().unwrap().to_string()));
        }
        h
    }

    fn request(&self) -> Request<Full<Bytes>> {
        let mut b = Request::post(&self.url);
        for (k, v) in self.headers() {
            b = b.header(k, v);
        }
        b.body(Full::new(Bytes::from(self.body().to_string()))).unwrap()
    }

    /// Sends the request and reads the whole answer.
    pub async fn send(self) -> Reply {
        let resp = send(&self.client, self.request()).await;
        Reply::read(resp).await
    }

    /// Sends the request and returns the answer as a stream being read.
    pub async fn open(self) -> Events {
        let resp = send(&self.client, self.request()).await;
        Events::of(resp)
    }
}

/// A complete answer from the gateway.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    /// The final JSON-RPC message (the JSON body, or the last SSE message);
    /// `Null` when there is none.
    pub body: Value,
    /// SSE messages that came before the final one.
    pub notes: Vec<Value>,
    pub raw: String,
}

impl Reply {
    pub async fn read(resp: Response<Incoming>) -> Reply {
        let status = resp.status();
        let headers = resp.headers().clone();
        let bytes = tokio::time::timeout(PATIENCE, resp.into_body().collect())
            .await
            .expect("the gateway finishes its answer in time")
            .expect("the answer body reads")
            .to_bytes();
        let raw = String::from_utf8_lossy(&bytes).into_owned();
        let (body, notes) = if content_type(&headers).starts_with("text/event-stream") {
            let mut messages = sse_messages(&raw);
            let last = messages.pop().unwrap_or(Value::Null);
            (last, messages)
        } else {
            (serde_json::from_str(&raw).unwrap_or(Value::Null), Vec::new())
        };
        Reply { status, headers, body, notes, raw }
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub fn is_sse(&self) -> bool {
        content_type(&self.headers).starts_with("text/event-stream")
    }

    pub fn result(&self) -> &Value {
        assert!(self.body.get("result").is_some(), "expected a result, got {} {}", self.status, self.raw);
        &self.body["result"]
    }

    pub fn error_code(&self) -> Option<i64> {
        self.body.pointer("/error/code").and_then(Value::as_i64)
    }

    pub fn reason(&self) -> Option<&str> {
        self.body.pointer("/error/data/reason").and_then(Value::as_str)
    }

    /// Asserts the HTTP status, JSON-RPC error code and echoed id.
    pub fn assert_error(&self, status: u16, code: i64, id: &Value) {
        assert_eq!(self.status.as_u16(), status, "status; body: {}", self.raw);
        assert_eq!(self.error_code(), Some(code), "code; body: {}", self.raw);
        assert_eq!(&self.body["id"], id, "echoed id; body: {}", self.raw);
        assert_eq!(self.body["jsonrpc"], "2.0", "body: {}", self.raw);
    }
}

fn content_type(headers: &HeaderMap) -> &str {
    headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("")
}

/// The JSON messages in a complete SSE text (comments and empty data skipped).
pub fn sse_messages(text: &str) -> Vec<Value> {
    text.replace("\r\n", "\n")
        .split("\n\n")
        .filter_map(event_data)
        .map(|data| serde_json::from_str(&data).expect("SSE data is JSON"))
        .collect()
}

fn event_data(event: &str) -> Option<String> {
    let data: Vec<&str> = event
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(|d| d.strip_prefix(' ').unwrap_or(d))
        .collect();
    let data = data.join("\n");
    (!data.trim().is_empty()).then_some(data)
}

/// An answer read event by event (for long-lived or abandoned streams).
pub struct Events {
    pub status: StatusCode,
    pub headers: HeaderMap,
    body: Incoming,
    buf: String,
}

impl Events {
    pub fn of(resp: Response<Incoming>) -> Events {
        Events {
            status: resp.status(),
            headers: resp.headers().clone(),
            body: resp.into_body(),
            buf: String::new(),
        }
    }

    /// The next JSON message, waiting up to [`PATIENCE`]; `None` at the end.
    pub async fn next(&mut self) -> Option<Value> {
        self.next_within(PATIENCE).await.expect("the next event arrives in time")
    }

    /// `Err(())` if nothing arrived within `wait`; `Ok(None)` at the end.
    pub async fn next_within(&mut self, wait: Duration) -> Result<Option<Value>, ()> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let text = self.buf.replace("\r\n", "\n");
            if let Some(end) = text.find("\n\n") {
                self.buf = text[end + 2..].to_string();
                match event_data(&text[..end]) {
                    Some(data) => return Ok(Some(serde_json::from_str(&data).unwrap())),
                    None => continue,
                }
            }
            let frame = match tokio::time::timeout_at(deadline, self.body.frame()).await {
                Err(_) => return Err(()),
                Ok(None) | Ok(Some(Err(_))) => return Ok(None),
                Ok(Some(Ok(f))) => f,
            };
            if let Ok(data) = frame.into_data() {
                self.buf.push_str(&String::from_utf8_lossy(&data));
            }
        }
    }
}
