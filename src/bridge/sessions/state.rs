//! `requestState`: what a retry needs to find its paused upstream call,
//! sealed ([`crate::sealed`], purpose [`Purpose::FlowState`]) and bound to
//! the route, method, principal, name and arguments of the request that
//! started it. A retry's state is opened once ([`opened`]) and carried with
//! its call.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::front::Call;
use crate::seal::Sealer;
use crate::sealed::{self, Bindings, Claims, Owner, Purpose, Sealed};

pub use crate::sealed::Rejected;

/// The sealed payload. Short names on the wire keep the blob small.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlowState {
    #[serde(rename = "r")]
    pub route: String,
    /// The upstream instance (its URL) holding the session; empty when
    /// there is none.
    #[serde(rename = "i", default, skip_serializing_if = "String::is_empty")]
    pub instance: String,
    /// The upstream session's id and negotiated version.
    #[serde(rename = "sid")]
    pub session_id: Option<String>,
    #[serde(rename = "ver")]
    pub session_version: Option<String>,
    /// The owner replica: its instance id and, in cluster mode, its internal address.
    #[serde(rename = "own")]
    pub owner: String,
    #[serde(rename = "oa", default, skip_serializing_if = "Option::is_none")]
    pub owner_address: Option<String>,
    /// The upstream's id for the paused call, and the last SSE event id its
    /// stream carried (if any: then another replica may try to resume it).
    #[serde(rename = "uid", default, skip_serializing_if = "Option::is_none")]
    pub upstream_id: Option<u64>,
    #[serde(rename = "ev", default, skip_serializing_if = "Option::is_none")]
    pub last_event_id: Option<String>,
    #[serde(rename = "f")]
    pub flow: String,
    /// The upstream's request id of each pending question, by input key.
    #[serde(rename = "k")]
    pub questions: BTreeMap<String, Value>,
    /// Principal digest.
    #[serde(rename = "p")]
    pub principal: String,
    /// Method and `Mcp-Name`.
    #[serde(rename = "m")]
    pub method: String,
    #[serde(rename = "n")]
    pub name: Option<String>,
    /// Digest of the request's params ([`params_digest`]).
    #[serde(rename = "a")]
    pub params_digest: String,
    /// Issued at and expiry, Unix milliseconds.
    #[serde(rename = "iat")]
    pub issued_ms: u64,
    #[serde(rename = "exp")]
    pub expires_ms: u64,
    /// Round number, from 1.
    #[serde(rename = "rd")]
    pub round: u32,
    /// A URL-elicitation round (a 2025-11-25 upstream's -32042): nothing is
    /// parked; the retry re-issues the call.
    #[serde(rename = "re", default, skip_serializing_if = "std::ops::Not::not")]
    pub reissue: bool,
    /// Replay mode: the answers given so far, by input key (sealed, so not
    /// readable outside the gateway). `Some` marks a replay-mode state.
    #[serde(rename = "ans", default, skip_serializing_if = "Option::is_none")]
    pub answers: Option<BTreeMap<String, Value>>,
}

impl FlowState {
    /// A park-mode round: its call waits in a gateway's parking lot.
    pub fn parks(&self) -> bool {
        !self.reissue && self.answers.is_none()
    }
}

impl Claims for FlowState {
    const PURPOSE: Purpose = Purpose::FlowState;

    fn bindings(&self) -> Bindings<'_> {
        Bindings {
            route: &self.route,
            principal: &self.principal,
            method: Some(&self.method),
            expires_ms: Some(self.expires_ms),
            instance: Some(&self.instance).filter(|i| !i.is_empty()).map(String::as_str),
            owner: Some(Owner { instance: &self.owner, address: self.owner_address.as_deref() }),
        }
    }

    fn v1_aad(expect: &sealed::Expect<'_>) -> Vec<u8> {
        format!("requestState\0{}\0{}", expect.route, expect.method).into_bytes()
    }
}

pub fn now_ms() -> u64 {
    sealed::now_ms()
}

/// Digest of the params that identify a request: everything but the MRTR
/// fields, `_meta` and `cursor`. serde_json maps are key-ordered: canonical.
pub fn params_digest(params: &Map<String, Value>) -> String {
    let mut p = params.clone();
    for k in ["inputResponses", "requestState", "_meta", "cursor"] {
        p.remove(k);
    }
    let digest = Sha256::digest(Value::Object(p).to_string().as_bytes());
    crate::seal::hex(&digest[..16])
}

/// Seals a round's state; refused when it would be too large (replay mode's
/// answers are carried in it).
pub fn seal(sealer: &Sealer, state: &FlowState) -> Result<String, Rejected> {
    Sealed::seal(sealer, state)
}

