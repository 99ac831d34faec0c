//! The gateway's `Mcp-Session-Id` for a legacy client: a sealed token
//! ([`crate::sealed`], purpose [`Purpose::LegacySession`]) that names
//! everything a later request needs (route, upstream instance and session,
//! negotiated version, principal, expiry), so that any replica can relay it
//! and no replica keeps a session table.

use serde::{Deserialize, Serialize};

use crate::seal::Sealer;
use crate::sealed::{self, Bindings, Claims as SealedClaims, Purpose, Sealed};

pub use crate::sealed::Rejected;

/// What a session token holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    #[serde(rename = "r")]
    pub route: String,
    /// The upstream instance (its URL) holding the session.
    #[serde(rename = "i")]
    pub instance: String,
    /// The upstream's own session id (`None`: the upstream issued none).
    #[serde(rename = "u")]
    pub upstream_session: Option<String>,
    /// The version the upstream negotiated.
    #[serde(rename = "v")]
    pub version: Option<String>,
    /// The principal the session was opened for.
    #[serde(rename = "p")]
    pub principal: String,
    /// Issued and expiring, Unix seconds.
    #[serde(rename = "iat")]
    pub issued: u64,
    #[serde(rename = "exp")]
    pub expires: u64,
    /// A session the gateway keeps for a 2026 upstream (translated, no
    /// upstream session): what the client declared at `initialize`.
    #[serde(rename = "t", default, skip_serializing_if = "Option::is_none")]
    pub translated: Option<Translated>,
}

/// What a translated session's requests carry upstream in `_meta`, and the
/// session's own id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Translated {
    /// The client's capabilities (the questions it can answer).
    #[serde(rename = "c")]
    pub capabilities: serde_json::Value,
    /// The client's `clientInfo` (name and version).
    #[serde(rename = "ci")]
    pub client_info: serde_json::Value,
    /// A random id minted at `initialize`, one per session: the ids of the
    /// questions pushed on the session are bound to it. Tokens sealed
    /// before it existed have none ([`Translated::session`]).
    #[serde(rename = "s", default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
}

impl Translated {
    /// What tells this session from every other: its id, or for a token
    /// sealed without one, a digest of the token itself (`token`, as the
    /// client sends it; a token is never issued twice, and each seal is
    /// salted, so two sessions never share one).
    pub fn session(&self, token: &str) -> String {
        use base64::Engine;
        use sha2::Digest;
        match &self.session_id {
            Some(id) => id.clone(),
            None => {
                let digest = sha2::Sha256::digest(token.as_bytes());
                base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&digest[..16])
            }
        }
    }
}

impl SealedClaims for Claims {
    const PURPOSE: Purpose = Purpose::LegacySession;

    fn bindings(&self) -> Bindings<'_> {
        Bindings {
            route: &self.route,
            principal: &self.principal,
            method: None,
            expires_ms: Some(self.expires.saturating_mul(1000)),
            instance: Some(&self.instance).filter(|i| !i.is_empty()).map(String::as_str),
            owner: None,
        }
    }

    fn v1_aad(_: &sealed::Expect<'_>) -> Vec<u8> {
        b"legacy-session\0v1".to_vec()
    }
}

/// Seals a session's token; refused when it would not fit (a translated
/// session carries the client's capabilities and `clientInfo`).
pub fn issue(sealer: &Sealer, claims: &Claims) -> Result<String, Rejected> {
    Sealed::seal(sealer, claims)
}

