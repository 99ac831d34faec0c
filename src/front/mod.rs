//! The front door: reads one client message, decides its generation, checks the
//! MCP headers against the body, checks `_meta`, the version and the method, and
//! yields a typed [`Call`] (or a notification to acknowledge).

pub mod generation;
pub mod headers;
pub mod legacy;
mod meta;
pub mod strict;

use http::HeaderMap;
use serde_json::{Map, Value};

use crate::error::Error;
pub use meta::{tag_subscription, LogLevel, Meta, SERVER_INFO, SUBSCRIPTION_ID};

/// The protocol revision this front door speaks, and the ones a client may
/// request (newest first), from the one table of revisions.
pub use crate::versions::{MODERN as MODERN_VERSION, SUPPORTED as SUPPORTED_VERSIONS};

/// The 2026-07-28 client requests the gateway serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    Discover,
    ToolsList,
    ToolsCall,
    PromptsList,
    PromptsGet,
    ResourcesList,
    ResourcesTemplatesList,
    ResourcesRead,
    CompletionComplete,
    SubscriptionsListen,
}

impl Method {
    pub fn parse(name: &str) -> Option<Method> {
        Some(match name {
            "server/discover" => Method::Discover,
            "tools/list" => Method::ToolsList,
            "tools/call" => Method::ToolsCall,
            "prompts/list" => Method::PromptsList,
            "prompts/get" => Method::PromptsGet,
            "resources/list" => Method::ResourcesList,
            "resources/templates/list" => Method::ResourcesTemplatesList,
            "resources/read" => Method::ResourcesRead,
            "completion/complete" => Method::CompletionComplete,
            "subscriptions/listen" => Method::SubscriptionsListen,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Method::Discover => "server/discover",
            Method::ToolsList => "tools/list",
            Method::ToolsCall => "tools/call",
            Method::PromptsList => "prompts/list",
            Method::PromptsGet => "prompts/get",
            Method::ResourcesList => "resources/list",
            Method::ResourcesTemplatesList => "resources/templates/list",
            Method::ResourcesRead => "resources/read",
            Method::CompletionComplete => "completion/complete",
            Method::SubscriptionsListen => "subscriptions/listen",
        }
    }

    /// The params key mirrored in `Mcp-Name`, if any.
    pub fn name_key(self) -> Option<&'static str> {
        match self {
            Method::ToolsCall | Method::PromptsGet => Some("name"),
            Method::ResourcesRead => Some("uri"),
            _ => None,
        }
    }

    /// List methods: their results may carry `nextCursor`.
    pub fn paginated(self) -> bool {
        matches!(
            self,
            Method::ToolsList | Method::PromptsList | Method::ResourcesList | Method::ResourcesTemplatesList
        )
    }

    /// Methods whose results may be `input_required` (MRTR).
    pub fn allows_input(self) -> bool {
        matches!(self, Method::ToolsCall | Method::PromptsGet | Method::ResourcesRead)
    }

    /// Results that must carry `ttlMs` and `cacheScope`.
    pub fn cacheable(self) -> bool {
        matches!(
            self,
            Method::Discover
                | Method::ToolsList
                | Method::PromptsList
                | Method::ResourcesList
                | Method::ResourcesTemplatesList
                | Method::ResourcesRead
        )
    }
}

/// One validated modern request.
#[derive(Debug, Clone)]
pub struct Call {
    pub id: Value,
    pub method: Method,
    /// The request params with `_meta` taken out.
    pub params: Map<String, Value>,
    pub meta: Meta,
    /// `params.name` or `params.uri`, for methods that mirror it in `Mcp-Name`.
    pub name: Option<String>,
    /// `params.requestState`, opened once by whoever needs it first.
    pub request_state: crate::sealed::Carried,
    /// Whether the caller mirrored the tool's annotated arguments in
    /// `Mcp-Param-*` headers (a 2026 client's call): they are then checked
    /// against the tool's annotations. A call the gateway wrote has none.
    pub client_headers: bool,
}

/// What the front door made of a message.
#[derive(Debug)]
pub enum Message {
    Call(Box<Call>),
    /// A notification: acknowledged with 202, nothing forwarded.
    Notification,
}

/// A rejected message: the error and the request id, when it could be read.
#[derive(Debug)]
pub struct Rejection {
    pub id: Option<Value>,
    pub error: Error,
}

fn reject(id: &Option<Value>, error: Error) -> Rejection {
    Rejection { id: id.clone(), error }
}

/// The request id of a body, when it is a string or a number: for errors
/// answered before the body is parsed (no tree is built for anything else).
pub fn request_id(body: &[u8]) -> Option<Value> {
    #[derive(serde::Deserialize)]
    struct Id<'a> {
        #[serde(borrow)]
        id: Option<&'a serde_json::value::RawValue>,
    }
    let raw = serde_json::from_slice::<Id<'_>>(body).ok()?.id?;
    match raw.get().as_bytes().first() {
        Some(b'"' | b'-' | b'0'..=b'9') => serde_json::from_str(raw.get()).ok(),
        _ => None,
    }
}

