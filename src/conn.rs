//! Client connections: how many may be open, how long one may take to send a
//! request head, how long it may sit with no request in flight, and the
//! HTTP/1.1 and h2 limits of each.
//!
//! hyper's own header-read timeout needs a timer and also closes a keep-alive
//! connection that is merely idle, so one watch per connection does both jobs
//! here: it sees bytes arrive ([`Watched`]) and requests begin and end
//! ([`Busy`]), and ends the connection when it has had no request in flight
//! for `client_idle_timeout`, or when a request head started arriving more
//! than `header_read_timeout` ago and is still not complete. A connection with
//! a request in flight (waiting for its upstream, or streaming an SSE answer)
//! is never cut by either; but an answer the connection has not polled for
//! `answer_stall_timeout` (the client stopped reading it) ends it too.
//!
//! Which protocol a connection speaks is known before hyper reads it: from
//! its first bytes, peeked (the h2 preface or not), or from TLS ALPN. hyper's
//! HTTP/1.1 or h2 connection then serves it directly, and an HTTP/1.1
//! connection holds one 8 KiB read buffer. (hyper_util's auto builder reads
//! the first bytes itself and hands them back to hyper as a first read of
//! at most 24 bytes, after which hyper's read buffer doubles to 16 KiB and
//! stays so for the connection's life: a held SSE stream paid 8 KiB for it.
//! It still serves a connection whose first bytes leave the question open.)

use std::convert::Infallible;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::server::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::Watcher;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::config::ConnLimits;
use crate::reply::{Body, BoxError};

/// Why a connection was ended by the gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// A request head took longer than `header_read_timeout`.
    HeaderTimeout,
    /// No request in flight for `client_idle_timeout`.
    Idle,
    /// An answer the client stopped reading (a zero h2 window, a full socket).
    Stalled,
}

impl Ended {
    pub fn reason(self) -> &'static str {
        match self {
            Ended::HeaderTimeout => "header_timeout",
            Ended::Idle => "idle",
            Ended::Stalled => "stalled",
        }
    }
}

/// One connection's activity, shared by its socket, its requests and its task.
pub struct Watch {
    epoch: Instant,
    /// Requests whose answer is not finished.
    busy: AtomicU32,
    /// Answers handed to the connection and not finished.
    answering: AtomicU32,
    /// Milliseconds since `epoch` when an answer was last polled by the
    /// connection (it polls only when the client can take more).
    answer_polled: AtomicU64,
    /// Milliseconds since `epoch` when the connection last became idle.
    idle_since: AtomicU64,
    /// Milliseconds since `epoch` (plus one) when the first byte of a new
    /// request arrived while idle; 0 when none did.
    head_started: AtomicU64,
    /// The connection speaks h2: its idle bytes are control frames, not heads.
    h2: AtomicBool,
    first_read: AtomicBool,
}

