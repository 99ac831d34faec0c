use super::body::MAX_HEADERS;
use super::head::MAX_HEAD;
use super::*;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use http_body_util::BodyExt;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;

/// An in-memory upstream: each read yields the next piece; after the last,
/// the stream ends (`eof`) or waits forever. Writes are taken and dropped.
/// `read` counts the bytes handed out.
struct Script {
    pieces: VecDeque<Vec<u8>>,
    eof: bool,
    read: Arc<AtomicUsize>,
}

impl Script {
    fn new(pieces: Vec<Vec<u8>>, eof: bool) -> Script {
        Script { pieces: pieces.into(), eof, read: Arc::default() }
    }

    /// Every byte of `data` in a read of its own.
    fn bytewise(data: &[u8], eof: bool) -> Script {
        Script::new(data.iter().map(|&b| vec![b]).collect(), eof)
    }
}

impl AsyncRead for Script {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.pieces.pop_front() {
            Some(mut piece) => {
                let n = piece.len().min(buf.remaining());
                buf.put_slice(&piece[..n]);
                self.read.fetch_add(n, Ordering::SeqCst);
                if n < piece.len() {
                    self.pieces.push_front(piece.split_off(n));
                }
                Poll::Ready(Ok(()))
            }
            None if self.eof => Poll::Ready(Ok(())),
            None => Poll::Pending,
        }
    }
}

impl AsyncWrite for Script {
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

fn mem_client() -> Client {
    client("127.0.0.1:9".parse().unwrap())
}

/// The response to `method` read from `script`.
async fn over(c: &Client, method: &str, script: Script) -> Result<Response, Error> {
    c.send_over(Box::new(script), method, &[], b"").await
}

/// The body, or its error, within a second (a stalled decoder fails).
async fn body_soon(resp: Response) -> io::Result<Bytes> {
    tokio::time::timeout(Duration::from_secs(1), body_of(resp)).await.expect("the body ended at once")
}

fn client(addr: std::net::SocketAddr) -> Client {
    let tls = Arc::new(super::super::transport::rustls_config());
    let settings = Settings {
        connect_timeout: Duration::from_secs(2),
        idle_timeout: Duration::from_secs(30),
        max_idle: 4,
    };
    Client::new(&format!("http://user:pw@{addr}/mcp?x=1").parse().unwrap(), tls, settings).unwrap()
}

/// A server that answers each connection's requests with the given raw
/// responses in turn (one per request, written in the given pieces), then
/// closes the connection. Returns the address and the requests it read.
async fn server(conns: Vec<Vec<Vec<&'static [u8]>>>) -> (std::net::SocketAddr, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        for responses in conns {
            let (mut s, _) = listener.accept().await.unwrap();
            for pieces in responses {
                let mut req = Vec::new();
                let mut b = [0u8; 4096];
                while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                    let n = s.read(&mut b).await.unwrap();
                    if n == 0 {
                        return;
                    }
                    req.extend_from_slice(&b[..n]);
                }
                log.lock().unwrap().push(String::from_utf8_lossy(&req).into_owned());
                for p in pieces {
                    s.write_all(p).await.unwrap();
                    s.flush().await.unwrap();
                    tokio::time::sleep(Duration::from_millis(30)).await;
                }
            }
        }
    });
    (addr, seen)
}

async fn body_of(resp: Response) -> io::Result<Bytes> {
    Ok(resp.body.collect().await?.to_bytes())
}

#[tokio::test]
async fn content_length_response_and_connection_reuse() {
    let ok = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\ncontent-length: 7\r\nMcp-Session-Id: s1\r\n\r\n{\"a\":1}";
    let (addr, seen) = server(vec![vec![vec![ok], vec![ok]]]).await;
    let c = client(addr);
    for _ in 0..2 {
        let r = c.send("POST", &[("accept", "application/json")], b"{}").await.unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.header("mcp-session-id"), Some("s1"));
        assert_eq!(r.header("CONTENT-TYPE"), Some("application/json"));
        assert_eq!(body_of(r).await.unwrap(), "{\"a\":1}");
        assert_eq!(c.idle(), 1, "the connection went back to the pool");
    }
    c.forget_idle();
    assert_eq!(c.idle(), 0, "a distrusted upstream's idle connections are dropped");
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2, "both requests on one connection");
    assert!(seen[0].starts_with("POST /mcp?x=1 HTTP/1.1\r\nhost: 127.0.0.1:"), "{}", seen[0]);
    assert!(seen[0].contains("accept: application/json\r\ncontent-length: 2\r\n\r\n"), "{}", seen[0]);
}

