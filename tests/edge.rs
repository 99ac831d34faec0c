//! The gateway at the edge (issue 14): headers added to every request to an
//! upstream (from the environment or a file), the client's token forwarded
//! only to the upstream it was issued for, an upstream's 401 answered with
//! the gateway's own challenge; TLS on the public listener (curl, h1 and
//! h2, a certificate swapped by reload); CORS for browsers (curl).

mod support;

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::process::Command;

use bytes::Bytes;
use http_body_util::Full;
use hyper::Response;
use hyper_util::rt::TokioIo;
use serde_json::json;
use sessionless::Config;
use support::jwt::{claims, Signer, AUDIENCE, HS_SECRET, ISSUER};
use support::legacy::Legacy;
use support::modern::ModernUpstream;
use support::{Answer, FakeUpstream, Gateway};

/// A fresh directory for this test's files.
fn dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("sessionless-edge-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn echo() -> FakeUpstream {
    FakeUpstream::new().on("tools/call", Answer::Result(json!({"content": [{"type": "text", "text": "hi"}]})))
}

/// `[[upstreams]]` with an API key from the environment and a tenant from a file.
fn with_headers(name: &str, url: &str, var: &str, file: &Path, generation: &str) -> String {
    format!(
        r#"
[[upstreams]]
name = "{name}"
url = "{url}"
generation = "{generation}"
legacy_clients = "translate"
[upstreams.headers]
X-Api-Key = {{ value_env = "{var}" }}
X-Tenant = {{ value_file = "{}" }}
"#,
        file.display()
    )
}

/// A modern client's call of `tool` on `path`, then a legacy client's
/// session and call, each with `token`: the legacy client and its session.
async fn call_from_both_generations<'g>(
    gw: &'g Gateway,
    path: &str,
    tool: &str,
    token: &str,
) -> (Legacy<'g>, String) {
    let reply = support::ModernRequest::new(support::client::http_client(), gw.url(path), "tools/call")
        .params(json!({"name": tool, "arguments": {}}))
        .bearer(token)
        .send()
        .await;
    assert_eq!(reply.status, 200, "{}", reply.raw);
    let legacy = Legacy::at(gw.url(path)).bearer(token);
    let session = legacy.open().await;
    let called = legacy.call(&session, json!(5), tool).await;
    assert_eq!(called.status, 200, "{}", called.raw);
    (legacy, session)
}

#[tokio::test]
async fn configured_headers_reach_a_legacy_upstream_from_both_client_generations_and_the_client_token_never_does(
) {
    let d = dir("legacy-headers");
    let var = "SESSIONLESS_EDGE_TEST_KEY_LEGACY";
    std::env::set_var(var, "key-legacy-123");
    std::fs::write(d.join("tenant"), "tenant-7\n").unwrap();
    let up = echo().start().await;
    let text = with_headers("u", up.url(), var, &d.join("tenant"), "legacy")
        + "[[routes]]\npath = \"/mcp\"\nupstream = \"u\"\n";
    let gw = Gateway::with_config(Config::from_toml(&text).unwrap()).await;

    // A modern client on a pooled session, a legacy client relayed, then its end.
    let (legacy, session) = call_from_both_generations(&gw, "/mcp", "echo", "client-secret").await;
    let ended = legacy.verb(http::Method::DELETE, Some(&session)).await;
    assert!(ended.status().is_success(), "{}", ended.status());
    up.wait_for("the relayed DELETE", |s| s.method == http::Method::DELETE).await;

    let seen = up.seen();
    assert!(seen.len() >= 6, "{}", up.dump());
    for s in &seen {
        assert_eq!(s.header("x-api-key"), Some("key-legacy-123"), "{} {:?}", s.method, s.rpc_method());
        assert_eq!(s.header("x-tenant"), Some("tenant-7"), "trimmed");
        assert!(s.header("authorization").is_none(), "the client's token never goes upstream");
    }
    gw.stop().await;
}

