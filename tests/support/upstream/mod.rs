//! A fake legacy MCP upstream (2025 Streamable HTTP): a real `initialize` →
//! `Mcp-Session-Id` handshake, scripted answers per JSON-RPC method (JSON, SSE
//! with priming events, ids, server requests, broken streams), resumption with
//! `Last-Event-ID`, a standalone GET stream, DELETE; and a log of every request.
//!
//! ```ignore
//! let up = FakeUpstream::new()
//!     .on("tools/call", Answer::Sse(vec![Step::progress(0.5), Step::result(json!({}))]))
//!     .expire_sessions_after(1)
//!     .start()
//!     .await;
//! ```

mod script;
mod serve;

use std::collections::HashMap;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{HeaderMap, Method};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

pub use script::{Answer, Msg, Step};

type Handler = Arc<dyn Fn(&Value) -> Answer + Send + Sync>;

/// How long the fake waits for something the gateway should send it.
pub const WAIT: Duration = Duration::from_secs(5);

/// One HTTP request the fake received, and the status it answered with.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: Method,
    pub headers: HeaderMap,
    /// The JSON body (`Null` for GET/DELETE or a body that is not JSON).
    pub body: Value,
    pub status: u16,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
    pub fn session(&self) -> Option<&str> {
        self.header("mcp-session-id")
    }
    /// The JSON-RPC method of a POSTed request or notification.
    pub fn rpc_method(&self) -> Option<&str> {
        self.body.get("method").and_then(Value::as_str)
    }
    pub fn rpc_id(&self) -> Option<&Value> {
        self.body.get("id")
    }
    /// A POSTed JSON-RPC response (to a server-initiated request).
    pub fn is_response(&self) -> bool {
        self.method == Method::POST
            && self.body.get("method").is_none()
            && self.body.get("id").is_some()
            && (self.body.get("result").is_some() || self.body.get("error").is_some())
    }
}

/// Builds a fake upstream; [`FakeUpstream::start`] serves it on 127.0.0.1:0.
#[derive(Clone)]
pub struct FakeUpstream {
    handlers: HashMap<String, Handler>,
    resume: HashMap<String, Vec<Step>>,
    get_stream: Option<Vec<Step>>,
    expire_after: Option<usize>,
    session_ids: bool,
    capabilities: Value,
    server_info: Value,
    /// Answers `initialize` with this version whatever was asked.
    version: Option<String>,
    /// Answers `initialize` on an SSE stream (as the Python SDK does).
    sse_initialize: bool,
}

impl Default for FakeUpstream {
    fn default() -> Self {
        Self::new()
    }
}

impl FakeUpstream {
    /// Answers `tools/list` with an empty list and unknown methods with -32601.
    pub fn new() -> FakeUpstream {
        FakeUpstream {
            handlers: HashMap::new(),
            resume: HashMap::new(),
            get_stream: None,
            expire_after: None,
            session_ids: true,
            capabilities: json!({
                "tools": {"listChanged": true},
                "prompts": {"listChanged": true},
                "resources": {"subscribe": true, "listChanged": true},
                "logging": {}
            }),
            server_info: json!({"name": "fake-upstream", "version": "9.9.9"}),
            version: None,
            sse_initialize: false,
        }
    }

    /// The same answer to every `method` request.
    pub fn on(self, method: &str, answer: Answer) -> FakeUpstream {
        self.on_fn(method, move |_| answer.clone())
    }

    /// An answer computed from the request (the whole JSON-RPC message).
    pub fn on_fn(
        mut self,
        method: &str,
        f: impl Fn(&Value) -> Answer + Send + Sync + 'static,
    ) -> FakeUpstream {
        self.handlers.insert(method.into(), Arc::new(f));
        self
    }

