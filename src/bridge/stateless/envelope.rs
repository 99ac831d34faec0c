//! A 2026 upstream's `requestState`, carried inside the gateway's own sealed
//! envelope ([`crate::sealed`], purpose [`Purpose::UpstreamState`]): bound to
//! the principal, route, method, name and upstream instance of the call that
//! received it, and handed back to the upstream byte for byte on the retry.
//! A state issued to one caller is refused for another (with nothing sent
//! upstream) even when the upstream binds nothing, and the retry goes to the
//! instance that asked.

use serde::{Deserialize, Serialize};

use crate::seal::Sealer;
use crate::sealed::{self, Bindings, Claims, Purpose, Sealed};

pub use crate::sealed::Rejected;

/// How long an envelope is accepted (the upstream's own state may say less).
const TTL_SECS: u64 = 24 * 3600;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope {
    #[serde(rename = "p")]
    pub principal: String,
    #[serde(rename = "r")]
    pub route: String,
    #[serde(rename = "m")]
    pub method: String,
    /// The tool, prompt or URI.
    #[serde(rename = "n")]
    pub name: Option<String>,
    /// The upstream instance that issued the state.
    #[serde(rename = "i")]
    pub instance: String,
    /// Unix seconds.
    #[serde(rename = "exp")]
    pub expires: u64,
    /// The upstream's `requestState`, as it sent it.
    #[serde(rename = "s")]
    pub state: String,
}

impl Claims for Envelope {
    const PURPOSE: Purpose = Purpose::UpstreamState;

    fn bindings(&self) -> Bindings<'_> {
        Bindings {
            route: &self.route,
            principal: &self.principal,
            method: Some(&self.method),
            expires_ms: Some(self.expires.saturating_mul(1000)),
            instance: Some(&self.instance),
            owner: None,
        }
    }

    fn v1_aad(_: &sealed::Expect<'_>) -> Vec<u8> {
        b"upstream-request-state\0v1".to_vec()
    }
}

/// What a retry must match.
pub struct Expect<'a> {
    pub principal: &'a str,
    pub route: &'a str,
    pub method: &'a str,
    pub name: Option<&'a str>,
    /// Unix seconds.
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

/// Seals the `requestState` that `instance` issued for the call `expect`
/// describes; refused when the envelope would be too large.
pub fn seal(
    sealer: &Sealer,
    expect: &Expect<'_>,
    instance: &str,
    upstream_state: &str,
) -> Result<String, Rejected> {
    let env = Envelope {
        principal: expect.principal.into(),
        route: expect.route.into(),
        method: expect.method.into(),
        name: expect.name.map(str::to_string),
        instance: instance.into(),
        expires: expect.now + TTL_SECS,
        state: upstream_state.into(),
    };
    Sealed::seal(sealer, &env)
}

/// The upstream's state inside `blob` and the instance it came from, if the
/// retry matches its bindings.
pub fn open(sealer: &Sealer, blob: &str, expect: &Expect<'_>) -> Result<Opened, Rejected> {
    let bound = sealed::Expect {
        route: expect.route,
        principal: expect.principal,
        method: expect.method,
        now_ms: expect.now.saturating_mul(1000),
    };
    let env = Sealed::<Envelope>::open(sealer, blob, &bound)?;
    if env.name.as_deref() != expect.name {
        return Err(Rejected::OtherRequest);
    }
    let env = env.into_claims();
    Ok(Opened { instance: env.instance, state: env.state })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SealKey;

    #[test]
    fn the_upstream_state_comes_back_only_to_the_same_call() {
        let sealer = Sealer::new(vec![SealKey { id: "k".into(), bytes: [3; 32] }]);
        let e = |principal, name| Expect { principal, route: "/mcp", method: "tools/call", name, now: 10 };
        let blob =
            seal(&sealer, &e("alice", Some("ask")), "http://a/mcp", "opaque-upstream-state ✓").unwrap();
        let opened = Opened { instance: "http://a/mcp".into(), state: "opaque-upstream-state ✓".into() };
        assert_eq!(open(&sealer, &blob, &e("alice", Some("ask"))), Ok(opened));
        assert_eq!(open(&sealer, &blob, &e("bob", Some("ask"))), Err(Rejected::OtherPrincipal));
        assert_eq!(open(&sealer, &blob, &e("alice", Some("other"))), Err(Rejected::OtherRequest));
        let later = Expect { now: 10 + TTL_SECS, ..e("alice", Some("ask")) };
        assert_eq!(open(&sealer, &blob, &later), Err(Rejected::Expired));
        let session = sealer.seal(b"legacy-session\0v1", b"{}");
        assert_eq!(open(&sealer, &session, &e("alice", Some("ask"))), Err(Rejected::Forged));
        assert_eq!(
            open(&sealer, "opaque-upstream-state", &e("alice", Some("ask"))),
            Err(Rejected::Malformed)
        );
        let huge = "x".repeat(Purpose::UpstreamState.max_len());
        assert_eq!(seal(&sealer, &e("alice", None), "http://a/mcp", &huge), Err(Rejected::TooLarge));
    }

    #[test]
    fn envelopes_sealed_before_formats_had_versions_still_open() {
        use crate::sealed::v1_fixtures as v1;
        let e =
            Expect { principal: "alice", route: "/mcp", method: "tools/call", name: Some("ask"), now: 10 };
        let opened = open(&v1::sealer(), v1::UPSTREAM_STATE, &e).expect("opens");
        assert_eq!(
            opened,
            Opened { instance: "http://a/mcp".into(), state: "opaque-upstream-state ✓".into() }
        );
        let bob = Expect { principal: "bob", ..e };
        assert_eq!(open(&v1::sealer(), v1::UPSTREAM_STATE, &bob), Err(Rejected::OtherPrincipal));
        let fresh = seal(&v1::sealer(), &e, "http://a/mcp", "s").unwrap();
        assert_eq!(v1::sealer().open(Purpose::UpstreamState.aad(), &fresh).unwrap()[0], sealed::FORMAT);
    }
}
