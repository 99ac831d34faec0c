//! Microbenchmarks of the per-request hot paths: sealing and opening a
//! `requestState`-sized blob, parsing/validating a modern request, and
//! authenticating a caller (no policy, API keys, JWTs cached and not).
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

/// A JWT policy whose JWKS holds one key of each kind, and a token per key.
fn jwt_setup() -> (sessionless::auth::jwt::Verifier, Vec<(&'static str, String)>) {
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine;
    use jsonwebtoken::{Algorithm, EncodingKey, Header};
    let ec = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let ed = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
    let raw = ec.public_key_raw();
    let jwks = serde_json::json!({"keys": [
        {"kty": "EC", "kid": "ec", "crv": "P-256", "x": URL_SAFE_NO_PAD.encode(&raw[1..33]), "y": URL_SAFE_NO_PAD.encode(&raw[33..65])},
        {"kty": "OKP", "kid": "ed", "crv": "Ed25519", "x": URL_SAFE_NO_PAD.encode(ed.public_key_raw())}]});
    let path = std::env::temp_dir().join(format!("sessionless-bench-jwks-{}.json", std::process::id()));
    std::fs::write(&path, jwks.to_string()).unwrap();
    let policy = sessionless::config::JwtPolicy {
        issuer: "https://idp".into(),
        audience: "https://gw/mcp".into(),
        jwks: Some(sessionless::config::JwksSource::File(path)),
        jwks_refresh: std::time::Duration::from_secs(300),
        algorithms: vec![Algorithm::ES256, Algorithm::EdDSA],
        hs256_secret: None,
        leeway: std::time::Duration::from_secs(30),
    };
    let verifier = sessionless::auth::jwt::Verifier::new(policy, None).unwrap();
    let exp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() + 3600;
    let claims = serde_json::json!({"iss": "https://idp", "aud": "https://gw/mcp", "sub": "user-1", "exp": exp, "scope": "mcp"});
    let sign = |alg, kid: &str, key: EncodingKey| {
        let mut h = Header::new(alg);
        h.kid = Some(kid.into());
        jsonwebtoken::encode(&h, &claims, &key).unwrap()
    };
    let tokens = vec![
        ("ES256", sign(Algorithm::ES256, "ec", EncodingKey::from_ec_der(&ec.serialize_der()))),
        ("EdDSA", sign(Algorithm::EdDSA, "ed", EncodingKey::from_ed_der(&ed.serialize_der()))),
    ];
    (verifier, tokens)
}

fn authenticate(c: &mut Criterion) {
    use sha2::Digest;
    let mut headers = HeaderMap::new();
    headers.insert("authorization", "Bearer sk-0123456789abcdef0123456789abcdef".parse().unwrap());
    c.bench_function("auth none: principal digest", |b| {
        b.iter(|| sessionless::guard::principal(black_box(&headers)))
    });
    let lines: String = (0..1000)
        .map(|i| sessionless::auth::keys::file_line(&format!("k{i}"), &format!("key-{i}")) + "\n")
        .collect();
    let keys = sessionless::auth::keys::Keys::parse(&lines).unwrap();
    c.bench_function("auth api_key: 1000 keys", |b| b.iter(|| keys.find(black_box("key-999")).unwrap()));
    let (verifier, tokens) = jwt_setup();
    for (alg, token) in &tokens {
        c.bench_function(&format!("auth jwt {alg}: uncached"), |b| {
            b.iter(|| verifier.check_now(black_box(token)).unwrap())
        });
    }
    let token = &tokens[0].1;
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    runtime.block_on(verifier.verify(token)).unwrap();
    c.bench_function("auth jwt: cached (digest + lookup)", |b| {
        b.iter(|| {
            let digest: [u8; 32] = sha2::Sha256::digest(black_box(token).as_bytes()).into();
            verifier.cached(&digest).unwrap()
        })
    });
}

criterion_group!(benches, seal_open, parse_call, authenticate);
criterion_main!(benches);
