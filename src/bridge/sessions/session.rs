//! One legacy upstream session: the `initialize` handshake, its negotiated
//! version and `InitializeResult`, and the ids the gateway mints on it.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use serde_json::{json, Map, Value};

use crate::config::LEGACY_VERSIONS;
use crate::upstream::channel::{self, Answer, Channel, SendError, SessionWire};

/// What a session was opened with: legacy capabilities are fixed per session,
/// so a modern request's declared capabilities pick its session.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PoolKey {
    pub route: String,
    /// The upstream instance (its URL) the session lives on.
    pub instance: String,
    /// Digest of the bearer token, or "anonymous".
    pub principal: String,
    /// Canonical JSON of the legacy capabilities sent at `initialize`.
    pub capabilities: String,
    /// The modern protocol version of the requests this session serves.
    pub version: String,
}

impl PoolKey {
    /// This key, borrowed.
    pub fn as_ref(&self) -> KeyRef<'_> {
        KeyRef {
            route: &self.route,
            instance: &self.instance,
            principal: &self.principal,
            capabilities: &self.capabilities,
            version: &self.version,
        }
    }
}

/// A pool key borrowed from the call it is looked up for: nothing is copied
/// unless a session is opened under it. Hashes as the [`PoolKey`] it equals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyRef<'a> {
    pub route: &'a str,
    pub instance: &'a str,
    pub principal: &'a str,
    pub capabilities: &'a str,
    pub version: &'a str,
}

impl KeyRef<'_> {
    pub fn to_owned(self) -> PoolKey {
        PoolKey {
            route: self.route.to_string(),
            instance: self.instance.to_string(),
            principal: self.principal.to_string(),
            capabilities: self.capabilities.to_string(),
            version: self.version.to_string(),
        }
    }
}

impl hashbrown::Equivalent<PoolKey> for KeyRef<'_> {
    fn equivalent(&self, key: &PoolKey) -> bool {
        *self == key.as_ref()
    }
}

pub struct Session {
    pub key: PoolKey,
    /// What carries the session's messages.
    pub channel: Arc<dyn Channel>,
    pub wire: SessionWire,
    /// The upstream's `InitializeResult`.
    pub init: Arc<Value>,
    /// `init.serverInfo` as JSON text, added to every result.
    pub server_info: Option<String>,
    /// Milliseconds since the pool's epoch when last handed out.
    pub last_used: AtomicU64,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session").field("key", &self.key).finish_non_exhaustive()
    }
}

/// Why a session could not be opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InitError {
    Post(SendError),
    /// The upstream answered `initialize` with a JSON-RPC error or nonsense.
    Refused(&'static str),
}

impl Session {
    /// A fresh JSON-RPC id for a request the gateway sends on this session:
    /// random, so that no answer can be aimed at the next one.
    pub fn mint_id(&self) -> u64 {
        crate::upstream::answers::mint_id()
    }

    /// A session opened by someone else (another replica), known from a sealed
    /// `requestState`: used to deliver answers and resume its stream.
    pub fn adopt(channel: &dyn Channel, key: PoolKey, wire: SessionWire, init: Arc<Value>) -> Session {
        Session {
            key,
            channel: channel.handle(),
            wire,
            server_info: server_info(&init),
            init,
            last_used: AtomicU64::new(0),
        }
    }

