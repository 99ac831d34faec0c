//! Bounds each SSE event of an upstream stream rather than the whole stream:
//! a long listen stream or a chatty call may carry any number of events, but
//! no single event may grow past the limit (memory stays bounded either way).

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

#[cfg(test)]
mod tests {
    use super::*;

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
