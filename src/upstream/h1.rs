//! A small HTTP/1.1 client for legacy upstreams, with its own keep-alive pool.
//!
//! Why not hyper's client: a parked flow keeps its upstream SSE response open
//! for as long as the user takes to answer, and a hyper client connection costs
//! about 15 KiB of resident memory whatever it carries (two fixed 8 KiB
//! buffers, a dispatch channel block, a connection task). On the hot path it
//! also costs a pool checkout, a spawned task and a channel hop per request.
//! Here a connection is a socket and one buffer that exists only while bytes
//! are waiting in it; it is owned by the request that uses it, polled by that
//! request's task, closed when dropped, and put back in the pool only after
//! its response was read to the end with nothing left over.
//!
//! The upstream is not trusted: the response parser ([`head`], [`body`])
//! follows hyper's and pingora's rules, caps every size, refuses anything
//! ambiguous, and is fuzzed against hyper's decoder (`fuzz/`). A request is
//! written in one piece, so a write that fails means the upstream never had
//! the whole request ([`Error::NotSent`], [`Error::Unreachable`]).

use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use futures_util::FutureExt;
use http::Uri;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

mod body;
mod head;

pub use body::Body;
pub use head::Response;
use head::{read_head, HeadError};

const READ_CHUNK: usize = 4096;

/// An idle connection reused within this long is checked without a system
/// call (see `Io::is_open`). Far below any upstream's keep-alive timeout
/// (seconds: uvicorn and Node 5 s, nginx 75 s).
const FRESH: Duration = Duration::from_millis(1000);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No connection could be made (refused, timed out, TLS failed): the
    /// upstream is unreachable and never had the request.
    #[error("cannot connect: {0}")]
    Unreachable(io::Error),
    /// Writing on a connection failed: the upstream never had the whole request.
    #[error("request not sent: {0}")]
    NotSent(io::Error),
    /// The request was written, then the connection failed or closed.
    #[error("connection broke: {0}")]
    Broken(io::Error),
    /// The response is not valid HTTP/1.1.
    #[error("invalid response: {0}")]
    Invalid(&'static str),
    /// The request cannot be written (a header value with control characters).
    #[error("invalid request: {0}")]
    Request(&'static str),
}

/// Where requests go: one origin and one path.
struct Target {
    host: String,
    port: u16,
    /// The `Host` header.
    authority: String,
    path: String,
    tls: Option<TlsConnector>,
}

struct Shared {
    target: Target,
    idle: Mutex<Vec<Conn>>,
    max_idle: usize,
    idle_timeout: Duration,
    connect_timeout: Duration,
}

/// A keep-alive pool of connections to one upstream URL.
#[derive(Clone)]
pub struct Client {
    shared: Arc<Shared>,
}

pub struct Settings {
    pub connect_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_idle: usize,
}

impl Client {
    pub fn new(
        url: &Uri,
        tls: Arc<rustls::ClientConfig>,
        settings: Settings,
    ) -> Result<Client, &'static str> {
        let https = match url.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            _ => return Err("the upstream URL must be http:// or https://"),
        };
        let authority = url.authority().ok_or("the upstream URL has no host")?;
        let host = authority.host().trim_start_matches('[').trim_end_matches(']').to_string();
        let port = authority.port_u16().unwrap_or(if https { 443 } else { 80 });
        let tls = https.then(|| TlsConnector::from(tls));
        let path = url.path_and_query().map(|p| p.as_str()).unwrap_or("/");
        let target = Target {
            host,
            port,
            // Without any userinfo: it never goes on the wire.
            authority: authority.as_str().rsplit('@').next().unwrap_or_default().to_string(),
            path: if path.is_empty() { "/".into() } else { path.into() },
            tls,
        };
        let shared = Shared {
            target,
            idle: Mutex::new(Vec::new()),
            max_idle: settings.max_idle,
            idle_timeout: settings.idle_timeout,
            connect_timeout: settings.connect_timeout,
        };
        Ok(Client { shared: Arc::new(shared) })
    }

    /// Sends one request and reads the response head. `headers` are written as
    /// given; `Host` and (for a body) `Content-Length` are added.
    pub async fn send(&self, method: &str, headers: &[(&str, &str)], body: &[u8]) -> Result<Response, Error> {
        let message = self.encode(method, headers, body)?;
        if let Some(conn) = self.checkout() {
            match self.exchange(conn, method, &message).await {
                // The upstream closed the idle connection as the request went
                // out (pingora's `ReusedOnly`). It may still have acted on it,
                // so only an idempotent request is sent again.
                Err(HeadError { silent: true, .. }) if idempotent(method) => {}
                done => return done.map_err(|e| e.error),
            }
        }
        let conn = Box::pin(self.connect()).await?; // boxed: the TLS handshake is large
        self.exchange(conn, method, &message).await.map_err(|e| e.error)
    }

    async fn exchange(&self, mut conn: Conn, method: &str, message: &[u8]) -> Result<Response, HeadError> {
        if let Err(e) = conn.io.write_all(message).await {
            return Err(HeadError { error: Error::NotSent(e), silent: false });
        }
        read_head(conn, self.shared.clone(), method).await
    }

    /// [`Client::send`] over a given in-memory stream instead of a pooled
    /// connection (for tests and fuzzing).
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) async fn send_over(
        &self,
        io: Box<dyn MemStream>,
        method: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<Response, Error> {
        let message = self.encode(method, headers, body)?;
        let conn = Conn { io: Io::Mem(io), buf: BytesMut::new(), idle_since: Instant::now() };
        self.exchange(conn, method, &message).await.map_err(|e| e.error)
    }

    fn encode(&self, method: &str, headers: &[(&str, &str)], body: &[u8]) -> Result<Vec<u8>, Error> {
        let t = &self.shared.target;
        let mut m = Vec::with_capacity(128 + t.path.len() + body.len() + headers.len() * 48);
        let mut put = |parts: &[&[u8]]| parts.iter().for_each(|p| m.extend_from_slice(p));
        put(&[
            method.as_bytes(),
            b" ",
            t.path.as_bytes(),
            b" HTTP/1.1\r\nhost: ",
            t.authority.as_bytes(),
            b"\r\n",
        ]);
        for (name, value) in headers {
            if !valid_value(value) || !valid_name(name) {
                return Err(Error::Request("header with control characters"));
            }
            put(&[name.as_bytes(), b": ", value.as_bytes(), b"\r\n"]);
        }
        if !body.is_empty() || method == "POST" {
            let mut digits = [0u8; 20];
            put(&[b"content-length: ", decimal(body.len(), &mut digits), b"\r\n"]);
        }
        put(&[b"\r\n", body]);
        Ok(m)
    }

    /// The most recently used idle connection that is still open.
    /// The socket check runs outside the pool's lock (it is a system call).
    fn checkout(&self) -> Option<Conn> {
        loop {
            let mut conn = self.shared.idle.lock().unwrap_or_else(|e| e.into_inner()).pop()?;
            let idle = conn.idle_since.elapsed();
            if idle < self.shared.idle_timeout && conn.io.is_open(idle) {
                return Some(conn);
            }
        }
    }

    async fn connect(&self) -> Result<Conn, Error> {
        let t = &self.shared.target;
        let connect = async {
            let tcp = TcpStream::connect((t.host.as_str(), t.port)).await?;
            tcp.set_nodelay(true)?;
            Ok::<_, io::Error>(match &t.tls {
                None => Io::Plain(tcp),
                Some(tls) => {
                    let name = rustls::pki_types::ServerName::try_from(t.host.clone())
                        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "not a TLS server name"))?;
                    Io::Tls(Box::new(tls.connect(name, tcp).await?))
                }
            })
        };
        match tokio::time::timeout(self.shared.connect_timeout, connect).await {
            Err(_) => Err(Error::Unreachable(io::ErrorKind::TimedOut.into())),
            Ok(Err(e)) => Err(Error::Unreachable(e)),
            Ok(Ok(io)) => Ok(Conn { io, buf: BytesMut::new(), idle_since: Instant::now() }),
        }
    }

    /// Drops every idle connection: one of them carried an answer to a
    /// request that was not sent, and which one is not known.
    pub fn forget_idle(&self) {
        self.shared.idle.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// Idle connections held (for tests).
    #[cfg(test)]
    fn idle(&self) -> usize {
        self.shared.idle.lock().unwrap().len()
    }
}

