//! `/status`: what it shows of a gateway with a route whose upstream is up
//! (the built-in demo server) and one whose upstream is down (a closed
//! port), as JSON and HTML; who may read it (`[server] status_allowed`,
//! the Host rule it shares with `/metrics`); that no route's auth or CORS
//! covers it; reloads; and that no route can take its path.

mod support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use support::{closed_port_url, Gateway};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A raw HTTP/1.1 exchange, so that the test says exactly which `Host` is sent.
struct Answer {
    status: u16,
    head: String,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

/// `GET path` with `host` (none: no Host header, HTTP/1.0) and `headers`.
async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    host: Option<&str>,
    headers: &[(&str, &str)],
) -> Answer {
    let mut head = match host {
        Some(host) => format!("{method} {path} HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n"),
        None => format!("{method} {path} HTTP/1.0\r\n"),
    };
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut raw)).await.unwrap().unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    Answer { status, head: head.to_string(), body: body.to_string() }
}

async fn get(gw: &Gateway, path: &str, headers: &[(&str, &str)]) -> Answer {
    request(gw.addr(), "GET", path, Some(&gw.addr().to_string()), headers).await
}

async fn status_json(gw: &Gateway) -> Value {
    let answer = get(gw, "/status", &[("accept", "application/json")]).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.header("content-type"), Some("application/json"));
    answer.json()
}

/// The built-in legacy demo server on a free port; stops with the test.
async fn demo_upstream() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    tokio::spawn(sessionless::demo::serve(listener, std::future::pending()));
    url
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sessionless-status-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Two routes: `/up` on the demo server and `/down` on a closed port, both probed.
async fn two_routes(server: &str) -> String {
    let (up, down) = (demo_upstream().await, closed_port_url().await);
    format!(
        "[server]\n{server}\n\n[[upstreams]]\nname = \"demo\"\nurl = \"{up}\"\n\n\
         [[upstreams]]\nname = \"gone\"\nurl = \"{down}\"\n\n\
         [[routes]]\npath = \"/up\"\nupstream = \"demo\"\n\n[[routes]]\npath = \"/down\"\nupstream = \"gone\"\n"
    )
}

async fn gateway(dir: &Path, toml: &str) -> Gateway {
    let file = dir.join("gateway.toml");
    std::fs::write(&file, toml).unwrap();
    Gateway::from_file(&file, false).await
}

/// The page once the start-up probes have settled (the up route's upstream
/// found legacy, the down route's instance marked down).
async fn settled(gw: &Gateway) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let page = status_json(gw).await;
        let first = |route: usize| page["routes"][route]["upstreams"][0].clone();
        if first(0)["generation"] == "legacy" && first(1)["state"] == "down" {
            return page;
        }
        assert!(tokio::time::Instant::now() < deadline, "not settled: {page:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn upstream<'a>(page: &'a Value, route: &str) -> &'a Value {
    let routes = page["routes"].as_array().unwrap();
    let r = routes.iter().find(|r| r["route"] == route).unwrap_or_else(|| panic!("{route} in {page:#}"));
    &r["upstreams"][0]
}