    /// Runs the legacy handshake: `initialize`, then `notifications/initialized`.
    pub async fn open(channel: &dyn Channel, key: PoolKey, now_ms: u64) -> Result<Session, InitError> {
        let capabilities: Value = serde_json::from_str(&key.capabilities).unwrap_or_else(|_| json!({}));
        let request = json!({
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {
                "protocolVersion": channel.upstream().protocol_version,
                "capabilities": capabilities,
                "clientInfo": {"name": "sessionless", "version": env!("CARGO_PKG_VERSION")},
            }
        });
        // Named for its principal: a channel whose sessions cost a process each counts them per caller.
        let opening = SessionWire { owner: Some(key.principal.as_str().into()), ..SessionWire::default() };
        let sent = channel::post(channel, &opening, &request).await.map_err(InitError::Post)?;
        let session_id = sent.session;
        let response = match sent.answer {
            Answer::Json(v) => v,
            Answer::Result { id, result } => channel::result_message(id, &result),
            Answer::Stream(mut s) => loop {
                match s.next().await {
                    Ok(v) if v.get("id") == Some(&json!(0)) => break v,
                    Ok(_) => continue,
                    Err(_) => return Err(InitError::Refused("stream ended")),
                }
            },
            Answer::Accepted => return Err(InitError::Refused("202 to initialize")),
        };
        if response.get("result").is_some() && response.get("id") != Some(&json!(0)) {
            channel.distrust();
            return Err(InitError::Refused("an answer to another request"));
        }
        let Some(result) = response.get("result").filter(|r| r.is_object()) else {
            return Err(InitError::Refused("initialize failed"));
        };
        let version = result
            .get("protocolVersion")
            .and_then(Value::as_str)
            .filter(|v| LEGACY_VERSIONS.contains(v))
            .ok_or(InitError::Refused("unsupported protocol version"))?
            .to_string();
        let wire = SessionWire { id: session_id, version: Some(version), owner: None };
        let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        match channel::post(channel, &wire, &initialized).await {
            Ok(_) => {}
            Err(e) => return Err(InitError::Post(e)),
        }
        Ok(Session {
            key,
            channel: channel.handle(),
            wire,
            server_info: server_info(result),
            init: Arc::new(result.clone()),
            last_used: AtomicU64::new(now_ms),
        })
    }
}

fn server_info(init: &Value) -> Option<String> {
    init.get("serverInfo").map(Value::to_string)
}

/// The legacy capabilities to declare for a modern request's capabilities,
/// reduced to what matters: which capabilities and which known
/// sub-capabilities are declared, each as `{}`. `roots` never has
/// `listChanged` (the gateway cannot send that notification). Canonical JSON,
/// drawn from a small fixed set whatever the client sends, because it keys
/// the session pool and the discover cache.
pub fn legacy_capabilities(modern: &Map<String, Value>) -> String {
    CapabilitiesText::of(modern).as_str().to_string()
}

/// [`legacy_capabilities`] written on the stack: part of the pool key
/// every call is looked up by.
pub struct CapabilitiesText {
    buf: [u8; CAPABILITIES_TEXT],
    len: usize,
}

/// The longest text [`CapabilitiesText`] writes (every known capability and
/// sub-capability) fits.
const CAPABILITIES_TEXT: usize = 128;

impl CapabilitiesText {
    pub fn of(modern: &Map<String, Value>) -> CapabilitiesText {
        // The names below are sorted and need no escaping, so this is the
        // compact JSON serde_json would write for the same object (its Map
        // is ordered by key).
        let mut out = CapabilitiesText { buf: [0; CAPABILITIES_TEXT], len: 0 };
        out.push("{");
        for (name, known) in KNOWN_SUB_CAPABILITIES {
            let Some(Value::Object(declared)) = modern.get(*name) else { continue };
            if out.len > 1 {
                out.push(",");
            }
            for part in ["\"", name, "\":{"] {
                out.push(part);
            }
            for (i, sub) in known.iter().filter(|k| declared.contains_key(**k)).enumerate() {
                for part in [if i == 0 { "\"" } else { ",\"" }, sub, "\":{}"] {
                    out.push(part);
                }
            }
            out.push("}");
        }
        out.push("}");
        out
    }

    fn push(&mut self, part: &str) {
        self.buf[self.len..self.len + part.len()].copy_from_slice(part.as_bytes());
        self.len += part.len();
    }

    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.buf[..self.len]).expect("written from str parts")
    }
}

