//! What the gateway reads of a legacy (2025 session) client's message, from
//! the one strict read of its body ([`super::strict`]): enough to answer
//! errors with the right id, label metrics, count rate limits, and choose
//! `initialize`. The relay forwards the message itself untouched; the
//! translating cell reads the same read.

use serde_json::Value;

use super::strict::{Id, Item, Message, Shape};
use crate::error::Error;

/// A legacy client's message, as read.
#[derive(Debug)]
pub struct Peeked {
    /// The request id, when it is a single request with a usable id.
    pub id: Option<Value>,
    /// What kind of message it is (its metrics label: [`Kind::as_str`]).
    pub label: Kind,
    pub initialize: bool,
    /// The requests in the message (one, or each of a batch's; none in an
    /// answer or a notification), each with its tool when a `tools/call`:
    /// what rate limits count.
    pub calls: Vec<Option<String>>,
    /// The usable ids of those requests: what the upstream's answer may answer.
    pub ids: Vec<Value>,
    /// A single request's method.
    pub method: Option<String>,
    /// A single message's `params`, when the read built its tree
    /// ([`super::strict::read_tree`]): what a translated call carries on.
    pub params: Option<serde_json::Map<String, Value>>,
}

/// What a legacy client's message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A request, by its method's bounded label ([`method_label`]).
    Request(&'static str),
    Notification,
    /// An answer to a request the server sent.
    Response,
    Batch,
}

impl Kind {
    /// The metrics label: the method of a request, else the kind.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Request(method) => method,
            Kind::Notification => "notification",
            Kind::Response => "response",
            Kind::Batch => "batch",
        }
    }
}

impl Peeked {
    pub fn of(msg: &Message<'_>) -> Result<Peeked, Error> {
        let item = match msg.shape {
            Shape::Batch => {
                let requests = || msg.items.iter().filter(|i| i.is_request());
                let calls = requests().map(tool_of).collect();
                let ids = requests().filter_map(usable_id).collect();
                let (method, params) = (None, None);
                return Ok(Peeked {
                    id: None,
                    label: Kind::Batch,
                    initialize: false,
                    calls,
                    ids,
                    method,
                    params,
                });
            }
            Shape::Other => return Err(Error::InvalidRequest("not a JSON-RPC message".into())),
            Shape::Object => &msg.items[0],
        };
        let id = usable_id(item);
        if item.has_method && item.method.is_none() {
            return Err(Error::InvalidRequest("method must be a string".into()));
        }
        if item.jsonrpc.as_deref() != Some("2.0") {
            return Err(Error::InvalidRequest("jsonrpc must be \"2.0\"".into()));
        }
        let has_id = item.id != Id::Absent;
        let label = match (item.method.as_deref(), has_id, item.answer) {
            (Some(m), true, false) => Kind::Request(method_label(m)),
            (Some(_), false, false) => Kind::Notification,
            (None, true, true) => Kind::Response,
            _ => return Err(Error::InvalidRequest("not a request, notification or response".into())),
        };
        let calls = if item.is_request() { vec![tool_of(item)] } else { Vec::new() };
        let id = id.filter(|_| label != Kind::Response);
        let ids = id.iter().cloned().collect();
        let method = item.method.as_deref().filter(|_| item.is_request()).map(str::to_string);
        Ok(Peeked {
            initialize: label == Kind::Request("initialize"),
            id,
            label,
            calls,
            ids,
            method,
            params: None,
        })
    }

    /// [`Peeked::of`], keeping the `params` tree of a single message.
    pub fn read(msg: Message<'_>) -> Result<Peeked, Error> {
        let mut peek = Peeked::of(&msg)?;
        if msg.shape == Shape::Object {
            peek.params = msg.items.into_iter().next().and_then(|item| item.tree);
        }
        Ok(peek)
    }
}

fn usable_id(item: &Item<'_>) -> Option<Value> {
    match &item.id {
        Id::Usable(id) => Some(id.clone()),
        _ => None,
    }
}