/// What the retry must match.
pub struct Expect<'a> {
    pub route: &'a str,
    pub method: &'a str,
    pub principal: &'a str,
    pub name: Option<&'a str>,
    pub params_digest: &'a str,
    pub now_ms: u64,
}

impl Expect<'_> {
    fn sealed(&self) -> sealed::Expect<'_> {
        sealed::Expect {
            route: self.route,
            principal: self.principal,
            method: self.method,
            now_ms: self.now_ms,
        }
    }
}

/// Opens a `requestState` sealed for `route` and `method`, without checking
/// it against a retry (expiry, principal, arguments): see [`check`].
pub fn peek(sealer: &Sealer, blob: &str, route: &str, method: &str) -> Result<Sealed<FlowState>, Rejected> {
    let expect = sealed::Expect { route, principal: "", method, now_ms: 0 };
    let state = Sealed::<FlowState>::unseal(sealer, blob, &expect)?;
    state.check_call(&expect)?;
    Ok(state)
}

/// The `requestState` of `call` on `route`, opened ([`peek`]) once for the
/// life of the call: `None` when it has none, or it is not a string.
pub fn opened<'c>(
    sealer: &Sealer,
    route: &str,
    call: &'c Call,
) -> Option<Result<&'c Sealed<FlowState>, Rejected>> {
    let Some(Value::String(blob)) = call.params.get("requestState") else {
        return None;
    };
    let method = call.method.as_str();
    Some(call.request_state.get_or_open(|| peek(sealer, blob, route, method)))
}

/// Checks an opened `requestState` against the retry.
pub fn check(state: &Sealed<FlowState>, expect: &Expect<'_>) -> Result<(), Rejected> {
    state.check(&expect.sealed())?;
    if state.name.as_deref() != expect.name || state.params_digest != expect.params_digest {
        return Err(Rejected::OtherRequest);
    }
    Ok(())
}

