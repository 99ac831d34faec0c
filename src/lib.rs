//! sessionless: a gateway that puts a stateless MCP 2026-07-28 front door on
//! legacy, session-based MCP servers. See ARCHITECTURE.md for the request path.
#![forbid(unsafe_code)]

pub mod auth;
pub mod authz;
pub mod body;
pub mod bridge;
pub mod cluster;
pub mod config;
pub mod conn;
pub mod cors;
pub mod demo;
pub mod error;
pub mod front;
pub mod guard;
pub mod live;
pub mod metrics;
pub mod observe;
pub mod park;
pub mod ratelimit;
pub mod ratelog;
pub mod reload;
pub mod reply;
pub mod seal;
pub mod sealed;
pub mod server;
pub mod shutdown;
pub mod status;
pub mod tls;
pub mod upstream;
pub mod versions;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use config::Config;

/// Entry points for the cargo-fuzz targets in `fuzz/` (feature `fuzzing`,
/// off by default); not an API.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing {
    pub use crate::bridge::legacy_client::translated_call;
    pub use crate::bridge::sessions::fuzzing::{h1_exchange, H1Response, Seals};
}

/// A running gateway.
pub struct Running {
    pub addr: SocketAddr,
    /// The internal listener's address (cluster mode).
    pub internal_addr: Option<SocketAddr>,
    /// The public listener's certificate (`[server.tls]`): a reload swaps it
    /// ([`tls::Certs::swap`] with the new config's pair, or [`tls::Certs::reload`]).
    pub tls: Option<Arc<tls::Certs>>,
    drain: CancellationToken,
    task: JoinHandle<()>,
    /// Started from a file: reads it again on demand.
    reloader: Option<reload::Reloader>,
    stopper: Stopper,
}

/// Starts a shutdown and can cut it short (what the binary's signals do).
#[derive(Clone)]
pub struct Stopper {
    drain: CancellationToken,
    gateway: Arc<server::Gateway>,
    /// The drain's deadline (`[server] drain_timeout_ms`, read at start).
    deadline: std::time::Duration,
}

impl Stopper {
    /// Starts the drain; says what it waits for and for how long at most.
    pub fn begin(&self) -> Draining {
        let pending = self.gateway.pending();
        self.drain.cancel();
        Draining { pending, deadline: self.deadline }
    }

    /// Stops now: the drain ends, open connections get no grace, what is
    /// parked is declined upstream (as at the drain's deadline). Returns
    /// what was still pending.
    pub fn now(&self) -> server::Pending {
        let pending = self.gateway.pending();
        self.drain.cancel();
        self.gateway.hurry();
        pending
    }
}

/// What a shutdown drains, in words: `draining: 1 paused call, up to 10 s`.
pub struct Draining {
    pub pending: server::Pending,
    pub deadline: std::time::Duration,
}

impl std::fmt::Display for Draining {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.pending == server::Pending::default() {
            return f.write_str("nothing to drain; stopping");
        }
        write!(f, "draining: {}, up to {} s", self.pending, self.deadline.as_secs_f64())
    }
}

impl Running {
    /// Drains and stops: new calls are refused (503, `/readyz` 503) while
    /// retries of paused calls are served, until none is left or the drain
    /// deadline passes; then the listeners close, open requests get a short
    /// grace period, what is still parked is declined upstream, and upstream
    /// sessions are closed. Waits for all of it.
    pub async fn shutdown(self) {
        self.drain.cancel();
        let _ = self.task.await;
    }

    /// Waits until the gateway stops (after `shutdown` from another handle).
    pub async fn wait(self) {
        let _ = self.task.await;
    }

    pub fn shutdown_token(&self) -> CancellationToken {
        self.drain.clone()
    }

    /// What starts a shutdown, says what it drains, and cuts it short.
    pub fn stopper(&self) -> Stopper {
        self.stopper.clone()
    }

    /// Reads the routing file again and applies it (what `SIGHUP` and a
    /// change to the file do); the running configuration stays when the
    /// file is bad. An error too when the gateway was not started from a file.
    pub async fn reload(&self) -> Result<live::Reloaded, String> {
        match &self.reloader {
            Some(r) => r.reload("asked").await,
            None => Err("started without a configuration file: nothing to reload".into()),
        }
    }

    /// What reloads this gateway, when it was started from a file.
    pub fn reloader(&self) -> Option<reload::Reloader> {
        self.reloader.clone()
    }

    /// The MCP endpoint URL of the first route.
    pub fn url(&self, path: &str) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}{}", self.addr, path)
    }
}

/// Probes every route's upstream once (what `check-config --probe` prints):
/// `(route, upstream name, URL or command, what it found and why, usable)`;
/// an error when an upstream's header value cannot be read.
pub async fn probe_upstreams(config: &Config) -> Result<Vec<ProbeReport>, String> {
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = metrics::Metrics::register(&mut registry);
    let targets = bridge::Targets::new(config, &metrics)?;
    let mut out = Vec::new();
    for t in targets.onto_upstreams() {
        let (route, upstream) = (t.route.id.clone(), t.route.upstream.name.clone());
        if let (Some(stdio), Some(command)) = (t.stdio(), &t.route.upstream.stdio) {
            let (found, usable) = match stdio.probe().await {
                Ok(found) => (found, true),
                Err(why) => (format!("unusable: {why}"), false),
            };
            out.push(ProbeReport { route, upstream, at: command.describe(), found, usable });
            continue;
        }
        let usable = matches!(t.generation().await, Ok(_) | Err(error::Error::UpstreamRefused));
        let found = match usable {
            true => t.detected.describe(),
            false => match t.detected.describe() {
                d if d.starts_with("unusable") => d,
                _ => "unusable: unreachable".into(),
            },
        };
        let urls: Vec<&str> = t.instances().iter().map(|i| i.instance()).collect();
        out.push(ProbeReport { route, upstream, at: urls.join(" "), found, usable });
    }
    Ok(out)
}

