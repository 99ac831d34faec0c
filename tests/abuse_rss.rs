//! What an attack costs in resident memory, measured on the real binary
//! (a child process on loopback, stopped by the test): stalled bodies are
//! bounded by the body budget, idle connections by the connection cap.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// The gateway binary, killed when dropped (even when the test fails).
struct Gateway {
    child: Child,
    port: u16,
    _dir: Option<TempDir>,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Gateway {
    /// In front of nothing (a closed port).
    fn start(tables: &str) -> Gateway {
        let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        Gateway::in_front_of(&format!("http://{dead}/mcp"), tables)
    }

    fn in_front_of(upstream: &str, tables: &str) -> Gateway {
        let dir =
            std::env::temp_dir().join(format!("sessionless-rss-{}-{}", std::process::id(), rand_suffix()));
        std::fs::create_dir_all(&dir).unwrap();
        let config = format!(
            "[server]\nlisten = \"127.0.0.1:0\"\n{tables}\n\n[[upstreams]]\nname = \"up\"\n\
             url = \"{upstream}\"\n\n[[routes]]\npath = \"/mcp\"\nupstream = \"up\"\n"
        );
        let path = dir.join("gateway.toml");
        std::fs::write(&path, config).unwrap();
        let (child, port) = spawn(&["--config", path.to_str().unwrap()], "listening on http://127.0.0.1:");
        Gateway { child, port, _dir: Some(TempDir(dir)) }
    }

    /// The built-in legacy demo server, alone.
    fn demo_upstream() -> Gateway {
        let (child, port) = spawn(&["demo-upstream", "--listen", "127.0.0.1:0"], "on http://127.0.0.1:");
        Gateway { child, port, _dir: None }
    }

    fn rss_mib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let kib: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap();
        kib / 1024
    }

    fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

/// Starts the binary with `args`; returns it and the port it logs after `marker`.
fn spawn(args: &[&str], marker: &str) -> (Child, u16) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sessionless"))
        .args(args)
        .stderr(Stdio::piped())
        .spawn()
        .expect("the gateway binary starts");
    let stderr = child.stderr.take().unwrap();
    let mut lines = BufReader::new(stderr).lines();
    let port = loop {
        let line = lines.next().expect("the binary logs its address").unwrap();
        if let Some(at) = line.find(marker) {
            let rest = &line[at + marker.len()..];
            break rest.chars().take_while(char::is_ascii_digit).collect::<String>().parse().unwrap();
        }
    };
    // Keep draining its log so that it never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines.by_ref() {});
    (child, port)
}

fn rand_suffix() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos() as u64
}

/// The status code of the answer on `s`, if one comes within `wait`.
async fn status_within(s: &mut TcpStream, wait: Duration) -> Option<u16> {
    let mut buf = [0u8; 512];
    let n = tokio::time::timeout(wait, s.read(&mut buf)).await.ok()?.ok()?;
    let text = std::str::from_utf8(&buf[..n]).ok()?;
    text.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()
}