/// Opens and checks a `requestState` against the retry.
#[cfg(any(test, feature = "fuzzing"))]
pub fn open(sealer: &Sealer, blob: &str, expect: &Expect<'_>) -> Result<Sealed<FlowState>, Rejected> {
    let state = peek(sealer, blob, expect.route, expect.method)?;
    check(&state, expect)?;
    Ok(state)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SealKey;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine;
    use serde_json::json;

    fn sealer() -> Sealer {
        Sealer::new(vec![SealKey { id: "k1".into(), bytes: [7; 32] }])
    }

    fn state() -> FlowState {
        FlowState {
            route: "/mcp".into(),
            instance: "http://127.0.0.1:1/mcp".into(),
            session_id: Some("abc".into()),
            session_version: Some("2025-11-25".into()),
            owner: "gw-1".into(),
            owner_address: None,
            upstream_id: Some(3),
            last_event_id: Some("ev-4".into()),
            flow: "flow-1".into(),
            questions: [("elicitation_1".to_string(), json!(7))].into_iter().collect(),
            principal: "anonymous".into(),
            method: "tools/call".into(),
            name: Some("ask".into()),
            params_digest: params_digest(
                &serde_json::from_value(json!({"name": "ask", "arguments": {"x": 1}})).unwrap(),
            ),
            issued_ms: 1_000,
            expires_ms: 2_000,
            round: 1,
            reissue: false,
            answers: None,
        }
    }

    fn expect(s: &FlowState) -> Expect<'_> {
        Expect {
            route: &s.route,
            method: &s.method,
            principal: &s.principal,
            name: s.name.as_deref(),
            params_digest: &s.params_digest,
            now_ms: 1_500,
        }
    }

    #[test]
    fn round_trip() {
        let s = state();
        let blob = seal(&sealer(), &s).unwrap();
        let opened = open(&sealer(), &blob, &expect(&s)).unwrap();
        assert_eq!((opened.format(), opened.into_claims()), (sealed::FORMAT, s));
    }

    #[test]
    fn every_bit_flip_of_a_real_blob_is_rejected() {
        let s = state();
        let raw = URL_SAFE_NO_PAD.decode(seal(&sealer(), &s).unwrap()).unwrap();
        for i in 0..raw.len() * 8 {
            let mut bad = raw.clone();
            bad[i / 8] ^= 1 << (i % 8);
            let r = open(&sealer(), &URL_SAFE_NO_PAD.encode(&bad), &expect(&s));
            assert_eq!(r.map(|_| ()).map_err(Rejected::reason), Err("invalid"), "bit {i}");
        }
    }

    #[test]
    fn bindings_are_checked() {
        let s = state();
        let blob = seal(&sealer(), &s).unwrap();
        let open = |e: &Expect<'_>| open(&sealer(), &blob, e).map(|_| ());
        let mut e = expect(&s);
        e.now_ms = 2_000;
        assert_eq!(open(&e), Err(Rejected::Expired));
        let mut e = expect(&s);
        e.principal = "b:someone-else";
        assert_eq!(open(&e), Err(Rejected::OtherPrincipal));
        let mut e = expect(&s);
        e.name = Some("other_tool");
        assert_eq!(open(&e), Err(Rejected::OtherRequest));
        let other_args =
            params_digest(&serde_json::from_value(json!({"name": "ask", "arguments": {"x": 2}})).unwrap());
        let mut e = expect(&s);
        e.params_digest = &other_args;
        assert_eq!(open(&e), Err(Rejected::OtherRequest));
        let mut e = expect(&s);
        e.method = "prompts/get";
        assert_eq!(open(&e), Err(Rejected::OtherRequest), "method is bound");
        let mut e = expect(&s);
        e.route = "/other";
        assert_eq!(open(&e), Err(Rejected::OtherRoute));
    }

    #[test]
    fn wrong_key_id_and_rotation() {
        let s = state();
        let blob = seal(&sealer(), &s).unwrap();
        let other = Sealer::new(vec![SealKey { id: "k2".into(), bytes: [7; 32] }]);
        assert_eq!(open(&other, &blob, &expect(&s)).map(|_| ()), Err(Rejected::UnknownKey));
        let rotated = Sealer::new(vec![
            SealKey { id: "k2".into(), bytes: [9; 32] },
            SealKey { id: "k1".into(), bytes: [7; 32] },
        ]);
        assert!(open(&rotated, &blob, &expect(&s)).is_ok());
    }

    #[test]
    fn an_oversized_state_is_not_sealed() {
        let mut s = state();
        let big: BTreeMap<String, Value> =
            [("a".to_string(), json!("x".repeat(Purpose::FlowState.max_len())))].into();
        s.answers = Some(big);
        assert_eq!(seal(&sealer(), &s), Err(Rejected::TooLarge));
    }

    #[test]
    fn the_digest_ignores_mrtr_fields() {
        let a: Map<String, Value> =
            serde_json::from_value(json!({"name": "t", "arguments": {"b": 1, "a": 2}})).unwrap();
        let b: Map<String, Value> =
            serde_json::from_value(json!({"arguments": {"a": 2, "b": 1}, "name": "t",
            "inputResponses": {}, "requestState": "x", "_meta": {"progressToken": 1}}))
            .unwrap();
        assert_eq!(params_digest(&a), params_digest(&b));
    }

    #[test]
    fn states_sealed_before_formats_had_versions_still_open() {
        use crate::sealed::v1_fixtures as v1;
        let digest =
            params_digest(&serde_json::from_value(json!({"name": "ask", "arguments": {"x": 1}})).unwrap());
        let e = Expect {
            route: "/mcp",
            method: "tools/call",
            principal: "anonymous",
            name: Some("ask"),
            params_digest: &digest,
            now_ms: now_ms(),
        };
        let replay = open(&v1::sealer(), v1::FLOW_STATE_REPLAY, &e).expect("a replay-mode state opens");
        assert_eq!(replay.format(), sealed::FORMAT_V1);
        let replay = replay.into_claims();
        assert_eq!((replay.owner.as_str(), replay.owner_address.as_deref()), ("gw-1", Some("10.0.0.1:9000")));
        assert_eq!((replay.flow.as_str(), replay.round, replay.upstream_id), ("flow-1", 2, Some(3)));
        assert_eq!(replay.session_id.as_deref(), Some("abc"));
        assert_eq!(replay.last_event_id.as_deref(), Some("ev-4"));
        assert_eq!(replay.questions, [("elicitation_1".to_string(), json!(7))].into());
        assert_eq!(replay.answers, Some([("elicitation_0".to_string(), json!({"action": "accept"}))].into()));
        assert!(!replay.parks() && !replay.reissue);
        let park =
            open(&v1::sealer(), v1::FLOW_STATE_PARK, &e).expect("a park-mode state opens").into_claims();
        assert!(park.parks());
        assert_eq!((park.round, park.owner_address, park.expires_ms), (1, None, 4_000_000_000_000));
        // Format 1 bound the route and method in its associated data.
        let elsewhere = Expect { method: "prompts/get", ..e };
        assert_eq!(open(&v1::sealer(), v1::FLOW_STATE_PARK, &elsewhere).map(|_| ()), Err(Rejected::Forged));
        let bob = Expect { principal: "b:bob", ..e };
        assert_eq!(open(&v1::sealer(), v1::FLOW_STATE_PARK, &bob).map(|_| ()), Err(Rejected::OtherPrincipal));
    }
}
