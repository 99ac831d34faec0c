//! The built-in legacy MCP server: what `sessionless demo` runs behind the
//! gateway and `sessionless demo-upstream` runs alone, and the fast legacy
//! upstream the integration tests and benchmarks talk to.
//!
//! It speaks session-based Streamable HTTP (2025-03-26, 2025-06-18,
//! 2025-11-25) on `/mcp`: sessions with idle expiry, a standalone GET stream,
//! progress and log notifications, and a form elicitation that waits for the
//! client's posted answer. Self-contained: nothing here uses the gateway.

mod http;
mod methods;
mod rpc;
mod session;
mod tools;

#[cfg(test)]
mod e2e_tests;
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

/// Shared by every connection of one `serve` call.
struct Server {
    store: Store,
    catalog: Catalog,
    /// Cancelled at shutdown; every session's token is a child of it.
    stop: CancellationToken,
}

/// Serves the demo legacy MCP server on `listener` (endpoint path `/mcp`) until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_with(listener, shutdown, MAX_SESSIONS, IDLE_TIMEOUT).await
}

async fn serve_with(
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
    max_sessions: usize,
    idle: Duration,
) -> std::io::Result<()> {
    let stop = CancellationToken::new();
    let server = Arc::new(Server {
        store: Store::new(max_sessions, idle),
        catalog: Catalog::new(),
        stop: stop.clone(),
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
    let service = service_fn(move |req| {
        let server = Arc::clone(&server);
        async move { Ok::<_, Infallible>(http::handle(server, req).await) }
    });
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
