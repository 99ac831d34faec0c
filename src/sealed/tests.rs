use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde::{Deserialize, Serialize};

use super::*;
use crate::seal::SealKey;

fn sealer() -> Sealer {
    Sealer::new(vec![SealKey { id: "k".into(), bytes: [9; 32] }])
}

/// One payload shape per purpose, with every common binding.
macro_rules! probe {
    ($name:ident, $purpose:expr) => {
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        struct $name {
            #[serde(rename = "r")]
            route: String,
            #[serde(rename = "p")]
            principal: String,
            #[serde(rename = "m")]
            method: String,
            #[serde(rename = "exp")]
            expires_ms: u64,
            #[serde(rename = "x", default)]
            padding: String,
        }

        impl Claims for $name {
            const PURPOSE: Purpose = $purpose;

            fn bindings(&self) -> Bindings<'_> {
                Bindings {
                    route: &self.route,
                    principal: &self.principal,
                    method: Some(&self.method),
                    expires_ms: Some(self.expires_ms),
                    instance: None,
                    owner: Some(Owner { instance: "gw-1", address: Some("10.0.0.1:9000") }),
                }
            }

            fn v1_aad(e: &Expect<'_>) -> Vec<u8> {
                format!("probe-v1\0{}", e.route).into_bytes()
            }

            fn adopt_v1(&mut self, e: &Expect<'_>) {
                if self.method.is_empty() {
                    self.method = e.method.into();
                }
            }
        }

        impl $name {
            fn new() -> $name {
                $name {
                    route: "/mcp".into(),
                    principal: "alice".into(),
                    method: "tools/call".into(),
                    expires_ms: 2_000,
                    padding: String::new(),
                }
            }
        }
    };
}

probe!(FlowProbe, Purpose::FlowState);
probe!(CursorProbe, Purpose::Cursor);
probe!(SessionProbe, Purpose::LegacySession);
probe!(UpstreamProbe, Purpose::UpstreamState);
probe!(QuestionProbe, Purpose::Question);
probe!(FederatedCursorProbe, Purpose::FederatedCursor);

const EXPECT: Expect<'static> =
    Expect { route: "/mcp", principal: "alice", method: "tools/call", now_ms: 1_000 };

/// A blob of each purpose, and whether it opens as each purpose.
fn opens_as(blob: &str, purpose: Purpose) -> Result<(), Rejected> {
    let s = sealer();
    match purpose {
        Purpose::FlowState => Sealed::<FlowProbe>::open(&s, blob, &EXPECT).map(drop),
        Purpose::Cursor => Sealed::<CursorProbe>::open(&s, blob, &EXPECT).map(drop),
        Purpose::LegacySession => Sealed::<SessionProbe>::open(&s, blob, &EXPECT).map(drop),
        Purpose::UpstreamState => Sealed::<UpstreamProbe>::open(&s, blob, &EXPECT).map(drop),
        Purpose::Question => Sealed::<QuestionProbe>::open(&s, blob, &EXPECT).map(drop),
        Purpose::FederatedCursor => Sealed::<FederatedCursorProbe>::open(&s, blob, &EXPECT).map(drop),
    }
}

fn sealed_as(purpose: Purpose) -> String {
    let s = sealer();
    match purpose {
        Purpose::FlowState => Sealed::seal(&s, &FlowProbe::new()),
        Purpose::Cursor => Sealed::seal(&s, &CursorProbe::new()),
        Purpose::LegacySession => Sealed::seal(&s, &SessionProbe::new()),
        Purpose::UpstreamState => Sealed::seal(&s, &UpstreamProbe::new()),
        Purpose::Question => Sealed::seal(&s, &QuestionProbe::new()),
        Purpose::FederatedCursor => Sealed::seal(&s, &FederatedCursorProbe::new()),
    }
    .unwrap()
}

#[test]
fn no_value_opens_as_another_purpose() {
    for sealed in Purpose::ALL {
        let blob = sealed_as(sealed);
        for opened in Purpose::ALL {
            let want = if sealed == opened { Ok(()) } else { Err(Rejected::WrongPurpose) };
            assert_eq!(opens_as(&blob, opened), want, "{sealed:?} opened as {opened:?}");
        }
    }
}

