//! What an anonymous client can cost the gateway: slow heads, stalled and
//! endless bodies, idle connections, the connection cap, Host-less requests.
//! Raw sockets on loopback; every limit is set small so each test is quick.

mod support;

use std::time::Duration;

use serde_json::json;
use support::{closed_port_url, single_route, Gateway};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

fn limits(server: &str, limits: &str) -> String {
    single_route("", &format!("[server]\n{server}\n\n[limits]\n{limits}\n"))
}

async fn gateway(server: &str, limit_keys: &str) -> Gateway {
    Gateway::from_toml(&limits(server, limit_keys), &closed_port_url().await).await
}

/// Reads until the peer closes; the bytes read, or `None` if still open after `wait`.
async fn closed_within(s: &mut TcpStream, wait: Duration) -> Option<Vec<u8>> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let until = Instant::now() + wait;
    loop {
        match tokio::time::timeout_at(until, s.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return Some(got),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
}

const HEALTH: &[u8] = b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n";

fn post_head(len: usize) -> String {
    format!(
        "POST /mcp HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n\
         accept: application/json, text/event-stream\r\ncontent-length: {len}\r\n\r\n"
    )
}

#[tokio::test]
async fn slow_request_heads_are_cut_at_the_header_timeout() {
    let gw = gateway("header_read_timeout_ms = 300\nclient_idle_timeout_ms = 60000", "").await;
    let mut conns = Vec::new();
    for _ in 0..50 {
        let mut s = TcpStream::connect(gw.addr()).await.unwrap();
        s.write_all(b"P").await.unwrap();
        conns.push(s);
    }
    // One more byte every 100 ms: never a complete head.
    let started = Instant::now();
    let mut closed = 0;
    for round in 0..20 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        for s in &mut conns {
            if s.write_all(&[b"OST /mcp HTTP/1.1\r\n"[round % 18]]).await.is_err() {
                continue;
            }
        }
    }
    for s in &mut conns {
        if closed_within(s, Duration::from_millis(500)).await.is_some() {
            closed += 1;
        }
    }
    assert_eq!(closed, 50, "every slow head is cut");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(gw.metric("sessionless_client_connections_ended_total").await, 50.0);
    gw.assert_healthy().await;
}

#[tokio::test]
async fn idle_keep_alive_connections_are_closed_and_busy_ones_are_not() {
    let gw = gateway("client_idle_timeout_ms = 300\nheader_read_timeout_ms = 5000", "").await;
    let mut idle = Vec::new();
    for _ in 0..20 {
        let mut s = TcpStream::connect(gw.addr()).await.unwrap();
        s.write_all(HEALTH).await.unwrap();
        let mut buf = [0u8; 1024];
        let n = s.read(&mut buf).await.unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&buf[..n]));
        idle.push(s);
    }
    let mut never_sent = TcpStream::connect(gw.addr()).await.unwrap();
    let started = Instant::now();
    for s in &mut idle {
        assert!(closed_within(s, Duration::from_secs(3)).await.is_some(), "idle keep-alive closed");
    }
    assert!(
        closed_within(&mut never_sent, Duration::from_secs(3)).await.is_some(),
        "a silent connection too"
    );
    assert!(started.elapsed() >= Duration::from_millis(250), "not before the idle timeout");
    assert_eq!(gw.metric("sessionless_client_connections_ended_total").await, 21.0);
    // The metrics request's own connection is the one left.
    assert_eq!(gw.metric("sessionless_client_connections_open").await, 1.0);
}

#[tokio::test]
async fn a_long_answer_is_not_idle() {
    // An upstream that takes 800 ms to answer; the client connection idles out at 300 ms.
    let up = support::FakeUpstream::new()
        .on(
            "tools/call",
            support::Answer::Sse(vec![
                support::Step::sleep_ms(800),
                support::Step::result(json!({"content": []})),
            ]),
        )
        .start()
        .await;
    let toml = limits("client_idle_timeout_ms = 300\nkeepalive_interval_ms = 60000", "");
    let gw = Gateway::from_toml(&toml, up.url()).await;
    let reply =
        gw.request("tools/call").id(json!(1)).params(json!({"name": "slow", "arguments": {}})).send().await;
    assert_eq!(reply.status, 200, "{}", reply.raw);
    assert_eq!(reply.result()["resultType"], "complete");
}

#[tokio::test]
async fn at_the_connection_cap_the_gateway_stops_accepting_until_one_closes() {
    let gw = gateway("client_idle_timeout_ms = 60000", "max_connections = 5").await;
    let mut held = Vec::new();
    for _ in 0..5 {
        let mut s = TcpStream::connect(gw.addr()).await.unwrap();
        s.write_all(HEALTH).await.unwrap();
        let mut buf = [0u8; 1024];
        assert!(s.read(&mut buf).await.unwrap() > 0);
        held.push(s);
    }
    // The sixth connects (the kernel's backlog) but is not served.
    let mut sixth = TcpStream::connect(gw.addr()).await.unwrap();
    sixth.write_all(HEALTH).await.unwrap();
    let mut buf = [0u8; 1024];
    let early = tokio::time::timeout(Duration::from_millis(300), sixth.read(&mut buf)).await;
    assert!(early.is_err(), "no answer over the cap");
    drop(held.pop());
    let n = tokio::time::timeout(Duration::from_secs(5), sixth.read(&mut buf)).await.unwrap().unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "served once a slot is free");
    // A seventh waits for a slot too: four held, the sixth, the metrics request.
    drop(held.pop());
    assert_eq!(gw.metric("sessionless_client_connections_open").await, 5.0);
}