impl Watch {
    pub fn new() -> Arc<Watch> {
        Arc::new(Watch {
            epoch: Instant::now(),
            busy: AtomicU32::new(0),
            answering: AtomicU32::new(0),
            answer_polled: AtomicU64::new(0),
            idle_since: AtomicU64::new(0),
            head_started: AtomicU64::new(0),
            h2: AtomicBool::new(false),
            first_read: AtomicBool::new(true),
        })
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Bytes arrived on the socket.
    fn on_read(&self, data: &[u8]) {
        // The h2 preface starts with "PRI"; a first read too short to tell
        // leaves the decision to the next one.
        if data.len() >= 3 && self.first_read.swap(false, Ordering::Relaxed) && data.starts_with(b"PRI") {
            self.h2.store(true, Ordering::Relaxed);
        }
        if self.busy.load(Ordering::Acquire) == 0
            && self.head_started.load(Ordering::Relaxed) == 0
            && !self.h2.load(Ordering::Relaxed)
        {
            self.head_started.store(self.now_ms() + 1, Ordering::Relaxed);
        }
    }

    /// A request begins: its head is complete.
    pub fn begin(self: &Arc<Self>) -> Busy {
        self.busy.fetch_add(1, Ordering::AcqRel);
        self.head_started.store(0, Ordering::Relaxed);
        Busy(self.clone())
    }

    /// When the connection should be ended if nothing changes, and why;
    /// `None` while a request waits for its answer.
    fn deadline(&self, limits: &ConnLimits) -> Option<(Instant, Ended)> {
        let at = |ms: u64, after: Duration| self.epoch + Duration::from_millis(ms) + after;
        if self.answering.load(Ordering::Acquire) > 0 {
            let polled = self.answer_polled.load(Ordering::Relaxed);
            return Some((at(polled, limits.answer_stall_timeout), Ended::Stalled));
        }
        if self.busy.load(Ordering::Acquire) > 0 {
            return None;
        }
        let idle = (at(self.idle_since.load(Ordering::Relaxed), limits.client_idle_timeout), Ended::Idle);
        match self.head_started.load(Ordering::Relaxed) {
            0 => Some(idle),
            started => {
                let head = (at(started - 1, limits.header_read_timeout), Ended::HeaderTimeout);
                Some(if head.0 < idle.0 { head } else { idle })
            }
        }
    }

    /// Resolves when the connection has overstayed: idle too long, too slow
    /// sending a head, or not reading its answer. Cancel-safe; the
    /// connection task selects on it.
    pub async fn overstayed(&self, limits: &ConnLimits) -> Ended {
        // Nothing wakes this loop when a head starts arriving (that would cost
        // a task wake-up per request): it looks again every quarter of the
        // header timeout, so a slow head is cut within 1.25 times the timeout.
        let look_again = limits.header_read_timeout / 4;
        loop {
            let now = Instant::now();
            match self.deadline(limits) {
                None => tokio::time::sleep(limits.client_idle_timeout.min(look_again)).await,
                Some((at, why)) if at <= now => return why,
                Some((at, _)) => tokio::time::sleep_until(at.min(now + look_again)).await,
            }
        }
    }
}

/// A request in flight on a connection; dropped when its answer is finished
/// (the response body ended or was dropped) or the request was abandoned.
pub struct Busy(Arc<Watch>);

impl Drop for Busy {
    fn drop(&mut self) {
        let w = &self.0;
        // The latest end wins when requests of one h2 connection end on two threads.
        w.idle_since.fetch_max(w.now_ms(), Ordering::Relaxed);
        w.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A socket that tells its [`Watch`] when bytes arrive.
pub struct Watched<T> {
    inner: T,
    watch: Arc<Watch>,
}

impl<T> Watched<T> {
    pub fn new(inner: T, watch: Arc<Watch>) -> Watched<T> {
        Watched { inner, watch }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            if buf.filled().len() > before {
                self.watch.on_read(&buf.filled()[before..]);
            }
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, data)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// An answer body that keeps its request counted as in flight until it
/// ends, and tells the watch each time the connection polls it.
pub struct Tracked {
    inner: Body,
    busy: Option<Busy>,
    /// The request's record: written out when the answer (and its work) ends.
    _record: std::sync::Arc<crate::observe::Record>,
}

impl Tracked {
    pub fn new(inner: Body, busy: Busy, record: std::sync::Arc<crate::observe::Record>) -> Tracked {
        let w = &busy.0;
        w.answer_polled.fetch_max(w.now_ms(), Ordering::Relaxed);
        w.answering.fetch_add(1, Ordering::AcqRel);
        Tracked { inner, busy: Some(busy), _record: record }
    }

    fn end(&mut self) {
        if let Some(busy) = self.busy.take() {
            busy.0.answering.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.end();
    }
}

impl hyper::body::Body for Tracked {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(busy) = &self.busy {
            busy.0.answer_polled.fetch_max(busy.0.now_ms(), Ordering::Relaxed);
        }
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(None) = polled {
            self.end();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// What a connection speaks, known before hyper reads from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Http1,
    Http2,
    /// Not known yet (the first bytes so far are the start of the h2
    /// preface, or TLS without ALPN): hyper_util's auto builder reads on
    /// and decides.
    Undecided,
}

const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// A plain connection's protocol, from its first bytes. They are peeked:
/// they stay in the socket for hyper to read.
pub async fn sniff(stream: &TcpStream) -> Protocol {
    let mut first = [0u8; H2_PREFACE.len()];
    match stream.peek(&mut first).await {
        Ok(n) if n > 0 && first[..n] != H2_PREFACE[..n] => Protocol::Http1,
        Ok(n) if n == H2_PREFACE.len() => Protocol::Http2,
        // Closed, failed, or a part of the preface only: hyper_util reads.
        _ => Protocol::Undecided,
    }
}

/// A TLS connection's protocol, from what ALPN settled.
pub fn negotiated<T>(stream: &tokio_rustls::server::TlsStream<T>) -> Protocol {
    match stream.get_ref().1.alpn_protocol() {
        Some(b"h2") => Protocol::Http2,
        Some(b"http/1.1") => Protocol::Http1,
        _ => Protocol::Undecided,
    }
}

/// The connection builders, with the configured HTTP/1.1 and h2 limits.
pub struct Builders {
    http1: http1::Builder,
    http2: http2::Builder<TokioExecutor>,
    /// The same two, for a connection whose protocol is [`Protocol::Undecided`].
    auto: auto::Builder<TokioExecutor>,
}

pub fn builders(limits: &ConnLimits) -> Builders {
    let max_buf = limits.max_header_bytes.max(8192);
    let mut http1 = http1::Builder::new();
    http1.max_buf_size(max_buf);
    let mut auto = auto::Builder::new(TokioExecutor::new());
    auto.http1().max_buf_size(max_buf);
    let header_list = u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX);
    let (window, stream_window) =
        (limits.h2_max_body_bytes_in_flight, limits.h2_max_body_bytes_in_flight.min(256 * 1024));
    let mut http2 = http2::Builder::new(TokioExecutor::new());
    http2
        .max_concurrent_streams(limits.h2_max_concurrent_streams)
        .max_header_list_size(header_list)
        .initial_connection_window_size(window)
        .initial_stream_window_size(stream_window)
        .max_pending_accept_reset_streams(Some(20))
        .max_local_error_reset_streams(Some(256));
    auto.http2()
        .max_concurrent_streams(limits.h2_max_concurrent_streams)
        .max_header_list_size(header_list)
        .initial_connection_window_size(window)
        .initial_stream_window_size(stream_window)
        .max_pending_accept_reset_streams(Some(20))
        .max_local_error_reset_streams(Some(256));
    Builders { http1, http2, auto }
}

impl Builders {
    /// Serves one client connection (after its TLS handshake, when `tls` is
    /// set) until it ends or shutdown's grace (`watcher`) ends it. The TLS
    /// and h2 paths are boxed: a plain HTTP/1.1 connection's task holds no
    /// room for their larger state.
    pub async fn serve<S>(
        &self,
        stream: TcpStream,
        tls: Option<tokio_rustls::TlsAcceptor>,
        watch: Arc<Watch>,
        service: S,
        watcher: Watcher,
    ) where
        S: hyper::service::Service<Request<Incoming>, Response = Response<Tracked>, Error = Infallible>
            + Send
            + 'static,
        S::Future: Send + 'static,
    {
        match tls {
            None => {
                let protocol = sniff(&stream).await;
                self.serve_io(TokioIo::new(Watched::new(stream, watch)), protocol, service, watcher).await
            }
            Some(tls) => {
                Box::pin(async move {
                    let Some(stream) = crate::cluster::tls::accept(&tls, stream).await else { return };
                    let protocol = negotiated(&stream);
                    self.serve_io(TokioIo::new(Watched::new(stream, watch)), protocol, service, watcher).await
                })
                .await
            }
        }
    }

    async fn serve_io<I, S>(&self, io: I, protocol: Protocol, service: S, watcher: Watcher)
    where
        I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
        S: hyper::service::Service<Request<Incoming>, Response = Response<Tracked>, Error = Infallible>
            + Send
            + 'static,
        S::Future: Send + 'static,
    {
        match protocol {
            Protocol::Http1 => {
                let _ = watcher.watch(self.http1.serve_connection(io, service)).await;
            }
            Protocol::Http2 => {
                let _ = Box::pin(watcher.watch(self.http2.serve_connection(io, service))).await;
            }
            Protocol::Undecided => {
                let _ = Box::pin(watcher.watch(self.auto.serve_connection(io, service))).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> ConnLimits {
        ConnLimits {
            header_read_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            body_idle_timeout: Duration::from_secs(10),
            client_idle_timeout: Duration::from_secs(60),
            answer_stall_timeout: Duration::from_secs(60),
            max_connections: 10,
            max_header_bytes: 64 * 1024,
            h2_max_concurrent_streams: 100,
            h2_max_body_bytes_in_flight: 1 << 20,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_overstays_after_the_idle_timeout() {
        let w = Watch::new();
        let started = Instant::now();
        assert_eq!(w.overstayed(&limits()).await, Ended::Idle);
        assert_eq!(started.elapsed(), Duration::from_secs(60));
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_head_overstays_after_the_header_timeout() {
        let w = Watch::new();
        let watch = w.clone();
        let overstayed = tokio::spawn(async move { watch.overstayed(&limits()).await });
        tokio::time::sleep(Duration::from_secs(5)).await;
        w.on_read(b"P");
        let started = Instant::now();
        assert_eq!(overstayed.await.unwrap(), Ended::HeaderTimeout);
        let waited = started.elapsed();
        assert!(waited >= Duration::from_secs(10) && waited <= Duration::from_millis(12_500), "{waited:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_in_flight_is_never_cut_and_idleness_restarts_after_it() {
        let w = Watch::new();
        w.on_read(b"POST");
        let busy = w.begin();
        let watch = w.clone();
        let overstayed = tokio::spawn(async move { watch.overstayed(&limits()).await });
        tokio::time::sleep(Duration::from_secs(600)).await;
        assert!(!overstayed.is_finished(), "busy for 10 minutes and still open");
        drop(busy);
        let ended_at = Instant::now();
        assert_eq!(overstayed.await.unwrap(), Ended::Idle);
        let waited = ended_at.elapsed();
        assert!(waited >= Duration::from_secs(60) && waited <= Duration::from_secs(70), "{waited:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_the_client_stops_reading_ends_the_connection() {
        let w = Watch::new();
        // An SSE answer with nothing more to say yet.
        let never = futures_util::stream::pending::<Result<Frame<Bytes>, BoxError>>();
        let mut answer = Tracked::new(
            http_body_util::BodyExt::boxed(http_body_util::StreamBody::new(never)),
            w.begin(),
            crate::observe::Record::new(&http::HeaderMap::new(), Default::default()),
        );
        let watch = w.clone();
        let overstayed = tokio::spawn(async move { watch.overstayed(&limits()).await });
        // Polled every 30 s (a reading client): never cut.
        for _ in 0..10 {
            tokio::time::sleep(Duration::from_secs(30)).await;
            assert!(!overstayed.is_finished());
            let waker = futures_util::task::noop_waker();
            let _ = hyper::body::Body::poll_frame(Pin::new(&mut answer), &mut Context::from_waker(&waker));
        }
        // Then never polled again: cut after the stall timeout.
        let stopped = Instant::now();
        assert_eq!(overstayed.await.unwrap(), Ended::Stalled);
        let waited = stopped.elapsed();
        assert!(waited >= Duration::from_secs(59) && waited <= Duration::from_secs(80), "{waited:?}");
    }

    /// A loopback pair: what the client sent, as the server's socket sees it.
    async fn sent(bytes: &[u8]) -> TcpStream {
        use tokio::io::AsyncWriteExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        client.write_all(bytes).await.unwrap();
        if bytes.is_empty() {
            drop(client);
        } else {
            // Kept open: the server's socket must not see an end.
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(5)).await;
                drop(client);
            });
        }
        server
    }

    #[tokio::test]
    async fn the_first_bytes_tell_the_protocol_and_stay_for_hyper() {
        use tokio::io::AsyncReadExt;
        for (bytes, protocol) in [
            (&b"POST /mcp HTTP/1.1\r\n"[..], Protocol::Http1),
            (b"GET / HTTP/1.1\r\n", Protocol::Http1),
            (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", Protocol::Http2),
            (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04", Protocol::Http2),
            // The start of the preface, or of a POST: hyper_util reads on.
            (b"P", Protocol::Undecided),
            (b"PRI * HTTP/2", Protocol::Undecided),
            (b"PRX", Protocol::Http1),
            // Closed before any byte.
            (b"", Protocol::Undecided),
        ] {
            let mut server = sent(bytes).await;
            assert_eq!(sniff(&server).await, protocol, "{:?}", String::from_utf8_lossy(bytes));
            let mut read = vec![0u8; bytes.len()];
            server.read_exact(&mut read).await.unwrap();
            assert_eq!(read, bytes, "peeked, not consumed");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn h2_control_frames_are_not_a_slow_head() {
        let w = Watch::new();
        w.on_read(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
        w.on_read(b"ping");
        let started = Instant::now();
        assert_eq!(w.overstayed(&limits()).await, Ended::Idle);
        assert_eq!(started.elapsed(), Duration::from_secs(60));
    }
}
