//! `front::strict::read`, then `front::generation::of_post` and `front::parse`, on arbitrary bodies and
//! header values: they must never panic.
//!
//! Input: byte 0 holds flags, the rest is the body. Flag 1 adds a supported
//! `MCP-Protocol-Version`; flag 2 mirrors the body's method and name into
//! `Mcp-Method` and `Mcp-Name` (so validation gets past them); flag 4 takes
//! fuzzed header values from after the body's last NUL (split by 0x1f).
#![no_main]

mod common;

use common::add;
use http::HeaderMap;
use libfuzzer_sys::fuzz_target;

const FUZZED: [&str; 5] =
    ["mcp-protocol-version", "mcp-method", "mcp-name", "mcp-param-region", "content-type"];

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
        common::mirror(&mut headers, body);
    }
    // (Only with the flag: an empty value for every input would read as a
    // version header on every other input.)
    if flags & 4 != 0 {
        common::fuzzed(&mut headers, &FUZZED, extra);
    }
    // The strict read comes first on every path; the rest read what it accepts.
    let Ok(message) = sessionless::front::strict::read(body) else { return };
    let _ = sessionless::front::generation::of_post(&headers, &message);
    let _ = sessionless::front::legacy::Peeked::of(&message);
    let _ = sessionless::front::parse(&headers, body);
});