    /// A `tools/list` in pages of one tool each, `names` in order: page `n`
    /// (from 2) is asked for with the cursor `p<n>`.
    #[allow(dead_code)]
    pub fn paged_tools(self, names: &'static [&'static str]) -> FakeUpstream {
        self.on_fn("tools/list", move |msg| {
            let at = match msg["params"]["cursor"].as_str() {
                None => 0,
                Some(c) => {
                    c.strip_prefix('p').and_then(|n| n.parse::<usize>().ok()).map_or(names.len(), |n| n - 1)
                }
            };
            let Some(name) = names.get(at) else { return Answer::Error(-32602, "bad cursor".into()) };
            let mut r = json!({"tools": [{"name": name, "inputSchema": {"type": "object"}}]});
            if at + 1 < names.len() {
                r["nextCursor"] = json!(format!("p{}", at + 2));
            }
            Answer::Result(r)
        })
    }

    /// What a GET with `Last-Event-ID` serves for a stream that answered `method`.
    pub fn on_resume(mut self, method: &str, steps: Vec<Step>) -> FakeUpstream {
        self.resume.insert(method.into(), steps);
        self
    }

    /// What the standalone GET stream (no `Last-Event-ID`) carries; without
    /// this, GET is answered 405.
    pub fn get_stream(mut self, steps: Vec<Step>) -> FakeUpstream {
        self.get_stream = Some(steps);
        self
    }

    /// Each session serves `n` requests, then forgets itself: 404 from then on.
    pub fn expire_sessions_after(mut self, n: usize) -> FakeUpstream {
        self.expire_after = Some(n);
        self
    }

    /// No `Mcp-Session-Id` at initialize, and none checked.
    pub fn without_session_ids(mut self) -> FakeUpstream {
        self.session_ids = false;
        self
    }

    /// Negotiates `version` at `initialize`, whatever the gateway asks for.
    pub fn protocol_version(mut self, version: &str) -> FakeUpstream {
        self.version = Some(version.into());
        self
    }

    /// Answers `initialize` with a priming event and the result on SSE.
    pub fn sse_initialize(mut self) -> FakeUpstream {
        self.sse_initialize = true;
        self
    }

    pub fn capabilities(mut self, caps: Value) -> FakeUpstream {
        self.capabilities = caps;
        self
    }

    /// A fake whose `tools/call` asks one question, named after the call's
    /// upstream id (so concurrent calls on one session ask distinct ones),
    /// waits for its answer, then finishes with "carried on".
    pub fn asking_each_call() -> FakeUpstream {
        FakeUpstream::new().on_fn("tools/call", |req| {
            let q = json!(format!("q-{}", req["id"]));
            Answer::Sse(vec![
                Step::ask(
                    q.clone(),
                    "elicitation/create",
                    json!({"message": "Which city?", "requestedSchema": {"type": "object", "properties": {}}}),
                ),
                Step::await_response(q),
                Step::result(json!({"content": [{"type": "text", "text": "carried on"}]})),
            ])
        })
    }

    pub async fn start(self) -> Upstream {
        self.start_at("127.0.0.1:0").await
    }

    /// Started on `addr` (an upstream instance restarted on its port).
    pub async fn start_at(self, addr: &str) -> Upstream {
        let listener = TcpListener::bind(addr).await.expect("bind fake");
        let url = format!("http://{}/mcp", listener.local_addr().unwrap());
        let shared = Arc::new(Shared {
            script: self,
            log: Mutex::new(Vec::new()),
            changed: Notify::new(),
            sessions: Mutex::new(HashMap::new()),
            next_session: AtomicUsize::new(1),
            event_origin: Mutex::new(HashMap::new()),
        });
        let task = tokio::spawn(serve::accept(listener, shared.clone()));
        Upstream { url, shared, task }
    }
}