/// The tool a `tools/call` names (`params.name`); `None` for other methods.
fn tool_of(item: &Item<'_>) -> Option<String> {
    match item.method.as_deref() {
        Some("tools/call") => item.name.as_deref().map(str::to_string),
        _ => None,
    }
}

/// Legacy request methods, as a bounded label.
pub fn method_label(method: &str) -> &'static str {
    const KNOWN: &[&str] = &[
        "initialize",
        "ping",
        "tools/list",
        "tools/call",
        "prompts/list",
        "prompts/get",
        "resources/list",
        "resources/templates/list",
        "resources/read",
        "resources/subscribe",
        "resources/unsubscribe",
        "completion/complete",
        "logging/setLevel",
        "tasks/get",
        "tasks/result",
        "tasks/list",
        "tasks/cancel",
    ];
    KNOWN.iter().find(|k| **k == method).copied().unwrap_or("other")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::front::strict;

    fn peek(body: &str) -> Result<Peeked, Error> {
        Peeked::of(&strict::read(body.as_bytes()).expect(body))
    }

    #[test]
    fn messages_are_classified_from_the_strict_read() {
        let ok = |body: &str| peek(body).unwrap();
        let p = ok(r#"{"jsonrpc":"2.0","id":"a","method":"initialize","params":{}}"#);
        assert_eq!(
            (p.label.as_str(), p.initialize, p.id),
            ("initialize", true, Some(serde_json::json!("a")))
        );
        assert_eq!(ok(r#"{"jsonrpc":"2.0","id":1,"method":"x/y"}"#).label, Kind::Request("other"));
        assert_eq!(ok(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#).label, Kind::Notification);
        let r = ok(r#"{"jsonrpc":"2.0","id":7,"result":{}}"#);
        assert_eq!((r.label, r.id), (Kind::Response, None), "a response's id is the server's");
        assert_eq!(ok(r#" [{"jsonrpc":"2.0","method":"a"}]"#).label, Kind::Batch);
        assert_eq!(Kind::Response.as_str(), "response");
        assert_eq!(Kind::Notification.as_str(), "notification");
        assert_eq!(
            ok(r#"{"jsonrpc":"2.0","id":{"x":1},"method":"ping"}"#).id,
            None,
            "odd ids are not echoed"
        );
        let err = |body: &str| peek(body).unwrap_err().reason();
        assert_eq!(err("42"), "invalid_request", "JSON, but not a JSON-RPC message");
        assert_eq!(err(r#"{"jsonrpc":"1.0","id":1,"method":"a"}"#), "invalid_request");
        assert_eq!(err(r#"{"jsonrpc":"2.0","id":1,"method":5}"#), "invalid_request");
        assert_eq!(err(r#"{"jsonrpc":"2.0","id":1}"#), "invalid_request");
    }

    #[test]
    fn rate_limits_count_every_request_and_see_the_tool_the_upstream_will() {
        let calls = |body: &str| peek(body).unwrap().calls;
        let tool = |name: &str| Some(name.to_string());
        assert_eq!(
            calls(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a"}}"#),
            [tool("a")]
        );
        assert_eq!(calls(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"name":"a"}}"#), [None]);
        assert_eq!(
            calls(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"n\u0061me":"b"}}"#),
            [tool("b")],
            "escapes read as the upstream reads them"
        );
        assert!(calls(r#"{"jsonrpc":"2.0","method":"notifications/cancelled"}"#).is_empty());
        assert!(calls(r#"{"jsonrpc":"2.0","id":7,"result":{}}"#).is_empty(), "answers are not counted");
        let batch = r#"[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a"}},
            {"jsonrpc":"2.0","method":"notifications/x"}, 5,
            {"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"b"}},
            {"jsonrpc":"2.0","id":3,"method":"ping"}]"#;
        assert_eq!(calls(batch), [tool("a"), tool("b"), None], "each request of a batch");
    }
}
