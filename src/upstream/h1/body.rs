//! The response body: by length, chunked, or to the end of the connection.
//! The chunked decoder works on what is buffered until it needs more, and
//! caps what a body may carry besides data (chunk extensions, trailers).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use hyper::body::{Frame, SizeHint};

use super::{Conn, Shared};

/// Most fields in a chunked body's trailer section (and in a response head,
/// which [`super::head`] reads with the same cap).
pub(super) const MAX_HEADERS: usize = 64;
/// Longest chunk-size line, extensions and CRLF included.
pub(super) const MAX_SIZE_LINE: usize = 4 * 1024;
/// Chunk-extension bytes per body (hyper's cap).
pub(super) const MAX_EXTENSIONS: usize = 16 * 1024;
/// Trailer-section bytes per body, CRLFs included (hyper's cap).
pub(super) const MAX_TRAILERS: usize = 16 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Framing {
    Length(u64),
    Chunked(Chunked),
    /// Until the upstream closes the connection.
    Eof,
    Done,
}

impl Framing {
    pub(super) fn chunked() -> Framing {
        Framing::Chunked(Chunked { state: Chunk::Size, extensions: 0, trailers: 0, trailer_bytes: 0 })
    }
}

/// The chunked decoder: where it is, and what the body has used of its caps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Chunked {
    state: Chunk,
    extensions: usize,
    trailers: usize,
    trailer_bytes: usize,
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

/// What one step of the decoder made of the buffer.
#[derive(Debug, PartialEq)]
enum Decoded {
    Data(Bytes),
    /// Framing consumed; step again.
    Progress,
    /// Nothing can be decided without more bytes.
    NeedMore,
    End,
}

