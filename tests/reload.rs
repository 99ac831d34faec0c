//! Hot reload (issue 14): the routing file read again on demand (`SIGHUP`)
//! or when it changes; a bad file rejected while the old configuration
//! stays; routes added, changed and removed (a removed route's parked calls
//! still finish); API keys revoked and sealing keys rotated by reload;
//! settings that need a restart named; and routes by host.

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine;
use serde_json::{json, Value};
use support::{Answer, FakeUpstream, Gateway, ModernRequest, Upstream};

const RELOADS: &str = "sessionless_config_reloads_total";

/// A fresh directory for this test's files.
fn dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("sessionless-reload-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Writes `text` to `path` as editors do: a new file renamed over the old.
fn write(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn echo(text: &str) -> FakeUpstream {
    FakeUpstream::new().on("tools/call", Answer::Result(json!({"content": [{"type": "text", "text": text}]})))
}

/// `[[upstreams]]` tables for `(name, url)`, legacy (not probed).
fn upstreams(list: &[(&str, &Upstream)]) -> String {
    list.iter()
        .map(|(name, up)| {
            format!("[[upstreams]]\nname = \"{name}\"\nurl = \"{}\"\ngeneration = \"legacy\"\n\n", up.url())
        })
        .collect()
}

fn route(path: &str, upstream: &str) -> String {
    format!("[[routes]]\npath = \"{path}\"\nupstream = \"{upstream}\"\n\n")
}

fn call(gw: &Gateway, path: &str, id: u64) -> ModernRequest {
    gw.request_to(path, "tools/call").id(json!(id)).params(json!({"name": "echo", "arguments": {}}))
}

fn text(reply: &support::Reply) -> &str {
    reply.result()["content"][0]["text"].as_str().unwrap_or_default()
}

#[tokio::test]
async fn routes_change_on_reload_and_a_bad_file_changes_nothing() {
    let d = dir("routes");
    let (a, b) = (echo("from a").start().await, echo("from b").start().await);
    let file = d.join("gateway.toml");
    let ups = upstreams(&[("a", &a), ("b", &b)]);
    write(&file, &format!("{ups}{}", route("/one", "a")));
    let gw = Gateway::from_file(&file, false).await;
    assert_eq!(text(&call(&gw, "/one", 1).send().await), "from a");
    assert_eq!(call(&gw, "/two", 2).send().await.status, 404);

    // A new route, and the old one moved to the other upstream.
    write(&file, &format!("{ups}{}{}", route("/one", "b"), route("/two", "a")));
    let report = gw.reload().await.expect("a good file is applied");
    assert_eq!(report.added, vec!["/two".to_string()]);
    assert_eq!(report.changed, vec!["/one".to_string()]);
    assert!(report.needs_restart.is_empty(), "{report}");
    assert_eq!(text(&call(&gw, "/one", 3).send().await), "from b");
    assert_eq!(text(&call(&gw, "/two", 4).send().await), "from a");

    // A file that does not parse, then one that does not validate: both
    // rejected with the line named, and everything as before.
    write(&file, &format!("{ups}{}[[routes]\npath = \"/x\"\n", route("/one", "b")));
    let err = gw.reload().await.expect_err("a syntax error is rejected");
    assert!(err.contains("line"), "{err}");
    write(&file, &format!("{ups}{}", route("/one", "nowhere")));
    let err = gw.reload().await.expect_err("an unknown upstream is rejected");
    assert!(err.contains("unknown upstream `nowhere`") && err.contains("line"), "{err}");
    assert_eq!(text(&call(&gw, "/one", 5).send().await), "from b");
    assert_eq!(text(&call(&gw, "/two", 6).send().await), "from a");
    let (_, metrics) = gw.get("/metrics").await;
    assert_eq!(support::metric_sum(&metrics, &format!("{RELOADS}{{outcome=\"applied\"}}")), 1.0);
    assert_eq!(support::metric_sum(&metrics, &format!("{RELOADS}{{outcome=\"rejected\"}}")), 2.0);
    assert!(support::metric_sum(&metrics, "sessionless_config_last_reload_success_timestamp_seconds") > 0.0);

    // Settings sized into the process are named, and kept as they run.
    write(
        &file,
        &format!(
            "[limits]\nmax_body_bytes = 1000\n\n[pool]\nmax_sessions = 7\n\n{ups}{}",
            route("/one", "a")
        ),
    );
    let report = gw.reload().await.expect("applied in part");
    assert_eq!(report.needs_restart, vec!["pool", "limits"], "{report}");
    assert_eq!(gw.metric("sessionless_config_restart_required").await, 1.0);
    let long = "x".repeat(2000);
    let big = gw
        .request_to("/one", "tools/call")
        .params(json!({"name": "echo", "arguments": {"text": long}}))
        .send()
        .await;
    assert_eq!(text(&big), "from a", "the running body limit stays: {}", big.raw);
    gw.stop().await;
}

#[tokio::test]
async fn a_changed_file_is_picked_up_without_being_asked() {
    let d = dir("watch");
    let (a, b) = (echo("from a").start().await, echo("from b").start().await);
    let file = d.join("gateway.toml");
    let ups = upstreams(&[("a", &a), ("b", &b)]);
    write(&file, &format!("{ups}{}", route("/one", "a")));
    let gw = Gateway::from_file(&file, true).await;
    assert_eq!(text(&call(&gw, "/one", 1).send().await), "from a");

    write(&file, &format!("{ups}{}{}", route("/one", "a"), route("/two", "b")));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let reply = call(&gw, "/two", 2).send().await;
        if reply.status == 200 {
            assert_eq!(text(&reply), "from b");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the change was not picked up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A broken write is seen too, and changes nothing.
    write(&file, "[[routes\n");
    let rejected = format!("{RELOADS}{{outcome=\"rejected\"}}");
    assert_eq!(gw.wait_metric(&rejected, 1.0).await, 1.0);
    assert_eq!(text(&call(&gw, "/two", 3).send().await), "from b");
    gw.stop().await;
}

#[tokio::test]
async fn an_api_key_is_revoked_by_reload() {
    let d = dir("keys");
    let up = echo("hi").start().await;
    let keys = d.join("keys.txt");
    let line = sessionless::auth::keys::file_line;
    std::fs::write(&keys, format!("{}\n{}\n", line("alice", "alice-key"), line("bob", "bob-key"))).unwrap();
    let file = d.join("gateway.toml");
    let text_of = format!(
        "{}[auth.keys]\ntype = \"api_key\"\nkeys_file = \"{}\"\n\n[[routes]]\npath = \"/mcp\"\nupstream = \"u\"\nauth = \"keys\"\n",
        upstreams(&[("u", &up)]),
        keys.display()
    );
    write(&file, &text_of);
    let gw = Gateway::from_file(&file, false).await;
    for key in ["alice-key", "bob-key"] {
        assert_eq!(text(&call(&gw, "/mcp", 1).bearer(key).send().await), "hi", "{key}");
    }

    std::fs::write(&keys, format!("{}\n", line("alice", "alice-key"))).unwrap();
    gw.reload().await.expect("applied");
    let refused = call(&gw, "/mcp", 2).bearer("bob-key").send().await;
    // Refused before its body is read: no id to echo.
    refused.assert_error(401, -31001, &Value::Null);
    assert!(refused.header("www-authenticate").is_some_and(|c| c.contains("invalid_token")));
    assert_eq!(text(&call(&gw, "/mcp", 3).bearer("alice-key").send().await), "hi");
    gw.stop().await;
}

/// Routes on upstreams that ask a question on every call, one each (the
/// fake names its questions after the upstream's request ids, which two
/// sessions share).
fn asking_file(d: &Path, ups: &[&Upstream], keys: &[&str], routes: &[&str]) -> PathBuf {
    let file = d.join("gateway.toml");
    let names: Vec<String> = (0..ups.len()).map(|i| format!("u{i}")).collect();
    let pairs: Vec<(&str, &Upstream)> = names.iter().map(String::as_str).zip(ups.iter().copied()).collect();
    let mut text = upstreams(&pairs);
    for id in keys {
        text.push_str(&format!("[[keys]]\nid = \"{id}\"\nfile = \"{}\"\n\n", d.join(id).display()));
    }
    for (path, upstream) in routes.iter().zip(&names) {
        text.push_str(&route(path, upstream));
    }
    write(&file, &text);
    file
}

fn seal_key(d: &Path, id: &str, byte: u8) {
    std::fs::write(d.join(id), base64::engine::general_purpose::URL_SAFE_NO_PAD.encode([byte; 32])).unwrap();
}

fn ask(gw: &Gateway, path: &str, id: u64) -> ModernRequest {
    gw.request_to(path, "tools/call")
        .id(json!(id))
        .params(json!({"name": "weather", "arguments": {}}))
        .capabilities(json!({"elicitation": {}}))
}

fn answer(gw: &Gateway, path: &str, id: u64, round: &Value) -> ModernRequest {
    let key = round["inputRequests"].as_object().expect("a question").keys().next().unwrap().clone();
    gw.request_to(path, "tools/call")
        .id(json!(id))
        .params(json!({"name": "weather", "arguments": {}, "requestState": round["requestState"],
            "inputResponses": {key: {"action": "accept", "content": {}}}}))
        .capabilities(json!({"elicitation": {}}))
}

/// The first round of a call: its `input_required` result.
async fn paused(gw: &Gateway, path: &str, id: u64) -> Value {
    let first = ask(gw, path, id).send().await;
    assert_eq!(first.result()["resultType"], "input_required", "{}", first.raw);
    first.result().clone()
}

fn sealed_with(state: &Value) -> String {
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(state.as_str().unwrap()).unwrap();
    String::from_utf8_lossy(&raw[2..2 + raw[1] as usize]).into_owned()
}

#[tokio::test]
async fn sealing_keys_are_added_and_retired_by_reload() {
    let d = dir("seal");
    let up = FakeUpstream::asking_each_call().start().await;
    seal_key(&d, "k1", 1);
    seal_key(&d, "k2", 2);
    let file = asking_file(&d, &[&up], &["k1"], &["/mcp"]);
    let gw = Gateway::from_file(&file, false).await;
    let old = paused(&gw, "/mcp", 1).await;
    let stale = paused(&gw, "/mcp", 2).await;
    assert_eq!(sealed_with(&old["requestState"]), "k1");

    // k2 seals from now on; k1 still opens what it sealed.
    asking_file(&d, &[&up], &["k2", "k1"], &["/mcp"]);
    let report = gw.reload().await.expect("applied");
    assert!(report.keys, "{report}");
    let new = paused(&gw, "/mcp", 3).await;
    assert_eq!(sealed_with(&new["requestState"]), "k2");
    let done = answer(&gw, "/mcp", 4, &old).send().await;
    assert_eq!(text(&done), "carried on", "{}", done.raw);

    // k1 retired: what it sealed is refused; k2's still opens.
    asking_file(&d, &[&up], &["k2"], &["/mcp"]);
    gw.reload().await.expect("applied");
    let done = answer(&gw, "/mcp", 5, &new).send().await;
    assert_eq!(text(&done), "carried on", "{}", done.raw);
    let refused = answer(&gw, "/mcp", 6, &stale).send().await;
    refused.assert_error(400, -32602, &json!(6));
    assert_eq!(refused.reason(), Some("invalid"), "{}", refused.raw);
    gw.stop().await;
}

#[tokio::test]
async fn a_removed_route_finishes_its_parked_calls_and_takes_nothing_new() {
    let d = dir("removed");
    let old = FakeUpstream::asking_each_call().start().await;
    let kept = FakeUpstream::asking_each_call().start().await;
    seal_key(&d, "k1", 1);
    let file = asking_file(&d, &[&old, &kept], &["k1"], &["/old", "/kept"]);
    let gw = Gateway::from_file(&file, false).await;
    let parked = paused(&gw, "/old", 1).await;

    asking_file(&d, &[&kept], &["k1"], &["/kept"]);
    let report = gw.reload().await.expect("applied");
    assert_eq!(report.removed, vec!["/old".to_string()]);
    assert_eq!(ask(&gw, "/old", 2).send().await.status, 404, "no new call on a removed route");
    let done = answer(&gw, "/old", 3, &parked).send().await;
    assert_eq!(text(&done), "carried on", "the parked call finishes: {}", done.raw);
    // Its state cannot be carried to another route either.
    let other = paused(&gw, "/kept", 4).await;
    let moved = answer(&gw, "/old", 5, &other).send().await;
    assert_eq!(moved.status, 404, "{}", moved.raw);
    gw.stop().await;
}

#[tokio::test]
async fn reloads_under_load_lose_no_request_and_no_parked_call() {
    let d = dir("load");
    let (up, asking) = (echo("hi").start().await, FakeUpstream::asking_each_call().start().await);
    seal_key(&d, "k1", 1);
    let file = d.join("gateway.toml");
    let good = |extra: &str| {
        format!(
            "[[keys]]\nid = \"k1\"\nfile = \"{}\"\n\n{}{}{}{extra}",
            d.join("k1").display(),
            upstreams(&[("u", &up), ("ask", &asking)]),
            route("/mcp", "u"),
            route("/ask", "ask"),
        )
    };
    write(&file, &good(""));
    let gw = std::sync::Arc::new(Gateway::from_file(&file, false).await);

    // Calls parked before and during the reloads, answered after them.
    let mut rounds = Vec::new();
    for id in 0..10 {
        rounds.push(paused(&gw, "/ask", 1000 + id).await);
    }
    let load: Vec<_> = (0..8)
        .map(|w| {
            let gw = gw.clone();
            tokio::spawn(async move {
                let mut failed = Vec::new();
                for i in 0..60 {
                    let reply = call(&gw, "/mcp", w * 1000 + i).send().await;
                    if reply.status != 200 || text(&reply) != "hi" {
                        failed.push(reply.raw);
                    }
                }
                failed
            })
        })
        .collect();
    for n in 0..10 {
        if n % 2 == 0 {
            write(&file, &good(&route(&format!("/extra{n}"), "u")));
            gw.reload().await.expect("a good file");
        } else {
            write(&file, "[[routes]]\npath = 1\n");
            gw.reload().await.expect_err("a bad file");
        }
        rounds.push(paused(&gw, "/ask", 2000 + n).await);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for task in load {
        let failed = task.await.unwrap();
        assert!(failed.is_empty(), "{} failed: {:?}", failed.len(), failed.first());
    }
    for (i, round) in rounds.iter().enumerate() {
        let done = answer(&gw, "/ask", 3000 + i as u64, round).send().await;
        assert_eq!(text(&done), "carried on", "parked call {i}: {}", done.raw);
    }
    assert_eq!(gw.metric("sessionless_parked_flows_open").await, 0.0);
}

async fn paused_on(gw: &Gateway, host: &str, id: u64) -> Value {
    let first = ask(gw, "/ask", id).header("host", host).send().await;
    assert_eq!(first.result()["resultType"], "input_required", "{}", first.raw);
    first.result().clone()
}

#[tokio::test]
async fn routes_by_host() {
    let d = dir("hosts");
    let (a, b) = (echo("from a").start().await, echo("from b").start().await);
    let (ask_a, ask_b) =
        (FakeUpstream::asking_each_call().start().await, FakeUpstream::asking_each_call().start().await);
    let file = d.join("gateway.toml");
    let text_of = format!(
        "[server]\nallowed_hosts = [\"a.example\", \"b.example\", \"127.0.0.1\"]\n\n{}\
         [[routes]]\npath = \"/mcp\"\nhost = \"A.example\"\nupstream = \"a\"\n\n{}\
         [[routes]]\npath = \"/ask\"\nhost = \"a.example\"\nupstream = \"ask_a\"\n\n{}",
        upstreams(&[("a", &a), ("b", &b), ("ask_a", &ask_a), ("ask_b", &ask_b)]),
        route("/mcp", "b"),
        route("/ask", "ask_b"),
    );
    write(&file, &text_of);
    let gw = Gateway::from_file(&file, false).await;
    let on = |host: &str, id: u64| call(&gw, "/mcp", id).header("host", host);
    assert_eq!(text(&on("a.example", 1).send().await), "from a");
    assert_eq!(
        text(&on("A.EXAMPLE:8443", 2).send().await),
        "from a",
        "host names are case-insensitive, ports ignored"
    );
    assert_eq!(text(&on("b.example", 3).send().await), "from b", "the route naming no host takes the rest");
    assert_eq!(text(&call(&gw, "/mcp", 4).send().await), "from b");

    // Two routes of one path on two hosts are two routes: one's sealed
    // state is not the other's.
    let round = paused_on(&gw, "a.example", 5).await;
    let elsewhere = answer(&gw, "/ask", 6, &round).header("host", "b.example").send().await;
    elsewhere.assert_error(400, -32602, &json!(6));
    let done = answer(&gw, "/ask", 7, &round).header("host", "a.example").send().await;
    assert_eq!(text(&done), "carried on", "{}", done.raw);
    let (_, metrics) = gw.get("/metrics").await;
    assert!(metrics.contains("route=\"a.example/mcp\""), "the route's id labels its metrics");
    assert!(metrics.contains("route=\"/mcp\""));

    // A duplicate (host, path) is refused.
    write(&file, &format!("{text_of}[[routes]]\npath = \"/mcp\"\nhost = \"a.example\"\nupstream = \"b\"\n"));
    let err = gw.reload().await.expect_err("duplicate");
    assert!(err.contains("duplicate route `a.example/mcp`"), "{err}");
    write(&file, &text_of.replace("A.example", "https://a.example"));
    let err = gw.reload().await.expect_err("not a host");
    assert!(err.contains("invalid route host"), "{err}");
    gw.stop().await;
}

/// The binary, stopped (killed) when dropped; its log collected.
struct Binary {
    child: std::process::Child,
    port: u16,
    log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Drop for Binary {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Binary {
    fn start(config: &Path) -> Binary {
        use std::io::BufRead;
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_sessionless"))
            .arg("--config")
            .arg(config)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("the gateway binary starts");
        let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
        let marker = "listening on http://127.0.0.1:";
        let port = loop {
            let line = lines.next().expect("the binary logs its address").unwrap();
            if let Some(at) = line.find(marker) {
                let rest = &line[at + marker.len()..];
                break rest.chars().take_while(char::is_ascii_digit).collect::<String>().parse().unwrap();
            }
        };
        let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let kept = log.clone();
        std::thread::spawn(move || lines.map_while(Result::ok).for_each(|l| kept.lock().unwrap().push(l)));
        Binary { child, port, log }
    }

    fn signal(&self, name: &str) {
        let ok =
            std::process::Command::new("kill").args([name, &self.child.id().to_string()]).status().unwrap();
        assert!(ok.success());
    }
}

#[tokio::test]
async fn sighup_reloads_the_binary() {
    let d = dir("sighup");
    // The key file sits in a directory of its own: the file watch (on the
    // routing file's directory) does not see it change; SIGHUP must.
    let keys_dir = d.join("keys");
    std::fs::create_dir_all(&keys_dir).unwrap();
    let keys = keys_dir.join("keys.txt");
    let line = sessionless::auth::keys::file_line;
    std::fs::write(&keys, format!("{}\n{}\n", line("alice", "alice-key"), line("bob", "bob-key"))).unwrap();
    let up = echo("hi").start().await;
    let file = d.join("gateway.toml");
    write(
        &file,
        &format!(
            "[server]\nlisten = \"127.0.0.1:0\"\n\n{}[auth.keys]\ntype = \"api_key\"\nkeys_file = \"{}\"\n\n{}auth = \"keys\"\n",
            upstreams(&[("u", &up)]),
            keys.display(),
            route("/mcp", "u")
        ),
    );
    let bin = Binary::start(&file);
    let client = support::client::http_client();
    let url = format!("http://127.0.0.1:{}/mcp", bin.port);
    let as_bob = |id: u64| {
        ModernRequest::new(client.clone(), url.clone(), "tools/call")
            .id(json!(id))
            .params(json!({"name": "echo", "arguments": {}}))
            .bearer("bob-key")
    };
    assert_eq!(text(&as_bob(1).send().await), "hi");

    std::fs::write(&keys, format!("{}\n", line("alice", "alice-key"))).unwrap();
    bin.signal("-HUP");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while as_bob(2).send().await.status != 401 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "SIGHUP did not reload: {:?}",
            bin.log.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The reader thread may not have taken the line in yet.
    let logged = || {
        bin.log.lock().unwrap().iter().any(|l| l.contains("configuration reloaded") && l.contains("SIGHUP"))
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !logged() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let log = bin.log.lock().unwrap().join("\n");
    assert!(logged(), "{log}");
    assert!(!log.contains("bob-key") && !log.contains("alice-key"), "no key in the log");
}

#[tokio::test]
async fn a_rotated_upstream_header_reaches_new_calls_on_pooled_sessions() {
    let d = dir("rotate");
    let up = echo("hi").start().await;
    let key = d.join("upstream-key");
    std::fs::write(&key, "old-key").unwrap();
    let file = d.join("gateway.toml");
    let text = format!(
        "[[upstreams]]\nname = \"u\"\nurl = \"{}\"\ngeneration = \"legacy\"\n\
         [upstreams.headers]\nX-Api-Key = {{ value_file = \"{}\" }}\n\n{}",
        up.url(),
        key.display(),
        route("/mcp", "u")
    );
    write(&file, &text);
    let gw = Gateway::from_file(&file, false).await;
    let last_key = || {
        let seen = up.seen();
        let call = seen.iter().rev().find(|s| s.rpc_method() == Some("tools/call")).expect("a call upstream");
        call.header("x-api-key").map(str::to_string)
    };
    assert_eq!(text_of_call(&gw, 1).await, "hi");
    assert_eq!(last_key().as_deref(), Some("old-key"));

    std::fs::write(&key, "new-key").unwrap();
    gw.reload().await.expect("applied");
    assert_eq!(text_of_call(&gw, 2).await, "hi");
    assert_eq!(last_key().as_deref(), Some("new-key"), "the pooled session of the old key is not reused");
    gw.stop().await;
}

async fn text_of_call(gw: &Gateway, id: u64) -> String {
    text(&call(gw, "/mcp", id).send().await).to_string()
}

#[tokio::test]
async fn a_removed_route_and_its_policy_still_check_their_parked_calls_retries() {
    use support::jwt::{claims, Signer, AUDIENCE, HS_SECRET, ISSUER};
    let d = dir("removed-policy");
    let up = FakeUpstream::asking_each_call().start().await;
    seal_key(&d, "k1", 1);
    std::fs::write(d.join("hs"), HS_SECRET).unwrap();
    let head = format!(
        "[[keys]]\nid = \"k1\"\nfile = \"{}\"\n\n{}",
        d.join("k1").display(),
        upstreams(&[("u", &up)])
    );
    let file = d.join("gateway.toml");
    write(
        &file,
        &format!(
            "{head}[auth.users]\ntype = \"jwt\"\nissuer = \"{ISSUER}\"\naudience = \"{AUDIENCE}\"\n\
             algorithms = [\"HS256\"]\nhs256_secret_file = \"{}\"\n\n{}auth = \"users\"\n\n{}",
            d.join("hs").display(),
            route("/old", "u"),
            route("/kept", "u")
        ),
    );
    let gw = Gateway::from_file(&file, false).await;
    let token = Signer::hs().sign(&claims("ada", "mcp"));
    let first = ask(&gw, "/old", 1).bearer(&token).send().await;
    assert_eq!(first.result()["resultType"], "input_required", "{}", first.raw);

    // The route and its JWT policy leave together: the retry is still
    // checked, by the verifier the route had.
    write(&file, &format!("{head}{}", route("/kept", "u")));
    gw.reload().await.expect("applied");
    let unauthenticated = answer(&gw, "/old", 2, first.result()).send().await;
    assert_eq!(unauthenticated.status, 401, "{}", unauthenticated.raw);
    let done = answer(&gw, "/old", 3, first.result()).bearer(&token).send().await;
    assert_eq!(text(&done), "carried on", "{}", done.raw);
    gw.stop().await;
}