/// What `check-config --probe` found for one route's upstream.
pub struct ProbeReport {
    pub route: String,
    pub upstream: String,
    /// Its URLs, or its command.
    pub at: String,
    /// What it speaks, or why it cannot be used.
    pub found: String,
    /// Whether it answered as an MCP server.
    pub usable: bool,
}

/// Binds `addr`; a failure says which address, why in words, and what to
/// do (`setting`: where the address is chosen).
async fn bind(addr: std::net::SocketAddr, setting: &str) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await.map_err(|e| {
        let hint = match e.kind() {
            std::io::ErrorKind::AddrInUse => {
                format!("the address is in use (another program, or another sessionless, holds the port): stop it, or choose another address with {setting}")
            }
            std::io::ErrorKind::PermissionDenied => {
                format!("permission denied (ports below 1024 need privileges): choose a port above 1024 with {setting}")
            }
            std::io::ErrorKind::AddrNotAvailable => {
                format!("no network interface of this machine has that address: use 127.0.0.1, 0.0.0.0 or one of its own addresses with {setting}")
            }
            _ => format!("{e}"),
        };
        std::io::Error::new(e.kind(), format!("cannot listen on {addr}: {hint}"))
    })
}

/// How long shutdown waits for upstream sessions to be closed with `DELETE`.
const CLOSE_SESSIONS: std::time::Duration = std::time::Duration::from_secs(5);

/// Binds the listeners and starts the gateway; returns once it accepts connections.
pub async fn run(config: Config) -> std::io::Result<Running> {
    start(config, None).await
}

/// Like [`run`], from a routing file that is watched: a change to it (or
/// [`Running::reload`], or `SIGHUP` in the binary) reloads it.
pub async fn run_from(source: reload::Source) -> Result<Running, String> {
    let config = source.load_off_runtime().await.map_err(|e| e.0)?;
    start(config, Some(source)).await.map_err(|e| e.to_string())
}

async fn start(config: Config, source: Option<reload::Source>) -> std::io::Result<Running> {
    let listener = bind(config.listen, "--listen ADDR (or [server] listen)").await?;
    let addr = listener.local_addr()?;
    let internal = match &config.cluster {
        Some(c) => Some(bind(c.internal_listen, "[cluster] internal_listen").await?),
        None => None,
    };
    let internal_addr = internal.as_ref().map(TcpListener::local_addr).transpose()?;
    let drain_timeout = config.drain_timeout;
    // Built once: cluster settings are not reloaded.
    let cluster_tls = config.cluster.as_ref().and_then(|c| c.tls.as_ref());
    let cluster_tls =
        cluster_tls.map(cluster::tls::ClusterTls::build).transpose().map_err(std::io::Error::other)?;
    let (drain, stop) = (CancellationToken::new(), CancellationToken::new());
    let gateway = Arc::new(
        server::Gateway::new(config, cluster_tls.as_ref(), stop.clone()).map_err(std::io::Error::other)?,
    );
    let certs = gateway.certs().cloned();
    let mut bound = vec![status::Bound { kind: "public", address: addr, tls: certs.is_some() }];
    if let Some(address) = internal_addr {
        bound.push(status::Bound { kind: "internal", address, tls: cluster_tls.is_some() });
    }
    gateway.bound(bound);
    // The first generation's tasks: what each `auto` upstream speaks
    // (found now rather than on the first request), health probes, rate
    // limit sweeps, JWKS refreshes.
    gateway.start();
    let mut tasks = vec![
        tokio::spawn(gateway.sessions().pool().clone().run_reaper(stop.clone())),
        tokio::spawn(gateway.sessions().clone().run_flow_reaper(stop.clone(), gateway.hurry_token())),
        tokio::spawn(server::serve(
            gateway.clone(),
            listener,
            stop.clone(),
            server::Listener::Public,
            certs.as_ref().map(tls::Certs::acceptor),
        )),
    ];
    let reloader = source.map(|source| reload::Reloader::new(gateway.clone(), source));
    if let Some(r) = reloader.as_ref().filter(|r| r.watches()) {
        tasks.push(tokio::spawn(r.clone().watch(stop.clone())));
    }
    if let Some(internal) = internal {
        let tls = cluster_tls.as_ref().map(cluster::tls::acceptor);
        tasks.push(tokio::spawn(server::serve(
            gateway.clone(),
            internal,
            stop.clone(),
            server::Listener::Internal,
            tls,
        )));
    }
    let draining = drain.clone();
    let stopper = Stopper { drain: drain.clone(), gateway: gateway.clone(), deadline: drain_timeout };
    let task = tokio::spawn(async move {
        draining.cancelled().await;
        gateway.drain(drain_timeout).await;
        stop.cancel();
        futures_util::future::join_all(tasks).await;
        // Upstream sessions are told goodbye, for a bounded time: an upstream
        // that hangs must not hold the process (its idle timeout ends them).
        let closing = gateway.sessions().pool().close_all();
        if shutdown::bounded(closing, CLOSE_SESSIONS, &gateway.hurry_token()).await.is_none() {
            tracing::warn!("upstream sessions still closing at exit; left to the upstream's idle timeout");
        }
        // Stdio upstreams' processes: TERM, KILL after a grace period, reaped.
        gateway.stop_processes().await;
        gateway.flush_spans().await;
    });
    Ok(Running { addr, internal_addr, tls: certs, drain, task, reloader, stopper })
}
