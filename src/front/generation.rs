//! Which generation a client message speaks, decided per message (DESIGN §9):
//! a 2026-07-28 marker first (a version header that is not a legacy one, or a
//! `_meta` protocol version), whatever else the message carries; otherwise a
//! legacy version header, an `initialize`, or an `Mcp-Session-Id` makes it
//! legacy; anything else is taken as modern and meets the modern rules.

use http::HeaderMap;

use super::headers::{PROTOCOL_VERSION, SESSION_ID};
use super::strict::Message;

/// Which protocol generation a client message, or an upstream, speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Generation {
    /// MCP 2026-07-28: stateless, `_meta` on every request.
    Modern,
    /// MCP 2025-03-26 … 2025-11-25: `initialize` and `Mcp-Session-Id`.
    Legacy,
}

impl Generation {
    pub fn as_str(self) -> &'static str {
        match self {
            Generation::Modern => "modern",
            Generation::Legacy => "legacy",
        }
    }
}

/// The session-era revisions a client may name in `MCP-Protocol-Version`.
pub use crate::versions::LEGACY as LEGACY_VERSIONS;

/// What the headers alone say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ByHeaders {
    /// A modern version header (or an unusable one, which the modern rules refuse).
    Modern,
    /// A legacy version header, or none but a session id: legacy unless the
    /// body carries a `_meta` protocol version.
    Legacy,
    /// No marker in the headers.
    Unmarked,
}

pub fn by_headers(headers: &HeaderMap) -> ByHeaders {
    let mut versions = headers.get_all(&PROTOCOL_VERSION).iter();
    match (versions.next(), versions.next()) {
        (Some(v), None) => {
            let v = v.to_str().unwrap_or("").trim_matches([' ', '\t']);
            if LEGACY_VERSIONS.contains(&v) {
                ByHeaders::Legacy
            } else {
                ByHeaders::Modern
            }
        }
        (Some(_), Some(_)) => ByHeaders::Modern,
        (None, _) if headers.contains_key(&SESSION_ID) => ByHeaders::Legacy,
        (None, _) => ByHeaders::Unmarked,
    }
}

/// The generation of a POST with these headers and this body.
/// The body is the one strict read of it ([`super::strict`]); a body it
/// refused is judged by its headers alone ([`of_headers`]).
pub fn of_post(headers: &HeaderMap, body: &Message<'_>) -> Generation {
    let by = by_headers(headers);
    if by == ByHeaders::Modern {
        return Generation::Modern;
    }
    let item = body.single();
    if item.is_some_and(|i| i.has_meta_version) {
        return Generation::Modern;
    }
    if by == ByHeaders::Legacy || item.is_some_and(|i| i.method.as_deref() == Some("initialize")) {
        return Generation::Legacy;
    }
    // A legacy batch (2025-03-26) carries a session id, so `by` said so.
    Generation::Modern
}

/// The generation of a POST whose body could not be read.
pub fn of_headers(headers: &HeaderMap) -> Generation {
    match by_headers(headers) {
        ByHeaders::Legacy => Generation::Legacy,
        ByHeaders::Modern | ByHeaders::Unmarked => Generation::Modern,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(pairs: &[(&'static str, &str)]) -> HeaderMap {
        pairs.iter().map(|(k, v)| (http::HeaderName::from_static(k), v.parse().unwrap())).collect()
    }

    #[test]
    fn modern_markers_win_over_legacy_ones() {
        let init = br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}"#;
        let modern_meta = br#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#;
        for (headers, body, want) in [
            (h(&[("mcp-protocol-version", "2026-07-28")]), &init[..], Generation::Modern),
            (h(&[("mcp-protocol-version", "2026-07-28"), ("mcp-session-id", "x")]), init, Generation::Modern),
            (h(&[("mcp-protocol-version", "2099-01-01")]), init, Generation::Modern),
            (h(&[("mcp-session-id", "x")]), modern_meta, Generation::Modern),
            (h(&[("mcp-protocol-version", "2025-06-18")]), modern_meta, Generation::Modern),
            (h(&[]), init, Generation::Legacy),
            (h(&[("mcp-protocol-version", "2025-11-25")]), b"{}", Generation::Legacy),
            (h(&[("mcp-protocol-version", "2025-03-26")]), b"[1,2]", Generation::Legacy),
            (h(&[("mcp-session-id", "x")]), b"[{\"jsonrpc\":\"2.0\"}]", Generation::Legacy),
            (h(&[]), b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\"}", Generation::Modern),
        ] {
            let read = super::super::strict::read(body).unwrap();
            assert_eq!(of_post(&headers, &read), want, "{headers:?} {}", String::from_utf8_lossy(body));
        }
        assert_eq!(of_headers(&h(&[("mcp-session-id", "x")])), Generation::Legacy, "not JSON: by headers");
        assert_eq!(of_headers(&h(&[])), Generation::Modern);
    }

    #[test]
    fn an_escaped_method_name_is_still_read() {
        let body = br#"{"jsonrpc":"2.0","id":1,"method":"initi\u0061lize"}"#;
        assert_eq!(of_post(&h(&[]), &super::super::strict::read(body).unwrap()), Generation::Legacy);
    }
}