#[tokio::test]
async fn json_shows_both_routes_one_up_one_down() {
    let dir = temp_dir("json");
    let gw = gateway(&dir, &two_routes("").await).await;
    let page = settled(&gw).await;
    assert_eq!(page["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(page["listeners"][0]["kind"], "public");
    assert_eq!(page["listeners"][0]["address"], gw.addr().to_string());
    assert_eq!(page["listeners"][0]["tls"], false);
    assert_eq!(page["config"]["generation"], 1);
    assert_eq!(page["config"]["last_reload"], Value::Null);
    assert_eq!(page["draining"], false);
    assert!(page["parked_flows"].is_u64() && page["pooled_sessions"].is_u64(), "{page:#}");
    assert_eq!(page["routes"].as_array().unwrap().len(), 2);
    let route = &page["routes"][0];
    assert_eq!((route["route"].as_str(), route["federated"].as_bool()), (Some("/up"), Some(false)));
    assert_eq!(route["auth"], Value::Null);

    let up = upstream(&page, "/up");
    assert_eq!(up["name"], "demo");
    assert_eq!(up["kind"], "http");
    assert_eq!(
        (up["generation"].as_str(), up["generation_setting"].as_str()),
        (Some("legacy"), Some("auto"))
    );
    assert_eq!(
        (up["state"].as_str(), up["instances_up"].as_u64(), up["instances_down"].as_u64()),
        (Some("up"), Some(1), Some(0))
    );
    assert_eq!(up["instances"][0]["up"], true);
    // The probe (`server/discover`, which a legacy server refuses with a 4xx) was answered.
    assert_eq!(up["requests"]["4xx"], 1, "{up:#}");
    assert_eq!(up["errors_last_5m"], 0);

    let down = upstream(&page, "/down");
    assert_eq!(down["name"], "gone");
    assert_eq!((down["generation"].as_str(), down["state"].as_str()), (Some("unknown"), Some("down")));
    assert_eq!((down["instances_up"].as_u64(), down["instances_down"].as_u64()), (Some(0), Some(1)));
    assert!(down["requests"]["connect_error"].as_u64().unwrap() >= 1, "{down:#}");

    // A call to the route whose upstream is down is an error of that upstream's.
    let answer = gw.request_to("/down", "tools/list").send().await;
    assert!(answer.status.is_server_error(), "{}", answer.status);
    let page = status_json(&gw).await;
    assert!(upstream(&page, "/down")["errors_last_5m"].as_u64().unwrap() >= 1, "{page:#}");
    assert_eq!(upstream(&page, "/up")["errors_last_5m"], 0);
    // And one to the route that is up leaves a pooled session there.
    let answer = gw.request_to("/up", "tools/list").send().await;
    assert_eq!(answer.status, 200, "{}", answer.raw);
    let page = status_json(&gw).await;
    assert_eq!(upstream(&page, "/up")["pooled_sessions"], 1, "{page:#}");
    assert!(upstream(&page, "/up")["requests"]["2xx"].as_u64().unwrap() >= 2, "initialize, the call");
    assert_eq!(page["pooled_sessions"], 1);
    gw.stop().await;
}

#[tokio::test]
async fn html_shows_the_same_and_is_inert() {
    let dir = temp_dir("html");
    let gw = gateway(&dir, &two_routes("").await).await;
    settled(&gw).await;
    let browser = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8";
    let page = get(&gw, "/status", &[("accept", browser)]).await;
    assert_eq!(page.status, 200);
    assert_eq!(page.header("content-type"), Some("text/html; charset=utf-8"));
    let csp = page.header("content-security-policy").unwrap();
    assert!(csp.contains("default-src 'none'") && !csp.contains("script"), "{csp}");
    assert_eq!(page.header("cache-control"), Some("no-store"));
    let html = &page.body;
    assert!(html.starts_with("<!doctype html>"), "{html}");
    assert!(html.contains(&format!("<span id=\"version\">{}</span>", env!("CARGO_PKG_VERSION"))), "{html}");
    assert!(html.contains("<article class=\"route\" data-route=\"/up\">"), "{html}");
    assert!(html.contains("<tr class=\"upstream\" data-upstream=\"demo\" data-state=\"up\">"), "{html}");
    assert!(html.contains("<tr class=\"upstream\" data-upstream=\"gone\" data-state=\"down\">"), "{html}");
    assert!(html.contains("<span id=\"config-generation\">1</span>"), "{html}");
    for external in ["<script", "src=", "href=", "http-equiv", "@import", "url("] {
        assert!(!html.contains(external), "{external} in {html}");
    }
    // Without Accept at all: HTML too.
    assert!(get(&gw, "/status", &[]).await.body.starts_with("<!doctype html>"));
    gw.stop().await;
}

#[tokio::test]
async fn only_allowed_peers_see_it() {
    let dir = temp_dir("peers");
    // This test's peer is 127.0.0.1: outside these ranges.
    for allowed in ["[\"10.0.0.0/8\", \"::1\"]", "[]"] {
        let gw = gateway(&dir, &two_routes(&format!("status_allowed = {allowed}")).await).await;
        let refused = get(&gw, "/status", &[("accept", "application/json")]).await;
        assert_eq!((refused.status, refused.body.as_str()), (404, "not found\n"), "{allowed}");
        assert_eq!(get(&gw, "/metrics", &[]).await.status, 200, "/metrics has no peer list");
        gw.stop().await;
    }
    for allowed in ["[\"127.0.0.1\"]", "[\"10.0.0.0/8\", \"127.0.0.0/8\"]"] {
        let gw = gateway(&dir, &two_routes(&format!("status_allowed = {allowed}")).await).await;
        assert_eq!(get(&gw, "/status", &[]).await.status, 200, "{allowed}");
        gw.stop().await;
    }
}

#[tokio::test]
async fn a_host_a_page_could_be_rebound_to_is_refused() {
    let dir = temp_dir("hosts");
    let gw = gateway(&dir, &two_routes("").await).await;
    let port = gw.addr().port();
    for path in ["/status", "/metrics"] {
        for host in ["evil.example", &format!("evil.example:{port}"), "localhost.evil.example", "10.1.2.3"] {
            let refused = request(gw.addr(), "GET", path, Some(host), &[]).await;
            assert_eq!(refused.status, 403, "{path} with Host {host}: {}", refused.body);
            assert!(refused.body.contains("Host is not allowed"), "{}", refused.body);
        }
        let unnamed = request(gw.addr(), "GET", path, None, &[]).await;
        assert_eq!(unnamed.status, 403, "{path} naming no host");
        for host in [format!("localhost:{port}"), format!("127.0.0.1:{port}"), "LocalHost".to_string()] {
            let ok = request(gw.addr(), "GET", path, Some(&host), &[]).await;
            assert_eq!(ok.status, 200, "{path} with Host {host}: {}", ok.body);
        }
    }
    // /healthz keeps answering whatever the Host (probes name the pod's address).
    assert_eq!(request(gw.addr(), "GET", "/healthz", Some("evil.example"), &[]).await.status, 200);
    gw.stop().await;

    // `allowed_hosts` set: those names, and the address the connection came in on.
    let gw = gateway(&dir, &two_routes("allowed_hosts = [\"gw.example\"]").await).await;
    for path in ["/status", "/metrics"] {
        assert_eq!(request(gw.addr(), "GET", path, Some("gw.example"), &[]).await.status, 200, "{path}");
        assert_eq!(request(gw.addr(), "GET", path, Some(&gw.addr().to_string()), &[]).await.status, 200);
        assert_eq!(request(gw.addr(), "GET", path, Some("localhost"), &[]).await.status, 403, "{path}");
        assert_eq!(request(gw.addr(), "GET", path, Some("evil.example"), &[]).await.status, 403, "{path}");
    }
    gw.stop().await;
}

#[tokio::test]
async fn never_behind_a_routes_auth_or_cors() {
    let dir = temp_dir("auth");
    let line = sessionless::auth::keys::file_line("ops", "sk-the-only-key");
    std::fs::write(dir.join("keys.txt"), format!("{line}\n")).unwrap();
    let server = "[server.cors]\nallowed_origins = [\"*\"]";
    let mut toml = two_routes(server).await;
    toml.push_str(&format!(
        "auth = \"keys\"\n\n[auth.keys]\ntype = \"api_key\"\nkeys_file = \"{}\"\n",
        dir.join("keys.txt").display()
    ));
    let gw = gateway(&dir, &toml).await;
    // The route wants a key (its auth policy works)…
    assert_eq!(gw.request_to("/down", "tools/list").send().await.status, 401);
    assert!(gw
        .request_to("/down", "tools/list")
        .bearer("sk-the-only-key")
        .send()
        .await
        .status
        .is_server_error());
    // …the gateway's pages do not, and carry no CORS header for any origin.
    for path in ["/status", "/metrics"] {
        let answer = get(&gw, path, &[("origin", "https://app.example")]).await;
        assert_eq!(answer.status, 200, "{path}: {}", answer.body);
        assert_eq!(answer.header("access-control-allow-origin"), None, "{path}");
    }
    let preflight =
        get(&gw, "/status", &[("origin", "https://app.example"), ("access-control-request-method", "GET")]);
    assert_eq!(preflight.await.header("access-control-allow-origin"), None);
    let options = request(
        gw.addr(),
        "OPTIONS",
        "/status",
        Some(&gw.addr().to_string()),
        &[("origin", "https://app.example"), ("access-control-request-method", "GET")],
    )
    .await;
    assert_eq!(options.status, 405, "no preflight answered for /status");
    assert_eq!(options.header("allow"), Some("GET, HEAD"));
    assert_eq!(options.header("access-control-allow-origin"), None);
    let post =
        request(gw.addr(), "POST", "/status", Some(&gw.addr().to_string()), &[("content-length", "0")]).await;
    assert_eq!(post.status, 405);
    gw.stop().await;
}

#[tokio::test]
async fn reloads_show_as_the_config_generation_and_the_last_result() {
    let dir = temp_dir("reload");
    let toml = two_routes("").await;
    let gw = gateway(&dir, &toml).await;
    let file = dir.join("gateway.toml");
    std::fs::write(&file, toml.replace("path = \"/down\"", "path = \"/later\"")).unwrap();
    gw.reload().await.expect("applied");
    let page = status_json(&gw).await;
    assert_eq!(page["config"]["generation"], 2);
    assert_eq!(page["config"]["reloads_applied"], 1);
    let last = &page["config"]["last_reload"];
    assert_eq!(last["outcome"], "applied");
    assert!(last["detail"].as_str().unwrap().contains("routes added: /later; removed: /down"), "{last}");
    assert!(page["routes"].as_array().unwrap().iter().any(|r| r["route"] == "/later"));

    std::fs::write(&file, toml.replace("upstream = \"gone\"", "upstream = \"nobody <b>\"")).unwrap();
    gw.reload().await.expect_err("rejected");
    let page = status_json(&gw).await;
    assert_eq!(page["config"]["generation"], 2, "the running configuration stays");
    assert_eq!(page["config"]["reloads_rejected"], 1);
    let last = &page["config"]["last_reload"];
    assert_eq!(last["outcome"], "rejected");
    assert!(last["detail"].as_str().unwrap().contains("unknown upstream `nobody <b>`"), "{last}");
    let html = get(&gw, "/status", &[]).await.body;
    assert!(html.contains("unknown upstream `nobody &lt;b&gt;`"), "escaped: {html}");
    assert!(!html.contains("nobody <b>"));
    gw.stop().await;
}

#[test]
fn no_route_can_take_the_path() {
    let dir = temp_dir("reserved");
    let toml = "[[upstreams]]\nname = \"a\"\nurl = \"http://127.0.0.1:9/mcp\"\n\n[[routes]]\npath = \"/status\"\nupstream = \"a\"\n";
    let err = sessionless::Config::from_toml(toml).unwrap_err().0;
    assert!(err.contains("line 6: route path `/status` is the gateway's own"), "{err}");
    let file = dir.join("reserved.toml");
    std::fs::write(&file, toml).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sessionless"))
        .arg("check-config")
        .arg(&file)
        .env_clear()
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "route path `/status` is the gateway's own (/metrics, /healthz, /readyz, /status are reserved)"
        ),
        "{stderr}"
    );
}

