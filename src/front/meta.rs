//! The per-request `_meta` of a 2026-07-28 request.

use serde_json::{Map, Value};

use crate::error::Error;

pub const PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
pub const CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
pub const CLIENT_INFO: &str = "io.modelcontextprotocol/clientInfo";
pub const LOG_LEVEL: &str = "io.modelcontextprotocol/logLevel";
pub const PROGRESS_TOKEN: &str = "progressToken";
/// A result's `_meta` key for the server that answered it.
pub const SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";
/// A listen stream's `_meta` key naming its subscription.
pub const SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";

/// Tags `msg` (a notification) with the subscription `id` in its
/// `params._meta`; `false` when `msg`, its params or its `_meta` is not an object.
pub fn tag_subscription(msg: &mut Value, id: &Value) -> bool {
    let Some(obj) = msg.as_object_mut() else { return false };
    let params = obj.entry("params").or_insert_with(|| Value::Object(Map::new()));
    let Some(params) = params.as_object_mut() else { return false };
    let meta = params.entry("_meta").or_insert_with(|| Value::Object(Map::new()));
    let Some(meta) = meta.as_object_mut() else { return false };
    meta.insert(SUBSCRIPTION_ID.into(), id.clone());
    true
}
const RESERVED_PREFIX: &str = "io.modelcontextprotocol/";

/// RFC 5424 severities, ordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    Debug,
    Info,
    Notice,
    Warning,
    Error,
    Critical,
    Alert,
    Emergency,
}

impl LogLevel {
    pub fn parse(s: &str) -> Option<LogLevel> {
        Some(match s {
            "debug" => LogLevel::Debug,
            "info" => LogLevel::Info,
            "notice" => LogLevel::Notice,
            "warning" => LogLevel::Warning,
            "error" => LogLevel::Error,
            "critical" => LogLevel::Critical,
            "alert" => LogLevel::Alert,
            "emergency" => LogLevel::Emergency,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Debug => "debug",
            LogLevel::Info => "info",
            LogLevel::Notice => "notice",
            LogLevel::Warning => "warning",
            LogLevel::Error => "error",
            LogLevel::Critical => "critical",
            LogLevel::Alert => "alert",
            LogLevel::Emergency => "emergency",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Meta {
    pub protocol_version: String,
    /// The declared `ClientCapabilities` object.
    pub capabilities: Map<String, Value>,
    pub client_info: Option<Value>,
    pub progress_token: Option<Value>,
    pub log_level: Option<LogLevel>,
    /// Other `_meta` keys (e.g. `traceparent`), forwarded upstream as they are.
    pub passthrough: Map<String, Value>,
}

impl Meta {
    /// Reads `_meta`; missing protocol version or capabilities → -32602.
    pub fn from_object(mut m: Map<String, Value>) -> Result<Meta, Error> {
        let protocol_version = match m.remove(PROTOCOL_VERSION) {
            Some(Value::String(v)) => v,
            Some(_) => return Err(Error::invalid_params("_meta protocolVersion must be a string")),
            None => return Err(Error::invalid_params(format!("missing _meta key {PROTOCOL_VERSION}"))),
        };
        let capabilities = match m.remove(CLIENT_CAPABILITIES) {
            Some(Value::Object(c)) => c,
            Some(_) => return Err(Error::invalid_params("_meta clientCapabilities must be an object")),
            None => return Err(Error::invalid_params(format!("missing _meta key {CLIENT_CAPABILITIES}"))),
        };
        let client_info = m.remove(CLIENT_INFO);
        let log_level = match m.remove(LOG_LEVEL) {
            None => None,
            Some(Value::String(s)) => {
                Some(LogLevel::parse(&s).ok_or_else(|| Error::invalid_params("invalid logLevel"))?)
            }
            Some(_) => return Err(Error::invalid_params("invalid logLevel")),
        };
        let progress_token = match m.remove(PROGRESS_TOKEN) {
            None => None,
            Some(t @ (Value::String(_) | Value::Number(_))) => Some(t),
            Some(_) => return Err(Error::invalid_params("progressToken must be a string or integer")),
        };
        m.retain(|k, _| !k.starts_with(RESERVED_PREFIX));
        Ok(Meta { protocol_version, capabilities, client_info, progress_token, log_level, passthrough: m })
    }

    /// The `_meta` object this was read from (reserved keys the gateway
    /// does not know are not kept).
    pub fn into_object(self) -> Map<String, Value> {
        let mut m = self.passthrough;
        m.insert(PROTOCOL_VERSION.into(), Value::String(self.protocol_version));
        m.insert(CLIENT_CAPABILITIES.into(), Value::Object(self.capabilities));
        if let Some(info) = self.client_info {
            m.insert(CLIENT_INFO.into(), info);
        }
        if let Some(level) = self.log_level {
            m.insert(LOG_LEVEL.into(), Value::from(level.as_str()));
        }
        if let Some(token) = self.progress_token {
            m.insert(PROGRESS_TOKEN.into(), token);
        }
        m
    }

    pub fn declares(&self, capability: &str) -> bool {
        self.capabilities.get(capability).is_some_and(|v| !v.is_null())
    }
}
