//! A legacy (2025 session) client of the gateway, raw HTTP as the 2025 SDKs send it.

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use serde_json::{json, Value};

use super::{Events, Gateway, Reply};

pub const LEGACY: &str = "2025-11-25";

pub fn init_body(id: Value) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": "initialize", "params": {
        "protocolVersion": LEGACY,
        "capabilities": {"elicitation": {}, "roots": {"listChanged": true}},
        "clientInfo": {"name": "old-client", "version": "1.2.3"}}})
    .to_string()
}

/// A legacy client of the gateway: raw HTTP as the 2025 SDKs send it.
pub struct Legacy<'g> {
    /// The gateway's MCP endpoint.
    url: String,
    client: super::client::HttpClient,
    bearer: Option<String>,
    _gateway: std::marker::PhantomData<&'g Gateway>,
}

impl<'g> Legacy<'g> {
    pub fn new(gw: &'g Gateway) -> Legacy<'g> {
        Legacy::at(gw.url("/mcp"))
    }

    /// A client of the endpoint at `url` (a replica, say).
    pub fn at(url: String) -> Legacy<'g> {
        Legacy { url, client: super::client::http_client(), bearer: None, _gateway: std::marker::PhantomData }
    }

    pub fn bearer(mut self, token: &str) -> Self {
        self.bearer = Some(format!("Bearer {token}"));
        self
    }

    pub fn request(&self, method: http::Method, session: Option<&str>) -> http::request::Builder {
        let mut b = Request::builder()
            .method(method)
            .uri(&self.url)
            .header("accept", "application/json, text/event-stream")
            .header("content-type", "application/json");
        if let Some(s) = session {
            b = b.header("mcp-session-id", s).header("mcp-protocol-version", LEGACY);
        }
        if let Some(auth) = &self.bearer {
            b = b.header("authorization", auth);
        }
        b
    }

    pub async fn post(&self, session: Option<&str>, body: String) -> Reply {
        let req = self.request(http::Method::POST, session).body(Full::new(Bytes::from(body))).unwrap();
        Reply::read(super::client::send(&self.client, req).await).await
    }

    /// initialize + notifications/initialized; the gateway's session id.
    pub async fn open(&self) -> String {
        let reply = self.post(None, init_body(json!(0))).await;
        assert_eq!(reply.status, 200, "{}", reply.raw);
        assert_eq!(reply.result()["protocolVersion"], LEGACY, "{}", reply.raw);
        let session = reply.header("mcp-session-id").expect("a session id").to_string();
        let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"}).to_string();
        let ack = self.post(Some(&session), note).await;
        assert_eq!(ack.status, 202, "{}", ack.raw);
        session
    }

    /// POSTs `body` on `session` and reads the answer event by event.
    pub async fn stream(&self, session: &str, body: String) -> Events {
        let req = self.request(http::Method::POST, Some(session)).body(Full::new(Bytes::from(body))).unwrap();
        Events::of(super::client::send(&self.client, req).await)
    }

    pub async fn call(&self, session: &str, id: Value, tool: &str) -> Reply {
        let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": tool, "arguments": {}}});
        self.post(Some(session), body.to_string()).await
    }

    pub async fn verb(
        &self,
        method: http::Method,
        session: Option<&str>,
    ) -> http::Response<hyper::body::Incoming> {
        let req = self.request(method, session).body(Full::new(Bytes::new())).unwrap();
        super::client::send(&self.client, req).await
    }
}
