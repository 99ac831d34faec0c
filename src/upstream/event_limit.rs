//! Bounds each SSE event of an upstream stream rather than the whole stream:
//! a long listen stream or a chatty call may carry any number of events, but
//! no single event may grow past the limit (memory stays bounded either way).
//! Also bounds what an upstream message costs once parsed: a JSON tree takes
//! about 32 bytes per value, so `[0,0,…]` grows sixteen-fold when parsed;
//! [`too_many_values`] refuses such text before any tree is built.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    #[error("upstream event too large")]
    TooLarge,
    #[error("upstream body broke")]
    Broken,
}

pub struct EventLimited<B> {
    inner: B,
    limit: usize,
    /// Bytes since the last blank line (event boundary); `\r` is not counted.
    since_boundary: usize,
    prev_newline: bool,
}

impl<B> EventLimited<B> {
    pub fn new(inner: B, limit: usize) -> EventLimited<B> {
        EventLimited { inner, limit, since_boundary: 0, prev_newline: false }
    }

    /// Follows event boundaries through `data`; false once an event is too large.
    fn scan(&mut self, data: &[u8]) -> bool {
        for &b in data {
            match b {
                b'\n' if self.prev_newline => self.since_boundary = 0,
                b'\n' => self.prev_newline = true,
                b'\r' => {}
                _ => {
                    self.prev_newline = false;
                    self.since_boundary += 1;
                }
            }
        }
        self.since_boundary <= self.limit
    }
}

impl<B> Body for EventLimited<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    if !this.scan(data) {
                        return Poll::Ready(Some(Err(BodyError::TooLarge)));
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(_))) => Poll::Ready(Some(Err(BodyError::Broken))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Whether `json` would parse into more values than `max_bytes` allows
/// (one value per 16 bytes of the limit). A single pass counting the commas,
/// colons, brackets and braces outside strings: every value but the first
/// follows one, and an object member (key and value) follows two.
pub fn too_many_values(json: &[u8], max_bytes: usize) -> bool {
    let max = (max_bytes / 16).max(MIN_VALUES);
    if json.len() <= max {
        return false; // fewer bytes than values allowed: cannot be too many
    }
    let (mut values, mut in_string, mut escaped) = (1usize, false, false);
    for &b in json {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b',' | b':' | b'[' | b'{' => {
                values += 1;
                if values > max {
                    return true;
                }
            }
            _ => {}
        }
    }
    false
}

/// However small the byte limit, a message may hold this many values.
const MIN_VALUES: usize = 4096;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flat_array_of_zeros_has_too_many_values_and_text_does_not() {
        let limit = 16 << 20;
        let zeros = format!("[{}0]", "0,".repeat(4 << 20));
        assert!(too_many_values(zeros.as_bytes(), limit), "4M values in 8 MiB");
        let text =
            format!(r#"{{"result":{{"content":[{{"type":"text","text":"{}"}}]}}}}"#, "a,[{".repeat(3 << 20));
        assert!(!too_many_values(text.as_bytes(), limit), "commas inside a string are not values");
        let escaped = format!(r#"["{}"]"#, r#"\",\""#.repeat(1 << 20));
        assert!(!too_many_values(escaped.as_bytes(), limit), "escaped quotes stay inside the string");
        let tools =
            format!("[{}]", vec![r#"{"name":"t","inputSchema":{"type":"object"}}"#; 10_000].join(","));
        assert!(!too_many_values(tools.as_bytes(), limit), "a large ordinary list passes");
        assert!(!too_many_values(b"[1,2,3]", 0), "small messages always pass");
        let members =
            format!("{{{}\"z\":0}}", (0..400_000).map(|i| format!("\"{i:x}\":0,")).collect::<String>());
        assert!(too_many_values(members.as_bytes(), 8 << 20), "object members count key and value");
    }

    #[test]
    fn many_small_events_pass_and_one_large_event_fails() {
        let mut l = EventLimited::new((), 10);
        for _ in 0..1000 {
            assert!(l.scan(b"data: 12345\n\n"[6..].as_ref()));
            assert!(l.scan(b"\r\n\r\n"));
        }
        assert!(l.scan(b"data: 0123"));
        assert!(!l.scan(b"456789\n"), "one event over the limit");
    }

    #[test]
    fn boundaries_split_across_frames() {
        let mut l = EventLimited::new((), 8);
        assert!(l.scan(b"abcdefgh\n"));
        assert!(l.scan(b"\nabcdefgh"));
        assert!(!l.scan(b"x"));
    }
}
