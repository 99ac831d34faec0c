//! Signed forwarded retries: the cluster secret never crosses the wire. A
//! forwarding replica sends an HMAC-SHA256 over a canonical encoding of what
//! the owner acts on (audience, route, principal, body digest, MCP headers,
//! timestamp, nonce, and for a legacy client's answer its session); the owner checks it in constant time, refuses
//! timestamps outside [`WINDOW_MS`], and refuses a (nonce, timestamp) it has
//! seen ([`Seen`]).

use std::collections::{HashSet, VecDeque};
use std::time::{SystemTime, UNIX_EPOCH};

use hkdf::Hkdf;
use hmac::{Hmac, Mac};
use http::HeaderMap;
use sha2::{Digest, Sha256};

/// How far a forwarded retry's timestamp may be from the owner's clock.
pub const WINDOW_MS: u64 = 30_000;

/// Forwarded retries remembered at once (each for about two windows); past
/// that the owner refuses rather than forgets. Only requests with a valid
/// signature get in, so only the replicas themselves can fill it.
pub const MAX_SEEN: usize = 65_536;

/// Random bytes per forwarded retry.
pub const NONCE_LEN: usize = 16;

/// HKDF labels: the MAC key is derived from the secret, never the secret itself.
const KDF_SALT: &[u8] = b"sessionless cluster";
const KDF_INFO: &[u8] = b"sessionless forwarded retry mac v1";
/// First field of every signed encoding (its version).
const DOMAIN: &[u8] = b"sessionless forwarded retry v1";

type HmacSha256 = Hmac<Sha256>;

/// What a forwarded retry's MAC covers.
pub struct Signed<'a> {
    /// The owner's advertised internal address: a request signed for one
    /// replica is not valid at another.
    pub audience: &'a str,
    pub route: &'a str,
    pub principal: &'a str,
    /// The MCP headers forwarded ([`crate::front::headers::is_mcp`]), all of them.
    pub headers: &'a HeaderMap,
    /// SHA-256 of the body, sent in its own header so that the owner checks
    /// the MAC before it reads a byte of the body.
    pub body_digest: &'a [u8; 32],
    pub timestamp_ms: u64,
    pub nonce: &'a [u8; NONCE_LEN],
    /// A translated legacy session's id, with an answer to a question
    /// pushed on it; `None` for everything else (whose encoding is then the
    /// one replicas without this field sign).
    pub session: Option<&'a str>,
}

/// The digest a request's body is signed by.
pub fn body_digest(body: &[u8]) -> [u8; 32] {
    Sha256::digest(body).into()
}

/// The bytes the MAC is computed over: every field length-prefixed (u64,
/// big-endian), headers sorted by name (values of one name in their order),
/// so no two different requests share an encoding. The session, when there
/// is one, comes last, after the fixed-length nonce and under its own label.
pub fn canonical(s: &Signed<'_>) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    let mut field = |bytes: &[u8]| {
        out.extend_from_slice(&(bytes.len() as u64).to_be_bytes());
        out.extend_from_slice(bytes);
    };
    field(DOMAIN);
    field(super::RETRY_PATH.as_bytes());
    field(s.audience.as_bytes());
    field(s.route.as_bytes());
    field(s.principal.as_bytes());
    field(s.body_digest);
    let mut headers: Vec<(&str, &[u8])> = s.headers.iter().map(|(k, v)| (k.as_str(), v.as_bytes())).collect();
    headers.sort_by(|a, b| a.0.cmp(b.0));
    field(&(headers.len() as u64).to_be_bytes());
    for (name, value) in headers {
        field(name.as_bytes());
        field(value);
    }
    field(&s.timestamp_ms.to_be_bytes());
    field(s.nonce);
    if let Some(session) = s.session {
        field(b"session");
        field(session.as_bytes());
    }
    out
}

/// MAC keys derived from the cluster secrets, newest first.
pub struct Keys(Vec<HmacSha256>);

impl Keys {
    pub fn derive(secrets: &[Vec<u8>]) -> Keys {
        Keys(secrets.iter().map(|s| derive(s)).collect())
    }

    /// The MAC of `s` under the newest key.
    pub fn sign(&self, s: &Signed<'_>) -> [u8; 32] {
        let mut mac = self.0[0].clone();
        mac.update(&canonical(s));
        mac.finalize().into_bytes().into()
    }

    /// Whether `tag` is `s`'s MAC under any key (each compared in constant time).
    pub fn verify(&self, s: &Signed<'_>, tag: &[u8]) -> bool {
        let bytes = canonical(s);
        self.0.iter().any(|key| {
            let mut mac = key.clone();
            mac.update(&bytes);
            mac.verify_slice(tag).is_ok()
        })
    }
}

fn derive(secret: &[u8]) -> HmacSha256 {
    let mut key = [0u8; 32];
    Hkdf::<Sha256>::new(Some(KDF_SALT), secret)
        .expand(KDF_INFO, &mut key)
        .expect("32 bytes is a valid HKDF length");
    HmacSha256::new_from_slice(&key).expect("HMAC takes any key length")
}

pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Whether a timestamp is within [`WINDOW_MS`] of `now_ms`, either side.
pub fn in_window(timestamp_ms: u64, now_ms: u64) -> bool {
    timestamp_ms.abs_diff(now_ms) <= WINDOW_MS
}

/// Why a signed request was not let through [`Seen::insert`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unseen {
    Replayed,
    Full,
}

/// The (nonce, timestamp) pairs accepted lately, bounded. An entry is kept
/// until `2 × WINDOW_MS` after it was accepted: by then its timestamp is out
/// of the window, so forgetting it lets nothing through. Entries expire in
/// the order they came (their expiry is set by the receiving clock).
pub struct Seen {
    set: HashSet<([u8; NONCE_LEN], u64)>,
    order: VecDeque<(u64, [u8; NONCE_LEN], u64)>,
    cap: usize,
}

impl Seen {
    pub fn new(cap: usize) -> Seen {
        Seen { set: HashSet::new(), order: VecDeque::new(), cap }
    }

    /// Records a (nonce, timestamp) accepted at `now_ms`; refuses one seen
    /// before, and any when full of unexpired entries.
    pub fn insert(&mut self, nonce: [u8; NONCE_LEN], timestamp_ms: u64, now_ms: u64) -> Result<(), Unseen> {
        while let Some(&(expires, n, ts)) = self.order.front() {
            if expires >= now_ms {
                break;
            }
            self.order.pop_front();
            self.set.remove(&(n, ts));
        }
        if self.set.contains(&(nonce, timestamp_ms)) {
            return Err(Unseen::Replayed);
        }
        if self.set.len() >= self.cap {
            return Err(Unseen::Full);
        }
        self.set.insert((nonce, timestamp_ms));
        self.order.push_back((now_ms + 2 * WINDOW_MS, nonce, timestamp_ms));
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.set.len()
    }

    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }
}

#[cfg(test)]
mod tests;