/// Opens `token` for a request on `route` by `principal` at `now` (Unix
/// seconds). Its instance ([`Claims::instance`]) is the caller's to look up.
pub fn open(
    sealer: &Sealer,
    token: &str,
    route: &str,
    principal: &str,
    now: u64,
) -> Result<Claims, Rejected> {
    let expect = sealed::Expect { route, principal, method: "", now_ms: now.saturating_mul(1000) };
    Sealed::<Claims>::open(sealer, token, &expect).map(Sealed::into_claims)
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
        return Err(Rejected::Malformed);
    };
    let id = id.to_str().map_err(|_| Rejected::Malformed)?;
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
            route: "/mcp".into(),
            instance: "http://127.0.0.1:1/mcp".into(),
            upstream_session: Some("abc".into()),
            version: Some("2025-11-25".into()),
            principal: "anonymous".into(),
            issued: 100,
            expires: 200,
            translated: None,
        }
    }

    #[test]
    fn a_token_opens_only_where_and_for_whom_it_was_issued() {
        let s = sealer();
        let t = issue(&s, &claims()).unwrap();
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
        let t = issue(&s, &claims()).unwrap();
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
                let refused = open(&s, &bad, "/mcp", "anonymous", 150).map_err(Rejected::reason);
                assert_eq!(refused, Err("invalid"), "position {i}");
            }
        }
    }

    #[test]
    fn a_translated_session_is_told_apart_by_its_id_or_else_its_token() {
        let s = sealer();
        let with_id =
            Translated { capabilities: json!({}), client_info: json!({}), session_id: Some("sid-1".into()) };
        let before = Translated { session_id: None, ..with_id.clone() };
        assert_eq!(with_id.session("any token"), "sid-1");
        // A token sealed before session ids existed opens, and is its own id.
        let old = s.seal(b"legacy-session\0v1", br#"{"r":"/mcp","i":"","u":null,"v":"2025-11-25","p":"anonymous","iat":100,"exp":200,"t":{"c":{},"ci":{}}}"#);
        let claims = open(&s, &old, "/mcp", "anonymous", 150).expect("an older token opens");
        assert_eq!(claims.translated.as_ref(), Some(&before));
        let again = issue(&s, &claims).unwrap();
        assert_eq!(before.session(&old), before.session(&old), "stable");
        assert_ne!(before.session(&old), before.session(&again), "the same claims, another session");
        assert_eq!(before.session(&old).len(), 22);
    }

    #[test]
    fn a_token_too_large_for_a_header_is_not_issued() {
        let mut c = claims();
        c.translated = Some(Translated {
            capabilities: json!({"x": "y".repeat(2048)}),
            client_info: json!({}),
            session_id: None,
        });
        assert_eq!(issue(&sealer(), &c), Err(Rejected::TooLarge));
    }

    #[test]
    fn other_sealed_values_do_not_open_as_tokens() {
        let s = sealer();
        let other = s.seal(b"requestState\0/mcp\0tools/call", &serde_json::to_vec(&claims()).unwrap());
        assert_eq!(open(&s, &other, "/mcp", "anonymous", 150), Err(Rejected::Forged));
        assert_eq!(open(&s, &"A".repeat(5000), "/mcp", "", 0), Err(Rejected::TooLarge));
    }

    #[test]
    fn tokens_sealed_before_formats_had_versions_still_open() {
        use crate::sealed::v1_fixtures as v1;
        let now = crate::seal::unix_now();
        let relayed = open(&v1::sealer(), v1::LEGACY_SESSION_RELAYED, "/mcp", "anonymous", now).unwrap();
        assert_eq!(relayed.instance, "http://127.0.0.1:1/mcp");
        assert_eq!(relayed.upstream_session.as_deref(), Some("up-1"));
        assert_eq!(relayed.version.as_deref(), Some("2025-06-18"));
        assert_eq!((relayed.issued, relayed.expires, &relayed.translated), (100, 4_000_000_000, &None));
        let translated = open(&v1::sealer(), v1::LEGACY_SESSION_TRANSLATED, "/mcp", "b:ff", now).unwrap();
        let t = translated.translated.expect("a translated session");
        assert_eq!(t.capabilities, json!({"elicitation": {}}));
        assert_eq!(t.client_info, json!({"name": "c", "version": "1"}));
        assert_eq!(t.session(v1::LEGACY_SESSION_TRANSLATED), "sid-1");
        let stolen = open(&v1::sealer(), v1::LEGACY_SESSION_TRANSLATED, "/mcp", "anonymous", now);
        assert_eq!(stolen, Err(Rejected::OtherPrincipal));
        // New tokens carry the new format.
        let fresh = issue(&v1::sealer(), &relayed).unwrap();
        assert_eq!(v1::sealer().open(Purpose::LegacySession.aad(), &fresh).unwrap()[0], sealed::FORMAT);
    }
}