#[tokio::test]
async fn chunked_body_split_anywhere_with_extensions_and_trailers() {
    let pieces: Vec<&'static [u8]> = vec![
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
        b"5;ext=1\r\nhel",
        b"lo\r",
        b"\n6\r\n world\r\n0\r",
        b"\nX-Trailer: 1\r\n",
        b"\r\n",
    ];
    let again: Vec<&'static [u8]> = vec![b"HTTP/1.1 204 No Content\r\n\r\n"];
    let (addr, seen) = server(vec![vec![pieces, again]]).await;
    let c = client(addr);
    let r = c.send("GET", &[], b"").await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(body_of(r).await.unwrap(), "hello world");
    let r = c.send("DELETE", &[], b"").await.unwrap();
    assert_eq!(r.status, 204);
    assert_eq!(body_of(r).await.unwrap(), "");
    assert_eq!(seen.lock().unwrap().len(), 2, "reused after a chunked body");
    assert!(!seen.lock().unwrap()[0].contains("content-length"), "no length on a bodiless GET");
}

#[tokio::test]
async fn close_delimited_and_connection_close_are_not_reused() {
    let eof: Vec<&'static [u8]> = vec![b"HTTP/1.1 200 OK\r\n\r\nuntil", b" the end"];
    let close: Vec<&'static [u8]> =
        vec![b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"];
    let (addr, seen) = server(vec![vec![eof], vec![close], vec![]]).await;
    let c = client(addr);
    let r = c.send("POST", &[], b"x").await.unwrap();
    assert_eq!(body_of(r).await.unwrap(), "until the end");
    assert_eq!(c.idle(), 0);
    let r = c.send("POST", &[], b"x").await.unwrap();
    assert_eq!(body_of(r).await.unwrap(), "ok");
    assert_eq!(c.idle(), 0, "Connection: close is honoured");
    assert_eq!(seen.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn an_idle_connection_the_server_closed_is_not_used() {
    let ok: Vec<&'static [u8]> = vec![b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n1"];
    let ok2: Vec<&'static [u8]> = vec![b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n2"];
    // The first connection serves one request and closes.
    let (addr, seen) = server(vec![vec![ok], vec![ok2]]).await;
    let c = client(addr);
    assert_eq!(body_of(c.send("POST", &[], b"x").await.unwrap()).await.unwrap(), "1");
    assert_eq!(c.idle(), 1);
    tokio::time::sleep(Duration::from_millis(50)).await; // the close arrives
    assert_eq!(body_of(c.send("POST", &[], b"x").await.unwrap()).await.unwrap(), "2");
    assert_eq!(seen.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn broken_responses_are_errors() {
    let cases: Vec<(Vec<&'static [u8]>, &str)> = vec![
        (vec![b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort"], "truncated"),
        (vec![b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"], "bad chunk size"),
        (vec![b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXY"], "missing CRLF"),
    ];
    for (pieces, what) in cases {
        let (addr, _) = server(vec![vec![pieces]]).await;
        let c = client(addr);
        let r = c.send("POST", &[], b"x").await.unwrap();
        assert!(body_of(r).await.is_err(), "{what}");
        assert_eq!(c.idle(), 0, "{what}");
    }
    let (addr, _) = server(vec![vec![vec![b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n"]]]).await;
    assert!(matches!(client(addr).send("POST", &[], b"x").await, Err(Error::Invalid(_))));
    let (addr, _) = server(vec![vec![vec![b"HTTP/1.1 200 O"]]]).await;
    assert!(matches!(client(addr).send("POST", &[], b"x").await, Err(Error::Broken(_))));
}

#[tokio::test]
async fn nothing_listening_is_unreachable_and_bad_headers_are_refused() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    assert!(matches!(client(addr).send("POST", &[], b"x").await, Err(Error::Unreachable(_))));
    let injected = client(addr).send("POST", &[("last-event-id", "1\r\nx: y")], b"x").await;
    assert!(matches!(injected, Err(Error::Request(_))));
}

#[tokio::test]
async fn a_waiting_body_holds_no_buffer() {
    let pieces: Vec<&'static [u8]> = vec![
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n",
        b"4\r\nlast\r\n0\r\n\r\n",
    ];
    let (addr, _) = server(vec![vec![pieces]]).await;
    let mut r = client(addr).send("POST", &[], b"x").await.unwrap();
    let first = r.body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(first, "first");
    let mut waited = false;
    loop {
        match r.body.frame().now_or_never() {
            None => {
                waited = true;
                assert_eq!(r.body.conn.as_ref().unwrap().buf.capacity(), 0, "no buffer while waiting");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Some(Some(f)) => {
                assert_eq!(f.unwrap().into_data().unwrap(), "last");
                break;
            }
            Some(None) => panic!("ended early"),
        }
    }
    assert!(waited, "the second piece comes later");
}

#[tokio::test]
async fn connections_idle_past_the_timeout_are_not_reused() {
    // A server that keeps every connection open and answers every request.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::spawn(async move {
                let mut b = [0u8; 4096];
                while s.read(&mut b).await.is_ok_and(|n| n > 0) {
                    let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx").await;
                }
            });
        }
    });
    let settings = Settings {
        connect_timeout: Duration::from_secs(2),
        idle_timeout: Duration::from_millis(100),
        max_idle: 4,
    };
    let tls = Arc::new(super::super::transport::rustls_config());
    let c = Client::new(&format!("http://{addr}/").parse().unwrap(), tls, settings).unwrap();
    for _ in 0..2 {
        body_of(c.send("POST", &[], b"x").await.unwrap()).await.unwrap();
    }
    assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 1, "reused while fresh");
    tokio::time::sleep(Duration::from_millis(150)).await;
    body_of(c.send("POST", &[], b"x").await.unwrap()).await.unwrap();
    assert_eq!(
        accepted.load(std::sync::atomic::Ordering::SeqCst),
        2,
        "a new connection after the idle timeout"
    );
    assert_eq!(c.idle(), 1, "the expired one is gone, the new one is kept");
}

const CHUNKED_HEAD: &[u8] = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

#[tokio::test]
async fn trailers_in_the_last_packet_end_the_body_at_once() {
    let last = b"5\r\nhello\r\n0\r\nX-Trailer: 1\r\nX-Other: 2\r\n\r\n";
    let c = mem_client();
    // The upstream then keeps the connection open and says nothing.
    let r = over(&c, "POST", Script::new(vec![CHUNKED_HEAD.to_vec(), last.to_vec()], false)).await.unwrap();
    assert_eq!(body_soon(r).await.unwrap(), "hello");
    let r = over(&c, "POST", Script::new(vec![cat(&[CHUNKED_HEAD, last])], false)).await.unwrap();
    assert_eq!(body_soon(r).await.unwrap(), "hello");
    assert_eq!(c.idle(), 2, "both clean ends went back to the pool");
}

/// Yields `head` once, then `line` forever (up to `limit` bytes, then EOF).
struct Endless {
    head: Option<Vec<u8>>,
    line: &'static [u8],
    served: Arc<AtomicUsize>,
    limit: usize,
}

impl AsyncRead for Endless {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.served.load(Ordering::SeqCst) >= self.limit {
            return Poll::Ready(Ok(()));
        }
        let piece = self.head.take().unwrap_or_else(|| self.line.repeat(64));
        let n = piece.len().min(buf.remaining());
        buf.put_slice(&piece[..n]);
        self.served.fetch_add(n, Ordering::SeqCst);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Endless {
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[tokio::test]
async fn endless_trailers_and_chunk_extensions_are_errors_after_a_bounded_read() {
    let cases: [(&[u8], &'static [u8]); 3] = [
        (b"0\r\n", b"X-Trailer: 0123456789\r\n"),
        (b"0\r\n", b"X:\r\n"),
        (b"", b"1;ext=0123456789abcdef0123456789abcdef0123456789abcdef\r\nx\r\n"),
    ];
    for (start, line) in cases {
        let served = Arc::new(AtomicUsize::new(0));
        let endless =
            Endless { head: Some(cat(&[CHUNKED_HEAD, start])), line, served: served.clone(), limit: 8 << 20 };
        let r = mem_client().send_over(Box::new(endless), "POST", &[], b"").await.unwrap();
        let what = String::from_utf8_lossy(line);
        assert!(body_soon(r).await.is_err(), "{what}");
        let n = served.load(Ordering::SeqCst);
        assert!(n < 64 * 1024, "{what}: an error after {n} bytes");
    }
}

#[tokio::test]
async fn digits_are_strict() {
    let c = mem_client();
    for cl in ["+2", "-2", " 2 x", "0x2", "2a", "", "2,3", "18446744073709551616"] {
        let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {cl}\r\n\r\nok");
        let r = over(&c, "POST", Script::new(vec![head.into_bytes()], true)).await;
        assert!(matches!(r, Err(Error::Invalid(_))), "content-length {cl:?}");
    }
    for cl in ["2", " 2 ", "2, 2", "2,2"] {
        let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {cl}\r\nContent-Length: 2\r\n\r\nok");
        let r = over(&c, "POST", Script::new(vec![head.into_bytes()], true)).await.unwrap();
        assert_eq!(body_soon(r).await.unwrap(), "ok", "content-length {cl:?}");
    }
    let bad_sizes: [&[u8]; 10] =
        [b"+5", b" 5", b"5 ", b"0x5", b"-0", b"", b";x", b"5\t;x", b"00000000000000005", b"5;a\rb"];
    for size in bad_sizes {
        for split in [false, true] {
            let data = cat(&[CHUNKED_HEAD, size, b"\r\nhello\r\n0\r\n\r\n"]);
            let script = if split { Script::bytewise(&data, true) } else { Script::new(vec![data], true) };
            let r = over(&c, "POST", script).await.unwrap();
            assert!(body_soon(r).await.is_err(), "chunk size {:?}", String::from_utf8_lossy(size));
        }
    }
    let good = cat(&[CHUNKED_HEAD, b"5;a=b;c=\"d\"\r\nhello\r\n000\r\n\r\n"]);
    let r = over(&c, "POST", Script::bytewise(&good, false)).await.unwrap();
    assert_eq!(body_soon(r).await.unwrap(), "hello");
}

#[tokio::test]
async fn bare_line_feeds_are_refused() {
    let c = mem_client();
    for head in [
        &b"HTTP/1.1 200 OK\nContent-Length: 2\n\nok"[..],
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\n\r\nok",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\nok",
        b"\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
    ] {
        for split in [false, true] {
            let script =
                if split { Script::bytewise(head, true) } else { Script::new(vec![head.to_vec()], true) };
            let r = over(&c, "POST", script).await;
            assert!(matches!(r, Err(Error::Invalid(_))), "{:?}", String::from_utf8_lossy(head));
        }
    }
    for body in
        [&b"5\nhello\r\n0\r\n\r\n"[..], b"5\r\nhello\n0\r\n\r\n", b"5\r\nhello\r\n0\n\n", b"0\r\nX: 1\n\r\n"]
    {
        let r = over(&c, "POST", Script::new(vec![cat(&[CHUNKED_HEAD, body])], true)).await.unwrap();
        assert!(body_soon(r).await.is_err(), "{:?}", String::from_utf8_lossy(body));
    }
}

#[tokio::test]
async fn ambiguous_framing_is_invalid_and_never_reused() {
    let c = mem_client();
    for head in [
        &b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n"[..],
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, chunked\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: \r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, \r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip,,chunked\r\n\r\n",
        b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
    ] {
        let data = cat(&[head, b"5\r\nhello\r\n0\r\n\r\n"]);
        let r = over(&c, "POST", Script::new(vec![data], false)).await;
        assert!(matches!(r, Err(Error::Invalid(_))), "{:?}", String::from_utf8_lossy(head));
    }
    assert_eq!(c.idle(), 0);
    // A final coding other than chunked: read to the end, never reused.
    let gzip = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: x-custom\r\nTransfer-Encoding: gzip\r\n\r\nzz";
    let r = over(&c, "POST", Script::new(vec![gzip.to_vec()], true)).await.unwrap();
    assert_eq!(body_soon(r).await.unwrap(), "zz");
    let unknown =
        cat(&[b"HTTP/1.1 200 OK\r\nTransfer-Encoding: x-custom, Chunked\r\n\r\n", b"2\r\nok\r\n0\r\n\r\n"]);
    let r = over(&c, "POST", Script::new(vec![unknown], false)).await.unwrap();
    assert_eq!(body_soon(r).await.unwrap(), "ok");
    assert_eq!(c.idle(), 1, "only the chunked one is reused");
}

#[tokio::test]
async fn framing_knows_the_method_and_the_status() {
    let c = mem_client();
    let head = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n";
    let r = over(&c, "HEAD", Script::new(vec![head.to_vec()], false)).await.unwrap();
    assert_eq!(body_soon(r).await.unwrap(), "", "a HEAD response has no body");
    let head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
    let r = over(&c, "HEAD", Script::new(vec![head.to_vec()], false)).await.unwrap();
    assert_eq!(body_soon(r).await.unwrap(), "");
    for status in ["204 No Content", "304 Not Modified"] {
        let head = format!("HTTP/1.1 {status}\r\nContent-Length: 5\r\n\r\n");
        let r = over(&c, "GET", Script::new(vec![head.into_bytes()], false)).await.unwrap();
        assert_eq!(body_soon(r).await.unwrap(), "", "{status}");
    }
    assert_eq!(c.idle(), 4);
    let ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
    let interim = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n";
    let r = over(&c, "POST", Script::bytewise(&cat(&[&interim.repeat(8), ok]), false)).await.unwrap();
    assert_eq!(body_soon(r).await.unwrap(), "ok", "16 interim responses are skipped");
    let too_many = cat(&[&interim.repeat(8), b"HTTP/1.1 100 Continue\r\n\r\n", ok]);
    let r = over(&c, "POST", Script::new(vec![too_many], false)).await;
    assert!(matches!(r, Err(Error::Invalid(_))), "the 17th is refused");
    let upgrade = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n";
    let r = over(&c, "GET", Script::new(vec![upgrade.to_vec()], false)).await;
    assert!(matches!(r, Err(Error::Invalid(_))), "we never ask for an upgrade");
    let r = over(&c, "GET", Script::new(vec![b"HTTP/1.1 099 Low\r\n\r\n".to_vec()], true)).await;
    assert!(matches!(r, Err(Error::Invalid(_))), "a status below 100");
}

#[tokio::test]
async fn header_count_and_head_size_are_capped() {
    let c = mem_client();
    let head = |n: usize| {
        let fields: String = (0..n).map(|i| format!("x-h{i}: v\r\n")).collect();
        format!("HTTP/1.1 200 OK\r\n{fields}Content-Length: 0\r\n\r\n").into_bytes()
    };
    let r = over(&c, "GET", Script::new(vec![head(MAX_HEADERS - 1)], false)).await.unwrap();
    assert_eq!(body_soon(r).await.unwrap(), "");
    let r = over(&c, "GET", Script::new(vec![head(MAX_HEADERS)], false)).await;
    assert!(matches!(r, Err(Error::Invalid("too many response headers"))));
    let big = format!("HTTP/1.1 200 OK\r\nx: {}\r\n\r\n", "a".repeat(MAX_HEAD)).into_bytes();
    let script = Script::new(big.chunks(1000).map(<[u8]>::to_vec).collect(), false);
    assert!(matches!(over(&c, "GET", script).await, Err(Error::Invalid("response head too large"))));
}

#[tokio::test]
async fn bytes_after_the_response_in_the_same_read_are_never_reused() {
    let c = mem_client();
    let stray = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstray";
    for first in [
        &b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"[..],
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
        b"HTTP/1.1 204 No Content\r\n\r\n",
    ] {
        let r = over(&c, "GET", Script::new(vec![cat(&[first, stray])], false)).await.unwrap();
        body_soon(r).await.unwrap();
        assert_eq!(c.idle(), 0, "{:?}", String::from_utf8_lossy(first));
    }
}

#[tokio::test]
async fn a_stray_response_after_the_end_is_never_handed_to_the_next_request() {
    let ok: Vec<&'static [u8]> = vec![b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\none"];
    // Unprompted, 30 ms after the answer, a second complete response.
    let stray: Vec<&'static [u8]> = vec![
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\none",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstray",
    ];
    let two: Vec<&'static [u8]> = vec![b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\ntwo"];
    let (addr, seen) = server(vec![vec![stray], vec![two, ok]]).await;
    let c = client(addr);
    assert_eq!(body_of(c.send("GET", &[], b"").await.unwrap()).await.unwrap(), "one");
    assert_eq!(c.idle(), 1);
    tokio::time::sleep(Duration::from_millis(100)).await; // the stray arrives
    assert_eq!(body_of(c.send("GET", &[], b"").await.unwrap()).await.unwrap(), "two");
    assert_eq!(seen.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn a_reused_connection_closed_before_any_byte_is_retried_only_when_idempotent() {
    let ok: Vec<&'static [u8]> = vec![b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n1"];
    let ok2: Vec<&'static [u8]> = vec![b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n2"];
    // The first connection answers one request, takes the next and closes silently.
    let (addr, seen) = server(vec![vec![ok.clone(), vec![]], vec![ok2.clone()]]).await;
    let c = client(addr);
    assert_eq!(body_of(c.send("GET", &[], b"").await.unwrap()).await.unwrap(), "1");
    assert_eq!(body_of(c.send("GET", &[], b"").await.unwrap()).await.unwrap(), "2", "a GET is sent again");
    assert_eq!(seen.lock().unwrap().len(), 3);
    let (addr, _) = server(vec![vec![ok, vec![]], vec![ok2]]).await;
    let c = client(addr);
    assert_eq!(body_of(c.send("POST", &[], b"x").await.unwrap()).await.unwrap(), "1");
    let r = c.send("POST", &[], b"x").await;
    assert!(matches!(r, Err(Error::Broken(_))), "the upstream may have acted on a POST");
    // A fresh connection closing before any byte is broken, whatever the method.
    let (addr, _) = server(vec![vec![vec![]]]).await;
    assert!(matches!(client(addr).send("GET", &[], b"").await, Err(Error::Broken(_))));
}

#[tokio::test]
async fn connection_close_wins_over_keep_alive() {
    let c = mem_client();
    for head in [
        &b"HTTP/1.0 200 OK\r\nConnection: close\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n"[..],
        b"HTTP/1.0 200 OK\r\nConnection: keep-alive, close\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nConnection: Close\r\nContent-Length: 0\r\n\r\n",
    ] {
        let r = over(&c, "GET", Script::new(vec![head.to_vec()], false)).await.unwrap();
        body_soon(r).await.unwrap();
        assert_eq!(c.idle(), 0, "{:?}", String::from_utf8_lossy(head));
    }
    let keep = b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n";
    let r = over(&c, "GET", Script::new(vec![keep.to_vec()], false)).await.unwrap();
    body_soon(r).await.unwrap();
    assert_eq!(c.idle(), 1);
}

/// A client config trusting the test CA, and an acceptor for `localhost`
/// (testdata: a throwaway CA and leaf made with openssl, valid for 100 years).
fn tls_pair() -> (Arc<rustls::ClientConfig>, tokio_rustls::TlsAcceptor) {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from(&include_bytes!("testdata/ca.der")[..])).unwrap();
    let client = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let cert = CertificateDer::from(&include_bytes!("testdata/localhost.der")[..]);
    let key =
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(&include_bytes!("testdata/localhost.key.der")[..]));
    let server = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .unwrap();
    (Arc::new(client), tokio_rustls::TlsAcceptor::from(Arc::new(server)))
}

async fn read_request<S: tokio::io::AsyncRead + Unpin>(s: &mut S) {
    let mut req = Vec::new();
    let mut b = [0u8; 4096];
    while !req.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = s.read(&mut b).await.unwrap();
        assert!(n > 0, "the client closed");
        req.extend_from_slice(&b[..n]);
    }
}

#[tokio::test]
async fn a_stray_response_on_an_idle_tls_connection_is_never_handed_to_the_next_request() {
    let (client_tls, acceptor) = tls_pair();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (go, stray_now) = std::sync::mpsc::channel::<()>();
    let (written, stray_written) = std::sync::mpsc::channel::<()>();
    // The upstream runs on a thread of its own: the test blocks its own runtime.
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            listener.set_nonblocking(true).unwrap();
            let listener = TcpListener::from_std(listener).unwrap();
            let mut first = acceptor.accept(listener.accept().await.unwrap().0).await.unwrap();
            read_request(&mut first).await;
            first.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\none").await.unwrap();
            first.flush().await.unwrap();
            tokio::task::spawn_blocking(move || stray_now.recv().unwrap()).await.unwrap();
            first.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstray").await.unwrap();
            first.flush().await.unwrap();
            written.send(()).unwrap();
            let mut second = acceptor.accept(listener.accept().await.unwrap().0).await.unwrap();
            read_request(&mut second).await;
            second.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\ntwo").await.unwrap();
            second.flush().await.unwrap();
            let _ = first.read(&mut [0u8; 1]).await; // hold both open until the client goes
        });
    });
    let settings = Settings {
        connect_timeout: Duration::from_secs(2),
        idle_timeout: Duration::from_secs(30),
        max_idle: 4,
    };
    let c =
        Client::new(&format!("https://localhost:{port}/").parse().unwrap(), client_tls, settings).unwrap();
    assert_eq!(body_of(c.send("GET", &[], b"").await.unwrap()).await.unwrap(), "one");
    assert_eq!(c.idle(), 1);
    go.send(()).unwrap();
    // Blocking the runtime: its I/O driver has not seen the bytes arrive.
    stray_written.recv().unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(body_of(c.send("GET", &[], b"").await.unwrap()).await.unwrap(), "two");
}

/// Found by fuzz/h1_response: hyper skips interim heads unread; a bad
/// Content-Length in one frames nothing and refuses nothing.
#[tokio::test]
async fn the_fields_of_interim_heads_are_not_read() {
    let c = mem_client();
    let data = b"HTTP/1.1 102 Processing\r\nContent-Length: WW\r\nTransfer-Encoding: chunked\r\n\r\n\
        HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
    let r = over(&c, "POST", Script::new(vec![data.to_vec()], false)).await.unwrap();
    assert_eq!(body_soon(r).await.unwrap(), "ok");
}

#[test]
fn header_bytes_are_checked_eight_at_a_time_as_one_at_a_time() {
    let value_ok = |b: u8| b == b'\t' || (b >= 0x20 && b != 0x7f);
    let name_ok = |b: u8| b.is_ascii_graphic() && b != b':';
    for len in 0..20 {
        for at in 0..len {
            for b in 0..=255u8 {
                let mut bytes = vec![b'a'; len];
                bytes[at] = b;
                let Ok(text) = std::str::from_utf8(&bytes) else { continue };
                assert_eq!(super::valid_value(text), value_ok(b), "value {bytes:?}");
                assert_eq!(super::valid_name(text), name_ok(b), "name {bytes:?}");
            }
        }
    }
    assert!(super::valid_value("") && super::valid_name(""));
    assert!(super::valid_value("a\tb c\u{e9}d") && !super::valid_name("a\u{e9}"));
}

#[test]
fn lengths_are_written_in_decimal() {
    let mut digits = [0u8; 20];
    for n in [0, 7, 10, 99, 1234567, usize::MAX] {
        assert_eq!(super::decimal(n, &mut digits), n.to_string().as_bytes());
    }
}