/// Parses and validates one POST body with its headers: the strict read
/// ([`strict::read_tree`]), then [`parse_read`].
pub fn parse(headers: &HeaderMap, body: &[u8]) -> Result<Message, Rejection> {
    match strict::read_tree(body) {
        Ok(read) => parse_read(headers, read),
        Err(refusal) => Err(Rejection { id: request_id(body), error: refusal.error() }),
    }
}

/// Validates a message the strict reader read with its `params` tree
/// ([`strict::read_tree`]): nothing of the body is parsed again.
pub fn parse_read(headers: &HeaderMap, read: strict::Message<'_>) -> Result<Message, Rejection> {
    let shape = read.shape;
    let Some(item) = read.items.into_iter().next().filter(|_| shape == strict::Shape::Object) else {
        let what = if shape == strict::Shape::Batch { "batching is not supported" } else { "not an object" };
        return Err(reject(&None, Error::InvalidRequest(what.into())));
    };
    let id = match item.id {
        strict::Id::Absent => None,
        strict::Id::Usable(id) => Some(id),
        strict::Id::Null | strict::Id::Other => {
            return Err(reject(&None, Error::InvalidRequest("invalid id".into())))
        }
    };
    if item.jsonrpc.as_deref() != Some("2.0") {
        return Err(reject(&id, Error::InvalidRequest("jsonrpc must be \"2.0\"".into())));
    }
    let Some(method) = item.method else {
        let what = if item.answer { "clients must not send responses" } else { "missing method" };
        return Err(reject(&id, Error::InvalidRequest(what.into())));
    };
    let params = match (item.params, item.tree) {
        (strict::Params::Absent, _) => Map::new(),
        (strict::Params::Object, Some(tree)) => tree,
        (strict::Params::Object, None) => {
            return Err(reject(&id, Error::Internal("params read without its tree".into())))
        }
        (strict::Params::Other, _) => {
            return Err(reject(&id, Error::invalid_params("params must be an object")))
        }
    };
    if id.is_none() {
        return Ok(Message::Notification);
    }
    validate(headers, id, &method, params)
}

fn validate(
    headers: &HeaderMap,
    id: Option<Value>,
    method: &str,
    mut params: Map<String, Value>,
) -> Result<Message, Rejection> {
    let meta_obj = match params.remove("_meta") {
        None => Map::new(),
        Some(Value::Object(m)) => m,
        Some(_) => return Err(reject(&id, Error::invalid_params("_meta must be an object"))),
    };
    let header_version = headers::text(headers, &headers::PROTOCOL_VERSION).map_err(|e| reject(&id, e))?;
    if header_version.is_none() && !meta_obj.contains_key(meta::PROTOCOL_VERSION) {
        // No modern marker at all: a legacy client. Tell it what we speak.
        if method == "initialize" {
            let requested = params.get("protocolVersion").and_then(Value::as_str).unwrap_or("").to_string();
            return Err(reject(&id, Error::UnsupportedVersion { requested }));
        }
        return Err(reject(&id, Error::HeaderMismatch("missing MCP-Protocol-Version header".into())));
    }
    let meta = Meta::from_object(meta_obj).map_err(|e| reject(&id, e))?;
    let Some(header_version) = header_version else {
        return Err(reject(&id, Error::HeaderMismatch("missing MCP-Protocol-Version header".into())));
    };
    if header_version != meta.protocol_version {
        return Err(reject(
            &id,
            Error::HeaderMismatch("MCP-Protocol-Version header does not match _meta".into()),
        ));
    }
    if !SUPPORTED_VERSIONS.contains(&header_version) {
        let requested = header_version.to_string();
        return Err(reject(&id, Error::UnsupportedVersion { requested }));
    }
    headers::expect_mirror(headers, &headers::METHOD, method).map_err(|e| reject(&id, e))?;
    let Some(method) = Method::parse(method) else {
        return Err(reject(&id, Error::MethodNotFound(method.to_string())));
    };
    let name = match method.name_key() {
        None => None,
        Some(key) => {
            let Some(name) = params.get(key).and_then(Value::as_str) else {
                return Err(reject(&id, Error::invalid_params(format!("missing params.{key}"))));
            };
            headers::expect_mirror(headers, &headers::NAME, name).map_err(|e| reject(&id, e))?;
            Some(name.to_string())
        }
    };
    Ok(Message::Call(Box::new(Call {
        id: id.expect("requests have ids"),
        method,
        params,
        meta,
        name,
        request_state: Default::default(),
        client_headers: true,
    })))
}

#[cfg(test)]
mod tests;
