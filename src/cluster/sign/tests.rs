use http::{HeaderMap, HeaderValue};

use super::*;

const NONCE: [u8; NONCE_LEN] = [7; NONCE_LEN];
static OTHER_NONCE: [u8; NONCE_LEN] = [8; NONCE_LEN];
static BODY: [u8; 32] = [1; 32];
static OTHER_BODY: [u8; 32] = [2; 32];

fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(*k, HeaderValue::from_static(v));
    }
    h
}

fn base(h: &HeaderMap) -> Signed<'_> {
    Signed {
        audience: "10.0.0.5:8081",
        route: "/mcp",
        principal: "anonymous",
        headers: h,
        body_digest: &BODY,
        timestamp_ms: 1_000_000,
        nonce: &NONCE,
        session: None,
    }
}

#[test]
fn every_field_changes_the_encoding() {
    let h = headers(&[("mcp-method", "tools/call"), ("mcp-name", "ask")]);
    let reference = canonical(&base(&h));
    let more = headers(&[("mcp-method", "tools/call"), ("mcp-name", "ask"), ("mcp-param-region", "eu")]);
    let renamed = headers(&[("mcp-method", "tools/call"), ("mcp-name", "other")]);
    let variants: [fn(&mut Signed<'_>); 8] = [
        |s| s.audience = "10.0.0.6:8081",
        |s| s.route = "/other",
        |s| s.principal = "b:0123",
        |s| s.body_digest = &OTHER_BODY,
        |s| s.timestamp_ms += 1,
        |s| s.nonce = &OTHER_NONCE,
        |s| s.session = Some("sid"),
        |s| s.session = Some(""),
    ];
    for (i, change) in variants.iter().enumerate() {
        let mut s = base(&h);
        change(&mut s);
        assert_ne!(canonical(&s), reference, "variant {i}");
    }
    assert_ne!(canonical(&base(&more)), reference, "an added header");
    assert_ne!(canonical(&base(&renamed)), reference, "a header value");
}

#[test]
fn no_session_signs_what_a_replica_without_sessions_signs() {
    let h = headers(&[("mcp-method", "tools/call")]);
    let without = canonical(&base(&h));
    assert!(without.ends_with(&NONCE), "nothing after the nonce");
    let (mut a, mut b) = (base(&h), base(&h));
    (a.session, b.session) = (Some("a"), Some("b"));
    assert_ne!(canonical(&a), canonical(&b));
}

#[test]
fn fields_are_length_prefixed() {
    let h = HeaderMap::new();
    let (mut a, mut b) = (base(&h), base(&h));
    (a.route, a.principal) = ("/mcpa", "nonymous");
    (b.route, b.principal) = ("/mcp", "anonymous");
    assert_ne!(canonical(&a), canonical(&b), "the boundary between fields moved");
    let one = headers(&[("mcp-name", "a")]);
    let two = headers(&[("mcp-nam", "ea")]);
    assert_ne!(canonical(&base(&one)), canonical(&base(&two)));
}

#[test]
fn headers_are_sorted_by_name_and_values_keep_their_order() {
    let ab = headers(&[("mcp-method", "tools/call"), ("accept", "application/json")]);
    let ba = headers(&[("accept", "application/json"), ("mcp-method", "tools/call")]);
    assert_eq!(canonical(&base(&ab)), canonical(&base(&ba)));
    let xy = headers(&[("accept", "x"), ("accept", "y")]);
    let yx = headers(&[("accept", "y"), ("accept", "x")]);
    assert_ne!(canonical(&base(&xy)), canonical(&base(&yx)));
}

#[test]
fn a_mac_verifies_under_any_listed_secret_and_nothing_else() {
    let h = headers(&[("mcp-method", "tools/call")]);
    let old = Keys::derive(&[b"the old secret, 16+ bytes".to_vec()]);
    let tag = old.sign(&base(&h));
    assert!(old.verify(&base(&h), &tag));
    let rotated =
        Keys::derive(&[b"the new secret, 16+ bytes".to_vec(), b"the old secret, 16+ bytes".to_vec()]);
    assert!(rotated.verify(&base(&h), &tag), "the old secret still verifies");
    assert!(!old.verify(&base(&h), &rotated.sign(&base(&h))), "the new secret signs");
    let mut bad = tag;
    bad[31] ^= 1;
    assert!(!old.verify(&base(&h), &bad));
    assert!(!old.verify(&base(&h), &tag[..16]), "a truncated tag");
    let mut later = base(&h);
    later.timestamp_ms += 1;
    assert!(!old.verify(&later, &tag));
}

#[test]
fn the_mac_key_is_derived_not_the_secret() {
    let secret = b"the old secret, 16+ bytes";
    let h = HeaderMap::new();
    let mut raw = HmacSha256::new_from_slice(secret).unwrap();
    raw.update(&canonical(&base(&h)));
    let raw: [u8; 32] = raw.finalize().into_bytes().into();
    assert_ne!(Keys::derive(&[secret.to_vec()]).sign(&base(&h)), raw);
}

#[test]
fn the_window_is_inclusive_and_symmetric() {
    let now = 10_000_000;
    assert!(in_window(now, now));
    assert!(in_window(now - WINDOW_MS, now));
    assert!(in_window(now + WINDOW_MS, now));
    assert!(!in_window(now - WINDOW_MS - 1, now));
    assert!(!in_window(now + WINDOW_MS + 1, now));
    assert!(!in_window(0, now));
}

#[test]
fn a_seen_pair_is_refused_until_its_timestamp_left_the_window() {
    let mut seen = Seen::new(8);
    let now = 10_000_000;
    assert_eq!(seen.insert(NONCE, now, now), Ok(()));
    assert_eq!(seen.insert(NONCE, now, now + 1), Err(Unseen::Replayed));
    assert_eq!(seen.insert(NONCE, now + 1, now + 1), Ok(()), "another timestamp, another pair");
    // Still remembered while its timestamp could pass the window check...
    assert_eq!(seen.insert(NONCE, now, now + WINDOW_MS), Err(Unseen::Replayed));
    assert_eq!(seen.insert(NONCE, now, now + 2 * WINDOW_MS), Err(Unseen::Replayed));
    // ...and forgotten after, when the window check refuses it anyway.
    assert!(!in_window(now, now + 2 * WINDOW_MS + 2));
    assert_eq!(seen.insert([1; NONCE_LEN], now + 2 * WINDOW_MS, now + 2 * WINDOW_MS + 2), Ok(()));
    assert_eq!(seen.len(), 1, "the two old pairs expired");
}

#[test]
fn a_full_set_refuses_rather_than_forgets() {
    let mut seen = Seen::new(3);
    let now = 10_000_000;
    for i in 0..3u8 {
        assert_eq!(seen.insert([i; NONCE_LEN], now, now), Ok(()));
    }
    assert_eq!(seen.insert([9; NONCE_LEN], now, now + 1), Err(Unseen::Full));
    assert_eq!(seen.insert([0; NONCE_LEN], now, now + 1), Err(Unseen::Replayed), "still remembered");
    assert_eq!(seen.len(), 3);
    assert_eq!(seen.insert([9; NONCE_LEN], now + 2 * WINDOW_MS, now + 2 * WINDOW_MS + 1), Ok(()));
    assert_eq!(seen.len(), 1);
}
