//! Pagination cursors: the upstream's cursor is sealed ([`crate::sealed`],
//! purpose [`Purpose::Cursor`]) together with the upstream session (and
//! instance) that issued it (legacy cursors may be session-bound), so the
//! next page goes to that session, from any replica sharing the keys. A
//! cursor is bound to its route, caller and method.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::Caller;
use crate::config::Route;
use crate::error::Error;
use crate::front::Call;
use crate::seal::Sealer;
use crate::sealed::{self, Bindings, Claims, Purpose, Rejected, Sealed};
use crate::upstream::SessionWire;

/// The sealed payload. Format 1 carried no route, principal or method (its
/// associated data bound them).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CursorClaims {
    #[serde(rename = "r", default)]
    pub route: String,
    #[serde(rename = "p", default)]
    pub principal: String,
    #[serde(rename = "m", default)]
    pub method: String,
    /// The instance holding the session.
    #[serde(rename = "i", default)]
    pub instance: String,
    #[serde(rename = "s")]
    pub session_id: Option<String>,
    #[serde(rename = "v")]
    pub session_version: Option<String>,
    /// The upstream's own cursor.
    #[serde(rename = "c")]
    pub cursor: Value,
}

impl Claims for CursorClaims {
    const PURPOSE: Purpose = Purpose::Cursor;

    fn bindings(&self) -> Bindings<'_> {
        Bindings {
            route: &self.route,
            principal: &self.principal,
            method: Some(&self.method),
            expires_ms: None,
            instance: Some(&self.instance),
            owner: None,
        }
    }

    fn v1_aad(e: &sealed::Expect<'_>) -> Vec<u8> {
        format!("cursor\0{}\0{}\0{}", e.route, e.principal, e.method).into_bytes()
    }

    fn adopt_v1(&mut self, e: &sealed::Expect<'_>) {
        self.route = e.route.into();
        self.principal = e.principal.into();
        self.method = e.method.into();
    }
}

fn expect<'a>(route: &'a Route, call: &'a Call, caller: &'a Caller) -> sealed::Expect<'a> {
    sealed::Expect { route: &route.id, principal: &caller.principal, method: call.method.as_str(), now_ms: 0 }
}

/// Seals the upstream's `next` cursor; refused when it is too long.
pub fn seal(
    sealer: &Sealer,
    route: &Route,
    call: &Call,
    caller: &Caller,
    instance: &str,
    wire: &SessionWire,
    next: &str,
) -> Result<String, Rejected> {
    let claims = CursorClaims {
        route: route.id.clone(),
        principal: caller.principal.clone(),
        method: call.method.as_str().into(),
        instance: instance.into(),
        session_id: wire.id.clone(),
        session_version: wire.version.clone(),
        cursor: Value::String(next.into()),
    };
    Sealed::seal(sealer, &claims)
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
        return Err(Rejected::Malformed.error(Purpose::Cursor));
    };
    let expect = expect(route, call, caller);
    let opened =
        Sealed::<CursorClaims>::open(sealer, cursor, &expect).map_err(|why| why.error(Purpose::Cursor))?;
    let c = opened.into_claims();
    let wire = SessionWire { id: c.session_id, version: c.session_version, owner: None };
    Ok(Some(Pinned { instance: c.instance, wire, cursor: c.cursor }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_sealed_before_formats_had_versions_still_open() {
        use crate::sealed::v1_fixtures as v1;
        let e = sealed::Expect { route: "/mcp", principal: "anonymous", method: "tools/list", now_ms: 0 };
        let c = Sealed::<CursorClaims>::open(&v1::sealer(), v1::CURSOR, &e).expect("opens");
        assert_eq!(c.format(), sealed::FORMAT_V1);
        let c = c.into_claims();
        assert_eq!(
            (c.route.as_str(), c.principal.as_str(), c.method.as_str()),
            ("/mcp", "anonymous", "tools/list")
        );
        assert_eq!(c.instance, "http://127.0.0.1:1/mcp");
        assert_eq!(
            (c.session_id.as_deref(), c.session_version.as_deref()),
            (Some("sess-1"), Some("2025-11-25"))
        );
        assert_eq!(c.cursor, json!("page-2"));
        // Format 1 bound the caller and the method in its associated data.
        for other in
            [sealed::Expect { principal: "bob", ..e }, sealed::Expect { method: "prompts/list", ..e }]
        {
            let refused = Sealed::<CursorClaims>::open(&v1::sealer(), v1::CURSOR, &other).map(drop);
            assert_eq!(refused, Err(Rejected::Forged));
        }
        // A new cursor is bound by its payload, in the new format.
        let fresh = Sealed::seal(&v1::sealer(), &c).unwrap();
        assert_eq!(v1::sealer().open(Purpose::Cursor.aad(), &fresh).unwrap()[0], sealed::FORMAT);
        let bob = sealed::Expect { principal: "bob", ..e };
        let refused = Sealed::<CursorClaims>::open(&v1::sealer(), &fresh, &bob).map(drop);
        assert_eq!(refused, Err(Rejected::OtherPrincipal));
        assert!(Sealed::<CursorClaims>::open(&v1::sealer(), &fresh, &e).is_ok());
    }
}