/// A running fake upstream; stops when dropped.
pub struct Upstream {
    url: String,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Upstream {
    /// The MCP endpoint, `http://127.0.0.1:PORT/mcp`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Every request received so far, in order.
    pub fn seen(&self) -> Vec<Seen> {
        self.shared.log.lock().unwrap().clone()
    }

    /// POSTed requests/notifications with this JSON-RPC method.
    pub fn calls(&self, method: &str) -> Vec<Seen> {
        self.seen()
            .into_iter()
            .filter(|s| s.method == Method::POST && s.rpc_method() == Some(method))
            .collect()
    }

    /// POSTed JSON-RPC responses to server-initiated requests.
    pub fn responses(&self) -> Vec<Seen> {
        self.seen().into_iter().filter(Seen::is_response).collect()
    }

    /// Forgets every live session, as an upstream restart would: requests on
    /// them are answered 404 from now on.
    pub fn forget_sessions(&self) {
        self.shared.sessions.lock().unwrap().clear();
    }

    pub fn initializes(&self) -> usize {
        self.calls("initialize").len()
    }

    /// Requests with this HTTP method.
    pub fn http(&self, method: Method) -> Vec<Seen> {
        self.seen().into_iter().filter(|s| s.method == method).collect()
    }

    /// Waits (up to [`WAIT`]) for a request matching `pred`; panics with the log otherwise.
    pub async fn wait_for(&self, what: &str, pred: impl Fn(&Seen) -> bool + Sync) -> Seen {
        match self.shared.wait_for(&pred, WAIT).await {
            Some(s) => s,
            None => panic!("the fake upstream never received {what}; it saw:\n{}", self.dump()),
        }
    }

    /// The log, one line per request, for assertion messages.
    pub fn dump(&self) -> String {
        self.seen()
            .iter()
            .map(|s| format!("  {} session={:?} status={} body={}", s.method, s.session(), s.status, s.body))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

#[derive(Default)]
struct Session {
    initialized: bool,
    /// Requests served so far.
    served: usize,
}

struct Shared {
    script: FakeUpstream,
    log: Mutex<Vec<Seen>>,
    changed: Notify,
    /// Live session id → requests served on it.
    sessions: Mutex<HashMap<String, Session>>,
    next_session: AtomicUsize,
    /// SSE event id → the request whose stream carried it.
    event_origin: Mutex<HashMap<String, Value>>,
}

impl Shared {
    fn record(&self, parts: &http::request::Parts, body: &Value, status: u16) {
        self.log.lock().unwrap().push(Seen {
            method: parts.method.clone(),
            headers: parts.headers.clone(),
            body: body.clone(),
            status,
        });
        self.changed.notify_waiters();
    }

    async fn wait_for(&self, pred: &(dyn Fn(&Seen) -> bool + Sync), within: Duration) -> Option<Seen> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(s) = self.log.lock().unwrap().iter().find(|s| pred(s)) {
                return Some(s.clone());
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return None;
            }
        }
    }

    /// `Ok(())` if the session header names a live session (counting one
    /// more request when `counts`), else the status to answer.
    /// Requests before `notifications/initialized` are refused (400), like
    /// a strict legacy server.
    fn check_session(&self, headers: &HeaderMap, counts: bool) -> Result<(), u16> {
        if !self.script.session_ids {
            return Ok(());
        }
        let Some(id) = headers.get("mcp-session-id").and_then(|v| v.to_str().ok()) else {
            return Err(400);
        };
        let mut sessions = self.sessions.lock().unwrap();
        let Some(session) = sessions.get_mut(id) else {
            return Err(404);
        };
        if counts {
            if !session.initialized {
                return Err(400);
            }
            if self.script.expire_after.is_some_and(|n| session.served >= n) {
                sessions.remove(id);
                return Err(404);
            }
            session.served += 1;
        }
        Ok(())
    }

    fn mark_initialized(&self, headers: &HeaderMap) {
        let Some(id) = headers.get("mcp-session-id").and_then(|v| v.to_str().ok()) else {
            return;
        };
        if let Some(session) = self.sessions.lock().unwrap().get_mut(id) {
            session.initialized = true;
        }
    }
}

impl Shared {
    fn remember_event(&self, id: &str, request: &Value) {
        self.event_origin.lock().unwrap().insert(id.to_string(), request.clone());
    }
}
