//! Sealed claims: every value the gateway hands out and must get back
//! unaltered (`requestState`, pagination cursors, legacy session ids, the ids
//! of questions pushed to legacy clients) is one [`Sealed`] payload, with a
//! [`Purpose`] (bound into the associated data, so that no value opens as
//! another kind), a size cap, a format version, common bindings (route,
//! principal, method, expiry, upstream instance, owner replica) checked in
//! one place, and one [`Rejected`] enum mapped once to errors and metrics.
//! The crypto is [`crate::seal`]'s; the payloads are the cells'.
//!
//! Formats: a blob sealed since formats have versions is sealed under
//! [`Purpose::aad`] and its plaintext is `[FORMAT] ‖ JSON`. A blob sealed
//! before (format 1, a plain JSON object) was sealed under its kind's own
//! associated data ([`Claims::v1_aad`]) and still opens, so that a rolling
//! upgrade keeps flows, sessions, cursors and questions in flight.

mod carried;
mod rejected;
#[cfg(test)]
mod tests;
#[cfg(test)]
pub mod v1_fixtures;

use std::ops::Deref;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::seal::{SealError, Sealer};
pub use carried::Carried;
pub use rejected::Rejected;

/// The format new blobs are sealed in (the first byte of their plaintext).
pub const FORMAT: u8 = 2;
/// Blobs sealed before formats had versions: a JSON object, nothing before it.
pub const FORMAT_V1: u8 = 1;

/// What a sealed value is for. Each has its own associated data and size cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// A 2026 client's call paused on a legacy upstream (`requestState`).
    FlowState,
    /// A pagination cursor pinned to an upstream session.
    Cursor,
    /// The `Mcp-Session-Id` handed to a legacy client.
    LegacySession,
    /// A 2026 upstream's own `requestState`, enveloped.
    UpstreamState,
    /// The JSON-RPC id of a question pushed to a legacy client.
    Question,
    /// A federated route's pagination cursor: which members continue, with
    /// which cursors of theirs.
    FederatedCursor,
}

impl Purpose {
    pub const ALL: [Purpose; 6] = [
        Purpose::FlowState,
        Purpose::Cursor,
        Purpose::LegacySession,
        Purpose::UpstreamState,
        Purpose::Question,
        Purpose::FederatedCursor,
    ];

    /// Bound into every blob of this purpose (format 2 and later).
    pub fn aad(self) -> &'static [u8] {
        match self {
            Purpose::FlowState => b"sessionless-sealed\0request-state",
            Purpose::Cursor => b"sessionless-sealed\0cursor",
            Purpose::LegacySession => b"sessionless-sealed\0legacy-session",
            Purpose::UpstreamState => b"sessionless-sealed\0upstream-request-state",
            Purpose::Question => b"sessionless-sealed\0legacy-question",
            Purpose::FederatedCursor => b"sessionless-sealed\0federated-cursor",
        }
    }

    /// Blobs longer than this are refused before decrypting, and a payload
    /// that would seal longer is not sealed.
    pub fn max_len(self) -> usize {
        match self {
            // Replay mode carries the answers so far.
            Purpose::FlowState => 1 << 20,
            Purpose::Cursor => 64 << 10,
            // A header value (a sealed token is ~200 bytes).
            Purpose::LegacySession => 2048,
            Purpose::UpstreamState => 1 << 20,
            Purpose::Question => 1024,
            // Each continuing member's cursor is itself sealed.
            Purpose::FederatedCursor => 256 << 10,
        }
    }

    /// How the client knows the value, in error messages.
    pub fn what(self) -> &'static str {
        match self {
            Purpose::FlowState | Purpose::UpstreamState => "requestState",
            Purpose::Cursor | Purpose::FederatedCursor => "cursor",
            Purpose::LegacySession => "session id",
            Purpose::Question => "question id",
        }
    }
}

/// What the request presenting a sealed value is: its bindings must match.
#[derive(Debug, Clone, Copy)]
pub struct Expect<'a> {
    pub route: &'a str,
    pub principal: &'a str,
    /// The call's method (`""` where the kind binds none).
    pub method: &'a str,
    /// Unix milliseconds.
    pub now_ms: u64,
}

/// The replica holding what a value refers to (a parked flow, a question's stream).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner<'a> {
    /// Its instance id.
    pub instance: &'a str,
    /// Its internal address, in cluster mode.
    pub address: Option<&'a str>,
}

/// A payload's common bindings. `None`: the kind has no such binding.
#[derive(Debug, Clone, Copy)]
pub struct Bindings<'a> {
    pub route: &'a str,
    pub principal: &'a str,
    pub method: Option<&'a str>,
    /// Unix milliseconds.
    pub expires_ms: Option<u64>,
    /// The upstream instance (its URL) holding the session or call.
    pub instance: Option<&'a str>,
    pub owner: Option<Owner<'a>>,
}

