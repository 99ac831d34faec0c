//! Pagination cursors: the upstream's cursor is sealed together with the
//! upstream session (and instance) that issued it (legacy cursors may be
//! session-bound), so the next page goes to that session, from any replica
//! sharing the keys.

use serde_json::{json, Value};

use super::Caller;
use crate::config::Route;
use crate::error::Error;
use crate::front::Call;
use crate::seal::Sealer;
use crate::upstream::transport::SessionWire;

fn aad(route: &Route, call: &Call, caller: &Caller) -> Vec<u8> {
    format!("cursor\0{}\0{}\0{}", route.id, caller.principal, call.method.as_str()).into_bytes()
}

pub fn seal(
    sealer: &Sealer,
    route: &Route,
    call: &Call,
    caller: &Caller,
    instance: &str,
    wire: &SessionWire,
    next: &str,
) -> String {
    let payload = json!({"i": instance, "s": wire.id, "v": wire.version, "c": next});
    sealer.seal(&aad(route, call, caller), payload.to_string().as_bytes())
}

fn invalid(reason: &'static str) -> Error {
    Error::InvalidParams { message: "invalid cursor".into(), data: Some(json!({"reason": reason})) }
}

/// The cursor's session is gone upstream: the client must list from the start.
pub fn expired() -> Error {
    invalid("cursor_expired")
}

/// A sealed cursor, opened: where the next page is asked for, and how.
pub struct Pinned {
    /// The instance holding the session.
    pub instance: String,
    pub wire: SessionWire,
    /// The upstream's own cursor.
    pub cursor: Value,
}

/// Opens a sealed `params.cursor`: the instance and session that must serve
/// the page and the upstream's own cursor. `None` when there is no cursor.
pub fn open(sealer: &Sealer, route: &Route, call: &Call, caller: &Caller) -> Result<Option<Pinned>, Error> {
    let Some(cursor) = call.params.get("cursor") else {
        return Ok(None);
    };
    let Value::String(cursor) = cursor else {
        return Err(invalid("malformed"));
    };
    let raw = sealer.open(&aad(route, call, caller), cursor).map_err(|e| invalid(e.reason()))?;
    let payload: Value = serde_json::from_slice(&raw).map_err(|_| invalid("malformed"))?;
    let upstream_cursor = payload.get("c").cloned().ok_or(invalid("malformed"))?;
    let wire = SessionWire {
        id: payload.get("s").and_then(Value::as_str).map(str::to_string),
        version: payload.get("v").and_then(Value::as_str).map(str::to_string),
    };
    let instance = payload.get("i").and_then(Value::as_str).unwrap_or_default().to_string();
    Ok(Some(Pinned { instance, wire, cursor: upstream_cursor }))
}
