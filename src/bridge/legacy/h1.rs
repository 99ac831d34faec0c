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
//! its response was read to the end.
//!
//! Responses are framed by RFC 9112 §6.3: `Transfer-Encoding: chunked`,
//! `Content-Length`, or the end of the connection. Interim 1xx heads are
//! skipped. A request is written in one piece, so a write that fails means the
//! upstream never had the whole request ([`Error::NotSent`]).

use std::io;
use std::ops::Range;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use futures_util::FutureExt;
use http::Uri;
use hyper::body::{Frame, SizeHint};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

/// Largest response head accepted.
const MAX_HEAD: usize = 64 * 1024;
/// Largest chunk-size line or trailer line accepted.
const MAX_LINE: usize = 4 * 1024;
const READ_CHUNK: usize = 4096;
const MAX_HEADERS: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Connecting or writing failed: the upstream never had the whole request.
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
        let mut conn = match self.checkout() {
            Some(conn) => conn,
            None => Box::pin(self.connect()).await?, // boxed: the TLS handshake is large
        };
        conn.io.write_all(&message).await.map_err(Error::NotSent)?;
        read_head(conn, self.shared.clone()).await
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
        let mut conn = Conn { io: Io::Mem(io), buf: BytesMut::new(), idle_since: Instant::now() };
        conn.io.write_all(&message).await.map_err(Error::NotSent)?;
        read_head(conn, self.shared.clone()).await
    }

    fn encode(&self, method: &str, headers: &[(&str, &str)], body: &[u8]) -> Result<Vec<u8>, Error> {
        let t = &self.shared.target;
        let mut m = Vec::with_capacity(128 + t.path.len() + body.len() + headers.len() * 48);
        for part in [method, " ", &t.path, " HTTP/1.1\r\nhost: ", &t.authority, "\r\n"] {
            m.extend_from_slice(part.as_bytes());
        }
        for (name, value) in headers {
            if !valid_value(value) || name.bytes().any(|b| !b.is_ascii_graphic() || b == b':') {
                return Err(Error::Request("header with control characters"));
            }
            for part in [*name, ": ", value, "\r\n"] {
                m.extend_from_slice(part.as_bytes());
            }
        }
        if !body.is_empty() || method == "POST" {
            m.extend_from_slice(b"content-length: ");
            m.extend_from_slice(body.len().to_string().as_bytes());
            m.extend_from_slice(b"\r\n");
        }
        m.extend_from_slice(b"\r\n");
        m.extend_from_slice(body);
        Ok(m)
    }

    /// The most recently used idle connection that is still open.
    fn checkout(&self) -> Option<Conn> {
        let mut idle = self.shared.idle.lock().unwrap_or_else(|e| e.into_inner());
        while let Some(mut conn) = idle.pop() {
            if conn.idle_since.elapsed() < self.shared.idle_timeout && conn.io.is_open() {
                return Some(conn);
            }
        }
        None
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
            Err(_) => Err(Error::NotSent(io::ErrorKind::TimedOut.into())),
            Ok(Err(e)) => Err(Error::NotSent(e)),
            Ok(Ok(io)) => Ok(Conn { io, buf: BytesMut::new(), idle_since: Instant::now() }),
        }
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

