//! A merged list's cursor ([`Purpose::FederatedCursor`]): the members that
//! continue, each with its own cursor (itself as the member's half sealed
//! it), the route's member set when the walk began, the first page's cache
//! fields, and an expiry. Bound to the route, the caller and the method;
//! usable on any replica sharing the keys; refused once the member set
//! changed.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::Target;
use crate::bridge::Caller;
use crate::error::Error;
use crate::front::Call;
use crate::seal::Sealer;
use crate::sealed::{self, Bindings, Claims, Purpose, Sealed};

/// How long a merged list's cursor may be followed.
const LIFETIME_MS: u64 = 60 * 60 * 1000;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FederatedCursor {
    #[serde(rename = "r")]
    pub route: String,
    #[serde(rename = "p")]
    pub principal: String,
    #[serde(rename = "m")]
    pub method: String,
    /// The route's members (and their upstreams) when the walk began.
    #[serde(rename = "ms")]
    pub members: String,
    #[serde(rename = "x")]
    pub expires_ms: u64,
    /// (member, the member's own cursor) for each member that continues.
    #[serde(rename = "n")]
    pub next: Vec<(String, String)>,
    /// The first page's smallest `ttlMs`, kept on every page.
    #[serde(rename = "t")]
    pub ttl_ms: Option<u64>,
    /// Whether any member's first page was `private`.
    #[serde(rename = "pv")]
    pub private: bool,
}

impl Claims for FederatedCursor {
    const PURPOSE: Purpose = Purpose::FederatedCursor;

    fn bindings(&self) -> Bindings<'_> {
        Bindings {
            route: &self.route,
            principal: &self.principal,
            method: Some(&self.method),
            expires_ms: Some(self.expires_ms),
            instance: None,
            owner: None,
        }
    }

    /// No blob of this kind was ever sealed in format 1.
    fn v1_aad(_: &sealed::Expect<'_>) -> Vec<u8> {
        b"sessionless-sealed\0federated-cursor\0no-format-1".to_vec()
    }
}

/// The member set a cursor is valid for: names and upstreams, in order.
fn member_set(target: &Target) -> String {
    let names: Vec<String> = target
        .members
        .iter()
        .map(|m| {
            format!(
                "{}={}",
                m.name,
                m.target.route.upstream.urls.iter().map(|u| u.to_string()).collect::<Vec<_>>().join(" ")
            )
        })
        .collect();
    names.join(",")
}

fn expect<'a>(target: &'a Target, call: &'a Call, caller: &'a Caller, now_ms: u64) -> sealed::Expect<'a> {
    sealed::Expect {
        route: &target.route.id,
        principal: &caller.principal,
        method: call.method.as_str(),
        now_ms,
    }
}

/// Seals what the next page needs.
pub fn seal(
    sealer: &Sealer,
    target: &Target,
    call: &Call,
    caller: &Caller,
    next: Vec<(String, String)>,
    cache: super::Cache,
) -> Result<String, Error> {
    let claims = FederatedCursor {
        route: target.route.id.clone(),
        principal: caller.principal.clone(),
        method: call.method.as_str().into(),
        members: member_set(target),
        expires_ms: sealed::now_ms() + LIFETIME_MS,
        next,
        ttl_ms: cache.ttl_ms,
        private: cache.private,
    };
    Sealed::seal(sealer, &claims)
        .map_err(|_| Error::UpstreamInvalid("the members' cursors are too long to carry"))
}

/// A cursor that names a member set the route no longer has.
pub fn stale() -> Error {
    Error::InvalidParams { message: "invalid cursor".into(), data: Some(json!({"reason": "cursor_expired"})) }
}

/// Opens `params.cursor` of a merged list.
pub fn open(
    sealer: &Sealer,
    target: &Target,
    call: &Call,
    caller: &Caller,
    cursor: &Value,
) -> Result<FederatedCursor, Error> {
    let purpose = Purpose::FederatedCursor;
    let Value::String(cursor) = cursor else {
        return Err(sealed::Rejected::Malformed.error(purpose));
    };
    let expect = expect(target, call, caller, sealed::now_ms());
    let opened =
        Sealed::<FederatedCursor>::open(sealer, cursor, &expect).map_err(|why| why.error(purpose))?;
    let opened = opened.into_claims();
    if opened.members != member_set(target) {
        return Err(stale());
    }
    Ok(opened)
}