#[tokio::test]
async fn configured_headers_reach_a_modern_upstream_on_probes_and_from_both_client_generations() {
    let d = dir("modern-headers");
    let var = "SESSIONLESS_EDGE_TEST_KEY_MODERN";
    std::env::set_var(var, "key-modern-456");
    std::fs::write(d.join("tenant"), "tenant-9").unwrap();
    let up = ModernUpstream::start().await;
    let text = with_headers("m", &up.url, var, &d.join("tenant"), "auto")
        + "[[routes]]\npath = \"/mcp\"\nupstream = \"m\"\n";
    let gw = Gateway::with_config(Config::from_toml(&text).unwrap()).await;

    // Passed through, and a legacy client translated into stateless calls.
    call_from_both_generations(&gw, "/mcp", "stream", "client-secret").await;

    let seen = up.seen();
    assert!(seen.iter().any(|r| r.body["method"] == "server/discover"), "the probe is among them");
    assert!(up.calls().len() >= 2, "{seen:?}");
    for r in &seen {
        assert_eq!(r.headers.get("x-api-key").unwrap(), "key-modern-456", "{}", r.body);
        assert_eq!(r.headers.get("x-tenant").unwrap(), "tenant-9");
        assert!(r.headers.get("authorization").is_none());
    }
    gw.stop().await;
}

#[tokio::test]
async fn a_missing_header_value_stops_the_start_naming_the_variable_not_a_value() {
    let d = dir("missing");
    std::fs::write(d.join("tenant"), "tenant-secret-value").unwrap();
    let text = with_headers(
        "u",
        "http://127.0.0.1:9/mcp",
        "SESSIONLESS_EDGE_TEST_UNSET",
        &d.join("tenant"),
        "legacy",
    ) + "[[routes]]\npath = \"/mcp\"\nupstream = \"u\"\n";
    // Loading the file for the gateway fails; the value that is there is not shown.
    let err = Config::from_toml(&text).expect_err("the gateway does not start").0;
    assert!(err.contains("SESSIONLESS_EDGE_TEST_UNSET") && err.to_lowercase().contains("x-api-key"), "{err}");
    assert!(!err.contains("tenant-secret-value"), "{err}");
}

/// A jwt policy (HS256), routes `/fwd` (its upstream takes the token) and
/// `/kept` (the same server, configured without forwarding).
fn forwarding(d: &Path, url: &str) -> String {
    std::fs::write(d.join("hs"), HS_SECRET).unwrap();
    format!(
        r#"
[auth.users]
type = "jwt"
issuer = "{ISSUER}"
audience = "{AUDIENCE}"
hs256_secret_file = "{hs}"
authorization_servers = ["{ISSUER}"]

[[upstreams]]
name = "rs"
url = "{url}"
generation = "legacy"
forward_authorization = true
audience = "{AUDIENCE}"

[[upstreams]]
name = "kept"
url = "{url}"
generation = "legacy"

[[routes]]
path = "/fwd"
upstream = "rs"
auth = "users"

[[routes]]
path = "/kept"
upstream = "kept"
auth = "users"
"#,
        hs = d.join("hs").display()
    )
}

#[tokio::test]
async fn the_verified_token_is_forwarded_only_where_opted_in_in_both_legacy_cells() {
    let d = dir("forward");
    let up = echo().start().await;
    let gw = Gateway::with_config(Config::from_toml(&forwarding(&d, up.url())).unwrap()).await;
    let token = Signer::hs().sign(&claims("alice", "mcp"));
    let call = |path: &str| {
        support::ModernRequest::new(support::client::http_client(), gw.url(path), "tools/call")
            .params(json!({"name": "echo", "arguments": {}}))
            .bearer(&token)
    };

    assert_eq!(call("/kept").send().await.status, 200);
    let kept = up.seen();
    assert!(!kept.is_empty());
    assert!(kept.iter().all(|s| s.header("authorization").is_none()), "no opt-in, no token");

    call_from_both_generations(&gw, "/fwd", "echo", &token).await;
    let forwarded: Vec<_> = up.seen().into_iter().skip(kept.len()).collect();
    assert!(forwarded.len() >= 5, "{}", up.dump());
    let bearer = format!("Bearer {token}");
    for s in &forwarded {
        assert_eq!(s.header("authorization"), Some(bearer.as_str()), "{:?}", s.rpc_method());
    }
    gw.stop().await;
}