fn invalid(what: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

impl Chunked {
    fn step(&mut self, buf: &mut BytesMut) -> io::Result<Decoded> {
        match self.state {
            Chunk::Size => {
                let Some(end) = line_end(buf, MAX_SIZE_LINE, "chunk-size line too long")? else {
                    return Ok(Decoded::NeedMore);
                };
                let (size, extensions) = chunk_size(&buf[..end])?;
                self.extensions += extensions;
                if self.extensions > MAX_EXTENSIONS {
                    return Err(invalid("chunk extensions too large"));
                }
                buf.advance(end);
                self.state = if size == 0 { Chunk::Trailer } else { Chunk::Data(size) };
                Ok(Decoded::Progress)
            }
            Chunk::Data(n) => {
                if buf.is_empty() {
                    return Ok(Decoded::NeedMore);
                }
                let take = buf.len().min(usize::try_from(n).unwrap_or(usize::MAX));
                let left = n - take as u64;
                self.state = if left == 0 { Chunk::DataEnd } else { Chunk::Data(left) };
                Ok(Decoded::Data(buf.split_to(take).freeze()))
            }
            Chunk::DataEnd => match buf.get(..2) {
                Some(b"\r\n") => {
                    buf.advance(2);
                    self.state = Chunk::Size;
                    Ok(Decoded::Progress)
                }
                None if buf.first().is_none_or(|&b| b == b'\r') => Ok(Decoded::NeedMore),
                _ => Err(invalid("chunk data not followed by CRLF")),
            },
            Chunk::Trailer => {
                let room = MAX_TRAILERS - self.trailer_bytes;
                let Some(end) = line_end(buf, room, "trailer section too large")? else {
                    return Ok(Decoded::NeedMore);
                };
                self.trailer_bytes += end;
                if end == 2 {
                    buf.advance(2);
                    return Ok(Decoded::End);
                }
                self.trailers += 1;
                if self.trailers > MAX_HEADERS {
                    return Err(invalid("too many trailer fields"));
                }
                if !is_field(&buf[..end - 2]) {
                    return Err(invalid("malformed trailer field"));
                }
                buf.advance(end); // trailers are not used
                Ok(Decoded::Progress)
            }
        }
    }
}

/// The length of the first line in `buf`, CRLF included, once it has all
/// arrived. A bare LF, or no line end within `max` bytes, is an error.
fn line_end(buf: &[u8], max: usize, too_long: &'static str) -> io::Result<Option<usize>> {
    let window = &buf[..buf.len().min(max)];
    match window.iter().position(|&b| b == b'\n') {
        Some(i) if i > 0 && window[i - 1] == b'\r' => Ok(Some(i + 1)),
        Some(_) => Err(invalid("bare LF in chunked framing")),
        None if buf.len() >= max => Err(invalid(too_long)),
        None => Ok(None),
    }
}

/// A chunk-size line (CRLF included): the size and its extension bytes.
/// httparse takes whitespace after the size and an empty size (as 0); here
/// the size is 1 to 16 hex digits followed by `;` or the CRLF.
fn chunk_size(line: &[u8]) -> io::Result<(u64, usize)> {
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 {
        return Err(invalid("chunk size without digits"));
    }
    if digits > 16 {
        return Err(invalid("chunk size longer than 16 digits"));
    }
    if !matches!(line[digits], b';' | b'\r') {
        return Err(invalid("chunk size not followed by ; or CRLF"));
    }
    match httparse::parse_chunk_size(line) {
        Ok(httparse::Status::Complete((n, size))) if n == line.len() => Ok((size, line.len() - 2 - digits)),
        _ => Err(invalid("bad chunk size")),
    }
}

/// `name: value`, as httparse and `http` would take a header field.
fn is_field(line: &[u8]) -> bool {
    let Some(colon) = line.iter().position(|&b| b == b':') else { return false };
    let (name, value) = (&line[..colon], &line[colon + 1..]);
    let tchar = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    !name.is_empty()
        && name.iter().all(|&b| tchar(b))
        && value.iter().all(|&b| b == b'\t' || (b >= 0x20 && b != 0x7f))
}

/// A response body, streamed as it arrives. Dropping it before the end
/// closes the connection; reading it to the end returns the connection to the
/// pool when the response allows and nothing was left over.
pub struct Body {
    pub(super) conn: Option<Conn>,
    framing: Framing,
    reusable: bool,
    pool: Arc<Shared>,
}

/// What the body does next.
enum Next {
    Data(Bytes),
    Fill,
    Again,
}

impl Body {
    pub(super) fn new(conn: Conn, framing: Framing, reusable: bool, pool: Arc<Shared>) -> Body {
        Body { conn: Some(conn), framing, reusable, pool }
    }

    /// The next piece of body data, `None` at the end.
    fn poll_data(&mut self, cx: &mut Context<'_>) -> Poll<Option<io::Result<Bytes>>> {
        loop {
            let Some(conn) = self.conn.as_mut() else {
                return Poll::Ready(None);
            };
            let next = match &mut self.framing {
                Framing::Done => {
                    self.finish();
                    return Poll::Ready(None);
                }
                Framing::Length(0) => {
                    self.framing = Framing::Done;
                    Next::Again
                }
                Framing::Length(n) if !conn.buf.is_empty() => {
                    let take = conn.buf.len().min(usize::try_from(*n).unwrap_or(usize::MAX));
                    *n -= take as u64;
                    Next::Data(conn.buf.split_to(take).freeze())
                }
                Framing::Eof if !conn.buf.is_empty() => Next::Data(conn.buf.split().freeze()),
                Framing::Length(_) | Framing::Eof => Next::Fill,
                Framing::Chunked(decoder) => match decoder.step(&mut conn.buf) {
                    Ok(Decoded::Data(d)) => Next::Data(d),
                    Ok(Decoded::Progress) => Next::Again,
                    Ok(Decoded::NeedMore) => Next::Fill,
                    Ok(Decoded::End) => {
                        self.framing = Framing::Done;
                        Next::Again
                    }
                    Err(e) => return self.fail(e),
                },
            };
            match next {
                Next::Again => {}
                Next::Data(d) => {
                    if self.framing == Framing::Length(0) {
                        self.framing = Framing::Done;
                        self.finish();
                    }
                    return Poll::Ready(Some(Ok(d)));
                }
                Next::Fill => match conn.io.poll_fill(cx, &mut conn.buf) {
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
                    Poll::Ready(Ok(0)) => return self.fail(io::ErrorKind::UnexpectedEof.into()),
                    Poll::Ready(Ok(_)) => {}
                    Poll::Ready(Err(e)) => return self.fail(e),
                },
            }
        }
    }

    /// The body is broken: the connection is closed, and the error is the last item.
    fn fail(&mut self, e: io::Error) -> Poll<Option<io::Result<Bytes>>> {
        self.conn = None;
        Poll::Ready(Some(Err(e)))
    }

    /// The response ended: keep the connection if it is reusable and nothing
    /// unrequested came after the response.
    fn finish(&mut self) {
        if let Some(conn) = self.conn.take() {
            if self.reusable && conn.buf.is_empty() {
                self.pool.checkin(conn);
            }
        }
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
mod tests {
    use super::*;

    #[test]
    fn chunk_decoder_steps() {
        let mut c = match Framing::chunked() {
            Framing::Chunked(c) => c,
            _ => unreachable!(),
        };
        let mut buf = BytesMut::from(&b"3;x=y\r\nabc\r\n0\r\nT: 1\r\n\r\n"[..]);
        assert_eq!(c.step(&mut buf).unwrap(), Decoded::Progress);
        assert_eq!((c.state, c.extensions), (Chunk::Data(3), 4));
        assert_eq!(c.step(&mut buf).unwrap(), Decoded::Data(Bytes::from_static(b"abc")));
        assert_eq!(c.step(&mut buf).unwrap(), Decoded::Progress);
        assert_eq!(c.step(&mut buf).unwrap(), Decoded::Progress);
        assert_eq!(c.state, Chunk::Trailer);
        assert_eq!(c.step(&mut buf).unwrap(), Decoded::Progress, "a buffered trailer is consumed");
        assert_eq!(c.step(&mut buf).unwrap(), Decoded::End);
        assert!(buf.is_empty());
    }

    #[test]
    fn chunk_sizes_are_strict() {
        for good in [&b"0\r\n"[..], b"F\r\n", b"ffffffffffffffff\r\n", b"1;\r\n", b"1;a=\"b c\"\r\n"] {
            assert!(chunk_size(good).is_ok(), "{:?}", String::from_utf8_lossy(good));
        }
        let bad: [&[u8]; 11] = [
            b"\r\n",
            b";\r\n",
            b" 1\r\n",
            b"1 \r\n",
            b"1\t;\r\n",
            b"+1\r\n",
            b"-0\r\n",
            b"0x1\r\n",
            b"1x\r\n",
            b"1;a\rb\r\n",
            b"10000000000000000\r\n",
        ];
        for line in bad {
            assert!(chunk_size(line).is_err(), "{:?}", String::from_utf8_lossy(line));
        }
    }

    #[test]
    fn trailer_fields_are_checked() {
        assert!(is_field(b"X-T: 1") && is_field(b"x:") && is_field(b"x:\tv\x80"));
        for bad in [&b": v"[..], b"x", b"x y: v", b" x: v", b"x: \x01", b"x: \x7f"] {
            assert!(!is_field(bad), "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