#[tokio::test]
async fn a_stalled_body_gets_408_at_the_idle_gap_and_holds_its_permit_only_until_then() {
    let gw =
        gateway("body_idle_timeout_ms = 300\nbody_timeout_ms = 10000", "max_concurrent_requests = 2").await;
    let mut stalled = Vec::new();
    for _ in 0..2 {
        let mut s = TcpStream::connect(gw.addr()).await.unwrap();
        s.write_all(post_head(1000).as_bytes()).await.unwrap();
        s.write_all(b"{\"jsonrpc\":").await.unwrap();
        stalled.push(s);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Both permits are held by bodies still arriving: a third request is turned away at once.
    let third = gw.request("tools/list").id(json!(3)).send().await;
    third.assert_error(503, -31000, &json!(3));
    let started = Instant::now();
    for s in &mut stalled {
        let answer = closed_within(s, Duration::from_secs(3)).await.expect("answered and closed");
        let text = String::from_utf8_lossy(&answer);
        assert!(text.starts_with("HTTP/1.1 408"), "{text}");
        assert!(text.contains("-32600"), "{text}");
    }
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[tokio::test]
async fn a_trickling_body_gets_408_at_the_whole_body_timeout() {
    let gw = gateway("body_idle_timeout_ms = 400\nbody_timeout_ms = 600", "").await;
    let mut s = TcpStream::connect(gw.addr()).await.unwrap();
    s.write_all(post_head(1 << 20).as_bytes()).await.unwrap();
    let started = Instant::now();
    let trickle = async {
        loop {
            if s.write_all(b" ").await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            if started.elapsed() > Duration::from_secs(5) {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_millis(900), trickle).await;
    let answer = closed_within(&mut s, Duration::from_secs(3)).await.expect("answered");
    assert!(String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 408"));
    assert!(started.elapsed() < Duration::from_secs(2), "cut near 600 ms, not at 5 s");
}

#[tokio::test]
async fn a_request_without_host_or_with_a_foreign_one_is_refused_on_loopback() {
    let gw = gateway("", "").await;
    for head in [
        "POST /mcp HTTP/1.1\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}",
        "POST /mcp HTTP/1.1\r\nhost: evil.example\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}",
        "POST http://evil.example/mcp HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}",
    ] {
        let mut s = TcpStream::connect(gw.addr()).await.unwrap();
        s.write_all(head.as_bytes()).await.unwrap();
        let mut buf = [0u8; 2048];
        let n = s.read(&mut buf).await.unwrap();
        let text = String::from_utf8_lossy(&buf[..n]);
        assert!(text.starts_with("HTTP/1.1 403"), "{head:?} → {text}");
    }
}

#[tokio::test]
async fn h2_requests_are_checked_against_their_authority() {
    use http_body_util::{BodyExt, Full};
    let gw = gateway("", "").await;
    for (authority, expected) in [("evil.example", 403), ("127.0.0.1", 200)] {
        let tcp = TcpStream::connect(gw.addr()).await.unwrap();
        let (mut send, conn) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(tcp),
        )
        .await
        .unwrap();
        tokio::spawn(conn);
        let port = gw.addr().port();
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {"_meta": {
            "io.modelcontextprotocol/protocolVersion": support::VERSION,
            "io.modelcontextprotocol/clientCapabilities": {}}}});
        let req = http::Request::post(format!("http://{authority}:{port}/healthz"))
            .header("content-type", "application/json")
            .body(Full::new(bytes::Bytes::from(body.to_string())))
            .unwrap();
        let resp = send.send_request(req).await.unwrap();
        let _ = resp.into_body().collect().await;
        // /healthz is not an MCP endpoint: it answers whatever the authority.
        let req = http::Request::post(format!("http://{authority}:{port}/mcp"))
            .header("content-type", "application/json")
            .header("mcp-protocol-version", support::VERSION)
            .header("mcp-method", "server/discover")
            .body(Full::new(bytes::Bytes::from(body.to_string())))
            .unwrap();
        let resp = send.send_request(req).await.unwrap();
        let status = resp.status().as_u16();
        let _ = resp.into_body().collect().await;
        if expected == 403 {
            assert_eq!(status, 403, "{authority}");
        } else {
            assert_ne!(status, 403, "{authority}: allowed (the upstream is down, so any other answer)");
        }
    }
}

#[tokio::test]
async fn h2_connections_get_the_configured_stream_and_header_limits() {
    let gw = gateway("h2_max_concurrent_streams = 2\nmax_header_bytes = 16384", "").await;
    let tcp = TcpStream::connect(gw.addr()).await.unwrap();
    let (client, mut conn) = h2::client::handshake(tcp).await.unwrap();
    assert_eq!(conn.max_concurrent_send_streams(), usize::MAX, "nothing known before the server's SETTINGS");
    // Drive the connection a moment: the server's SETTINGS arrive.
    let _ = tokio::time::timeout(Duration::from_millis(300), &mut conn).await;
    assert_eq!(conn.max_concurrent_send_streams(), 2, "the gateway's SETTINGS_MAX_CONCURRENT_STREAMS");
    let driver = tokio::spawn(conn);
    let mut client = client.ready().await.unwrap();
    let req = http::Request::post(format!("http://127.0.0.1:{}/mcp", gw.addr().port()))
        .header("content-type", "application/json")
        .header("x-padding", "x".repeat(32 * 1024))
        .body(())
        .unwrap();
    let answer = match client.send_request(req, true) {
        Ok((resp, _)) => resp.await.map(|r| r.status().as_u16()),
        Err(e) => Err(e),
    };
    assert!(!matches!(answer, Ok(200..=299)), "a 32 KiB header list over a 16 KiB limit: {answer:?}");
    driver.abort();
}
