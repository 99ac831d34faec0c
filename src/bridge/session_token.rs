//! The gateway's `Mcp-Session-Id` for a legacy client: a sealed token that
//! names everything a later request needs (route, upstream instance and
//! session, negotiated version, principal, expiry), so that any replica can
//! relay it and no replica keeps a session table. Sealed under the same key
//! ring as `requestState`, with its own purpose label in the associated data,
//! so that no other sealed value opens as a session token or the reverse.

use serde::{Deserialize, Serialize};

use crate::seal::Sealer;

/// What a session token holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    /// Route path.
    pub r: String,
    /// The upstream instance (its URL) holding the session.
    pub i: String,
    /// The upstream's own session id (`None`: the upstream issued none).
    pub u: Option<String>,
    /// The version the upstream negotiated.
    pub v: Option<String>,
    /// The principal the session was opened for.
    pub p: String,
    /// Issued and expiring, Unix seconds.
    pub iat: u64,
    pub exp: u64,
    /// A session the gateway keeps for a 2026 upstream (translated, no
    /// upstream session): what the client declared at `initialize`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub t: Option<Translated>,
}

/// What a translated session's requests carry upstream in `_meta`, and the
/// session's own id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Translated {
    /// The client's capabilities (the questions it can answer).
    pub c: serde_json::Value,
    /// The client's `clientInfo` (name and version).
    pub ci: serde_json::Value,
    /// A random id minted at `initialize`, one per session: the ids of the
    /// questions pushed on the session are bound to it. Tokens sealed
    /// before it existed have none ([`Translated::session`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s: Option<String>,
}

impl Translated {
    /// What tells this session from every other: its id, or for a token
    /// sealed without one, a digest of the token itself (`token`, as the
    /// client sends it; a token is never issued twice, and each seal is
    /// salted, so two sessions never share one).
    pub fn session(&self, token: &str) -> String {
        use base64::Engine;
        use sha2::Digest;
        match &self.s {
            Some(id) => id.clone(),
            None => {
                let digest = sha2::Sha256::digest(token.as_bytes());
                base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&digest[..16])
            }
        }
    }
}

/// Why a token was refused (a metrics label; the client always sees 404).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejected {
    /// Not a token this gateway sealed (altered, another key ring, garbage).
    Invalid,
    Expired,
    OtherRoute,
    OtherPrincipal,
    /// Sealed for an upstream instance this route no longer has.
    OtherInstance,
    /// A relayed session's token on a route whose legacy clients are now
    /// translated, or the reverse (the upstream changed).
    OtherCell,
}

impl Rejected {
    pub fn reason(self) -> &'static str {
        match self {
            Rejected::Invalid => "invalid",
            Rejected::Expired => "expired",
            Rejected::OtherRoute => "other_route",
            Rejected::OtherPrincipal => "other_principal",
            Rejected::OtherInstance => "other_instance",
            Rejected::OtherCell => "other_cell",
        }
    }
}

/// The purpose label: no other sealed value (requestState, cursors) opens here.
const AAD: &[u8] = b"legacy-session\0v1";
/// Tokens longer than this are not opened (a sealed token is ~200 bytes).
const MAX_TOKEN: usize = 2048;

pub fn issue(sealer: &Sealer, claims: &Claims) -> String {
    sealer.seal(AAD, &serde_json::to_vec(claims).expect("claims serialise"))
}

/// Opens `token` for a request on `route` by `principal` at `now` (Unix
/// seconds). Its instance (`Claims::i`) is the caller's to look up.
pub fn open(
    sealer: &Sealer,
    token: &str,
    route: &str,
    principal: &str,
    now: u64,
) -> Result<Claims, Rejected> {
    if token.len() > MAX_TOKEN {
        return Err(Rejected::Invalid);
    }
    let bytes = sealer.open(AAD, token).map_err(|_| Rejected::Invalid)?;
    let claims: Claims = serde_json::from_slice(&bytes).map_err(|_| Rejected::Invalid)?;
    if claims.r != route {
        return Err(Rejected::OtherRoute);
    }
    if claims.p != principal {
        return Err(Rejected::OtherPrincipal);
    }
    if now >= claims.exp {
        return Err(Rejected::Expired);
    }
    Ok(claims)
}