#[test]
fn every_binding_is_checked() {
    let blob = Sealed::seal(&sealer(), &FlowProbe::new()).unwrap();
    let open = |e: Expect<'_>| Sealed::<FlowProbe>::open(&sealer(), &blob, &e).map(drop);
    assert_eq!(open(EXPECT), Ok(()));
    assert_eq!(open(Expect { route: "/other", ..EXPECT }), Err(Rejected::OtherRoute));
    assert_eq!(open(Expect { method: "prompts/get", ..EXPECT }), Err(Rejected::OtherRequest));
    assert_eq!(open(Expect { principal: "mallory", ..EXPECT }), Err(Rejected::OtherPrincipal));
    assert_eq!(open(Expect { now_ms: 1_999, ..EXPECT }), Ok(()));
    assert_eq!(open(Expect { now_ms: 2_000, ..EXPECT }), Err(Rejected::Expired));
    // Unsealed without checks; the call alone checked apart.
    let opened =
        Sealed::<FlowProbe>::unseal(&sealer(), &blob, &Expect { principal: "x", now_ms: 9_999, ..EXPECT });
    let opened = opened.unwrap();
    assert_eq!(opened.check_call(&Expect { principal: "x", ..EXPECT }), Ok(()));
    assert!(opened.owned_by("gw-1", Some("10.0.0.1:9000")));
    assert!(!opened.owned_by("gw-1", None) && !opened.owned_by("gw-2", Some("10.0.0.1:9000")));
}

#[test]
fn the_size_cap_holds_both_ways() {
    let cap = Purpose::Question.max_len();
    let mut big = QuestionProbe::new();
    big.padding = "x".repeat(cap);
    assert_eq!(Sealed::seal(&sealer(), &big), Err(Rejected::TooLarge), "not sealed");
    let mut fits = QuestionProbe::new();
    fits.padding = "x".repeat(cap / 2);
    assert!(Sealed::seal(&sealer(), &fits).is_ok());
    // Refused before decrypting: a blob over the cap is never tried.
    let long = URL_SAFE_NO_PAD.encode(vec![0u8; cap]);
    assert_eq!(opens_as(&long, Purpose::Question), Err(Rejected::TooLarge));
    assert_eq!(opens_as(&long, Purpose::FlowState), Err(Rejected::Malformed), "under this cap: decoded");
}

