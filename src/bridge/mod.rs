//! The cells: a client half over an upstream half ([`half`], DESIGN.md §10),
//! one per (client generation, upstream generation) pair of §9, or the
//! relay; chosen once per request at [`Cell::of`] (the server holds one of
//! each half and picks the pair). What every cell uses lives here or beside
//! it: the request's [`Caller`], the resolved [`Target`] (route and
//! upstream handle), and the shared [`Services`] (sealing, cluster
//! forwarding, metrics, the places of parking lots, the stream slots, drain
//! and shutdown). A half that pauses calls owns a [`crate::park::ParkingLot`]
//! of its own flow type, drawing from the shared places. No half imports
//! another.
//!
//! | client half ↓ upstream half → | legacy sessions: [`sessions`] | 2026: [`stateless`] |
//! |---|---|---|
//! | 2026 client: [`crate::front`], [`modern_client`] | `ModernLegacy` | `ModernModern` (passed through) |
//! | legacy client, translated: [`legacy_client`] | `LegacyLegacy` | `LegacyModern` |
//! | legacy client, relayed: [`legacy_relay`] | `Relay` (the direct path) | `Relay`, to a server that serves both eras |

pub mod federation;
pub mod half;
pub mod legacy_client;
pub mod legacy_relay;
pub mod modern_client;
pub mod quota;
pub mod relay;
pub mod session_token;
pub mod sessions;
pub mod stateless;
mod target;
pub mod tool_headers;

pub use target::{Admitted, Ask, Detected, Target, Targets};

use std::sync::Arc;
use std::time::Duration;

use http::HeaderMap;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
pub use crate::front::generation::Generation;
use crate::metrics::Metrics;
use crate::seal::Sealer;

/// How a request runs: a client half over an upstream half ([`half`]), or
/// the relay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cell {
    /// A 2026 client on pooled legacy sessions: questions become rounds.
    ModernLegacy,
    /// A 2026 client on a 2026 upstream: passed through, `requestState` enveloped.
    ModernModern,
    /// A session client translated (its session a sealed token, each
    /// request a typed call) on a 2026 upstream.
    LegacyModern,
    /// A session client translated onto pooled legacy sessions.
    LegacyLegacy,
    /// A session client relayed to the upstream's own sessions, session id
    /// sealed: the direct path, for fidelity (log levels, subscriptions,
    /// batches).
    Relay,
    /// Either client on a federated route: calls go through the federation
    /// half to each member's own upstream half (DESIGN §11).
    Federated,
}

impl Cell {
    /// The cell for a client message of generation `client` on an upstream
    /// of generation `upstream`; `translate`: legacy clients are translated
    /// (the upstream serves only 2026, or is configured so) rather than relayed.
    pub fn of(client: Generation, upstream: Generation, translate: bool) -> Cell {
        match (client, upstream) {
            (Generation::Modern, Generation::Legacy) => Cell::ModernLegacy,
            (Generation::Modern, Generation::Modern) => Cell::ModernModern,
            (Generation::Legacy, Generation::Modern) if translate => Cell::LegacyModern,
            (Generation::Legacy, Generation::Legacy) if translate => Cell::LegacyLegacy,
            // A modern server that also serves the session era (the SDK v2
            // servers) takes legacy clients as they are.
            (Generation::Legacy, _) => Cell::Relay,
        }
    }
}

/// What every cell shares.
pub struct Services {
    pub sealer: Arc<Sealer>,
    pub metrics: Metrics,
    /// This replica's name in sealed tokens.
    pub instance: String,
    /// Cluster mode: how to reach the replica that owns a paused call.
    pub cluster: Option<crate::cluster::Forwarder>,
    /// SSE keep-alive interval on the client side.
    pub keepalive: Duration,
    /// The places every parking lot draws from (global and per-principal caps).
    pub parking: Arc<crate::park::Places>,
    /// Long-lived client streams (listen, a legacy session's GET stream):
    /// a global cap and a share per principal.
    pub streams: Arc<crate::park::Places>,
    /// Fires when draining starts: long-lived streams end so that clients
    /// reconnect elsewhere.
    pub draining: CancellationToken,
    /// Fires at shutdown.
    pub shutdown: CancellationToken,
}