impl Shared {
    fn checkin(&self, mut conn: Conn) {
        conn.idle_since = Instant::now();
        conn.buf = BytesMut::new();
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        // Oldest first (connections are taken from the end): drop the expired.
        let now = conn.idle_since;
        let expired = idle.iter().take_while(|c| now - c.idle_since >= self.idle_timeout).count();
        idle.drain(..expired);
        if idle.len() < self.max_idle {
            idle.push(conn);
        }
    }
}

/// RFC 9110 §9.2.2: a request that can be sent twice to the same effect.
fn idempotent(method: &str) -> bool {
    matches!(method, "GET" | "HEAD" | "PUT" | "DELETE" | "OPTIONS" | "TRACE")
}

fn valid_value(v: &str) -> bool {
    // Eight bytes at a time where none is below 0x20 or DEL; a tab (or a
    // bad byte) has its eight looked at one by one.
    all_bytes(v.as_bytes(), |w| below(w, 0x20) | equal(w, 0x7f), |b| b == b'\t' || (b >= 0x20 && b != 0x7f))
}

fn valid_name(name: &str) -> bool {
    let odd = |w: u64| below(w, 0x21) | equal(w, 0x7f) | equal(w, b':') | (w & HIGH_BITS);
    all_bytes(name.as_bytes(), odd, |b| b.is_ascii_graphic() && b != b':')
}

const LOW_BITS: u64 = 0x0101_0101_0101_0101;
const HIGH_BITS: u64 = 0x8080_8080_8080_8080;

