//! Upstream header values as the routing file gives them (`[upstreams.headers]`):
//! a [`Secret`] is a value fit for a header, redacted in `Debug`, marked
//! sensitive; [`refused_name`] says which headers no configuration may set.
//! Plain data: [`crate::upstream::credentials`] adds them to requests.

use http::{HeaderName, HeaderValue};

/// The longest value a header may carry (an upstream's head limit is usually 8–16 KiB in all).
const MAX_VALUE_BYTES: usize = 8192;

/// A header value that must not be shown: redacted in `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(HeaderValue);

impl Secret {
    /// A value fit for a header: visible ASCII (and spaces) only, trimmed.
    pub fn new(value: &str) -> Result<Secret, &'static str> {
        let value = value.trim();
        if value.is_empty() {
            return Err("is empty");
        }
        if value.len() > MAX_VALUE_BYTES {
            return Err("is longer than 8192 bytes");
        }
        match HeaderValue::from_str(value) {
            Ok(mut v) if v.to_str().is_ok() => {
                v.set_sensitive(true);
                Ok(Secret(v))
            }
            _ => Err("is not a valid header value (visible ASCII only)"),
        }
    }

    pub fn as_str(&self) -> &str {
        self.0.to_str().unwrap_or_default()
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// Headers a configured upstream header may not set: hop-by-hop ones, the
/// framing, and those the gateway writes itself (the MCP ones, tracing).
pub fn refused_name(name: &HeaderName) -> bool {
    let n = name.as_str();
    const REFUSED: &[&str] = &[
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "host",
        "content-length",
        "content-type",
        "accept",
        "last-event-id",
        "traceparent",
        "tracestate",
    ];
    REFUSED.contains(&n) || n.starts_with("mcp-") || n.starts_with(':')
}