impl Services {
    /// `cluster_tls`: built from `config.cluster`'s TLS when the gateway started.
    pub fn new(
        config: &Config,
        cluster_tls: Option<&crate::cluster::tls::ClusterTls>,
        metrics: Metrics,
        shutdown: CancellationToken,
    ) -> Services {
        Services {
            sealer: Arc::new(Sealer::new(config.keys.clone())),
            metrics,
            instance: config.cluster.as_ref().map(|c| c.instance_id.clone()).unwrap_or_else(random_id),
            cluster: config.cluster.as_ref().map(|c| {
                // A forwarded retry may take as long as a direct one.
                let timeout = config.routes.iter().map(|r| r.upstream.call_timeout).max().unwrap_or_default();
                crate::cluster::Forwarder::new(c, cluster_tls, timeout)
            }),
            keepalive: config.keepalive_interval,
            parking: crate::park::Places::new(
                config.limits.max_parked_flows,
                config.limits.max_parked_flows_per_principal,
            ),
            streams: crate::park::Places::new(
                config.limits.max_listen_streams,
                config.limits.max_listen_streams_per_principal,
            ),
            draining: CancellationToken::new(),
            shutdown,
        }
    }
}

impl Services {
    /// A place for one long-lived stream of `principal`, or the error that
    /// refuses it (503 when all are taken, 429 when the principal holds its share).
    pub fn stream_place(
        &self,
        route: &str,
        principal: &str,
    ) -> Result<crate::park::Held, crate::error::Error> {
        use crate::park::Refused;
        self.streams.hold(principal).map_err(|why| match why {
            Refused::PrincipalFull => {
                let labels = crate::metrics::QuotaLabels {
                    route: route.to_string(),
                    quota: "listen_streams_per_principal",
                };
                self.metrics.quota_exceeded.get_or_create(&labels).inc();
                crate::error::Error::TooManyStreams
            }
            Refused::Full | Refused::Closed => crate::error::Error::Overloaded,
        })
    }

    /// Counts one finished client request of `target` (by client and
    /// upstream generation) and its duration.
    pub fn count(
        &self,
        target: &Target,
        (client, upstream): (Generation, Generation),
        method: &'static str,
        outcome: &'static str,
        started: std::time::Instant,
    ) {
        let route = target.route.id.as_str();
        let seconds = started.elapsed().as_secs_f64();
        target.counts.count(&self.metrics, route, (client, upstream, method, outcome), seconds);
        // A federated route's failures are its members', counted per member.
        if !target.federated() && crate::status::recent::upstream_failed(outcome) {
            target.errors.add();
        }
        if method == "tools/call" {
            if let Some(tool) = crate::observe::labelled_tool() {
                let labels = crate::metrics::ToolLabels { route: route.to_string(), tool };
                self.metrics.tool_call_duration.get_or_create(&labels).observe(seconds);
            }
        }
        // The access line and the span are written when the request's answer ends.
        crate::observe::counted(|| crate::observe::Counted {
            route: route.to_string(),
            method,
            generation: client.as_str(),
            upstream: upstream.as_str(),
            outcome,
        });
    }
}

/// Who is calling, as far as upstream sessions and sealed tokens are concerned.
#[derive(Debug, Clone)]
pub struct Caller {
    /// Digest of the bearer token, or "anonymous".
    pub principal: String,
    /// The request's headers. Only the MCP ones ([`crate::front::headers::is_mcp`])
    /// ever leave the gateway (to the replica owning a flow, or relayed to
    /// a legacy upstream); credentials never do.
    pub headers: HeaderMap,
    /// The request body as received (a retry forwarded to its owner replica
    /// carries it unchanged).
    pub body: bytes::Bytes,
    /// Received from another replica (signed, and admitted as the retry of
    /// a call paused here): only ever resumes that call; never forwarded
    /// again, never run as a new call.
    pub forwarded: bool,
    /// The route's authorization rules as this caller sees them (`None`:
    /// the route has none).
    pub access: Option<Arc<crate::authz::View>>,
}

/// What a call holds while it runs: its permits, as long as its answer
/// lives, and its share of the body budget, until its body was sent.
pub struct Held {
    pub permits: Box<dyn std::any::Any + Send + Sync>,
    pub body: Option<crate::body::Share>,
}

/// What [`Target::admit`] is asked for a legacy client's message: each of
/// its requests, with its tool.
pub(crate) fn asks(peek: &crate::front::legacy::Peeked) -> Vec<Ask<'_>> {
    peek.calls.iter().map(|tool| Ask { tool: tool.as_deref(), resumes: false }).collect()
}

/// 128 random bits, hex: flow ids and instance ids.
pub(crate) fn random_id() -> String {
    let mut b = [0u8; 16];
    rand::RngCore::fill_bytes(&mut rand::thread_rng(), &mut b);
    crate::seal::hex(&b)
}
