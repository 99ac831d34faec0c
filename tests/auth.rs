//! Authentication per route: static API keys and JWT bearer tokens (RS256,
//! ES256, EdDSA from a JWKS file or URL; HS256 from a secret), the 401/403
//! challenges and RFC 9728 metadata, the principal each gives (what sealed
//! tokens and quotas are bound to).

mod support;

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::Full;
use hyper::Response;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use sessionless::Config;
use support::jwt::{self, claims, Signer, AUDIENCE, ISSUER};
use support::legacy::Legacy;
use support::{Answer, FakeUpstream, Gateway, Upstream};

const FAILURES: &str = "sessionless_auth_failures_total";

/// A fresh directory for this test's files.
fn dir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("sessionless-auth-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn echo() -> FakeUpstream {
    FakeUpstream::new().on("tools/call", Answer::Result(json!({"content": [{"type": "text", "text": "hi"}]})))
}

struct Setup {
    gw: Gateway,
    up: Upstream,
    rsa: Signer,
    ec: Signer,
    ed: Signer,
}

/// Routes `/keys` (API keys alice and bob), `/jwt` (a JWKS file of three
/// keys, scope `mcp` required) and `/open` (no policy), one echo upstream.
async fn setup(tag: &str) -> Setup {
    let d = dir(tag);
    let keys = format!(
        "{} ops\n{}\n",
        sessionless::auth::keys::file_line("alice", "alice-key"),
        sessionless::auth::keys::file_line("bob", "bob-key")
    );
    std::fs::write(d.join("keys.txt"), keys).unwrap();
    let (rsa, ec, ed) = (Signer::rsa("rsa-1"), Signer::ec("ec-1"), Signer::ed("ed-1"));
    std::fs::write(d.join("jwks.json"), jwt::jwks(&[&rsa, &ec, &ed])).unwrap();
    let up = echo().start().await;
    let text = format!(
        r#"
[[upstreams]]
name = "u"
url = "{url}"
generation = "legacy"

[auth.keys]
type = "api_key"
keys_file = "{d}/keys.txt"

[auth.users]
type = "jwt"
issuer = "{ISSUER}"
audience = "{AUDIENCE}"
jwks_file = "{d}/jwks.json"
required_scopes = ["mcp"]
authorization_servers = ["{ISSUER}"]
scopes_supported = ["mcp"]

[[routes]]
path = "/keys"
upstream = "u"
auth = "keys"

[[routes]]
path = "/jwt"
upstream = "u"
auth = "users"

[[routes]]
path = "/open"
upstream = "u"
"#,
        url = up.url(),
        d = d.display()
    );
    let gw = Gateway::with_config(Config::from_toml(&text).expect("valid config")).await;
    Setup { gw, up, rsa, ec, ed }
}