/// The claims of a request's `Mcp-Session-Id` (exactly one, visible ASCII),
/// opened for `route` and `principal` now.
pub fn of_request(
    sealer: &Sealer,
    headers: &http::HeaderMap,
    route: &str,
    principal: &str,
) -> Result<Claims, Rejected> {
    let mut ids = headers.get_all(&crate::front::headers::SESSION_ID).iter();
    let (Some(id), None) = (ids.next(), ids.next()) else {
        return Err(Rejected::Invalid);
    };
    let id = id.to_str().map_err(|_| Rejected::Invalid)?;
    open(sealer, id, route, principal, crate::seal::unix_now())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SealKey;
    use serde_json::json;

    fn sealer() -> Sealer {
        Sealer::new(vec![SealKey { id: "k".into(), bytes: [7; 32] }])
    }

    fn claims() -> Claims {
        Claims {
            r: "/mcp".into(),
            i: "http://127.0.0.1:1/mcp".into(),
            u: Some("abc".into()),
            v: Some("2025-11-25".into()),
            p: "anonymous".into(),
            iat: 100,
            exp: 200,
            t: None,
        }
    }

    #[test]
    fn a_token_opens_only_where_and_for_whom_it_was_issued() {
        let s = sealer();
        let t = issue(&s, &claims());
        let open = |route, principal, now| open(&s, &t, route, principal, now);
        assert_eq!(open("/mcp", "anonymous", 150), Ok(claims()));
        assert_eq!(open("/other", "anonymous", 150), Err(Rejected::OtherRoute));
        assert_eq!(open("/mcp", "b:ff", 150), Err(Rejected::OtherPrincipal));
        assert_eq!(open("/mcp", "anonymous", 200), Err(Rejected::Expired));
        assert!(t.bytes().all(|b| (0x21..=0x7e).contains(&b)), "visible ASCII only");
    }

    #[test]
    fn every_single_character_change_is_refused() {
        let s = sealer();
        let t = issue(&s, &claims());
        let alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        for i in 0..t.len() {
            for &c in alphabet {
                if t.as_bytes()[i] == c {
                    continue;
                }
                let mut bad = t.clone().into_bytes();
                bad[i] = c;
                let bad = String::from_utf8(bad).unwrap();
                // The last character carries spare bits that base64url ignores
                // on decode only when they are zero; any change there that
                // still decodes to the same bytes is the same token.
                if base64::Engine::decode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, &bad).ok()
                    == base64::Engine::decode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, &t).ok()
                {
                    continue;
                }
                assert_eq!(open(&s, &bad, "/mcp", "anonymous", 150), Err(Rejected::Invalid), "position {i}");
            }
        }
    }

    #[test]
    fn a_translated_session_is_told_apart_by_its_id_or_else_its_token() {
        let s = sealer();
        let with_id = Translated { c: json!({}), ci: json!({}), s: Some("sid-1".into()) };
        let before = Translated { s: None, ..with_id.clone() };
        assert_eq!(with_id.session("any token"), "sid-1");
        // A token sealed before session ids existed opens, and is its own id.
        let old = s.seal(AAD, br#"{"r":"/mcp","i":"","u":null,"v":"2025-11-25","p":"anonymous","iat":100,"exp":200,"t":{"c":{},"ci":{}}}"#);
        let claims = open(&s, &old, "/mcp", "anonymous", 150).expect("an older token opens");
        assert_eq!(claims.t.as_ref(), Some(&before));
        let again = s.seal(AAD, &serde_json::to_vec(&claims).unwrap());
        assert_eq!(before.session(&old), before.session(&old), "stable");
        assert_ne!(before.session(&old), before.session(&again), "the same claims, another session");
        assert_eq!(before.session(&old).len(), 22);
    }

    #[test]
    fn other_sealed_values_do_not_open_as_tokens() {
        let s = sealer();
        let other = s.seal(b"requestState\0/mcp\0tools/call", &serde_json::to_vec(&claims()).unwrap());
        assert_eq!(open(&s, &other, "/mcp", "anonymous", 150), Err(Rejected::Invalid));
        assert_eq!(open(&s, &"A".repeat(5000), "/mcp", "", 0), Err(Rejected::Invalid));
    }
}
