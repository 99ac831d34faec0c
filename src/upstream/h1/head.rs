//! The response head: httparse, plus what httparse leaves to its caller.
//! Every line ends in CRLF, digits are digits, the framing is unambiguous
//! (RFC 9112 §6.3, with the request method), and every size has a cap.

use std::io;
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;

use super::body::{Body, Framing, MAX_HEADERS};
use super::{Conn, Error, Shared};

/// Largest response head accepted.
pub(super) const MAX_HEAD: usize = 64 * 1024;
/// Most interim (1xx) responses skipped before the final one.
pub(super) const MAX_INTERIM: usize = 16;

/// A response head; the body is read through [`Response::body`].
pub struct Response {
    pub status: u16,
    head: Bytes,
    headers: Vec<(Range<usize>, Range<usize>)>,
    /// The first `Content-Type` among `headers`: asked of every answer.
    content_type: Option<usize>,
    pub body: Body,
}

impl Response {
    /// Whether the answer is an SSE stream (by its `Content-Type`).
    pub fn is_sse(&self) -> bool {
        self.content_type().is_some_and(|c| c.starts_with("text/event-stream"))
    }

    /// Whether the answer is JSON (by its `Content-Type`).
    pub fn is_json(&self) -> bool {
        self.content_type().is_some_and(|c| c.starts_with("application/json"))
    }

    fn content_type(&self) -> Option<&str> {
        self.value(self.content_type?)
    }

    /// The first value of a header, if it is valid UTF-8.
    pub fn header(&self, name: &str) -> Option<&str> {
        let at =
            self.headers.iter().position(|(n, _)| self.head[n.clone()].eq_ignore_ascii_case(name.as_bytes()));
        self.value(at?)
    }

    /// The value of the header at `at`, trimmed, if it is valid UTF-8.
    fn value(&self, at: usize) -> Option<&str> {
        let (_, v) = &self.headers[at];
        std::str::from_utf8(&self.head[v.clone()]).ok().map(str::trim)
    }

    /// Every header as raw name and value bytes, in order (for fuzzing).
    #[cfg(feature = "fuzzing")]
    pub(crate) fn raw_headers(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.headers.iter().map(|(n, v)| (&self.head[n.clone()], &self.head[v.clone()]))
    }
}

/// Why no response head: the error, and whether the connection ended (or
/// failed) before a single byte of a response arrived.
pub(super) struct HeadError {
    pub error: Error,
    pub silent: bool,
}

impl From<Error> for HeadError {
    fn from(error: Error) -> HeadError {
        HeadError { error, silent: false }
    }
}

/// Reads the final response head to a request made with `method`.
pub(super) async fn read_head(
    mut conn: Conn,
    pool: Arc<Shared>,
    method: &str,
) -> Result<Response, HeadError> {
    let mut interim = 0;
    // How much of the buffer is known not to end a head.
    let mut scanned: usize = 0;
    let mut silent = true;
    loop {
        if ends_head(&conn.buf[scanned.saturating_sub(2)..]) {
            if let Some(parsed) = parse_head(&conn.buf)? {
                let head = conn.buf.split_to(parsed.len).freeze();
                scanned = 0;
                match parsed.status {
                    101 => return Err(Error::Invalid("101 to a request that asked for no upgrade").into()),
                    100..=199 if interim == MAX_INTERIM => {
                        return Err(Error::Invalid("too many interim responses").into())
                    }
                    100..=199 => {
                        interim += 1;
                        continue;
                    }
                    _ => {}
                }
                let framing = parsed.framing(method);
                let reusable = parsed.keep_alive && framing != Framing::Eof;
                let body = Body::new(conn, framing, reusable, pool);
                let (status, headers, content_type) = (parsed.status, parsed.headers, parsed.content_type);
                return Ok(Response { status, head, headers, content_type, body });
            }
        }
        scanned = conn.buf.len();
        if scanned >= MAX_HEAD {
            return Err(Error::Invalid("response head too large").into());
        }
        let read = std::future::poll_fn(|cx| conn.io.poll_fill(cx, &mut conn.buf)).await;
        match read {
            Ok(0) => {
                return Err(HeadError { error: Error::Broken(io::ErrorKind::UnexpectedEof.into()), silent })
            }
            Ok(_) => silent = false,
            Err(e) => return Err(HeadError { error: Error::Broken(e), silent }),
        }
    }
}

/// Whether `buf` holds a line end followed by an empty line: only then can a
/// head be complete, so a head that trickles in is not parsed again per byte.
/// One pass over the line ends, stopping at the first empty line (the body
/// that follows in the same read is not scanned).
fn ends_head(buf: &[u8]) -> bool {
    memchr::memchr_iter(b'\n', buf).any(|i| matches!(&buf[i + 1..], [b'\n', ..] | [b'\r', b'\n', ..]))
}

