//! The legacy-session half over a channel that is not HTTP: an in-memory
//! server that links its messages to the one sent, as a stdio transport
//! will. Pooling, the handshake, a request answered after a server request
//! of its own, and the session's end see only [`Channel`].

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

use super::call::simple_request;
use super::pool::Pool;
use super::session::PoolKey;
use crate::config::{Config, Upstream};
use crate::metrics::Metrics;
use crate::upstream::channel::{
    Answer, Channel, Messages, Pending, SendError, Sent, SessionWire, Stateless, StreamEnd,
};
use crate::upstream::health::Health;

/// Messages queued for one reader.
struct Queue(VecDeque<Value>);

impl Messages for Queue {
    fn next(&mut self) -> Pending<'_, Result<Value, StreamEnd>> {
        let next = self.0.pop_front().ok_or(StreamEnd::Closed);
        Box::pin(async move { next })
    }

    fn resume_point(&self) -> Option<&str> {
        None
    }
}

/// A legacy server in memory: what it was sent, per session, and the
/// sessions it ended. Clones are handles to the same server.
#[derive(Clone)]
struct Memory(Arc<Server>);

struct Server {
    upstream: Upstream,
    health: Health,
    sent: Mutex<Vec<(Option<String>, Value)>>,
    closed: Mutex<Vec<String>>,
}

impl Memory {
    fn new(upstream: Upstream, metrics: &Metrics) -> Memory {
        let health = Health::new(metrics, "/mcp", "memory", "memory:1");
        Memory(Arc::new(Server { upstream, health, sent: Mutex::default(), closed: Mutex::default() }))
    }

    /// What the server sends back for `msg`, linked to it: for `tools/list`,
    /// a `ping` of its own first, then the response.
    fn serve(msg: &Value) -> Vec<Value> {
        let id = msg.get("id").cloned();
        match (msg.get("method").and_then(Value::as_str), id) {
            (Some("initialize"), Some(id)) => vec![json!({"jsonrpc": "2.0", "id": id, "result": {
                "protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
                "serverInfo": {"name": "memory", "version": "1"}}})],
            (Some("tools/list"), Some(id)) => vec![
                json!({"jsonrpc": "2.0", "id": "srv-1", "method": "ping"}),
                json!({"jsonrpc": "2.0", "id": id, "result": {"tools": [{"name": "echo", "inputSchema": {}}]}}),
            ],
            _ => Vec::new(),
        }
    }
}

impl Channel for Memory {
    fn send<'a>(
        &'a self,
        session: &'a SessionWire,
        message: &'a [u8],
    ) -> Pending<'a, Result<Sent, SendError>> {
        Box::pin(async move {
            let msg: Value = serde_json::from_slice(message).map_err(|_| SendError::Invalid("json"))?;
            self.0.sent.lock().unwrap().push((session.id.clone(), msg.clone()));
            let opened = (msg["method"] == "initialize").then(|| "mem-1".to_string());
            let out = Memory::serve(&msg);
            let answer =
                if out.is_empty() { Answer::Accepted } else { Answer::Stream(Box::new(Queue(out.into()))) };
            Ok(Sent { answer, session: opened })
        })
    }

    fn send_stateless<'a>(&'a self, _: &'a Stateless<'a>) -> Pending<'a, Result<Sent, SendError>> {
        Box::pin(async { Err(SendError::Invalid("a legacy server")) })
    }

    fn messages<'a>(
        &'a self,
        _: &'a SessionWire,
        _: Option<&'a str>,
    ) -> Pending<'a, Result<Box<dyn Messages>, SendError>> {
        Box::pin(async { Ok(Box::new(Queue(VecDeque::new())) as Box<dyn Messages>) })
    }

    fn close<'a>(&'a self, session: &'a SessionWire) -> Pending<'a, ()> {
        self.0.closed.lock().unwrap().extend(session.id.clone());
        Box::pin(async {})
    }

    fn distrust(&self) {}

    fn instance(&self) -> &str {
        "memory:1"
    }

    fn identity(&self) -> *const () {
        Arc::as_ptr(&self.0).cast()
    }

    fn handle(&self) -> Arc<dyn Channel> {
        Arc::new(self.clone())
    }

    fn health(&self) -> &Health {
        &self.0.health
    }

    fn upstream(&self) -> &Upstream {
        &self.0.upstream
    }
}

#[tokio::test]
async fn a_pooled_session_runs_over_a_channel_that_is_not_http() {
    let config = Config::single("http://127.0.0.1:9/mcp", "127.0.0.1:0".parse().unwrap()).unwrap();
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = Metrics::register(&mut registry);
    let channel = Memory::new(config.routes[0].upstream.clone(), &metrics);
    let pool = Pool::new(4, 4, Duration::from_secs(60), metrics);
    let key = PoolKey {
        route: "/mcp".into(),
        instance: channel.instance().into(),
        principal: "anonymous".into(),
        capabilities: "{}".into(),
        version: "2026-07-28".into(),
    };

    let session = pool.acquire(&channel, key.as_ref()).await.expect("opened over the channel");
    assert_eq!(session.wire.id.as_deref(), Some("mem-1"), "the session the channel named");
    assert_eq!(session.wire.version.as_deref(), Some("2025-06-18"));
    assert_eq!(session.init["serverInfo"]["name"], "memory");
    let again = pool.acquire(&channel, key.as_ref()).await.unwrap();
    assert!(Arc::ptr_eq(&session, &again), "the same channel's session is pooled");
    let other =
        pool.acquire(&channel, PoolKey { principal: "p2".into(), ..key.clone() }.as_ref()).await.unwrap();
    assert!(!Arc::ptr_eq(&session, &other), "another key, another session");
    assert!(Arc::ptr_eq(&session.init, &other.init), "one initialize result kept for both");

    let tools = simple_request(&session, "tools/list", json!({}), Duration::from_secs(5)).await.unwrap();
    assert_eq!(tools["tools"][0]["name"], "echo");

    let sent = channel.0.sent.lock().unwrap().clone();
    let methods: Vec<(Option<&str>, &str)> = sent
        .iter()
        .map(|(s, m)| (s.as_deref(), m.get("method").and_then(Value::as_str).unwrap_or("(response)")))
        .collect();
    assert_eq!(
        methods,
        [
            (None, "initialize"),
            (Some("mem-1"), "notifications/initialized"),
            (None, "initialize"),
            (Some("mem-1"), "notifications/initialized"),
            (Some("mem-1"), "tools/list"),
            (Some("mem-1"), "(response)"),
        ]
    );
    assert_eq!(sent[5].1["id"], "srv-1", "the server's ping answered on its session");
    assert!(sent[5].1.get("result").is_some());

    drop((session, again, other));
    pool.close_all().await;
    assert_eq!(
        *channel.0.closed.lock().unwrap(),
        ["mem-1", "mem-1"],
        "the sessions ended through the channel"
    );
}
