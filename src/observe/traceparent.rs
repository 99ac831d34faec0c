//! W3C Trace Context (`traceparent`, `tracestate`): read strictly from a
//! client, and the gateway's own hop sent upstream with a span id of its own.

use std::sync::Arc;

/// `tracestate` longer than this is dropped (the W3C limit a vendor must propagate).
pub const MAX_TRACESTATE: usize = 512;
/// List members of a `tracestate` at most.
const MAX_MEMBERS: usize = 32;

/// A client's trace context, as validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parent {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub flags: u8,
}

/// The gateway's hop of a trace: its span (the upstream's parent) and the
/// client's span it continues, if any.
#[derive(Debug, Clone)]
pub struct Hop {
    pub trace_id: [u8; 16],
    /// The client's span; `None` when the gateway started the trace.
    pub parent: Option<[u8; 8]>,
    /// The gateway's span: sent upstream as the parent.
    pub span: [u8; 8],
    pub flags: u8,
    pub state: Option<Arc<str>>,
}

impl Hop {
    /// The hop continuing `parent` (with its `tracestate`, if valid).
    pub fn child_of(parent: &Parent, state: Option<&str>) -> Hop {
        Hop {
            trace_id: parent.trace_id,
            parent: Some(parent.span_id),
            span: new_span_id(),
            flags: parent.flags & 0x01,
            state: state.filter(|s| valid_tracestate(s)).map(Arc::from),
        }
    }

    /// A new trace started by the gateway (sampled).
    pub fn root() -> Hop {
        let mut trace_id = [0u8; 16];
        while trace_id == [0; 16] {
            rand::RngCore::fill_bytes(&mut rand::thread_rng(), &mut trace_id);
        }
        Hop { trace_id, parent: None, span: new_span_id(), flags: 0x01, state: None }
    }

    /// The `traceparent` the upstream gets: version 00, the gateway's span.
    pub fn traceparent(&self) -> String {
        let mut s = String::with_capacity(55);
        s.push_str("00-");
        hex_into(&mut s, &self.trace_id);
        s.push('-');
        hex_into(&mut s, &self.span);
        s.push('-');
        hex_into(&mut s, &[self.flags]);
        s
    }
}

fn new_span_id() -> [u8; 8] {
    let mut id = [0u8; 8];
    while id == [0; 8] {
        rand::RngCore::fill_bytes(&mut rand::thread_rng(), &mut id);
    }
    id
}

fn hex_into(s: &mut String, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for b in bytes {
        s.push(HEX[(b >> 4) as usize] as char);
        s.push(HEX[(b & 0x0f) as usize] as char);
    }
}

/// Lowercase hex only (W3C: uppercase is invalid).
fn unhex<const N: usize>(text: &[u8]) -> Option<[u8; N]> {
    if text.len() != 2 * N {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; N];
    for (i, pair) in text.chunks_exact(2).enumerate() {
        out[i] = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(out)
}

/// Parses a `traceparent` value strictly: `version-traceid-parentid-flags`,
/// lowercase hex of exactly 2, 32, 16 and 2 digits, neither id all zeros,
/// version `ff` invalid; version `00` is exactly 55 bytes, a later version
/// may carry more after a `-` (ignored: the upstream gets version 00).
pub fn parse(value: &str) -> Option<Parent> {
    let b = value.as_bytes();
    if b.len() < 55 || b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
        return None;
    }
    let version = unhex::<1>(&b[..2])?[0];
    match version {
        0xff => return None,
        0x00 if b.len() != 55 => return None,
        _ if b.len() > 55 && b[55] != b'-' => return None,
        _ => {}
    }
    let trace_id = unhex::<16>(&b[3..35])?;
    let span_id = unhex::<8>(&b[36..52])?;
    let flags = unhex::<1>(&b[53..55])?[0];
    if trace_id == [0; 16] || span_id == [0; 8] {
        return None;
    }
    Some(Parent { trace_id, span_id, flags })
}

/// A `tracestate` worth passing on: at most 512 bytes of printable ASCII,
/// at most 32 `key=value` members.
pub fn valid_tracestate(value: &str) -> bool {
    value.len() <= MAX_TRACESTATE
        && value.bytes().all(|c| (0x20..=0x7e).contains(&c))
        && value.split(',').filter(|m| !m.trim().is_empty()).count() <= MAX_MEMBERS
        && value.split(',').map(str::trim).filter(|m| !m.is_empty()).all(|m| {
            m.split_once('=').is_some_and(|(k, v)| {
                !k.is_empty()
                    && k.len() <= 256
                    && k.bytes()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b"_-*/@".contains(&c))
                    && !v.is_empty()
                    && !v.contains('=')
            })
        })
}

/// The client's trace context from its headers: exactly one valid
/// `traceparent` (several are invalid), and one `tracestate`.
pub fn from_headers(headers: &http::HeaderMap) -> Option<Hop> {
    let mut values = headers.get_all("traceparent").iter();
    let (Some(value), None) = (values.next(), values.next()) else { return None };
    let parent = parse(value.to_str().ok()?)?;
    let mut states = headers.get_all("tracestate").iter();
    let state = match (states.next(), states.next()) {
        (Some(s), None) => s.to_str().ok(),
        _ => None,
    };
    Some(Hop::child_of(&parent, state))
}