/// The capabilities passed on to legacy upstreams, with the sub-capabilities
/// the 2025-11-25 schema defines for each.
/// Sorted by name, and each list too ([`legacy_capabilities`] relies on it).
const KNOWN_SUB_CAPABILITIES: &[(&str, &[&str])] =
    &[("elicitation", &["form", "url"]), ("roots", &[]), ("sampling", &["context", "tools"])];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_capability_declared_fits_the_key_text() {
        let all: Map<String, Value> = serde_json::from_value(json!({
            "elicitation": {"form": {}, "url": {}}, "roots": {"listChanged": true},
            "sampling": {"context": {}, "tools": {}}}))
        .unwrap();
        let text = legacy_capabilities(&all);
        assert_eq!(
            text,
            r#"{"elicitation":{"form":{},"url":{}},"roots":{},"sampling":{"context":{},"tools":{}}}"#
        );
        assert!(text.len() <= CAPABILITIES_TEXT);
    }

    #[test]
    fn a_borrowed_key_finds_its_owned_key() {
        let key = PoolKey {
            route: "/mcp".into(),
            instance: "http://u".into(),
            principal: "p".into(),
            capabilities: "{}".into(),
            version: "2026-07-28".into(),
        };
        let mut map = hashbrown::HashMap::new();
        map.insert(key.clone(), 1);
        assert_eq!(map.get(&key.as_ref()), Some(&1));
        assert_eq!(map.get(&KeyRef { principal: "q", ..key.as_ref() }), None);
        assert_eq!(key.as_ref().to_owned(), key);
    }

    #[test]
    fn capabilities_are_canonical_and_drop_list_changed() {
        let a: Map<String, Value> = serde_json::from_value(
            json!({"sampling": {}, "roots": {"listChanged": true}, "elicitation": {"form": {}}}),
        )
        .unwrap();
        let b: Map<String, Value> = serde_json::from_value(
            json!({"roots": {}, "elicitation": {"form": {}}, "sampling": {}, "extensions": {}}),
        )
        .unwrap();
        assert_eq!(legacy_capabilities(&a), legacy_capabilities(&b));
        assert_eq!(legacy_capabilities(&a), r#"{"elicitation":{"form":{}},"roots":{},"sampling":{}}"#);
        assert_eq!(legacy_capabilities(&Map::new()), "{}");
    }

    /// The hand-written key is what serde_json writes for the same object,
    /// for every mix of known (and unknown) capabilities and sub-capabilities.
    #[test]
    fn capabilities_match_serde_json_for_every_mix() {
        let options: Vec<Vec<&str>> = KNOWN_SUB_CAPABILITIES
            .iter()
            .map(|(_, subs)| subs.iter().copied().chain(["listChanged"]).collect())
            .collect();
        for mask in 0u32..(1 << 3) {
            for sub_mask in 0u32..(1 << 6) {
                let mut modern = Map::new();
                let mut expected = Map::new();
                for (i, (name, known)) in KNOWN_SUB_CAPABILITIES.iter().enumerate() {
                    if mask & (1 << i) == 0 {
                        continue;
                    }
                    let chosen: Vec<&str> = options[i]
                        .iter()
                        .enumerate()
                        .filter(|(j, _)| sub_mask & (1 << ((2 * i + j) % 6)) != 0)
                        .map(|(_, s)| *s)
                        .collect();
                    let declared: Map<String, Value> =
                        chosen.iter().map(|s| (s.to_string(), json!({}))).collect();
                    modern.insert(name.to_string(), Value::Object(declared));
                    let kept: Map<String, Value> = chosen
                        .iter()
                        .filter(|s| known.contains(s))
                        .map(|s| (s.to_string(), json!({})))
                        .collect();
                    expected.insert(name.to_string(), Value::Object(kept));
                }
                modern.insert("experimental".into(), json!({"x": 1}));
                assert_eq!(legacy_capabilities(&modern), Value::Object(expected).to_string(), "{modern:?}");
            }
        }
    }

    #[test]
    fn capabilities_reduce_to_a_fingerprint_whatever_the_client_sends() {
        let big = "x".repeat(100_000);
        let a: Map<String, Value> = serde_json::from_value(json!({
            "sampling": {"tools": {"padding": big}, "context": {}, "invented": {}},
            "elicitation": {"url": {"nested": [1, 2, 3]}, "unknown": true},
            "experimental": {"anything": big},
            "roots": {"listChanged": true, "more": big},
        }))
        .unwrap();
        let fingerprint = legacy_capabilities(&a);
        assert_eq!(
            fingerprint,
            r#"{"elicitation":{"url":{}},"roots":{},"sampling":{"context":{},"tools":{}}}"#
        );
        let mut seen = std::collections::HashSet::new();
        for i in 0..1000 {
            let caps: Map<String, Value> = serde_json::from_value(
                json!({"sampling": {format!("k{i}"): {}}, "elicitation": {"form": {"n": i}}}),
            )
            .unwrap();
            seen.insert(legacy_capabilities(&caps));
        }
        assert_eq!(seen.len(), 1, "unique capability objects make one key");
    }
}