struct Parsed {
    len: usize,
    status: u16,
    keep_alive: bool,
    headers: Vec<(Range<usize>, Range<usize>)>,
    content_type: Option<usize>,
    length: Option<u64>,
    codings: Codings,
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
    if len > MAX_HEAD {
        return Err(Error::Invalid("response head too large"));
    }
    // httparse takes a bare LF for a line end; a proxy must not.
    if memchr::memchr_iter(b'\n', &buf[..len]).any(|i| i == 0 || buf[i - 1] != b'\r') {
        return Err(Error::Invalid("bare LF in the response head"));
    }
    let status = resp.code.unwrap_or(0);
    if status < 100 {
        return Err(Error::Invalid("status below 100"));
    }
    let http11 = resp.version == Some(1);
    let mut parsed = Parsed {
        len,
        status,
        keep_alive: http11,
        headers: Vec::new(),
        content_type: None,
        length: None,
        codings: Codings::default(),
    };
    if status < 200 {
        return Ok(Some(parsed)); // an interim head frames nothing: its fields are not read
    }
    let base = buf.as_ptr() as usize;
    let range = |s: &[u8]| {
        let start = s.as_ptr() as usize - base;
        start..start + s.len()
    };
    parsed.headers.reserve_exact(resp.headers.len());
    let (mut close, mut keep_alive) = (false, false);
    for h in resp.headers.iter() {
        let name = h.name.as_bytes();
        if name.eq_ignore_ascii_case(b"content-length") {
            parsed.length = content_length(h.value, parsed.length)?;
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            parsed.codings.add(h.value)?;
        } else if name.eq_ignore_ascii_case(b"content-type") {
            parsed.content_type = parsed.content_type.or(Some(parsed.headers.len()));
        } else if name.eq_ignore_ascii_case(b"connection") {
            for token in h.value.split(|&b| b == b',').map(<[u8]>::trim_ascii) {
                close |= token.eq_ignore_ascii_case(b"close");
                keep_alive |= token.eq_ignore_ascii_case(b"keep-alive");
            }
        }
        parsed.headers.push((range(name), range(h.value)));
    }
    // A close anywhere wins; HTTP/1.0 keeps the connection only if asked.
    parsed.keep_alive = !close && (http11 || keep_alive);
    if parsed.codings.present {
        // RFC 9112 §6.1: faulty framing. For a proxy, TE with CL is the
        // request-smuggling signal, whichever one a reader would believe.
        if !http11 {
            return Err(Error::Invalid("transfer-encoding in an HTTP/1.0 response"));
        }
        if parsed.length.is_some() {
            return Err(Error::Invalid("transfer-encoding with content-length"));
        }
    }
    Ok(Some(parsed))
}

/// A `Content-Length` field value: digits only (`u64::from_str` takes a
/// `+`), a list only of one repeated value, and no value other than `seen`.
fn content_length(value: &[u8], seen: Option<u64>) -> Result<Option<u64>, Error> {
    let mut length = seen;
    for v in value.split(|&b| b == b',') {
        let n = digits(v.trim_ascii()).ok_or(Error::Invalid("bad content-length"))?;
        if length.is_some_and(|l| l != n) {
            return Err(Error::Invalid("conflicting content-length"));
        }
        length = Some(n);
    }
    Ok(length)
}

fn digits(s: &[u8]) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    s.iter().try_fold(0u64, |n, &b| match b {
        b'0'..=b'9' => n.checked_mul(10)?.checked_add(u64::from(b - b'0')),
        _ => None,
    })
}

/// The transfer codings named by every `Transfer-Encoding` field, in order.
#[derive(Default)]
struct Codings {
    present: bool,
    /// The last coding is chunked: the body is chunked. Otherwise it is read
    /// to the end of the connection (RFC 9112 §6.3).
    chunked: bool,
}

impl Codings {
    /// Anything a reader could frame two ways is refused: chunked twice or
    /// not last, an empty coding, a coding that is not visible ASCII.
    fn add(&mut self, value: &[u8]) -> Result<(), Error> {
        self.present = true;
        for coding in value.split(|&b| b == b',').map(<[u8]>::trim_ascii) {
            if coding.is_empty() || !coding.iter().all(|&b| b.is_ascii_graphic() || b == b' ' || b == b'\t') {
                return Err(Error::Invalid("malformed transfer-encoding"));
            }
            if self.chunked {
                return Err(Error::Invalid("chunked is not the last transfer coding, or not the only one"));
            }
            self.chunked = coding.eq_ignore_ascii_case(b"chunked");
        }
        Ok(())
    }
}

impl Parsed {
    /// How the body ends (RFC 9112 §6.3, in its order).
    fn framing(&self, method: &str) -> Framing {
        if method == "HEAD" || self.status == 204 || self.status == 304 {
            Framing::Length(0)
        } else if self.codings.present {
            if self.codings.chunked {
                Framing::chunked()
            } else {
                Framing::Eof
            }
        } else {
            self.length.map_or(Framing::Eof, Framing::Length)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ends_head;

    #[test]
    fn a_head_ends_at_the_first_empty_line_whatever_follows() {
        assert!(ends_head(b"HTTP/1.1 200 OK\r\nA: b\r\n\r\n{\"body\":1}"));
        assert!(ends_head(b"HTTP/1.1 200 OK\n\n"), "bare LF ends it too (then refused by the parser)");
        assert!(ends_head(b"\r\n\r\n"));
        assert!(!ends_head(b"HTTP/1.1 200 OK\r\nA: b\r\n"));
        assert!(!ends_head(b"HTTP/1.1 200 OK\r\nA: b\r\n\r"), "not yet");
        assert!(!ends_head(b"\n"));
        assert!(!ends_head(b""));
    }
}
