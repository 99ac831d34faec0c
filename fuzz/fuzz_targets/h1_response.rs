//! Differential: the same bytes, as the response to a request, read by our
//! upstream client (`upstream/h1`) and by hyper's client connection.
//! Each reads them from its own in-memory stream, in reads of the sizes the
//! input chooses. A divergence is a panic: one side accepts what the other
//! refuses, or they disagree on the status, the header set or the body.
//!
//! Input: byte 0 picks the method, byte 1 the read sizes, the rest is what
//! the upstream sends before it closes the connection.
//!
//! Where we are deliberately stricter than hyper, our refusal is not a
//! divergence; see [`deliberate`]. We are never more lenient: anything we
//! accept, hyper must accept the same way.
#![no_main]

use std::pin::Pin;
use std::sync::LazyLock;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

const METHODS: [&str; 4] = ["GET", "POST", "HEAD", "DELETE"];

/// Our refusals that hyper does not share, on purpose (DESIGN §8).
const STRICTER: &[&str] = &[
    // httparse and hyper take a bare LF for CRLF (in the head, in chunked framing).
    "bare LF in the response head",
    "bare LF in chunked framing",
    // Ambiguous framing, the request-smuggling signals: hyper lets chunked win
    // over Content-Length, reads "chunked, gzip" to EOF, takes "chunked,
    // chunked" and empty codings. (TE in HTTP/1.0: hyper refuses it too, but
    // only after it has framed 204, 304 and HEAD responses without looking.)
    "transfer-encoding with content-length",
    "transfer-encoding in an HTTP/1.0 response",
    "malformed transfer-encoding",
    "chunked is not the last transfer coding, or not the only one",
    // We never ask for an upgrade; hyper hands a 101 back. Hyper skips any
    // number of 1xx heads.
    "101 to a request that asked for no upgrade",
    "too many interim responses",
    // Smaller caps: 64 fields (hyper 100), 64 KiB heads (hyper ~400 KiB),
    // 4 KiB per chunk-size line, 64 trailer fields, extension and trailer
    // bytes counted with their separators.
    "too many response headers",
    "response head too large",
    "chunk-size line too long",
    "chunk extensions too large",
    "trailer section too large",
    "too many trailer fields",
    // Hyper takes whitespace after a chunk size, and leading zeros past 16 digits.
    "chunk size not followed by ; or CRLF",
    "chunk size longer than 16 digits",
];

/// Whether our refusal `why` of a response hyper read as `theirs` is deliberate.
fn deliberate(why: &str, theirs: &Read, method: &str) -> bool {
    // We check Content-Length wherever it is; hyper only when it frames the body.
    let unframed = method == "HEAD"
        || matches!(theirs.status, 204 | 304)
        || theirs.headers.iter().any(|(n, _)| n == b"transfer-encoding");
    STRICTER.contains(&why)
        || (unframed && matches!(why, "bad content-length" | "conflicting content-length"))
}

/// What a reader made of the response.
#[derive(Debug, PartialEq)]
struct Read {
    status: u16,
    headers: Vec<(Vec<u8>, Vec<u8>)>,
    body: Vec<u8>,
}

/// The upstream: once the request is written, hands out `data` in reads of
/// varying size (sometimes after a spurious wake-up), then ends. Takes every
/// write. (Hyper, like any client, treats bytes before its request as an
/// unexpected message.)
struct Feed {
    data: Bytes,
    seed: u32,
    reads: u32,
    asked: bool,
    reader: Option<std::task::Waker>,
}

impl Feed {
    fn next_size(&mut self) -> usize {
        self.reads += 1;
        if self.seed == 0 {
            return usize::MAX;
        }
        let x = self.seed.wrapping_mul(self.reads.wrapping_mul(2_654_435_761)) >> 7;
        if self.seed & 0x80 != 0 {
            1 + (x % 512) as usize
        } else {
            1 + (x % 8) as usize
        }
    }
}

impl AsyncRead for Feed {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if !self.asked {
            self.reader = Some(cx.waker().clone());
            return Poll::Pending;
        }
        if self.seed & 0x40 != 0 && self.reads % 2 == 1 && !self.data.is_empty() {
            self.reads += 1;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        let n = self.next_size().min(self.data.len()).min(buf.remaining());
        let piece = self.data.split_to(n);
        buf.put_slice(&piece);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Feed {
    fn poll_write(mut self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        self.asked = true;
        if let Some(w) = self.reader.take() {
            w.wake();
        }
        Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

async fn ours(method: &str, feed: Feed) -> Result<Read, String> {
    let r = sessionless::fuzzing::h1_exchange(method, feed).await?;
    Ok(Read { status: r.status, headers: r.headers, body: r.body })
}

async fn hypers(method: &str, feed: Feed) -> Result<Read, String> {
    let io = hyper_util::rt::TokioIo::new(feed);
    let (mut send, conn) = hyper::client::conn::http1::handshake(io).await.map_err(|e| e.to_string())?;
    let conn = tokio::spawn(conn);
    let req = http::Request::builder()
        .method(method)
        .uri("/mcp")
        .header("host", "upstream.invalid")
        .body(Empty::<Bytes>::new())
        .expect("a valid request");
    let read = async {
        let resp = send.send_request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let headers = resp
            .headers()
            .iter()
            .map(|(n, v)| (n.as_str().as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect();
        let body = resp.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes().to_vec();
        Ok(Read { status, headers, body })
    };
    let read = read.await;
    conn.abort();
    read
}

fn sorted(mut r: Read) -> Read {
    r.headers.sort();
    r
}

static RT: LazyLock<tokio::runtime::Runtime> =
    LazyLock::new(|| tokio::runtime::Builder::new_current_thread().enable_time().build().expect("a runtime"));

fuzz_target!(|input: &[u8]| {
    let [m, seed, response @ ..] = input else { return };
    let method = METHODS[*m as usize % METHODS.len()];
    let data = Bytes::copy_from_slice(response);
    let feed = || Feed { data: data.clone(), seed: u32::from(*seed), reads: 0, asked: false, reader: None };
    let limit = Duration::from_secs(5);
    let (a, b) = RT.block_on(async {
        let a = tokio::time::timeout(limit, ours(method, feed())).await.expect("our client hangs");
        let b = tokio::time::timeout(limit, hypers(method, feed())).await.expect("hyper hangs");
        (a, b)
    });
    let text = String::from_utf8_lossy(response);
    match (a.map(sorted), b.map(sorted)) {
        (Ok(a), Ok(b)) => assert_eq!(a, b, "{method} {text:?}"),
        (Err(why), Ok(b)) => {
            assert!(deliberate(&why, &b, method), "we refused ({why}) what hyper read: {method} {text:?}")
        }
        (Ok(_), Err(why)) => panic!("we read what hyper refused ({why}): {method} {text:?}"),
        (Err(_), Err(_)) => {}
    }
});
