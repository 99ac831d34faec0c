//! Microbenchmarks of the per-request hot paths: sealing and opening a
//! `requestState`-sized blob, and parsing/validating a modern request.
//! Run: `cargo bench --bench hot_paths`.

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use http::HeaderMap;
use sessionless::config::SealKey;
use sessionless::front;
use sessionless::seal::Sealer;

/// A payload of the size and shape of a real requestState.
const STATE: &str = r#"{"r":"/mcp","sid":"3f2a9c1e8b7d4a6f9e0c2b1a5d4e3f2a","ver":"2025-11-25","own":"9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d","f":"0123456789abcdef0123456789abcdef","k":{"elicitation_1":7},"p":"b:00112233445566778899aabbccddeeff","m":"tools/call","n":"ask_user","a":"aabbccddeeff00112233445566778899","iat":1764460800000,"exp":1764461100000,"rd":1}"#;

fn seal_open(c: &mut Criterion) {
    let sealer = Sealer::new(vec![SealKey { id: "k1".into(), bytes: [7; 32] }]);
    let aad = b"requestState\0/mcp\0tools/call";
    let blob = sealer.seal(aad, STATE.as_bytes());
    c.bench_function("seal", |b| b.iter(|| sealer.seal(black_box(aad), black_box(STATE.as_bytes()))));
    c.bench_function("open", |b| b.iter(|| sealer.open(black_box(aad), black_box(&blob)).unwrap()));
    c.bench_function("seal+open", |b| {
        b.iter(|| {
            let blob = sealer.seal(aad, STATE.as_bytes());
            sealer.open(aad, &blob).unwrap()
        })
    });
}

fn parse_call(c: &mut Criterion) {
    let mut headers = HeaderMap::new();
    headers.insert("content-type", "application/json".parse().unwrap());
    headers.insert("mcp-protocol-version", "2026-07-28".parse().unwrap());
    headers.insert("mcp-method", "tools/call".parse().unwrap());
    headers.insert("mcp-name", "echo".parse().unwrap());
    let body = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hello"},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{},"io.modelcontextprotocol/clientInfo":{"name":"bench","version":"1"}}}}"#;
    c.bench_function("front::parse tools/call", |b| {
        b.iter(|| front::parse(black_box(&headers), black_box(body)).unwrap())
    });
}

criterion_group!(benches, seal_open, parse_call);
criterion_main!(benches);