/// The values an upstream request made for a hop carries.
pub struct Sent {
    pub traceparent: String,
    pub tracestate: Option<Arc<str>>,
}

impl Hop {
    pub fn sent(&self) -> Sent {
        Sent { traceparent: self.traceparent(), tracestate: self.state.clone() }
    }
}

/// `headers` with the hop's `traceparent` (and `tracestate`) in place of any
/// already there.
pub fn with_headers<'a>(headers: &[(&'a str, &'a str)], sent: &'a Sent) -> Vec<(&'a str, &'a str)> {
    let trace = |k: &str| k.eq_ignore_ascii_case("traceparent") || k.eq_ignore_ascii_case("tracestate");
    let mut all: Vec<(&str, &str)> = headers.iter().filter(|(k, _)| !trace(k)).copied().collect();
    all.push(("traceparent", &sent.traceparent));
    if let Some(state) = &sent.tracestate {
        all.push(("tracestate", state));
    }
    all
}

/// Puts the current hop's `traceparent` (and `tracestate`) in an upstream
/// request's `_meta`, in place of the client's: for the bodies the gateway writes.
pub fn into_meta(meta: &mut serde_json::Map<String, serde_json::Value>) {
    if let Some(hop) = crate::observe::hop() {
        meta.insert("traceparent".into(), hop.traceparent().into());
        match hop.state {
            Some(state) => meta.insert("tracestate".into(), state.to_string().into()),
            None => meta.remove("tracestate"),
        };
    }
}

/// A body passed through as received, with the client's `_meta.traceparent`
/// (`client`, a valid one) replaced by the hop's, byte for byte otherwise.
/// Only when the value occurs once, unescaped, in the body: anything else
/// is left as it is (the header still carries the hop).
pub fn swap_in_body(body: &bytes::Bytes, client: &str, hop: &Hop) -> Option<bytes::Bytes> {
    let quoted = format!("\"{client}\"");
    let mut at = memchr::memmem::find_iter(body, quoted.as_bytes());
    let (Some(i), None) = (at.next(), at.next()) else { return None };
    let ours = hop.traceparent();
    let mut out = Vec::with_capacity(body.len() + ours.len());
    out.extend_from_slice(&body[..i + 1]);
    out.extend_from_slice(ours.as_bytes());
    out.extend_from_slice(&body[i + 1 + client.len()..]);
    Some(out.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn parses_the_w3c_example() {
        let p = parse(GOOD).unwrap();
        assert_eq!(p.flags, 1);
        assert_eq!(p.span_id, [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]);
        let hop = Hop::child_of(&p, Some("congo=t61rcWkgMzE"));
        let sent = hop.traceparent();
        assert_eq!(sent.len(), 55);
        assert!(sent.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"), "{sent}");
        assert!(!sent.contains("00f067aa0ba902b7"), "a span of its own: {sent}");
        assert_eq!(hop.parent, Some(p.span_id));
        assert_eq!(parse(&sent).unwrap().trace_id, p.trace_id);
        assert_eq!(hop.state.as_deref(), Some("congo=t61rcWkgMzE"));
    }

    #[test]
    fn refuses_anything_else() {
        for bad in [
            "",
            &GOOD[..54],
            &format!("{GOOD}-"),
            &format!("{GOOD}0"),
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0x",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
        ] {
            assert_eq!(parse(bad), None, "{bad}");
        }
        assert!(parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-future").is_some());
    }

    #[test]
    fn tracestate_is_bounded() {
        assert!(valid_tracestate("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"));
        assert!(!valid_tracestate("rojo"));
        assert!(!valid_tracestate("Rojo=1"));
        assert!(!valid_tracestate("a=\u{7f}"));
        assert!(!valid_tracestate(&"a=b,".repeat(33)));
        assert!(!valid_tracestate(&format!("a={}", "x".repeat(MAX_TRACESTATE))));
    }

    #[test]
    fn swapped_in_a_body_only_when_unambiguous() {
        let hop = Hop::child_of(&parse(GOOD).unwrap(), None);
        let body = bytes::Bytes::from(format!(r#"{{"params":{{"_meta":{{"traceparent":"{GOOD}"}}}}}}"#));
        let out = swap_in_body(&body, GOOD, &hop).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out),
            String::from_utf8_lossy(&body).replace(GOOD, &hop.traceparent())
        );
        let twice = bytes::Bytes::from(format!(r#"{{"a":"{GOOD}","_meta":{{"traceparent":"{GOOD}"}}}}"#));
        assert!(swap_in_body(&twice, GOOD, &hop).is_none());
    }

    #[test]
    fn one_header_only() {
        let mut h = http::HeaderMap::new();
        h.append("traceparent", GOOD.parse().unwrap());
        assert!(from_headers(&h).is_some());
        h.append("traceparent", GOOD.parse().unwrap());
        assert!(from_headers(&h).is_none(), "two traceparent headers");
    }
}