#[tokio::test]
async fn the_verified_token_reaches_a_modern_upstream_from_both_client_generations_and_shared_fetches_go_without(
) {
    let d = dir("forward-modern");
    let up = ModernUpstream::start().await;
    let text = forwarding(&d, &up.url)
        .replace("generation = \"legacy\"", "generation = \"modern\"\nlegacy_clients = \"translate\"");
    let gw = Gateway::with_config(Config::from_toml(&text).unwrap()).await;
    let token = Signer::hs().sign(&claims("alice", "mcp"));
    call_from_both_generations(&gw, "/fwd", "stream", &token).await;

    let bearer = format!("Bearer {token}");
    let calls: Vec<_> = up.seen().into_iter().filter(|r| r.body["method"] == "tools/call").collect();
    assert_eq!(calls.len(), 2, "{:?}", up.seen());
    for r in &calls {
        assert_eq!(r.headers.get("authorization").unwrap(), bearer.as_str());
    }
    // The discover result (a legacy client's initialize) serves every caller.
    let shared: Vec<_> = up.seen().into_iter().filter(|r| r.body["method"] != "tools/call").collect();
    assert!(shared.iter().any(|r| r.body["method"] == "server/discover"));
    assert!(shared.iter().all(|r| r.headers.get("authorization").is_none()), "{shared:?}");
    gw.stop().await;
}