/// A kind of sealed payload. Its fields have readable names in Rust and
/// short ones on the wire (`#[serde(rename)]`), the same in every format.
pub trait Claims: Serialize + DeserializeOwned {
    const PURPOSE: Purpose;

    fn bindings(&self) -> Bindings<'_>;

    /// The associated data a format-1 blob of this kind was sealed with,
    /// for the request `expect` describes.
    fn v1_aad(expect: &Expect<'_>) -> Vec<u8>;

    /// A format-1 payload, opened: takes what its associated data bound
    /// (and the payload did not carry) from `expect`.
    fn adopt_v1(&mut self, _expect: &Expect<'_>) {}
}

/// A payload of kind `C`, opened (or about to be sealed), with its format.
#[derive(Debug, Clone, PartialEq)]
pub struct Sealed<C> {
    format: u8,
    claims: C,
}

impl<C> Deref for Sealed<C> {
    type Target = C;
    fn deref(&self) -> &C {
        &self.claims
    }
}

impl<C: Claims> Sealed<C> {
    /// Seals `claims` in the current format; refused when the blob would be
    /// longer than its purpose allows ([`Rejected::TooLarge`]).
    pub fn seal(sealer: &Sealer, claims: &C) -> Result<String, Rejected> {
        let mut plaintext = vec![FORMAT];
        serde_json::to_writer(&mut plaintext, claims).expect("sealed claims serialise");
        let blob = sealer.seal(C::PURPOSE.aad(), &plaintext);
        if blob.len() > C::PURPOSE.max_len() {
            return Err(Rejected::TooLarge);
        }
        Ok(blob)
    }

    /// Opens `blob` and checks every binding against `expect`.
    pub fn open(sealer: &Sealer, blob: &str, expect: &Expect<'_>) -> Result<Sealed<C>, Rejected> {
        let opened = Self::unseal(sealer, blob, expect)?;
        opened.check(expect)?;
        Ok(opened)
    }

    /// Opens `blob` without checking its bindings ([`Sealed::check`]). The
    /// `expect` is needed to open a format-1 blob whose associated data
    /// bound the request.
    pub fn unseal(sealer: &Sealer, blob: &str, expect: &Expect<'_>) -> Result<Sealed<C>, Rejected> {
        let purpose = C::PURPOSE;
        if blob.len() > purpose.max_len() {
            return Err(Rejected::TooLarge);
        }
        let v1 = C::v1_aad(expect);
        let mut aads: Vec<&[u8]> = vec![purpose.aad(), &v1];
        // Only a blob short enough to be another purpose's is tried as one.
        let others = Purpose::ALL.into_iter().filter(|p| *p != purpose && blob.len() <= p.max_len());
        aads.extend(others.map(|p| -> &[u8] { p.aad() }));
        let (which, plaintext) = sealer.open_first(&aads, blob).map_err(|e| match e {
            SealError::Malformed => Rejected::Malformed,
            SealError::UnknownKey => Rejected::UnknownKey,
            SealError::Forged => Rejected::Forged,
        })?;
        let (format, json) = match (which, plaintext.split_first()) {
            (0, Some((&FORMAT, json))) => (FORMAT, json),
            (0, _) => return Err(Rejected::UnknownVersion),
            (1, Some((b'{', _))) => (FORMAT_V1, &plaintext[..]),
            (1, _) => return Err(Rejected::Malformed),
            _ => return Err(Rejected::WrongPurpose),
        };
        let mut claims: C = serde_json::from_slice(json).map_err(|_| Rejected::Malformed)?;
        if format == FORMAT_V1 {
            claims.adopt_v1(expect);
        }
        Ok(Sealed { format, claims })
    }

    /// Whether it was issued for this route and method at all.
    pub fn check_call(&self, expect: &Expect<'_>) -> Result<(), Rejected> {
        let b = self.claims.bindings();
        if b.route != expect.route {
            return Err(Rejected::OtherRoute);
        }
        if b.method.is_some_and(|m| m != expect.method) {
            return Err(Rejected::OtherRequest);
        }
        Ok(())
    }

    /// Every binding: route, method, principal, expiry.
    pub fn check(&self, expect: &Expect<'_>) -> Result<(), Rejected> {
        self.check_call(expect)?;
        let b = self.claims.bindings();
        if b.principal != expect.principal {
            return Err(Rejected::OtherPrincipal);
        }
        if b.expires_ms.is_some_and(|exp| expect.now_ms >= exp) {
            return Err(Rejected::Expired);
        }
        Ok(())
    }

    /// Whether the owner it names is this replica (`instance`, at `address`
    /// in cluster mode). A kind without an owner is owned nowhere.
    pub fn owned_by(&self, instance: &str, address: Option<&str>) -> bool {
        self.claims.bindings().owner.is_some_and(|o| o.instance == instance && o.address == address)
    }

    pub fn format(&self) -> u8 {
        self.format
    }

    pub fn into_claims(self) -> C {
        self.claims
    }
}

/// Unix time in milliseconds: the clock of [`Expect::now_ms`].
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
