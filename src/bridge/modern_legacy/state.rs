//! `requestState`: what a retry needs to find its paused upstream call, sealed
//! (AES-256-GCM, see `seal.rs`) and bound to the route, method, principal,
//! name and arguments of the request that started it.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::seal::Sealer;

/// The sealed payload. Short field names keep the blob small.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlowState {
    /// Route path.
    pub r: String,
    /// The upstream instance (its URL) holding the session; empty when
    /// there is none.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub i: String,
    /// Upstream session id and version.
    pub sid: Option<String>,
    pub ver: Option<String>,
    /// Owner replica: its instance id and, in cluster mode, its internal address.
    pub own: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oa: Option<String>,
    /// The upstream's id for the paused call, and the last SSE event id its
    /// stream carried (if any: then another replica may try to resume it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ev: Option<String>,
    /// Flow id.
    pub f: String,
    /// Upstream request id per input key.
    pub k: BTreeMap<String, Value>,
    /// Principal digest.
    pub p: String,
    /// Method and `Mcp-Name`.
    pub m: String,
    pub n: Option<String>,
    /// Digest of the request's params (arguments, uri…).
    pub a: String,
    /// Issued at and expiry, Unix milliseconds.
    pub iat: u64,
    pub exp: u64,
    /// Round number, from 1.
    pub rd: u32,
    /// A URL-elicitation round (a 2025-11-25 upstream's -32042): nothing is
    /// parked; the retry re-issues the call.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub re: bool,
    /// Replay mode: the answers given so far, by input key (sealed, so not
    /// readable outside the gateway). `Some` marks a replay-mode state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ans: Option<BTreeMap<String, Value>>,
}

pub use crate::bridge::Rejected;

pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
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

fn aad(route: &str, method: &str) -> Vec<u8> {
    format!("requestState\0{route}\0{method}").into_bytes()
}

pub fn seal(sealer: &Sealer, state: &FlowState) -> String {
    let bytes = serde_json::to_vec(state).expect("FlowState serialises");
    sealer.seal(&aad(&state.r, &state.m), &bytes)
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

/// Opens a `requestState` sealed for `route` and `method`, without checking
/// it against a retry (expiry, principal, arguments): see [`open`].
pub fn peek(sealer: &Sealer, blob: &str, route: &str, method: &str) -> Result<FlowState, Rejected> {
    let bytes = sealer.open(&aad(route, method), blob).map_err(|_| Rejected::Invalid)?;
    let state: FlowState = serde_json::from_slice(&bytes).map_err(|_| Rejected::Invalid)?;
    if state.r != route || state.m != method {
        return Err(Rejected::Invalid);
    }
    Ok(state)
}

/// Opens and checks a `requestState` against the retry.
pub fn open(sealer: &Sealer, blob: &str, expect: &Expect<'_>) -> Result<FlowState, Rejected> {
    let state = peek(sealer, blob, expect.route, expect.method)?;
    if expect.now_ms >= state.exp {
        return Err(Rejected::Expired);
    }
    if state.p != expect.principal {
        return Err(Rejected::WrongPrincipal);
    }
    if state.n.as_deref() != expect.name || state.a != expect.params_digest {
        return Err(Rejected::WrongRequest);
    }
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
            r: "/mcp".into(),
            i: "http://127.0.0.1:1/mcp".into(),
            sid: Some("abc".into()),
            ver: Some("2025-11-25".into()),
            own: "gw-1".into(),
            oa: None,
            uid: Some(3),
            ev: Some("ev-4".into()),
            f: "flow-1".into(),
            k: [("elicitation_1".to_string(), json!(7))].into_iter().collect(),
            p: "anonymous".into(),
            m: "tools/call".into(),
            n: Some("ask".into()),
            a: params_digest(&serde_json::from_value(json!({"name": "ask", "arguments": {"x": 1}})).unwrap()),
            iat: 1_000,
            exp: 2_000,
            rd: 1,
            re: false,
            ans: None,
        }
    }

    fn expect(s: &FlowState) -> Expect<'_> {
        Expect {
            route: &s.r,
            method: &s.m,
            principal: &s.p,
            name: s.n.as_deref(),
            params_digest: &s.a,
            now_ms: 1_500,
        }
    }

    #[test]
    fn round_trip() {
        let s = state();
        let blob = seal(&sealer(), &s);
        assert_eq!(open(&sealer(), &blob, &expect(&s)).unwrap(), s);
    }

    #[test]
    fn every_bit_flip_of_a_real_blob_is_rejected() {
        let s = state();
        let raw = URL_SAFE_NO_PAD.decode(seal(&sealer(), &s)).unwrap();
        for i in 0..raw.len() * 8 {
            let mut bad = raw.clone();
            bad[i / 8] ^= 1 << (i % 8);
            let r = open(&sealer(), &URL_SAFE_NO_PAD.encode(&bad), &expect(&s));
            assert_eq!(r, Err(Rejected::Invalid), "bit {i}");
        }
    }

    #[test]
    fn bindings_are_checked() {
        let s = state();
        let blob = seal(&sealer(), &s);
        let mut e = expect(&s);
        e.now_ms = 2_000;
        assert_eq!(open(&sealer(), &blob, &e), Err(Rejected::Expired));
        let mut e = expect(&s);
        e.principal = "b:someone-else";
        assert_eq!(open(&sealer(), &blob, &e), Err(Rejected::WrongPrincipal));
        let mut e = expect(&s);
        e.name = Some("other_tool");
        assert_eq!(open(&sealer(), &blob, &e), Err(Rejected::WrongRequest));
        let other_args =
            params_digest(&serde_json::from_value(json!({"name": "ask", "arguments": {"x": 2}})).unwrap());
        let mut e = expect(&s);
        e.params_digest = &other_args;
        assert_eq!(open(&sealer(), &blob, &e), Err(Rejected::WrongRequest));
        let mut e = expect(&s);
        e.method = "prompts/get";
        assert_eq!(open(&sealer(), &blob, &e), Err(Rejected::Invalid), "method is in the AAD");
    }

    #[test]
    fn wrong_key_id_and_rotation() {
        let s = state();
        let blob = seal(&sealer(), &s);
        let other = Sealer::new(vec![SealKey { id: "k2".into(), bytes: [7; 32] }]);
        assert_eq!(open(&other, &blob, &expect(&s)), Err(Rejected::Invalid));
        let rotated = Sealer::new(vec![
            SealKey { id: "k2".into(), bytes: [9; 32] },
            SealKey { id: "k1".into(), bytes: [7; 32] },
        ]);
        assert!(open(&rotated, &blob, &expect(&s)).is_ok());
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
}