#[tokio::test]
async fn bodies_stalled_just_under_the_limit_are_bounded_by_the_body_budget() {
    let gw = Gateway::start(
        "body_timeout_ms = 4000\nbody_idle_timeout_ms = 4000\n\n[limits]\nmax_buffered_body_bytes = 33554432",
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = gw.rss_mib();
    const BODY: usize = 4 << 20;
    let head = format!(
        "POST /mcp HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {BODY}\r\n\r\n"
    );
    let filler = vec![b' '; BODY - 1];
    let mut senders = Vec::new();
    for _ in 0..100 {
        let (addr, head, filler) = (gw.addr(), head.clone(), filler.clone());
        senders.push(tokio::spawn(async move {
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.write_all(head.as_bytes()).await.unwrap();
            let _ = s.write_all(&filler).await; // refused bodies are cut short
            s
        }));
    }
    let mut conns = Vec::new();
    for sender in senders {
        conns.push(sender.await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let peak = gw.rss_mib();
    let started = Instant::now();
    let (mut refused, mut timed_out) = (0, 0);
    for s in &mut conns {
        match status_within(s, Duration::from_secs(8)).await {
            Some(503) => refused += 1,
            Some(408) => timed_out += 1,
            other => panic!("every stalled body is answered: {other:?}"),
        }
    }
    assert_eq!(refused + timed_out, 100);
    assert!(
        refused >= 90,
        "at most 8 bodies of 4 MiB fit the 32 MiB budget: {timed_out} waited for the timeout"
    );
    assert!(started.elapsed() < Duration::from_secs(8));
    // 100 bodies of 4 MiB would be 400 MiB; the budget is 32 (measured: about
    // 50 MiB of growth, with the connections' buffers and the allocator's slack).
    assert!(peak.saturating_sub(before) < 96, "RSS {before} → {peak} MiB");
}

#[tokio::test]
async fn connections_over_the_cap_wait_unserved_and_cost_nothing() {
    let gw = Gateway::start("client_idle_timeout_ms = 60000\n\n[limits]\nmax_connections = 100");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = gw.rss_mib();
    // 200: the listen backlog (128) holds the hundred over the cap.
    let mut conns = Vec::new();
    for _ in 0..200 {
        let mut s = TcpStream::connect(gw.addr()).await.unwrap();
        s.write_all(b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n").await.unwrap();
        conns.push(s);
    }
    let answered =
        futures_util::future::join_all(conns.iter_mut().map(|s| status_within(s, Duration::from_secs(3))))
            .await;
    let served = answered.iter().filter(|a| **a == Some(200)).count();
    assert_eq!(served, 100, "exactly the cap is served");
    let after = gw.rss_mib();
    assert!(after.saturating_sub(before) < 30, "RSS {before} → {after} MiB for 100 served and 100 waiting");
    // Closing the served connections lets waiting ones in.
    let mut waiting: Vec<TcpStream> =
        conns.into_iter().zip(answered).filter(|(_, a)| a.is_none()).map(|(s, _)| s).collect();
    assert_eq!(waiting.len(), 100);
    let next =
        futures_util::future::join_all(waiting.iter_mut().map(|s| status_within(s, Duration::from_secs(3))))
            .await;
    assert_eq!(
        next.iter().filter(|a| **a == Some(200)).count(),
        100,
        "the hundred waiting are served once the first leave"
    );
}

#[tokio::test]
async fn unique_capability_objects_cost_neither_memory_nor_sessions() {
    use http_body_util::{BodyExt, Full};
    let up = Gateway::demo_upstream();
    let gw = Gateway::in_front_of(&format!("http://127.0.0.1:{}/mcp", up.port), "");
    let tcp = TcpStream::connect(gw.addr()).await.unwrap();
    let (mut send, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp)).await.unwrap();
    tokio::spawn(conn);
    let padding = "x".repeat(100_000);
    let mut call = |i: usize| {
        let body = serde_json::json!({"jsonrpc": "2.0", "id": i, "method": "server/discover", "params": {"_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities":
                {"sampling": {format!("k{i}"): {"padding": padding}}, "experimental": {"n": i}}}}});
        let req = http::Request::post("/mcp")
            .header("host", "127.0.0.1")
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", "server/discover")
            .body(Full::new(bytes::Bytes::from(body.to_string())))
            .unwrap();
        send.send_request(req)
    };
    let warm = call(0).await.unwrap();
    assert_eq!(warm.status(), 200);
    let _ = warm.into_body().collect().await;
    let before = gw.rss_mib();
    for i in 1..=500 {
        let resp = call(i).await.unwrap();
        assert_eq!(resp.status(), 200);
        let _ = resp.into_body().collect().await;
    }
    let after = gw.rss_mib();
    // 500 distinct 100 KB capability objects: kept, they would be 50 MB and
    // more; reduced to their fingerprint, they are one key.
    assert!(after.saturating_sub(before) < 25, "RSS {before} → {after} MiB");
    let metrics = get_text(&gw.addr(), "/metrics").await;
    let initialized: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("sessionless_upstream_sessions_initialized_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(initialized, 1.0, "one upstream session for one fingerprint");
}

/// A GET over a fresh connection, the whole body as text.
async fn get_text(addr: &str, path: &str) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    String::from_utf8_lossy(&out).into_owned()
}
