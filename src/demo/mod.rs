//! The built-in MCP server: what `sessionless demo` runs behind the gateway
//! and `sessionless demo-upstream` runs alone, and the fast upstream the
//! integration tests and benchmarks talk to.
//!
//! By default ([`Generation::Legacy`]) it speaks session-based Streamable
//! HTTP (2025-03-26, 2025-06-18, 2025-11-25) on `/mcp`: sessions with idle
//! expiry, a standalone GET stream, progress and log notifications, and a
//! form elicitation that waits for the client's posted answer. With
//! [`Generation::Modern`] it speaks only 2026-07-28, stateless (`modern.rs`).
//! Self-contained: nothing here uses the gateway.

mod http;
mod methods;
mod modern;
mod rpc;
mod session;
mod tools;

#[cfg(test)]
mod e2e_tests;
#[cfg(test)]
mod modern_tests;
#[cfg(test)]
mod tests;

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use methods::Catalog;
use session::Store;

/// Most sessions held at once; the oldest is evicted beyond this.
const MAX_SESSIONS: usize = 10_000;
/// A session unused for this long is forgotten (later requests on it → 404).
const IDLE_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// How often expired sessions are swept out.
const SWEEP_EVERY: Duration = Duration::from_secs(60);
/// How long open connections get to finish after shutdown.
const DRAIN: Duration = Duration::from_secs(5);

/// Which protocol generation the demo server speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Generation {
    /// Session-based Streamable HTTP, 2025-03-26 to 2025-11-25.
    #[default]
    Legacy,
    /// 2026-07-28 only, stateless.
    Modern,
}

/// Shared by every connection of one `serve` call.
struct Server {
    store: Store,
    catalog: Catalog,
    /// Cancelled at shutdown; every session's token is a child of it.
    stop: CancellationToken,
    /// Set when the server speaks 2026-07-28 (then `store` stays empty).
    modern: Option<modern::Modern>,
}

/// Serves the demo legacy MCP server on `listener` (endpoint path `/mcp`) until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_with(listener, shutdown, MAX_SESSIONS, IDLE_TIMEOUT).await
}

/// Serves the demo server of `generation` on `listener` (endpoint path `/mcp`) until `shutdown` resolves.
pub async fn serve_generation(
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
    generation: Generation,
) -> std::io::Result<()> {
    serve_inner(listener, shutdown, MAX_SESSIONS, IDLE_TIMEOUT, generation).await
}

async fn serve_with(
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
    max_sessions: usize,
    idle: Duration,
) -> std::io::Result<()> {
    serve_inner(listener, shutdown, max_sessions, idle, Generation::Legacy).await
}

async fn serve_inner(
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
    max_sessions: usize,
    idle: Duration,
    generation: Generation,
) -> std::io::Result<()> {
    let stop = CancellationToken::new();
    let server = Arc::new(Server {
        store: Store::new(max_sessions, idle),
        catalog: Catalog::new(),
        stop: stop.clone(),
        modern: (generation == Generation::Modern).then(modern::Modern::new),
    });
    // Dropping `serve` early still ends every session, stream and task.
    let stop_on_exit = stop.clone().drop_guard();
    let mut sweeper = JoinSet::new();
    sweeper.spawn(sweep(Arc::clone(&server)));
    let mut tasks = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    tasks.spawn(connection(Arc::clone(&server), stream));
                }
                // Per-connection failures and fd exhaustion: back off briefly.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    }
    drop(listener);
    drop(stop_on_exit);
    let _ = tokio::time::timeout(DRAIN, async { while tasks.join_next().await.is_some() {} }).await;
    tasks.abort_all();
    sweeper.abort_all();
    Ok(())
}

async fn sweep(server: Arc<Server>) {
    let mut ticks = tokio::time::interval(SWEEP_EVERY);
    loop {
        tokio::select! {
            () = server.stop.cancelled() => return,
            _ = ticks.tick() => server.store.sweep(),
        }
    }
}

async fn connection(server: Arc<Server>, stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    let stop = server.stop.clone();
    // One service type per generation: the legacy path stays what it was.
    if server.modern.is_some() {
        let service = service_fn(move |req| {
            let server = Arc::clone(&server);
            async move { Ok::<_, Infallible>(modern::handle(server, req).await) }
        });
        drive(stream, service, stop).await;
    } else {
        let service = service_fn(move |req| {
            let server = Arc::clone(&server);
            async move { Ok::<_, Infallible>(http::handle(server, req).await) }
        });
        drive(stream, service, stop).await;
    }
}

async fn drive<S>(stream: TcpStream, service: S, stop: CancellationToken)
where
    S: hyper::service::Service<
            hyper::Request<hyper::body::Incoming>,
            Response = hyper::Response<rpc::DemoBody>,
        > + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new());
    builder.http2().timer(TokioTimer::new());
    let conn = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => return,
        () = stop.cancelled() => conn.as_mut().graceful_shutdown(),
    }
    let _ = conn.await;
}