fn valid_value(v: &str) -> bool {
    v.bytes().all(|b| b == b'\t' || (b >= 0x20 && b != 0x7f))
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
pub(crate) trait MemStream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Sync + Unpin {}
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
    /// stray bytes. The check never blocks.
    fn is_open(&mut self) -> bool {
        let mut byte = [0u8; 1];
        let read = match self {
            Io::Plain(s) => s.read(&mut byte).now_or_never(),
            Io::Tls(s) => s.read(&mut byte).now_or_never(),
            #[cfg(any(test, feature = "fuzzing"))]
            Io::Mem(s) => s.read(&mut byte).now_or_never(),
        };
        read.is_none()
    }

    /// Reads more bytes into `buf`, allocating it only once data is ready.
    fn poll_fill(&mut self, cx: &mut Context<'_>, buf: &mut BytesMut) -> Poll<io::Result<usize>> {
        match self {
            Io::Plain(s) => loop {
                ready!(s.poll_read_ready(cx))?;
                reserve(buf);
                match s.try_read_buf(buf) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    r => return Poll::Ready(r),
                }
            },
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

fn reserve(buf: &mut BytesMut) {
    if buf.capacity() - buf.len() < READ_CHUNK / 4 {
        buf.reserve(READ_CHUNK);
    }
}

/// A response head; the body is read through [`Response::body`].
pub struct Response {
    pub status: u16,
    head: Bytes,
    headers: Vec<(Range<usize>, Range<usize>)>,
    pub body: Body,
}

impl Response {
    /// The first value of a header, if it is valid UTF-8.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| self.head[n.clone()].eq_ignore_ascii_case(name.as_bytes()))
            .and_then(|(_, v)| std::str::from_utf8(&self.head[v.clone()]).ok())
            .map(str::trim)
    }
}

async fn read_head(mut conn: Conn, pool: Arc<Shared>) -> Result<Response, Error> {
    loop {
        let parsed = loop {
            if !conn.buf.is_empty() {
                match parse_head(&conn.buf)? {
                    Some(p) => break p,
                    None if conn.buf.len() >= MAX_HEAD => {
                        return Err(Error::Invalid("response head too large"))
                    }
                    None => {}
                }
            }
            let n = std::future::poll_fn(|cx| conn.io.poll_fill(cx, &mut conn.buf))
                .await
                .map_err(Error::Broken)?;
            if n == 0 {
                return Err(Error::Broken(io::ErrorKind::UnexpectedEof.into()));
            }
        };
        let head = conn.buf.split_to(parsed.len).freeze();
        if (100..200).contains(&parsed.status) && parsed.status != 101 {
            continue; // interim response
        }
        let framing = framing(&parsed);
        let reusable = framing != Framing::Eof && parsed.keep_alive;
        let body = Body { conn: Some(conn), framing, reusable, pool };
        return Ok(Response { status: parsed.status, head, headers: parsed.headers, body });
    }
}

struct Parsed {
    len: usize,
    status: u16,
    keep_alive: bool,
    headers: Vec<(Range<usize>, Range<usize>)>,
    length: Option<u64>,
    chunked: Option<bool>,
}

fn parse_head(buf: &[u8]) -> Result<Option<Parsed>, Error> {
    let mut storage = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut storage);
    let len = match resp.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(Error::Invalid("too many response headers")),
        Err(_) => return Err(Error::Invalid("malformed response head")),
    };
    let base = buf.as_ptr() as usize;
    let range = |s: &[u8]| {
        let start = s.as_ptr() as usize - base;
        start..start + s.len()
    };
    let mut parsed = Parsed {
        len,
        status: resp.code.unwrap_or(0),
        keep_alive: resp.version == Some(1),
        headers: Vec::with_capacity(resp.headers.len()),
        length: None,
        chunked: None,
    };
    for h in resp.headers.iter() {
        let name = h.name.as_bytes();
        if name.eq_ignore_ascii_case(b"content-length") {
            let n = std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .ok_or(Error::Invalid("bad content-length"))?;
            if parsed.length.is_some_and(|l| l != n) {
                return Err(Error::Invalid("conflicting content-length"));
            }
            parsed.length = Some(n);
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            let last = h.value.rsplit(|&b| b == b',').next().unwrap_or_default();
            parsed.chunked = Some(last.trim_ascii().eq_ignore_ascii_case(b"chunked"));
        } else if name.eq_ignore_ascii_case(b"connection") {
            for token in h.value.split(|&b| b == b',').map(<[u8]>::trim_ascii) {
                if token.eq_ignore_ascii_case(b"close") {
                    parsed.keep_alive = false;
                } else if token.eq_ignore_ascii_case(b"keep-alive") && resp.version == Some(0) {
                    parsed.keep_alive = true;
                }
            }
        }
        parsed.headers.push((range(name), range(h.value)));
    }
    Ok(Some(parsed))
}

