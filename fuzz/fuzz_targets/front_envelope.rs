//! `front::strict::read`, then `front::generation::of_post` and `front::parse`, on arbitrary bodies and
//! header values: they must never panic.
//!
//! Input: byte 0 holds flags, the rest is the body. Flag 1 adds a supported
//! `MCP-Protocol-Version`; flag 2 mirrors the body's method and name into
//! `Mcp-Method` and `Mcp-Name` (so validation gets past them); flag 4 takes
//! fuzzed header values from after the body's last NUL (split by 0x1f).
#![no_main]

use http::{HeaderMap, HeaderName, HeaderValue};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

const FUZZED: [&str; 5] =
    ["mcp-protocol-version", "mcp-method", "mcp-name", "mcp-param-region", "content-type"];

fn add(headers: &mut HeaderMap, name: &'static str, value: &[u8]) {
    if let Ok(v) = HeaderValue::from_bytes(value) {
        headers.append(HeaderName::from_static(name), v);
    }
}

fuzz_target!(|input: &[u8]| {
    let [flags, rest @ ..] = input else { return };
    let (body, extra) = match rest.iter().rposition(|&b| b == 0) {
        Some(i) if flags & 4 != 0 => (&rest[..i], &rest[i + 1..]),
        _ => (rest, &[][..]),
    };
    let mut headers = HeaderMap::new();
    if flags & 1 != 0 {
        add(&mut headers, "mcp-protocol-version", sessionless::front::SUPPORTED_VERSIONS[0].as_bytes());
    }
    if flags & 2 != 0 {
        if let Ok(v) = serde_json::from_slice::<Value>(body) {
            if let Some(m) = v.get("method").and_then(Value::as_str) {
                add(&mut headers, "mcp-method", m.as_bytes());
            }
            let params = v.get("params");
            if let Some(n) = params.and_then(|p| p.get("name").or(p.get("uri"))).and_then(Value::as_str) {
                add(&mut headers, "mcp-name", n.as_bytes());
            }
        }
    }
    // (Only with the flag: splitting no bytes still yields one empty value,
    // which made every other input carry an empty version header.)
    if flags & 4 != 0 {
        for (name, value) in FUZZED.iter().zip(extra.split(|&b| b == 0x1f)) {
            add(&mut headers, name, value);
        }
    }
    // The strict read comes first on every path; the rest read what it accepts.
    let Ok(message) = sessionless::front::strict::read(body) else { return };
    let _ = sessionless::front::generation::of_post(&headers, &message);
    let _ = sessionless::front::legacy::Peeked::of(&message);
    let _ = sessionless::front::parse(&headers, body);
});