/// Whether every byte passes `ok`, looking at eight at a time with `odd`
/// (nonzero when some byte of the word may fail: a false alarm only costs
/// a look at each of its bytes).
fn all_bytes(bytes: &[u8], odd: impl Fn(u64) -> u64 + Copy, ok: impl Fn(u8) -> bool + Copy) -> bool {
    let mut words = bytes.chunks_exact(8);
    let whole = words.by_ref().all(|w| {
        let word = u64::from_le_bytes(w.try_into().unwrap_or_default());
        odd(word) == 0 || w.iter().all(|&b| ok(b))
    });
    whole && words.remainder().iter().all(|&b| ok(b))
}

/// Nonzero if some byte of `w` is below `n` (at most 0x80).
fn below(w: u64, n: u8) -> u64 {
    w.wrapping_sub(LOW_BITS * u64::from(n)) & !w & HIGH_BITS
}

/// Nonzero if some byte of `w` is `n`.
fn equal(w: u64, n: u8) -> u64 {
    below(w ^ (LOW_BITS * u64::from(n)), 1)
}

/// `n` in decimal, written into `digits` (no allocation).
fn decimal(mut n: usize, digits: &mut [u8; 20]) -> &[u8] {
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &digits[at..];
        }
    }
}

struct Conn {
    io: Io,
    /// Bytes read and not yet consumed; empty (no allocation) while waiting.
    buf: BytesMut,
    idle_since: Instant,
}

enum Io {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
    #[cfg(any(test, feature = "fuzzing"))]
    Mem(Box<dyn MemStream>),
}

/// Any in-memory transport, for tests and fuzzing.
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) trait MemStream:
    tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Sync + Unpin
{
}
#[cfg(any(test, feature = "fuzzing"))]
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Sync + Unpin> MemStream for T {}

impl Io {
    async fn write_all(&mut self, data: &[u8]) -> io::Result<()> {
        match self {
            Io::Plain(s) => s.write_all(data).await,
            Io::Tls(s) => {
                s.write_all(data).await?;
                s.flush().await
            }
            #[cfg(any(test, feature = "fuzzing"))]
            Io::Mem(s) => {
                s.write_all(data).await?;
                s.flush().await
            }
        }
    }

    /// An idle connection is usable if reading it would wait: no close, no
    /// stray bytes (an unrequested response must never be taken for the
    /// answer to the next request). The check never blocks.
    ///
    /// A plain connection idle for less than [`FRESH`] is asked of tokio's
    /// readiness first, which costs no system call: the last read of its
    /// response was short, which cleared it, so it is set only if bytes or a
    /// close arrived since and the runtime's driver saw them. Then, or once
    /// the connection has been idle longer (the driver has looked since, but
    /// the socket is asked anyway), the socket itself is peeked.
    fn is_open(&mut self, idle: Duration) -> bool {
        let mut byte = [0u8; 1];
        match self {
            Io::Plain(s) => {
                let mut cx = Context::from_waker(std::task::Waker::noop());
                let flagged = s.poll_read_ready(&mut cx).is_ready();
                (!flagged && idle < FRESH) || nothing_waiting(s)
            }
            // Bytes may wait in the socket or, already decrypted, in rustls.
            Io::Tls(s) => nothing_waiting(s.get_ref().0) && s.read(&mut byte).now_or_never().is_none(),
            #[cfg(any(test, feature = "fuzzing"))]
            Io::Mem(s) => s.read(&mut byte).now_or_never().is_none(),
        }
    }

    /// Reads more bytes into `buf`, allocating it only once data is ready.
    fn poll_fill(&mut self, cx: &mut Context<'_>, buf: &mut BytesMut) -> Poll<io::Result<usize>> {
        match self {
            // Through `poll_read`, which clears tokio's readiness after a
            // short read (what `is_open` relies on).
            Io::Plain(s) => {
                ready!(s.poll_read_ready(cx))?;
                reserve(buf);
                tokio_util::io::poll_read_buf(Pin::new(s), cx, buf)
            }
            Io::Tls(s) => {
                reserve(buf);
                tokio_util::io::poll_read_buf(Pin::new(s), cx, buf)
            }
            #[cfg(any(test, feature = "fuzzing"))]
            Io::Mem(s) => {
                reserve(buf);
                tokio_util::io::poll_read_buf(Pin::new(s), cx, buf)
            }
        }
    }
}

/// Asks the socket itself: tokio's cached readiness can lag behind bytes
/// (or a close) that arrived while the connection sat idle, and a read of a
/// TLS stream says nothing of them until its runtime's driver has looked.
fn nothing_waiting(s: &TcpStream) -> bool {
    let mut byte = [MaybeUninit::uninit()];
    matches!(socket2::SockRef::from(s).peek(&mut byte), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
}

fn reserve(buf: &mut BytesMut) {
    if buf.capacity() - buf.len() < READ_CHUNK / 4 {
        buf.reserve(READ_CHUNK);
    }
}

#[cfg(test)]
mod tests;