#[test]
fn the_format_is_inside_the_payload() {
    let s = sealer();
    let blob = Sealed::seal(&s, &CursorProbe::new()).unwrap();
    let plaintext = s.open(Purpose::Cursor.aad(), &blob).unwrap();
    assert_eq!(plaintext[0], FORMAT);
    assert_eq!(Sealed::<CursorProbe>::open(&s, &blob, &EXPECT).unwrap().format(), FORMAT);
    // A newer build's format is refused, not misread.
    let mut newer = vec![FORMAT + 1];
    newer.extend_from_slice(&plaintext[1..]);
    let newer = s.seal(Purpose::Cursor.aad(), &newer);
    assert_eq!(opens_as(&newer, Purpose::Cursor), Err(Rejected::UnknownVersion));
    // Format 1 opens only under its kind's own associated data, as a bare object.
    let v1 = s.seal(b"probe-v1\0/mcp", br#"{"r":"/mcp","p":"alice","m":"","exp":2000}"#);
    let opened = Sealed::<CursorProbe>::open(&s, &v1, &EXPECT).unwrap();
    assert_eq!((opened.format(), opened.method.as_str()), (FORMAT_V1, "tools/call"), "bound by its AAD");
    let elsewhere = Expect { route: "/other", ..EXPECT };
    assert_eq!(Sealed::<CursorProbe>::open(&s, &v1, &elsewhere).map(drop), Err(Rejected::Forged));
    let prefixed = s.seal(b"probe-v1\0/mcp", &plaintext);
    assert_eq!(
        opens_as(&prefixed, Purpose::Cursor),
        Err(Rejected::Malformed),
        "format 2 under format 1's AAD"
    );
    let bare = s.seal(Purpose::Cursor.aad(), &plaintext[1..]);
    assert_eq!(
        opens_as(&bare, Purpose::Cursor),
        Err(Rejected::UnknownVersion),
        "format 1 under format 2's AAD"
    );
}

#[test]
fn crypto_failures_are_told_apart() {
    let blob = sealed_as(Purpose::FlowState);
    let other_ring = Sealer::new(vec![SealKey { id: "k2".into(), bytes: [9; 32] }]);
    assert_eq!(Sealed::<FlowProbe>::open(&other_ring, &blob, &EXPECT).map(drop), Err(Rejected::UnknownKey));
    let same_id = Sealer::new(vec![SealKey { id: "k".into(), bytes: [1; 32] }]);
    assert_eq!(Sealed::<FlowProbe>::open(&same_id, &blob, &EXPECT).map(drop), Err(Rejected::Forged));
    assert_eq!(opens_as("not base64!", Purpose::FlowState), Err(Rejected::Malformed));
    let junk = sealer().seal(Purpose::FlowState.aad(), &[FORMAT, b'[', b']']);
    assert_eq!(opens_as(&junk, Purpose::FlowState), Err(Rejected::Malformed));
}

#[test]
fn every_refusal_has_a_stable_label_and_error() {
    use crate::error::Error;
    let invalid = [
        Rejected::Malformed,
        Rejected::Forged,
        Rejected::UnknownKey,
        Rejected::WrongPurpose,
        Rejected::TooLarge,
        Rejected::UnknownVersion,
    ];
    for why in invalid {
        assert_eq!(why.reason(), "invalid", "{why:?}");
        assert_ne!(why.detail(), "invalid", "{why:?}");
    }
    assert_eq!(Rejected::OtherPrincipal.reason(), "wrong_principal");
    assert_eq!(Rejected::OtherRequest.reason(), "wrong_request");
    assert_eq!(Rejected::FlowGone.reason(), "flow_finished");
    assert_eq!(Rejected::InstanceGone.reason(), "instance_unreachable");
    assert!(matches!(Rejected::Expired.error(Purpose::LegacySession), Error::SessionNotFound));
    let Error::InvalidParams { message, data } = Rejected::Expired.error(Purpose::FlowState) else {
        panic!("a requestState refusal is -32602");
    };
    assert!(message.starts_with("requestState expired"), "{message}");
    assert_eq!(data, Some(serde_json::json!({"reason": "expired"})));
    let Error::InvalidParams { message, .. } = Rejected::Forged.error(Purpose::Cursor) else {
        panic!("a cursor refusal is -32602");
    };
    assert_eq!(message, "invalid cursor");
    let metrics = crate::metrics::Metrics::register(&mut prometheus_client::registry::Registry::default());
    Rejected::OtherCell.refuse(Purpose::LegacySession, "/mcp", &metrics);
    let labels = crate::metrics::ReasonLabels { route: "/mcp".into(), reason: "other_cell" };
    assert_eq!(metrics.session_tokens_rejected.get_or_create(&labels).get(), 1);
}

#[test]
fn a_carried_value_is_opened_once() {
    let carried = Carried::default();
    let blob = sealed_as(Purpose::FlowState);
    let mut opened = 0;
    for _ in 0..3 {
        let got = carried.get_or_open(|| {
            opened += 1;
            Sealed::<FlowProbe>::unseal(&sealer(), &blob, &EXPECT)
        });
        assert_eq!(got.map(|s| s.principal.clone()), Ok("alice".to_string()));
    }
    assert_eq!(opened, 1);
    let as_other = carried.get_or_open(|| Sealed::<CursorProbe>::unseal(&sealer(), &blob, &EXPECT));
    assert_eq!(as_other.map(drop), Err(Rejected::WrongPurpose));
    assert!(!carried.clone().is_opened(), "a copy starts unopened");
    let refused = Carried::default();
    assert_eq!(
        refused.get_or_open(|| Sealed::<FlowProbe>::unseal(&sealer(), "x", &EXPECT)).map(drop),
        Err(Rejected::Malformed)
    );
    let again = refused.get_or_open(|| -> Result<Sealed<FlowProbe>, Rejected> { panic!("opened twice") });
    assert_eq!(again.map(drop), Err(Rejected::Malformed), "a refusal is kept too");
}