/// A modern tools/call on `path` with this Authorization header.
async fn call(gw: &Gateway, path: &str, auth: Option<&str>) -> support::Reply {
    let mut req = support::ModernRequest::new(support::client::http_client(), gw.url(path), "tools/call")
        .id(json!("c"))
        .params(json!({"name": "echo", "arguments": {}}));
    if let Some(a) = auth {
        req = req.header("authorization", a);
    }
    req.send().await
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

#[tokio::test]
async fn jwt_tokens_are_verified_and_every_bad_one_gets_a_challenge() {
    let s = setup("jwt").await;
    let ok = call(&s.gw, "/jwt", Some(&bearer(&s.rsa.sign(&claims("ada", "mcp read"))))).await;
    assert_eq!(ok.status, 200, "{}", ok.raw);
    for signer in [&s.ec, &s.ed] {
        let ok = call(&s.gw, "/jwt", Some(&bearer(&signer.sign(&claims("ada", "mcp"))))).await;
        assert_eq!(ok.status, 200, "{:?}: {}", signer.alg, ok.raw);
    }
    let calls_before = s.up.calls("tools/call").len();

    let metadata = "resource_metadata=\"https://gw.test/.well-known/oauth-protected-resource/jwt\"";
    let missing = call(&s.gw, "/jwt", None).await;
    assert_eq!(missing.status, 401);
    assert_eq!(missing.header("www-authenticate"), Some(format!("Bearer {metadata}").as_str()));
    assert_eq!(missing.error_code(), Some(-31001), "{}", missing.raw);

    let now = jwt::now();
    let with = |patch: Value| {
        let mut c = claims("ada", "mcp");
        for (k, v) in patch.as_object().unwrap() {
            c[k] = v.clone();
        }
        c
    };
    let mut other_key = Signer::ec("ec-1"); // same kid, another key
    other_key.kid = "ec-1".into();
    let cases: Vec<(&str, String)> = vec![
        ("malformed", "Basic abc".to_string()),
        ("malformed", bearer("not.a.jwt")),
        ("expired", bearer(&s.rsa.sign(&with(json!({"exp": now - 120}))))),
        ("not_yet_valid", bearer(&s.rsa.sign(&with(json!({"nbf": now + 600}))))),
        ("wrong_issuer", bearer(&s.rsa.sign(&with(json!({"iss": "https://evil.test"}))))),
        ("wrong_audience", bearer(&s.rsa.sign(&with(json!({"aud": "https://other.test/mcp"}))))),
        ("bad_signature", bearer(&other_key.sign(&claims("ada", "mcp")))),
        // `alg: none` is no algorithm the verifier knows: the header does not even parse.
        ("malformed", bearer(&jwt::unsigned(&claims("ada", "mcp")))),
        ("algorithm", bearer(&jwt::confused("rsa-1", &claims("ada", "mcp")))),
        ("unknown_key", bearer(&Signer::ec("ec-9").sign(&claims("ada", "mcp")))),
        ("missing_claim", bearer(&s.rsa.sign(&json!({"iss": ISSUER, "aud": AUDIENCE, "exp": now + 60})))),
    ];
    for (reason, header) in &cases {
        let refused = call(&s.gw, "/jwt", Some(header)).await;
        assert_eq!(refused.status, 401, "{reason}: {}", refused.raw);
        let challenge = refused.header("www-authenticate").unwrap_or_default().to_string();
        assert!(challenge.contains("error=\"invalid_token\""), "{reason}: {challenge}");
        assert!(challenge.contains(&format!("error_description=\"{reason}\"")), "{reason}: {challenge}");
        assert!(challenge.contains(metadata), "{challenge}");
        assert_eq!(refused.reason(), Some(*reason), "{}", refused.raw);
    }
    // The expiry holds within the leeway (30 s) and not beyond.
    let skewed = call(&s.gw, "/jwt", Some(&bearer(&s.rsa.sign(&with(json!({"exp": now - 10})))))).await;
    assert_eq!(skewed.status, 200, "within the leeway: {}", skewed.raw);

    let no_scope = call(&s.gw, "/jwt", Some(&bearer(&s.rsa.sign(&claims("ada", "read"))))).await;
    assert_eq!(no_scope.status, 403, "{}", no_scope.raw);
    let challenge = no_scope.header("www-authenticate").unwrap().to_string();
    assert!(challenge.contains("error=\"insufficient_scope\", scope=\"mcp\""), "{challenge}");

    assert_eq!(
        s.up.calls("tools/call").len(),
        calls_before + 1,
        "only the skewed token reached the upstream"
    );
    assert_eq!(s.gw.metric(FAILURES).await, (cases.len() + 2) as f64);
    let (_, metrics) = s.gw.get("/metrics").await;
    assert!(!metrics.contains(&s.rsa.sign(&claims("ada", "mcp"))[..20]), "no token material in metrics");
}

#[tokio::test]
async fn the_principal_is_the_subject_so_a_refreshed_token_keeps_the_session() {
    let s = setup("principal").await;
    let legacy = |token: String| Legacy::at(s.gw.url("/jwt")).bearer(&token);
    let first = s.rsa.sign(&claims("ada", "mcp"));
    let session = legacy(first).open().await;
    // A new token of the same subject (another key, another expiry) opens the same session.
    let refreshed = s.ec.sign(&claims("ada", "mcp"));
    let reply = legacy(refreshed).call(&session, json!(1), "echo").await;
    assert_eq!(reply.status, 200, "{}", reply.raw);
    // Another subject's token does not.
    let other = s.rsa.sign(&claims("grace", "mcp"));
    legacy(other).call(&session, json!(2), "echo").await.assert_error(404, -32001, &json!(2));
}

#[tokio::test]
async fn api_keys_name_the_principal_and_unknown_keys_are_refused() {
    let s = setup("keys").await;
    let alice = Legacy::at(s.gw.url("/keys")).bearer("alice-key");
    let session = alice.open().await;
    assert_eq!(alice.call(&session, json!(1), "echo").await.status, 200);
    let bob = Legacy::at(s.gw.url("/keys")).bearer("bob-key");
    bob.call(&session, json!(2), "echo").await.assert_error(404, -32001, &json!(2));

    let unknown = call(&s.gw, "/keys", Some("Bearer mallory-key")).await;
    assert_eq!(unknown.status, 401);
    assert_eq!(unknown.reason(), Some("unknown_key"));
    assert_eq!(
        unknown.header("www-authenticate"),
        Some("Bearer error=\"invalid_token\", error_description=\"unknown_key\"")
    );
    // No policy: anyone, as before.
    assert_eq!(call(&s.gw, "/open", None).await.status, 200);
}

#[tokio::test]
async fn protected_resource_metadata_is_served_per_route() {
    let s = setup("metadata").await;
    let (status, body) = s.gw.get("/.well-known/oauth-protected-resource/jwt").await;
    assert_eq!(status, 200, "{body}");
    let doc: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(doc["resource"], AUDIENCE);
    assert_eq!(doc["authorization_servers"], json!([ISSUER]));
    assert_eq!(doc["scopes_supported"], json!(["mcp"]));
    let (status, _) = s.gw.get("/.well-known/oauth-protected-resource/open").await;
    assert_eq!(status, 404, "an open route has no metadata");
}

/// Serves `jwks` (changeable) at `/jwks` on 127.0.0.1:0.
async fn jwks_server(jwks: Arc<Mutex<String>>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/jwks", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let mut conns = tokio::task::JoinSet::new();
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let jwks = jwks.clone();
            conns.spawn(async move {
                let service = hyper::service::service_fn(move |_req| {
                    let body = jwks.lock().unwrap().clone();
                    async move { Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(body)))) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    url
}

#[tokio::test]
async fn a_jwks_url_rotation_picks_up_new_keys_and_drops_old_ones() {
    let (old, new) = (Signer::ec("old"), Signer::ed("new"));
    let served = Arc::new(Mutex::new(jwt::jwks(&[&old])));
    let url = jwks_server(served.clone()).await;
    let up = echo().start().await;
    let text = format!(
        "[[upstreams]]\nname = \"u\"\nurl = \"{}\"\ngeneration = \"legacy\"\n\
         [auth.users]\ntype = \"jwt\"\nissuer = \"{ISSUER}\"\naudience = \"{AUDIENCE}\"\njwks_url = \"{url}\"\njwks_refresh_s = 1\n\
         [[routes]]\npath = \"/jwt\"\nupstream = \"u\"\nauth = \"users\"\n",
        up.url()
    );
    let gw = Gateway::with_config(Config::from_toml(&text).unwrap()).await;
    let old_token = bearer(&old.sign(&claims("ada", "")));
    let new_token = bearer(&new.sign(&claims("ada", "")));
    assert_eq!(call(&gw, "/jwt", Some(&old_token)).await.status, 200);
    let unknown = call(&gw, "/jwt", Some(&new_token)).await;
    assert_eq!(unknown.reason(), Some("unknown_key"), "{}", unknown.raw);

    // The new key is published and the old one retired.
    *served.lock().unwrap() = jwt::jwks(&[&new]);
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    assert_eq!(call(&gw, "/jwt", Some(&new_token)).await.status, 200, "a new kid is fetched");
    let retired = call(&gw, "/jwt", Some(&old_token)).await;
    assert_eq!(retired.status, 401, "a cached token of a retired key is refused: {}", retired.raw);
}

#[tokio::test]
async fn hs256_uses_its_configured_secret_only() {
    let up = echo().start().await;
    std::env::set_var("SESSIONLESS_TEST_HS_SECRET", jwt::HS_SECRET);
    let text = format!(
        "[[upstreams]]\nname = \"u\"\nurl = \"{}\"\ngeneration = \"legacy\"\n\
         [auth.hs]\ntype = \"jwt\"\nissuer = \"{ISSUER}\"\naudience = \"{AUDIENCE}\"\nhs256_secret_env = \"SESSIONLESS_TEST_HS_SECRET\"\n\
         [[routes]]\npath = \"/jwt\"\nupstream = \"u\"\nauth = \"hs\"\n",
        up.url()
    );
    let gw = Gateway::with_config(Config::from_toml(&text).unwrap()).await;
    assert_eq!(call(&gw, "/jwt", Some(&bearer(&Signer::hs().sign(&claims("ada", ""))))).await.status, 200);
    let rs = call(&gw, "/jwt", Some(&bearer(&Signer::rsa("rsa-1").sign(&claims("ada", ""))))).await;
    assert_eq!(rs.reason(), Some("algorithm"), "{}", rs.raw);
}

#[test]
fn policies_are_checked_when_the_file_is_read() {
    let bad = |auth: &str| {
        let text = format!(
            "[[upstreams]]\nname = \"u\"\nurl = \"http://a/mcp\"\n{auth}\n[[routes]]\npath = \"/mcp\"\nupstream = \"u\"\nauth = \"p\"\n"
        );
        Config::from_toml(&text).err().map(|e| e.0).unwrap_or_default()
    };
    assert!(
        bad("[auth.p]\ntype = \"jwt\"\nissuer = \"i\"\njwks_url = \"https://idp/jwks\"").contains("audience")
    );
    assert!(bad("[auth.p]\ntype = \"jwt\"\nissuer = \"i\"\naudience = \"a\"").contains("jwks"));
    assert!(bad("[auth.p]\ntype = \"api_key\"").contains("keys_file"));
    assert!(bad("[auth.p]\ntype = \"api_key\"\nkeys_file = \"/nonexistent\"").contains("/nonexistent"));
    assert!(bad("[auth.p]\ntype = \"api_key\"\nissuer = \"x\"").contains("does not apply"));
    assert!(bad("[auth.p]\ntype = \"jwt\"\nissuer = \"i\"\naudience = \"a\"\njwks_url = \"https://idp/jwks\"\nalgorithms = [\"RS256\", \"HS256\"]\nhs256_secret_env = \"X\"").contains("mixed"));
    assert!(bad("[auth.p]\ntype = \"jwt\"\nissuer = \"i\"\naudience = \"a\"\njwks_url = \"https://idp/jwks\"\nalgorithms = [\"none\"]").contains("not one of"));
    assert!(bad("[auth.q]\ntype = \"none\"").contains("unknown auth policy"));
    assert!(bad(
        "[auth.p]\ntype = \"jwt\"\nissuer = \"i\"\naudience = \"a\"\njwks_url = \"http://idp.example/jwks\""
    )
    .contains("https"));
    let open_route_rules = "[[upstreams]]\nname = \"u\"\nurl = \"http://a/mcp\"\n[[routes]]\npath = \"/mcp\"\nupstream = \"u\"\n\
        [[routes.rules]]\neffect = \"deny\"\ntools = [\"x\"]\nprincipals = [\"key:bob\"]\n";
    assert!(Config::from_toml(open_route_rules).unwrap_err().0.contains("need an auth policy"));
}

#[tokio::test]
async fn a_policy_without_a_resource_has_no_metadata() {
    let s = setup("no-resource").await;
    // `/keys` names no resource: no document, and its challenge names none.
    let (status, body) = s.gw.get("/.well-known/oauth-protected-resource/keys").await;
    assert_eq!(status, 404, "{body}");
    let (status, body) = s.gw.get("/.well-known/oauth-protected-resource").await;
    assert_eq!(status, 200, "the one route with a resource: {body}");
    assert!(body.contains(AUDIENCE), "{body}");
}