/// An upstream that refuses everything with a challenge of its own.
async fn refusing(status: u16) -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |_req| async move {
                    let resp = Response::builder()
                        .status(status)
                        .header(
                            "www-authenticate",
                            r#"Bearer resource_metadata="https://upstream.internal/x""#,
                        )
                        .header("content-type", "application/json")
                        .body(Full::new(Bytes::from_static(br#"{"error":"https://upstream.internal"}"#)))
                        .unwrap();
                    Ok::<_, Infallible>(resp)
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (url, task)
}

#[tokio::test]
async fn an_upstream_401_or_403_to_a_forwarded_token_is_the_gateways_own_challenge() {
    let d = dir("refused");
    for (status, code, error) in [(401, -31001, "invalid_token"), (403, -31003, "insufficient_scope")] {
        let (url, task) = refusing(status).await;
        let gw = Gateway::with_config(Config::from_toml(&forwarding(&d, &url)).unwrap()).await;
        let token = Signer::hs().sign(&claims("alice", "mcp"));
        let call = |path: &str| {
            support::ModernRequest::new(support::client::http_client(), gw.url(path), "tools/call")
                .id(json!("r-1"))
                .params(json!({"name": "echo", "arguments": {}}))
                .bearer(&token)
        };

        let modern = call("/fwd").send().await;
        modern.assert_error(status, code, &json!("r-1"));
        // A legacy client's initialize, relayed: the same challenge, its id echoed.
        let legacy = Legacy::at(gw.url("/fwd")).bearer(&token);
        let relayed = legacy.post(None, support::legacy::init_body(json!(0))).await;
        relayed.assert_error(status, code, &json!(0));
        for reply in [&modern, &relayed] {
            let challenge = reply.headers["www-authenticate"].to_str().unwrap();
            assert!(challenge.contains(&format!("error=\"{error}\"")), "{challenge}");
            let metadata = "resource_metadata=\"https://gw.test/.well-known/oauth-protected-resource/jwt\"";
            assert!(challenge.contains(metadata), "{challenge}");
            assert!(!reply.raw.contains("upstream.internal") && !challenge.contains("upstream.internal"));
        }

        // Without forwarding the refusal is of the gateway's own credentials.
        let reply = call("/kept").send().await;
        assert_eq!(reply.status, 502, "{}", reply.raw);
        assert_eq!(reply.body["id"], "r-1");
        assert_eq!(reply.body["error"]["data"]["reason"], "upstream_refused_credentials");
        assert!(reply.headers.get("www-authenticate").is_none());
        assert!(!reply.raw.contains("upstream.internal"));
        gw.stop().await;
        task.abort();
    }
}

/// A certificate for 127.0.0.1 signed by a fresh CA: (cert, key, ca) files in `d`.
fn certificate(d: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name.push(rcgen::DnType::CommonName, "sessionless test CA");
    let ca = ca.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let mut leaf =
        rcgen::CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
    // A subject of its own: with the CA's, curl takes it for self-signed.
    leaf.distinguished_name.push(rcgen::DnType::CommonName, "127.0.0.1");
    let cert = leaf.signed_by(&key, &ca, &ca_key).unwrap();
    let (c, k, a) = (d.join("cert.pem"), d.join("key.pem"), d.join("ca.pem"));
    std::fs::write(&c, cert.pem()).unwrap();
    std::fs::write(&k, key.serialize_pem()).unwrap();
    std::fs::write(&a, ca.pem()).unwrap();
    (c, k, a)
}

/// curl's status line for `url`: `<code> <http version>`, or its error.
fn curl(args: &[&str], url: &str) -> String {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", "-o", "/dev/null", "-w", "%{http_code} %{http_version}"])
        .args(args)
        .arg(url)
        .output()
        .expect("curl runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() {
        text
    } else {
        format!("failed: {}", String::from_utf8_lossy(&out.stderr))
    }
}

/// Stops the gateway even when an assertion fails first.
struct Stop(tokio_util::sync::CancellationToken);

impl Drop for Stop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_serves_h1_and_h2_and_a_reload_swaps_the_certificate() {
    let d = dir("tls");
    let (cert, key, ca) = certificate(&d);
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n[server.tls]\ncert_file = \"{}\"\nkey_file = \"{}\"\n\
         [[upstreams]]\nname = \"u\"\nurl = \"http://127.0.0.1:9/mcp\"\ngeneration = \"legacy\"\n\
         [[routes]]\npath = \"/mcp\"\nupstream = \"u\"\n",
        cert.display(),
        key.display()
    );
    let file = d.join("gateway.toml");
    std::fs::write(&file, text).unwrap();
    let source = sessionless::reload::Source { path: file, listen: None, watch: false };
    let running = sessionless::run_from(source).await.unwrap();
    let _stop = Stop(running.shutdown_token());
    let url = running.url("/healthz");
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");
    let ca1 = ca.display().to_string();
    let get = |args: Vec<String>| {
        let url = url.clone();
        tokio::task::spawn_blocking(move || curl(&args.iter().map(String::as_str).collect::<Vec<_>>(), &url))
    };

    let h1 = get(vec!["--cacert".into(), ca1.clone(), "--http1.1".into()]).await.unwrap();
    assert_eq!(h1, "200 1.1");
    let h2 = get(vec!["--cacert".into(), ca1.clone(), "--http2".into()]).await.unwrap();
    assert_eq!(h2, "200 2", "ALPN offers h2");
    let plain = tokio::task::spawn_blocking({
        let url = url.replace("https://", "http://");
        move || curl(&[], &url)
    });
    assert!(!plain.await.unwrap().starts_with("200"), "no plain HTTP on a TLS listener");

    // New files, then the configuration's reload (SIGHUP's): the next
    // handshake serves the new pair.
    let old = d.join("old");
    std::fs::create_dir_all(&old).unwrap();
    std::fs::rename(&ca, old.join("ca.pem")).unwrap();
    let (_, _, ca2) = certificate(&d);
    running.reload().await.expect("the new pair loads");
    let ca2 = ca2.display().to_string();
    let old_ca = old.join("ca.pem").display().to_string();
    assert_eq!(get(vec!["--cacert".into(), ca2, "--http2".into()]).await.unwrap(), "200 2");
    let refused = get(vec!["--cacert".into(), old_ca, "--http1.1".into()]).await.unwrap();
    assert!(refused.starts_with("failed"), "the old CA no longer verifies: {refused}");

    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_answers_preflights_and_decorates_answers_for_allowed_origins_only() {
    let up = echo().start().await;
    let text = format!(
        "[server.cors]\nallowed_origins = [\"https://app.example\"]\nmax_age_s = 120\n\
         [[upstreams]]\nname = \"u\"\nurl = \"{}\"\ngeneration = \"legacy\"\n\
         [[routes]]\npath = \"/mcp\"\nupstream = \"u\"\n",
        up.url()
    );
    let gw = Gateway::with_config(Config::from_toml(&text).unwrap()).await;
    let url = gw.url("/mcp");
    let run = |args: Vec<String>| {
        let url = url.clone();
        tokio::task::spawn_blocking(move || {
            let out = Command::new("curl")
                .args(["-sS", "--max-time", "10", "-D", "-", "-o", "/dev/null"])
                .args(&args)
                .arg(&url)
                .output()
                .expect("curl runs");
            String::from_utf8_lossy(&out.stdout).to_ascii_lowercase()
        })
    };
    let preflight = |origin: &str| {
        vec![
            "-X".into(),
            "OPTIONS".into(),
            "-H".into(),
            format!("Origin: {origin}"),
            "-H".into(),
            "Access-Control-Request-Method: POST".into(),
            "-H".into(),
            "Access-Control-Request-Headers: content-type, authorization, mcp-param-region, x-other".into(),
        ]
    };

    let ok = run(preflight("https://app.example")).await.unwrap();
    assert!(ok.starts_with("http/1.1 204"), "{ok}");
    assert!(ok.contains("access-control-allow-origin: https://app.example"), "{ok}");
    assert!(ok.contains("access-control-allow-methods: post, get, delete, options"), "{ok}");
    let allowed = ok.lines().find(|l| l.starts_with("access-control-allow-headers:")).unwrap();
    for h in ["content-type", "authorization", "mcp-protocol-version", "mcp-param-region", "last-event-id"] {
        assert!(allowed.contains(h), "{h}: {allowed}");
    }
    assert!(!allowed.contains("x-other"), "{allowed}");
    assert!(ok.contains("access-control-max-age: 120") && ok.contains("vary: origin"), "{ok}");

    let refused = run(preflight("https://evil.example")).await.unwrap();
    assert!(refused.starts_with("http/1.1 403"), "{refused}");
    assert!(!refused.contains("access-control-"), "{refused}");

    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "echo",
        "arguments": {}, "_meta": {"io.modelcontextprotocol/protocolVersion": support::VERSION,
        "io.modelcontextprotocol/clientCapabilities": {}}}});
    let actual = |origin: &str| {
        vec![
            "-H".into(),
            format!("Origin: {origin}"),
            "-H".into(),
            "Content-Type: application/json".into(),
            "-H".into(),
            "Accept: application/json, text/event-stream".into(),
            "-H".into(),
            format!("MCP-Protocol-Version: {}", support::VERSION),
            "-H".into(),
            "Mcp-Method: tools/call".into(),
            "-H".into(),
            "Mcp-Name: echo".into(),
            "--data".into(),
            body.to_string(),
        ]
    };
    let answered = run(actual("https://app.example")).await.unwrap();
    assert!(answered.starts_with("http/1.1 200"), "{answered}");
    assert!(answered.contains("access-control-allow-origin: https://app.example"), "{answered}");
    assert!(answered.contains("access-control-expose-headers:") && answered.contains("www-authenticate"));
    let other = run(actual("https://evil.example")).await.unwrap();
    assert!(other.starts_with("http/1.1 403"), "the Origin guard refuses it: {other}");
    assert!(!other.contains("access-control-allow-origin"), "{other}");
    gw.stop().await;
}