#[tokio::test]
async fn federation_members_and_stdio_processes() {
    let dir = temp_dir("members");
    let (up, down) = (demo_upstream().await, closed_port_url().await);
    let fake = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/stdio_fake.py");
    let count = dir.join("secret-looking-count").display().to_string();
    let toml = format!(
        "[[upstreams]]\nname = \"demo\"\nurl = \"{up}\"\n\n[[upstreams]]\nname = \"gone\"\nurl = \"{down}\"\n\n\
         [[upstreams]]\nname = \"tools\"\ncommand = [\"python3\", \"{fake}\", \"--count-file\", \"{count}\"]\n\n\
         [[routes]]\npath = \"/all\"\nmembers = [\"demo\", \"gone\"]\n\n\
         [[routes]]\npath = \"/stdio\"\nupstream = \"tools\"\n"
    );
    let gw = gateway(&dir, &toml).await;
    assert_eq!(gw.request_to("/stdio", "tools/list").send().await.status, 200);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let page = loop {
        let page = status_json(&gw).await;
        let members = &page["routes"][0]["upstreams"];
        if members[0]["generation"] == "legacy" && members[1]["state"] == "down" {
            break page;
        }
        assert!(tokio::time::Instant::now() < deadline, "not settled: {page:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let all = &page["routes"][0];
    assert_eq!((all["route"].as_str(), all["federated"].as_bool()), (Some("/all"), Some(true)));
    let names: Vec<&str> =
        all["upstreams"].as_array().unwrap().iter().map(|u| u["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["demo", "gone"], "members in order");
    assert_eq!(all["upstreams"][0]["state"], "up");
    assert_eq!(all["upstreams"][1]["instances_down"], 1);

    let stdio = upstream(&page, "/stdio");
    assert_eq!((stdio["kind"].as_str(), stdio["command"].as_str()), (Some("stdio"), Some("python3")));
    assert!(!page.to_string().contains("secret-looking"), "arguments are not shown");
    assert!(stdio["processes"].as_u64().unwrap() >= 1, "{stdio:#}");
    assert_eq!(stdio["max_processes"], 16);
    assert_eq!(stdio["instances"][0]["instance"], "stdio:tools");
    assert_eq!((stdio["state"].as_str(), stdio["generation"].as_str()), (Some("up"), Some("legacy")));
    assert!(stdio["requests"]["started"].as_u64().unwrap() >= 1, "{stdio:#}");
    let html = get(&gw, "/status", &[]).await.body;
    assert!(html.contains("stdio: <code>python3</code>"), "{html}");
    gw.stop().await;
}
