//! A 2026 upstream's `requestState`, carried inside the gateway's own sealed
//! envelope: bound to the principal, route, method, name and upstream
//! instance of the call that received it, and handed back to the upstream
//! byte for byte on the retry. A state issued to one caller is refused for
//! another (with nothing sent upstream) even when the upstream binds nothing,
//! and the retry goes to the instance that asked.

use serde::{Deserialize, Serialize};

use crate::seal::Sealer;

/// The purpose label: no other sealed value opens as an envelope.
const AAD: &[u8] = b"upstream-request-state\0v1";
/// How long an envelope is accepted (the upstream's own state may say less).
const TTL_SECS: u64 = 24 * 3600;
/// Envelopes longer than this are not opened.
const MAX_ENVELOPE: usize = 1 << 20;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope {
    /// Principal, route, method, name (tool, prompt or URI), instance.
    pub p: String,
    pub r: String,
    pub m: String,
    pub n: Option<String>,
    pub i: String,
    pub exp: u64,
    /// The upstream's `requestState`, as it sent it.
    pub s: String,
}

/// What a retry must match.
pub struct Expect<'a> {
    pub principal: &'a str,
    pub route: &'a str,
    pub method: &'a str,
    pub name: Option<&'a str>,
    pub now: u64,
}

/// An opened envelope: where the retry goes and what it carries there.
#[derive(Debug, PartialEq, Eq)]
pub struct Opened {
    /// The instance that issued the state.
    pub instance: String,
    /// The upstream's `requestState`, as it sent it.
    pub state: String,
}

pub use crate::bridge::Rejected;

/// Seals the `requestState` that `instance` issued for the call `expect` describes.
pub fn seal(sealer: &Sealer, expect: &Expect<'_>, instance: &str, upstream_state: &str) -> String {
    let env = Envelope {
        p: expect.principal.into(),
        r: expect.route.into(),
        m: expect.method.into(),
        n: expect.name.map(str::to_string),
        i: instance.into(),
        exp: expect.now + TTL_SECS,
        s: upstream_state.into(),
    };
    sealer.seal(AAD, &serde_json::to_vec(&env).expect("serialises"))
}

/// The upstream's state inside `blob` and the instance it came from, if the
/// retry matches its bindings.
pub fn open(sealer: &Sealer, blob: &str, expect: &Expect<'_>) -> Result<Opened, Rejected> {
    if blob.len() > MAX_ENVELOPE {
        return Err(Rejected::Invalid);
    }
    let bytes = sealer.open(AAD, blob).map_err(|_| Rejected::Invalid)?;
    let env: Envelope = serde_json::from_slice(&bytes).map_err(|_| Rejected::Invalid)?;
    if env.p != expect.principal {
        return Err(Rejected::WrongPrincipal);
    }
    if env.r != expect.route || env.m != expect.method || env.n.as_deref() != expect.name {
        return Err(Rejected::WrongRequest);
    }
    if expect.now >= env.exp {
        return Err(Rejected::Expired);
    }
    Ok(Opened { instance: env.i, state: env.s })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SealKey;

    #[test]
    fn the_upstream_state_comes_back_only_to_the_same_call() {
        let sealer = Sealer::new(vec![SealKey { id: "k".into(), bytes: [3; 32] }]);
        let e = |principal, name| Expect { principal, route: "/mcp", method: "tools/call", name, now: 10 };
        let blob = seal(&sealer, &e("alice", Some("ask")), "http://a/mcp", "opaque-upstream-state ✓");
        let opened = Opened { instance: "http://a/mcp".into(), state: "opaque-upstream-state ✓".into() };
        assert_eq!(open(&sealer, &blob, &e("alice", Some("ask"))), Ok(opened));
        assert_eq!(open(&sealer, &blob, &e("bob", Some("ask"))), Err(Rejected::WrongPrincipal));
        assert_eq!(open(&sealer, &blob, &e("alice", Some("other"))), Err(Rejected::WrongRequest));
        let later = Expect { now: 10 + TTL_SECS, ..e("alice", Some("ask")) };
        assert_eq!(open(&sealer, &blob, &later), Err(Rejected::Expired));
        let session = sealer.seal(b"legacy-session\0v1", b"{}");
        assert_eq!(open(&sealer, &session, &e("alice", Some("ask"))), Err(Rejected::Invalid));
        assert_eq!(open(&sealer, "opaque-upstream-state", &e("alice", Some("ask"))), Err(Rejected::Invalid));
    }
}