fn framing(p: &Parsed) -> Framing {
    if p.status == 204 || p.status == 304 {
        return Framing::Length(0);
    }
    match (p.chunked, p.length) {
        (Some(true), _) => Framing::Chunked(Chunk::Size),
        (Some(false), _) => Framing::Eof,
        (None, Some(n)) => Framing::Length(n),
        (None, None) => Framing::Eof,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    Length(u64),
    Chunked(Chunk),
    /// Until the upstream closes the connection.
    Eof,
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// Expecting a chunk-size line.
    Size,
    Data(u64),
    /// Expecting the CRLF after a chunk's data.
    DataEnd,
    /// After the last chunk: trailer lines until an empty one.
    Trailer,
}

/// A response body, streamed as it arrives. Dropping it before the end
/// closes the connection; reading it to the end returns the connection to the
/// pool when the response allows.
pub struct Body {
    conn: Option<Conn>,
    framing: Framing,
    reusable: bool,
    pool: Arc<Shared>,
}

fn invalid(what: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

impl Body {
    /// The next piece of body data, `None` at the end.
    fn poll_data(&mut self, cx: &mut Context<'_>) -> Poll<Option<io::Result<Bytes>>> {
        loop {
            let Some(conn) = self.conn.as_mut() else {
                return Poll::Ready(None);
            };
            let step = match self.framing {
                Framing::Done => Step::Finished,
                Framing::Length(0) => {
                    self.framing = Framing::Done;
                    continue;
                }
                Framing::Length(n) if !conn.buf.is_empty() => {
                    let take = conn.buf.len().min(usize::try_from(n).unwrap_or(usize::MAX));
                    self.framing = Framing::Length(n - take as u64);
                    Step::Data(conn.buf.split_to(take).freeze())
                }
                Framing::Eof if !conn.buf.is_empty() => Step::Data(conn.buf.split().freeze()),
                Framing::Chunked(state) => match chunk_step(state, &mut conn.buf) {
                    Ok((next, data)) => {
                        self.framing = next.map_or(Framing::Done, Framing::Chunked);
                        match data {
                            Some(d) => Step::Data(d),
                            None if next.is_none() || next != Some(state) => continue,
                            None => Step::Fill,
                        }
                    }
                    Err(e) => return Poll::Ready(Some(Err(e))),
                },
                Framing::Length(_) | Framing::Eof => Step::Fill,
            };
            match step {
                Step::Data(d) => {
                    if self.framing == Framing::Done || self.framing == Framing::Length(0) {
                        self.framing = Framing::Done;
                        self.finish();
                    }
                    return Poll::Ready(Some(Ok(d)));
                }
                Step::Finished => {
                    self.finish();
                    return Poll::Ready(None);
                }
                Step::Fill => {
                    let filled = conn.io.poll_fill(cx, &mut conn.buf);
                    match filled {
                        Poll::Pending => {
                            if conn.buf.is_empty() {
                                conn.buf = BytesMut::new(); // hold no buffer while waiting
                            }
                            return Poll::Pending;
                        }
                        Poll::Ready(Ok(0)) if self.framing == Framing::Eof => {
                            self.framing = Framing::Done;
                            self.conn = None;
                            return Poll::Ready(None);
                        }
                        Poll::Ready(Ok(0)) => {
                            self.conn = None;
                            return Poll::Ready(Some(Err(io::ErrorKind::UnexpectedEof.into())));
                        }
                        Poll::Ready(Ok(_)) => {}
                        Poll::Ready(Err(e)) => {
                            self.conn = None;
                            return Poll::Ready(Some(Err(e)));
                        }
                    }
                }
            }
        }
    }

    /// The response ended: keep the connection if it is clean and reusable.
    fn finish(&mut self) {
        if let Some(conn) = self.conn.take() {
            if self.reusable && conn.buf.is_empty() {
                self.pool.checkin(conn);
            }
        }
    }
}

enum Step {
    Data(Bytes),
    Fill,
    Finished,
}

/// Advances the chunked decoder over `buf`. Returns the next state (`None`
/// when the body is complete) and any data; the same state and no data means
/// more bytes are needed.
fn chunk_step(state: Chunk, buf: &mut BytesMut) -> io::Result<(Option<Chunk>, Option<Bytes>)> {
    match state {
        Chunk::Size => {
            let Some(line) = take_line(buf)? else { return Ok((Some(state), None)) };
            let size = line[..].split(|&b| b == b';').next().unwrap_or_default().trim_ascii();
            let size = std::str::from_utf8(size)
                .ok()
                .filter(|s| !s.is_empty() && s.len() <= 16)
                .and_then(|s| u64::from_str_radix(s, 16).ok())
                .ok_or_else(|| invalid("bad chunk size"))?;
            Ok((Some(if size == 0 { Chunk::Trailer } else { Chunk::Data(size) }), None))
        }
        Chunk::Data(n) => {
            if buf.is_empty() {
                return Ok((Some(state), None));
            }
            let take = buf.len().min(usize::try_from(n).unwrap_or(usize::MAX));
            let data = buf.split_to(take).freeze();
            let left = n - take as u64;
            Ok((Some(if left == 0 { Chunk::DataEnd } else { Chunk::Data(left) }), Some(data)))
        }
        Chunk::DataEnd => {
            if buf.len() < 2 {
                return Ok((Some(state), None));
            }
            if &buf[..2] != b"\r\n" {
                return Err(invalid("chunk data not followed by CRLF"));
            }
            buf.advance(2);
            Ok((Some(Chunk::Size), None))
        }
        Chunk::Trailer => match take_line(buf)? {
            None => Ok((Some(state), None)),
            Some(line) if line.is_empty() => Ok((None, None)),
            Some(_) => Ok((Some(Chunk::Trailer), None)), // trailers are ignored
        },
    }
}

/// One CRLF-terminated line, without the CRLF.
fn take_line(buf: &mut BytesMut) -> io::Result<Option<BytesMut>> {
    match buf.iter().position(|&b| b == b'\n') {
        Some(i) => {
            let mut line = buf.split_to(i + 1);
            line.truncate(i);
            if line.last() == Some(&b'\r') {
                line.truncate(i - 1);
            }
            Ok(Some(line))
        }
        None if buf.len() > MAX_LINE => Err(invalid("chunk line too long")),
        None => Ok(None),
    }
}

impl hyper::body::Body for Body {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<io::Result<Frame<Bytes>>>> {
        self.get_mut().poll_data(cx).map(|d| d.map(|r| r.map(Frame::data)))
    }

    fn is_end_stream(&self) -> bool {
        self.conn.is_none() || self.framing == Framing::Done
    }

    fn size_hint(&self) -> SizeHint {
        match self.framing {
            Framing::Length(n) => SizeHint::with_exact(n),
            Framing::Done => SizeHint::with_exact(0),
            _ => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests;
