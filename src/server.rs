//! The listener and the request pipeline: guard → read body → front → route →
//! bridge → respond. Also `/metrics`, `/healthz`, `/readyz` and `/status`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwap;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use hyper::body::Incoming;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;

use crate::bridge::{
    federation, legacy_client, legacy_relay, modern_client, sessions, stateless, Caller, Cell, Generation,
    Held, Services, Target, Targets,
};
use crate::cluster;
use crate::config::{Config, ConnLimits};
use crate::conn::Tracked;
use crate::error::{error_body, Error};
use crate::front::generation::ByHeaders;
use crate::front::{self, Message, SUPPORTED_VERSIONS};
use crate::live::{self, Found, Live, Reloaded};
use crate::metrics::{EndedLabels, HeaderLabels, Metrics, OutcomeOnlyLabels};
use crate::ratelog::RateLimitedLog;
use crate::reply::{self, Body, Reply};
use crate::upstream::credentials::{client_token, Forwarded, Secret, CLIENT_TOKEN};
use crate::upstream::Channel as _;

/// A federated route's half, over the two upstream halves.
type Federation = federation::Federation<sessions::Bridge, stateless::Bridge>;

pub struct Gateway {
    /// The routes with their upstream handles, the auth verifiers, the
    /// settings: what a reload replaces (see [`crate::live`]).
    live: ArcSwap<Live>,
    /// Stdio fleets a reload replaced, stopping as their processes go idle
    /// (stopped outright at shutdown).
    retired_fleets: std::sync::Mutex<Vec<std::sync::Weak<crate::upstream::stdio::Fleet>>>,
    /// One reload at a time.
    reloading: tokio::sync::Mutex<()>,
    /// The gateway's stop: the live generations' tasks are its children.
    stop: CancellationToken,
    services: Arc<Services>,
    /// One of each half (DESIGN §10): the legacy-session and the 2026
    /// upstream halves, the legacy-client half, and the relay.
    sessions: Arc<sessions::Bridge>,
    legacy_relay: legacy_relay::Bridge,
    stateless: Arc<stateless::Bridge>,
    legacy_client: Arc<legacy_client::Bridge>,
    /// Federated routes: calls through the halves above, per member.
    federation: Arc<Federation>,
    metrics: Metrics,
    registry: Registry,
    draining: AtomicBool,
    limit: Arc<tokio::sync::Semaphore>,
    /// The internal listener's own concurrency permits (cluster mode).
    internal_limit: Arc<tokio::sync::Semaphore>,
    /// Request body bytes all requests may hold at once.
    body_budget: Arc<crate::body::Budget>,
    /// The public listener's certificate, when it has TLS.
    certs: Option<Arc<crate::tls::Certs>>,
    /// Sized at start (a reload does not change them).
    max_body_bytes: usize,
    connections: Arc<ConnLimits>,
    /// Cluster mode: the internal listener's signature and replay checks.
    gate: Option<cluster::Gate>,
    /// Where finished requests' records go (spans, when OTLP is configured).
    sinks: crate::observe::Sinks,
    /// The listeners bound (set once they are), for `/status`.
    listeners: std::sync::OnceLock<Vec<crate::status::Bound>>,
    /// The configuration's generation and its reloads, for `/status`.
    reloads: crate::status::Reloads,
    started: std::time::SystemTime,
    /// Shutdown without waiting (a second signal): the drain and the
    /// connections' grace end at once, every later step within a second.
    hurry: CancellationToken,
}

/// What a shutdown waits for (see [`Gateway::drain`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pending {
    /// Calls paused on a question, waiting for their client's retry.
    pub paused: usize,
    /// Legacy clients' answers still streaming (a call waiting on its user).
    pub streaming: usize,
}

impl std::fmt::Display for Pending {
    /// `1 paused call, 2 answers still streaming`; `nothing` when empty.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let plural = |n: usize, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
        let mut what = Vec::new();
        if self.paused > 0 {
            what.push(plural(self.paused, "paused call", "paused calls"));
        }
        if self.streaming > 0 {
            what.push(plural(self.streaming, "answer still streaming", "answers still streaming"));
        }
        if what.is_empty() {
            return f.write_str("nothing");
        }
        f.write_str(&what.join(", "))
    }
}

impl Gateway {
    pub fn new(
        config: Config,
        cluster_tls: Option<&cluster::tls::ClusterTls>,
        shutdown: CancellationToken,
    ) -> Result<Gateway, String> {
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        let services = Arc::new(Services::new(&config, cluster_tls, metrics.clone(), shutdown.clone()));
        let gate = config.cluster.as_ref().map(|c| cluster::Gate::new(c, metrics.internal_refused.clone()));
        let legacy_relay = legacy_relay::Bridge::new(&config, services.clone());
        let quota = legacy_relay.session_quota();
        let live = Live::new(config.clone(), &metrics, &shutdown)?;
        for outcome in ["applied", "rejected"] {
            metrics.config_reloads.get_or_create(&OutcomeOnlyLabels { outcome }).inc_by(0);
        }
        metrics.config_last_reload.set(crate::seal::unix_now() as i64);
        let sinks = sinks(&config)?;
        let sessions = Arc::new(sessions::Bridge::new(&config, services.clone()));
        let stateless = Arc::new(stateless::Bridge::new(services.clone()));
        let federation = Arc::new(Federation::new(sessions.clone(), stateless.clone(), services.clone()));
        Ok(Gateway {
            sinks,
            gate,
            limit: Arc::new(tokio::sync::Semaphore::new(config.limits.max_concurrent_requests)),
            internal_limit: Arc::new(tokio::sync::Semaphore::new(config.limits.max_concurrent_requests)),
            body_budget: crate::body::Budget::new(config.limits.max_buffered_body_bytes),
            certs: live.tls.as_ref().map(crate::tls::Certs::new),
            max_body_bytes: config.limits.max_body_bytes,
            connections: Arc::new(config.connections.clone()),
            sessions,
            legacy_relay,
            stateless,
            federation,
            legacy_client: Arc::new(legacy_client::Bridge::new(&config, services.clone(), quota)),
            live: ArcSwap::from_pointee(live),
            reloading: tokio::sync::Mutex::new(()),
            retired_fleets: Default::default(),
            stop: shutdown,
            services,
            metrics,
            registry,
            draining: AtomicBool::new(false),
            listeners: std::sync::OnceLock::new(),
            reloads: crate::status::Reloads::new(),
            hurry: CancellationToken::new(),
            started: std::time::SystemTime::now(),
        })
    }

    /// Sends the spans still queued (at shutdown).
    pub async fn flush_spans(&self) {
        #[cfg(feature = "otlp")]
        if let Some(spans) = &self.sinks.spans {
            // The exporter bounds itself (5 s); a second once told to hurry.
            let _ = crate::shutdown::bounded(spans.flush(), std::time::Duration::from_secs(10), &self.hurry)
                .await;
        }
    }

    /// The live configuration generation (a reload replaces it).
    pub fn live(&self) -> Arc<Live> {
        self.live.load_full()
    }

    /// The public listener's certificate (`[server.tls]`), swapped by reloads.
    pub fn certs(&self) -> Option<&Arc<crate::tls::Certs>> {
        self.certs.as_ref()
    }

    /// Starts the first generation's tasks (health probes, rate-limit
    /// sweeps, JWKS refreshes, first generation probes).
    pub fn start(&self) {
        self.live.load().start();
    }

    /// Replaces the live configuration with `config` (validated already),
    /// or changes nothing and says why. See [`crate::live`]. The next
    /// generation is built on a blocking thread (it reads header values,
    /// JWKS files and HS256 secrets); the current one serves meanwhile.
    pub async fn reload(&self, config: Config) -> Result<Reloaded, String> {
        let _one = self.reloading.lock().await;
        let current = self.live.load_full();
        let (metrics, stop) = (self.metrics.clone(), self.stop.clone());
        let building = current.clone();
        let outcome = tokio::task::spawn_blocking(move || live::prepare(&building, config, &metrics, &stop))
            .await
            .unwrap_or_else(|e| Err(format!("building the configuration failed: {e}")));
        let (next, report) = match outcome {
            Ok(prepared) => prepared,
            Err(e) => {
                self.reload_failed(&e);
                return Err(e);
            }
        };
        let next = Arc::new(next);
        self.live.store(next.clone());
        let retired = live::commit(&current, &next, &self.services.sealer, self.certs.as_deref());
        let mut fleets = self.retired_fleets.lock().unwrap_or_else(|e| e.into_inner());
        fleets.retain(|f| f.strong_count() > 0);
        fleets.extend(retired.iter().map(Arc::downgrade));
        drop(fleets);
        self.metrics.config_reloads.get_or_create(&OutcomeOnlyLabels { outcome: "applied" }).inc();
        self.metrics.config_restart_required.set(i64::from(!report.needs_restart.is_empty()));
        self.metrics.config_last_reload.set(crate::seal::unix_now() as i64);
        self.reloads.applied(&report);
        Ok(report)
    }

    /// Counts a reload that changed nothing (a bad file, a secret missing),
    /// and keeps `why` for `/status`.
    pub fn reload_failed(&self, why: &str) {
        self.metrics.config_reloads.get_or_create(&OutcomeOnlyLabels { outcome: "rejected" }).inc();
        self.reloads.rejected(why);
    }

    /// The listeners bound (once, at start), for `/status`.
    pub fn bound(&self, listeners: Vec<crate::status::Bound>) {
        let _ = self.listeners.set(listeners);
    }

    pub fn sessions(&self) -> &Arc<sessions::Bridge> {
        &self.sessions
    }

    /// Refuses new modern calls, ends legacy GET streams (their clients
    /// reconnect elsewhere), and waits until no paused call is left here
    /// (their retries are still served) and no legacy POST answer is still
    /// streaming (legacy POSTs are still relayed), or `deadline` passes.
    pub async fn drain(&self, deadline: std::time::Duration) {
        self.draining.store(true, Ordering::SeqCst);
        // Long-lived streams end now, so that their clients reconnect elsewhere.
        self.services.draining.cancel();
        let until = tokio::time::Instant::now() + deadline;
        while self.pending() != Pending::default() && tokio::time::Instant::now() < until {
            tokio::select! {
                _ = self.hurry.cancelled() => break,
                _ = tokio::time::sleep(std::time::Duration::from_millis(50)) => {}
            }
        }
        let Pending { paused, streaming } = self.pending();
        match self.hurried() {
            true => tracing::info!(paused, streaming, "drain cut short by a second signal"),
            false => tracing::info!(paused, streaming, "drain finished"),
        }
    }

    /// What a drain would wait for now.
    pub fn pending(&self) -> Pending {
        Pending {
            paused: self.sessions.parked_flows() + self.legacy_client.waiting(),
            streaming: self.legacy_relay.streaming(),
        }
    }

    /// Cuts a shutdown short: the drain ends now, and open connections get
    /// no grace period. What is still parked is declined upstream, as at the
    /// drain's deadline.
    pub fn hurry(&self) {
        self.hurry.cancel();
    }

    /// Cancelled by [`Gateway::hurry`]: shutdown steps cut short.
    pub fn hurry_token(&self) -> CancellationToken {
        self.hurry.clone()
    }

    pub fn hurried(&self) -> bool {
        self.hurry.is_cancelled()
    }

    pub async fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
        peer: Peer,
    ) -> Result<Response<Body>, Infallible> {
        // The live configuration once per request, and the request's route in it.
        let live = self.live.load_full();
        // The gateway's own pages: never a route's (no route can take their
        // paths), so never behind a route's auth or CORS.
        match req.uri().path() {
            "/status" => return Ok(self.status(&live, &req, peer)),
            "/metrics" => return Ok(self.metrics_text(&live, &req, peer)),
            _ => {}
        }
        let found = live.route(|| request_host(&req), req.uri().path());
        // CORS: the route's policy, or the server's (for `/.well-known/`).
        let cors = match &found {
            Some(found) => found.target.route.cors.clone(),
            None => live.config.cors.clone(),
        };
        // Only its `Origin` is kept for the answer.
        let request: Option<HeaderMap> = cors.as_ref().map(|_| {
            let origins = req.headers().get_all(http::header::ORIGIN).iter();
            origins.map(|v| (http::header::ORIGIN, v.clone())).collect()
        });
        if let Some(cors) = cors.as_ref().filter(|_| crate::cors::is_preflight(req.method(), req.headers())) {
            return Ok(cors.preflight(req.headers()));
        }
        let mut resp = self.route(req, live, found).await;
        if let (Some(cors), Some(request)) = (cors, request) {
            cors.decorate(&request, &mut resp);
        }
        Ok(resp)
    }

    /// `found`: the route of the request's host and path, if there is one.
    async fn route(
        self: Arc<Self>,
        req: Request<Incoming>,
        live: Arc<Live>,
        found: Option<Found>,
    ) -> Response<Body> {
        match req.uri().path() {
            "/healthz" => reply::text(StatusCode::OK, "text/plain", "ok\n".into()),
            "/readyz" if self.draining.load(Ordering::SeqCst) => {
                reply::text(StatusCode::SERVICE_UNAVAILABLE, "text/plain", "draining\n".into())
            }
            "/readyz" => self.readiness(),
            path if path.starts_with(crate::auth::METADATA_PATH) => {
                let host = request_host(&req).map(crate::config::request_host);
                crate::auth::metadata(&live.config, host.as_deref(), path)
                    .unwrap_or_else(|| reply::text(StatusCode::NOT_FOUND, "text/plain", "not found\n".into()))
            }
            _ => match found {
                Some(found) => {
                    // Sent upstream only once `mcp` has verified it (nothing is sent before).
                    let forwarded = forwarded_token(&found.target, req.headers()).map(Forwarded::new);
                    let route = found.target.route.clone();
                    // Boxed: the cells' futures are large, and this one is
                    // moved a few times on its way into hyper's connection.
                    let fut = Box::pin(self.mcp(live, found, req));
                    // Unset reads as none: no scope (polled at every wake-up) without a token.
                    let resp = match forwarded.clone() {
                        Some(token) => CLIENT_TOKEN.scope(Some(token), fut).await,
                        None => fut.await,
                    };
                    match forwarded.filter(|f| f.refused()) {
                        Some(_) => challenge_upstream_refusal(&route, resp),
                        None => resp,
                    }
                }
                None => reply::text(StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
            },
        }
    }

    /// `/readyz`: what each upstream speaks, and 200 unless the readiness
    /// policy asks for usable upstreams and they are not: no instance
    /// reachable, or a probe whose answer was no MCP (a wrong path). A
    /// refused upstream (another revision) is named, but does not take the
    /// replica out of service.
    fn readiness(&self) -> Response<Body> {
        let live = self.live.load();
        let reachable = |t: &Arc<Target>| match t.stdio() {
            Some(stdio) => stdio.health().is_up(),
            None => t.instances().iter().any(|i| i.health().is_up()),
        };
        let usable = |t: &Arc<Target>| reachable(t) && !t.detected.unusable();
        let ready = match live.config.readiness {
            crate::config::Readiness::Always => true,
            crate::config::Readiness::AnyUpstream => live.targets.onto_upstreams().any(usable),
            crate::config::Readiness::AllUpstreams => live.targets.onto_upstreams().all(usable),
        };
        let mut lines =
            String::from(if ready { "ready\n" } else { "not ready: upstreams unreachable or unusable\n" });
        for t in live.targets.onto_upstreams() {
            let (path, name) = (&t.route.id, &t.route.upstream.name);
            lines.push_str(&format!("{path} {name}: {}\n", t.detected.describe()));
            if let Some(stdio) = t.stdio() {
                let state = if stdio.health().is_up() { "starts" } else { "failing to start" };
                lines.push_str(&format!("  stdio: {} processes, {state}\n", stdio.fleet().processes()));
            } else if t.instances().len() > 1 {
                for i in t.instances() {
                    let state = if i.health().is_up() { "up" } else { "down" };
                    lines.push_str(&format!("  {} {state}\n", i.instance()));
                }
            } else if !reachable(t) {
                lines.push_str("  unreachable\n");
            }
        }
        let status = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
        reply::text(status, "text/plain", lines)
    }

    /// Stops every stdio upstream process (shutdown, after the drain),
    /// those of fleets a reload replaced included; waits until they are reaped.
    pub async fn stop_processes(&self) {
        let retired: Vec<_> = {
            let fleets = self.retired_fleets.lock().unwrap_or_else(|e| e.into_inner());
            fleets.iter().filter_map(std::sync::Weak::upgrade).collect()
        };
        let stopping = retired.iter().map(|f| f.stop_all(&self.hurry));
        let targets = self.targets();
        tokio::join!(targets.stop_processes(&self.hurry), futures_util::future::join_all(stopping));
    }

    /// The routes and their upstreams, as they are now.
    pub fn targets(&self) -> Arc<Targets> {
        self.live.load().targets.clone()
    }

    /// `/metrics`, for a request that names an allowed host
    /// ([`crate::guard::ops_host`]: a page of loopback rebound to a
    /// foreign name cannot read it).
    fn metrics_text(&self, live: &Live, req: &Request<Incoming>, peer: Peer) -> Response<Body> {
        if crate::guard::ops_host(&live.config, req.uri().authority(), req.headers(), peer.local.ip())
            .is_err()
        {
            return host_refused();
        }
        let mut out = String::new();
        match prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            Ok(()) => {
                reply::text(StatusCode::OK, "application/openmetrics-text; version=1.0.0; charset=utf-8", out)
            }
            Err(_) => reply::empty(StatusCode::INTERNAL_SERVER_ERROR),
        }
    }

    /// `/status`: 404 to a peer outside `[server] status_allowed` (the page
    /// is not there for it, as any unknown path), 403 to a request naming a
    /// host the Host rule refuses, else the page (HTML, or JSON when asked).
    fn status(&self, live: &Live, req: &Request<Incoming>, peer: Peer) -> Response<Body> {
        let ip = peer.remote.ip();
        if !live.config.status_allowed.iter().any(|range| range.contains(ip)) {
            return reply::text(StatusCode::NOT_FOUND, "text/plain", "not found\n".into());
        }
        if crate::guard::ops_host(&live.config, req.uri().authority(), req.headers(), peer.local.ip())
            .is_err()
        {
            return host_refused();
        }
        if !matches!(*req.method(), http::Method::GET | http::Method::HEAD) {
            let mut resp = reply::text(StatusCode::METHOD_NOT_ALLOWED, "text/plain", "GET only\n".into());
            resp.headers_mut().insert(http::header::ALLOW, http::HeaderValue::from_static("GET, HEAD"));
            return resp;
        }
        let listeners = self.listeners.get().map(Vec::as_slice).unwrap_or_default();
        let page = crate::status::Page::gather(&crate::status::Sources {
            live,
            metrics: &self.metrics,
            listeners,
            reloads: &self.reloads,
            started: self.started,
            draining: self.draining.load(Ordering::SeqCst),
            parked_flows: self.sessions.parked_flows(),
            pooled_sessions: self.sessions.pool().len(),
        });
        page.respond(req.headers())
    }

    /// Refuses a modern request (or one whose generation is not known yet).
    fn reject(
        &self,
        target: &Target,
        id: Option<&serde_json::Value>,
        err: &Error,
        started: Instant,
    ) -> Response<Body> {
        self.reject_as(Generation::Modern, target, id, err, started)
    }

    /// Refuses a request of generation `client` before any cell ran it.
    fn reject_as(
        &self,
        client: Generation,
        target: &Target,
        id: Option<&serde_json::Value>,
        err: &Error,
        started: Instant,
    ) -> Response<Body> {
        let upstream = target.detected.known().and_then(Result::ok).unwrap_or(Generation::Legacy);
        self.services.count(target, (client, upstream), "invalid", err.reason(), started);
        let mut resp = error_response(id, err);
        if err.status() == StatusCode::METHOD_NOT_ALLOWED {
            resp.headers_mut()
                .insert(http::header::ALLOW, http::HeaderValue::from_static("POST, GET, DELETE"));
        }
        resp
    }

    async fn mcp(self: Arc<Self>, live: Arc<Live>, found: Found, req: Request<Incoming>) -> Response<Body> {
        let started = Instant::now();
        let Found { target, retired } = found;
        // A retired route's policy is checked by the verifiers it had.
        let auth = retired.clone().unwrap_or_else(|| live.auth.clone());
        let retired = retired.is_some();
        let (parts, body) = req.into_parts();
        // GET and DELETE exist only in the session era: a legacy session's
        // stream and its end. Without a legacy marker they stay 405.
        let session_verb = parts.method == http::Method::GET || parts.method == http::Method::DELETE;
        let legacy_verb = session_verb && front::generation::by_headers(&parts.headers) == ByHeaders::Legacy;
        let cors = target.route.cors.as_deref();
        let checked = if legacy_verb {
            crate::guard::check_origin(&live.config, cors, parts.uri.authority(), &parts.headers)
        } else {
            crate::guard::check(&live.config, cors, &parts.method, parts.uri.authority(), &parts.headers)
        };
        let client = if legacy_verb { Generation::Legacy } else { Generation::Modern };
        if let Err(e) = checked {
            return self.reject_as(client, &target, None, &e, started);
        }
        // Who is calling, before anything is read or sent.
        let who = match &target.route.auth {
            None => crate::auth::anyone(&parts.headers),
            Some(policy) => match Box::pin(auth.check(&target.route.id, policy, &parts.headers)).await {
                Ok(who) => who,
                Err(e) => {
                    let mut resp = self.reject_as(client, &target, None, &e, started);
                    resp.headers_mut()
                        .insert(http::header::WWW_AUTHENTICATE, crate::auth::challenge(policy, &e));
                    return resp;
                }
            },
        };
        let access = (!target.route.rules.is_empty()).then(|| {
            let who = crate::authz::Who {
                principal: who.principal.clone(),
                groups: who.groups,
                scopes: who.scopes,
            };
            Arc::new(crate::authz::View::new(target.route.rules.clone(), who))
        });
        let principal = who.principal;
        crate::observe::principal(&principal);
        drop(live);
        // A route removed by a reload serves only the retries of calls
        // parked on it (checked once the call is parsed).
        if retired && (legacy_verb || parts.method != http::Method::POST) {
            return reply::text(StatusCode::NOT_FOUND, "text/plain", "not found\n".into());
        }
        if legacy_verb {
            return Box::pin(self.session_verb(&target, parts, principal, started)).await;
        }
        // Taken before the body is read: a body in memory holds a permit
        // and its share of the body budget, each for at most the body timeout.
        let Ok(permit) = self.limit.clone().try_acquire_owned() else {
            let id = crate::body::ready_id(body);
            return self.reject(&target, id.as_ref(), &Error::Overloaded, started);
        };
        let (body, admission) = match self.read_body(body, permit).await {
            Ok(read) => read,
            Err(e) => return self.reject(&target, None, &e, started),
        };
        // The one strict read of the body: every later step reads it, and a
        // body it refuses goes nowhere, whichever generation sent it.
        // The `params` of a 2026 client, or of a legacy client whose calls
        // are translated, is built as a tree in the same walk (the typed
        // call carries it on); a relayed legacy client's is not needed.
        let trees =
            front::generation::by_headers(&parts.headers) != ByHeaders::Legacy || target.translates_legacy();
        let read = if trees { front::strict::read_tree(&body) } else { front::strict::read(&body) };
        let message = match read {
            Ok(message) => message,
            Err(refusal) => {
                let client = front::generation::of_headers(&parts.headers);
                let id = front::request_id(&body);
                return self.reject_as(client, &target, id.as_ref(), &refusal.error(), started);
            }
        };
        let generation = front::generation::of_post(&parts.headers, &message);
        if retired && generation == Generation::Legacy {
            return reply::text(StatusCode::NOT_FOUND, "text/plain", "not found\n".into());
        }
        if generation == Generation::Modern {
            self.count_stale_headers(&parts.headers);
        }
        // A legacy client's call is checked here; a modern one once parsed.
        if let (Some(view), Generation::Legacy) = (&access, generation) {
            if let Some(what) = crate::authz::legacy_denied(view, &message) {
                let id = front::request_id(&body);
                let e = Error::Denied(what);
                // Inside a 2025 session a refusal is a JSON-RPC error in a
                // 200: an HTTP error status ends the session of some clients
                // (the Python SDK 1.x).
                let mut resp = self.reject_as(generation, &target, id.as_ref(), &e, started);
                *resp.status_mut() = StatusCode::OK;
                return resp;
            }
        }
        // What the message is, for the cells of its generation: validated
        // from the strict read, never parsed again.
        let read = match generation {
            Generation::Modern if trees => Read::Modern(front::parse_read(&parts.headers, message)),
            // A legacy version header with a 2026 `_meta` marker: read again, with the tree.
            Generation::Modern => Read::Modern(front::parse(&parts.headers, &body)),
            Generation::Legacy => match front::legacy::Peeked::read(message) {
                Ok(peek) => Read::Legacy(peek),
                Err(e) => return self.reject_as(generation, &target, None, &e, started),
            },
        };
        let caller = Caller { principal, headers: parts.headers, body, forwarded: false, access };
        if target.federated() {
            return match read {
                Read::Modern(parsed) => {
                    let modern = ModernCall { cell: Cell::Federated, retired, parsed };
                    Box::pin(self.dispatch(modern, target, caller, admission, started)).await
                }
                Read::Legacy(peeked) => {
                    Box::pin(self.translate(Cell::Federated, target, caller, peeked, admission, started))
                        .await
                }
            };
        }
        let upstream = match target.generation().await {
            Ok(upstream) => upstream,
            Err(e) => {
                let id = front::request_id(&caller.body);
                return self.reject_as(generation, &target, id.as_ref(), &e, started);
            }
        };
        match (Cell::of(generation, upstream, target.translates_legacy()), read) {
            (cell @ (Cell::ModernLegacy | Cell::ModernModern), Read::Modern(parsed)) => {
                let modern = ModernCall { cell, retired, parsed };
                Box::pin(self.dispatch(modern, target, caller, admission, started)).await
            }
            (cell @ (Cell::LegacyModern | Cell::LegacyLegacy), Read::Legacy(peeked)) => {
                Box::pin(self.translate(cell, target, caller, peeked, admission, started)).await
            }
            (Cell::Relay, Read::Legacy(peeked)) => {
                // The relay never forwards the body again: its budget share
                // goes back once the body is sent, not when a streamed
                // answer ends (the body itself is dropped then too).
                let Admission { _call: permit, _body: share } = admission;
                let held = Held { permits: Box::new(permit), body: share };
                let post = self.legacy_relay.post(&target, upstream, caller, peeked, held, started);
                Box::pin(post).await
            }
            // `Cell::of` takes the client's generation from the message.
            (_, _) => self.reject_as(generation, &target, None, &Error::Internal("cell".into()), started),
        }
    }

    /// GET or DELETE of a legacy session: its stream, or its end.
    async fn session_verb(
        &self,
        target: &Target,
        parts: http::request::Parts,
        principal: String,
        started: Instant,
    ) -> Response<Body> {
        let caller =
            Caller { principal, headers: parts.headers, body: Bytes::new(), forwarded: false, access: None };
        let (upstream, cell) = match target.federated() {
            true => (Generation::Modern, Cell::Federated),
            false => match target.generation().await {
                Ok(upstream) => {
                    (upstream, Cell::of(Generation::Legacy, upstream, target.translates_legacy()))
                }
                Err(e) => return self.reject_as(Generation::Legacy, target, None, &e, started),
            },
        };
        // A concurrency permit like any request, for as long as the answer lives.
        let Ok(permit) = self.limit.clone().try_acquire_owned() else {
            return self.reject_as(Generation::Legacy, target, None, &Error::Overloaded, started);
        };
        match cell {
            Cell::Relay => {
                let permit = Box::new(permit);
                self.legacy_relay.session_verb(target, upstream, &parts.method, caller, permit, started).await
            }
            Cell::LegacyModern | Cell::LegacyLegacy | Cell::Federated => {
                let get = parts.method == http::Method::GET;
                let (translated, hold) = (&self.legacy_client, Box::new(permit));
                let verb = match cell {
                    Cell::LegacyModern => {
                        translated.session_verb(&*self.stateless, target, &caller, get, hold).await
                    }
                    Cell::LegacyLegacy => {
                        translated.session_verb(&*self.sessions, target, &caller, get, hold).await
                    }
                    _ => translated.session_verb(&*self.federation, target, &caller, get, hold).await,
                };
                match verb {
                    Ok(resp) => {
                        let label = if get { "GET" } else { "DELETE" };
                        self.services.count(target, (Generation::Legacy, upstream), label, "ok", started);
                        resp
                    }
                    Err(e) => self.reject_as(Generation::Legacy, target, None, &e, started),
                }
            }
            // No session verbs on the modern cells: what a 2026 endpoint says.
            Cell::ModernLegacy | Cell::ModernModern => {
                self.reject_as(Generation::Legacy, target, None, &Error::MethodNotAllowed, started)
            }
        }
    }

    /// Reads the body under its limits; the call permit and the body's share
    /// of the budget become the request's admission.
    async fn read_body(
        &self,
        body: Incoming,
        call: OwnedSemaphorePermit,
    ) -> Result<(Bytes, Admission), Error> {
        let max = self.max_body_bytes;
        let (bytes, share) = crate::body::read(body, max, &self.connections, &self.body_budget).await?;
        let call = Permits { _gateway: call, _upstream: None };
        Ok((bytes, Admission { _call: call, _body: Some(share) }))
    }

    /// The internal listener (cluster mode): a retry forwarded by another
    /// replica, signed, with the caller's principal, to be answered as if
    /// received here. Only the retry of a call paused on this replica gets
    /// through; anything else is refused before any upstream work.
    pub async fn internal(self: Arc<Self>, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
        let started = Instant::now();
        let Some(gate) = &self.gate else {
            return Ok(cluster::refusal(StatusCode::NOT_FOUND));
        };
        let (parts, body) = req.into_parts();
        // Before the body is read, as on the public listener, but from
        // permits of its own: whoever reaches this port cannot spend the
        // clients' permits before its signature is checked.
        let Ok(permit) = self.internal_limit.clone().try_acquire_owned() else {
            let id = crate::body::ready_id(body);
            return Ok(error_response(id.as_ref(), &Error::Overloaded));
        };
        let head = match gate.head(&parts) {
            Ok(head) => head,
            Err(why) => return Ok(gate.refuse(why)),
        };
        // Signed, fresh and never seen before a byte of the body is read.
        let headers = front::headers::mcp_only(&parts.headers);
        if let Err(why) = gate.verify(&head, &headers) {
            return Ok(gate.refuse(why));
        }
        let (body, admission) = match self.read_body(body, permit).await {
            Ok(read) => read,
            Err(Error::PayloadTooLarge(_)) => return Ok(gate.refuse(cluster::Refused::TooLarge)),
            Err(Error::Overloaded) => return Ok(error_response(None, &Error::Overloaded)),
            Err(_) => return Ok(gate.refuse(cluster::Refused::Unreadable)),
        };
        if let Err(why) = gate.body_matches(&head, &body) {
            return Ok(gate.refuse(why));
        }
        // A route removed by a reload still takes its parked calls' retries.
        let Some(Found { target, .. }) = self.live.load().route_by_id(&head.route) else {
            return Ok(gate.refuse(cluster::Refused::UnknownRoute));
        };
        // Read as strictly as on the public listener (the receiving replica
        // did, and a replica of another build may not have), once.
        let Ok(read) = front::strict::read_tree(&body) else {
            return Ok(gate.refuse(cluster::Refused::NotARetry));
        };
        // A legacy client's answer to a question pushed on a stream here.
        if self.legacy_client.take_forwarded(&target, &head.principal, head.session.as_deref(), &body) {
            return Ok(reply::empty(StatusCode::ACCEPTED));
        }
        let Ok(Message::Call(call)) = front::parse_read(&headers, read) else {
            return Ok(gate.refuse(cluster::Refused::NotARetry));
        };
        if let Err(why) = self.sessions.admit_forwarded(&target.route, &call, &head.principal) {
            return Ok(gate.refuse(why));
        }
        // Checked by the replica that received it, before it was forwarded.
        let caller = Caller { principal: head.principal, headers, body, forwarded: true, access: None };
        // A member's parked call: the retry names it as its federated route
        // advertises it, and goes through the federation to the member.
        if let Some(federated) = &target.route.member_of {
            let Some(Found { target, .. }) = self.live.load().route_by_id(federated) else {
                return Ok(gate.refuse(cluster::Refused::UnknownRoute));
            };
            return Ok(self.run(target, *call, caller, admission, started).await);
        }
        Ok(self.run(target, *call, caller, admission, started).await)
    }

    /// Runs a modern request, as the front door read it, to its answer on its cell.
    async fn dispatch(
        self: Arc<Self>,
        modern: ModernCall,
        target: Arc<Target>,
        caller: Caller,
        admission: Admission,
        started: Instant,
    ) -> Response<Body> {
        let ModernCall { cell, retired, parsed } = modern;
        let call = match parsed {
            Ok(Message::Notification) => return reply::empty(StatusCode::ACCEPTED),
            Ok(Message::Call(call)) => *call,
            Err(rej) => return self.reject(&target, rej.id.as_ref(), &rej.error, started),
        };
        crate::observe::meta_traceparent(&call.meta.passthrough);
        if let (front::Method::ToolsCall, Some(tool)) = (&call.method, &call.name) {
            crate::observe::called_tool(tool, self.live.load().config.telemetry.labels_tool(tool));
        }
        if let (Some(view), Some(name)) = (&caller.access, &call.name) {
            if !view.allows_call(call.method.as_str(), name) {
                let e = Error::Denied(format!("{} {name}", call.method.as_str()));
                return self.reject(&target, Some(&call.id), &e, started);
            }
        }
        // Draining: retries of paused calls are still served, new calls go elsewhere.
        if self.draining.load(Ordering::SeqCst) && !call.params.contains_key("requestState") {
            return self.reject(&target, Some(&call.id), &Error::Overloaded, started);
        }
        let mut admission = admission;
        let resumes = cell == Cell::ModernLegacy && self.sessions.resumes_parked(&target.route, &call);
        if retired && !resumes {
            return reply::text(StatusCode::NOT_FOUND, "text/plain", "not found\n".into());
        }
        match target.admit(&caller.principal, &[ask(resumes, &target, &call)]) {
            // A listen stream lasts as long as its client wants: it is
            // bounded by the stream places, not the upstream's slots.
            Ok(_slot) if call.method == front::Method::SubscriptionsListen => {}
            Ok(slot) => admission._call._upstream = Some(slot),
            Err(e) => return self.reject(&target, Some(&call.id), &e, started),
        }
        // Passed through to an HTTP instance as received; a process of a
        // stdio upstream is written the typed call (`run`, on the 2026 half).
        if cell == Cell::ModernModern && target.stdio().is_none() {
            return Box::pin(self.pass(target, call, caller, admission, started)).await;
        }
        self.run(target, call, caller, admission, started).await
    }

    /// A modern call on a modern upstream: passed through. The concurrency
    /// permit lives as long as the answer; the body's budget share only
    /// until it was sent.
    async fn pass(
        &self,
        target: Arc<Target>,
        call: front::Call,
        caller: Caller,
        admission: Admission,
        started: Instant,
    ) -> Response<Body> {
        let Admission { _call: permit, _body: share } = admission;
        let (resp, outcome) = self.stateless.serve(&target, &call, caller, Box::new(permit)).await;
        drop(share);
        self.services.count(
            &target,
            (Generation::Modern, Generation::Modern),
            call.method.as_str(),
            outcome,
            started,
        );
        resp
    }

    /// Runs a parsed call to its answer: bridge → reply.
    async fn run(
        self: Arc<Self>,
        target: Arc<Target>,
        call: front::Call,
        caller: Caller,
        admission: Admission,
        started: Instant,
    ) -> Response<Body> {
        let retry = call.params.contains_key("requestState");
        let (mut caller, mut admission) = (caller, admission);
        if !retry {
            // Only a retry may be forwarded with its body: any other call
            // gives its bytes and its share back now, not when it ends (a
            // listen stream may last hours).
            caller.body = Bytes::new();
            admission._body = None;
        }
        if call.method == front::Method::SubscriptionsListen && target.federated() {
            // Every member's change stream, merged; it holds the call's permits.
            let id = call.id.clone();
            let listened = self.federation.subscribe(&target, call, &caller, Box::new(admission)).await;
            let (resp, outcome) = match listened {
                Ok(resp) => (resp, "ok"),
                Err(e) => (error_response(Some(&id), &e), e.reason()),
            };
            let cell = (Generation::Modern, Generation::Modern);
            self.services.count(&target, cell, "subscriptions/listen", outcome, started);
            return resp;
        }
        let exchanged = onto_stdio_modern(&target);
        if call.method == front::Method::SubscriptionsListen && exchanged {
            // Its notifications would name no request: nothing links them to the stream.
            let e = Error::MethodNotFound("subscriptions/listen (not carried to a stdio upstream)".into());
            let cell = (Generation::Modern, Generation::Modern);
            self.services.count(&target, cell, "subscriptions/listen", e.reason(), started);
            return error_response(Some(&call.id), &e);
        }
        let (reply, answer) = Reply::new(crate::guard::accepts_sse(&caller.headers));
        let method = call.method.as_str();
        let gateway = self.clone();
        if call.method == front::Method::SubscriptionsListen && !target.federated() {
            // A listen stream may last hours: its work is boxed at its own
            // size, not at the call path's (several times larger), and holds
            // the call and the caller boxed, to be dropped once it streams.
            let (call, caller) = (Box::new(call), Box::new(caller));
            let work: Work = crate::observe::carry(async move {
                let outcome = gateway.sessions.listen(&target, call, caller, reply).await;
                let cell = (Generation::Modern, Generation::Legacy);
                gateway.services.count(&target, cell, method, outcome, started);
                drop(admission);
            });
            return answer_of(work, answer).await;
        }
        // Boxed: it may move to a task of its own (`Inline`), with the record.
        let work: Work = crate::observe::carry(async move {
            let mut reply = reply;
            // Boxed: the work is moved into its box (and its task-local
            // scope) whole, and the upstream half's future is most of it.
            let (outcome, id, upstream) = if target.federated() {
                use crate::bridge::half::UpstreamHalf;
                let mut call = call;
                let id = std::mem::take(&mut call.id);
                let outcome = Box::pin(gateway.federation.call(&target, call, &caller, &mut reply)).await;
                (outcome, id, Generation::Modern)
            } else if exchanged {
                use crate::bridge::half::UpstreamHalf;
                let mut call = call;
                let id = std::mem::take(&mut call.id);
                let outcome = Box::pin(gateway.stateless.call(&target, call, &caller, &mut reply)).await;
                (outcome, id, Generation::Modern)
            } else {
                let outcome = Box::pin(gateway.sessions.serve(&target, &call, &caller, &mut reply)).await;
                target.observed(outcome.unreachable());
                (outcome, call.id, Generation::Legacy)
            };
            let outcome = modern_client::answer(&id, outcome, reply).await;
            gateway.services.count(&target, (Generation::Modern, upstream), method, outcome, started);
            drop(admission);
        });
        answer_of(work, answer).await
    }

    /// A legacy client's message, translated: its calls run on the upstream
    /// half of the upstream's generation `onto`. The concurrency permit
    /// lives as long as the answer (a round of questions may keep it streaming).
    async fn translate(
        self: Arc<Self>,
        onto: Cell,
        target: Arc<Target>,
        caller: Caller,
        peeked: front::legacy::Peeked,
        admission: Admission,
        started: Instant,
    ) -> Response<Body> {
        let (reply, answer) = Reply::new(crate::guard::accepts_sse(&caller.headers));
        let gateway = self.clone();
        let work: Work = crate::observe::carry(async move {
            let translated = &gateway.legacy_client;
            let (label, outcome) = match onto {
                Cell::LegacyModern => {
                    translated.post(&*gateway.stateless, &target, &caller, peeked, reply).await
                }
                Cell::LegacyLegacy => {
                    translated.post(&*gateway.sessions, &target, &caller, peeked, reply).await
                }
                _ => translated.post(&*gateway.federation, &target, &caller, peeked, reply).await,
            };
            drop(caller);
            let upstream = if onto == Cell::LegacyLegacy { Generation::Legacy } else { Generation::Modern };
            gateway.services.count(&target, (Generation::Legacy, upstream), label, outcome, started);
            drop(admission);
        });
        answer_of(work, answer).await
    }

    fn count_stale_headers(&self, headers: &HeaderMap) {
        for (name, label) in
            [(front::headers::SESSION_ID, "mcp-session-id"), (front::headers::LAST_EVENT_ID, "last-event-id")]
        {
            if headers.contains_key(&name) {
                self.metrics.stale_headers_dropped.get_or_create(&HeaderLabels { header: label }).inc();
            }
        }
    }
}

/// Whether `target`'s calls go to a 2026 server over stdio: as typed calls
/// of the 2026 half (there are no bytes to pass through to a process).
fn onto_stdio_modern(target: &Target) -> bool {
    target.stdio().is_some() && matches!(target.detected.known(), Some(Ok(Generation::Modern)))
}

/// What the front door made of a POST, for the cells of its generation.
enum Read {
    Modern(Result<Message, front::Rejection>),
    Legacy(front::legacy::Peeked),
}

/// A modern request on its way to its cell: which cell, whether its route
/// was removed by a reload (only retries of parked calls are served), and
/// the call as read.
struct ModernCall {
    cell: Cell,
    retired: bool,
    parsed: Result<Message, front::Rejection>,
}

/// Where finished requests go: an OTLP exporter when one is configured.
fn sinks(config: &Config) -> Result<crate::observe::Sinks, String> {
    #[cfg(feature = "otlp")]
    {
        let spans = config.telemetry.otlp.as_ref().map(crate::observe::otlp::Exporter::start).transpose()?;
        Ok(crate::observe::Sinks { spans })
    }
    #[cfg(not(feature = "otlp"))]
    {
        let _ = config;
        Ok(crate::observe::Sinks::default())
    }
}

/// The client's `Authorization`, for a route whose upstream takes it
/// (`forward_authorization`: a `jwt` route of the upstream's audience,
/// checked at load), when its `aud` names that upstream (the policy has
/// verified the token before anything is sent).
fn forwarded_token(target: &Target, headers: &HeaderMap) -> Option<Secret> {
    let audience = target.route.upstream.forward_authorization.as_ref()?;
    let mut values = headers.get_all(http::header::AUTHORIZATION).iter();
    let (Some(value), None) = (values.next(), values.next()) else { return None };
    let value = value.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    let ours =
        scheme.eq_ignore_ascii_case("bearer") && crate::auth::jwt::audience_includes(token.trim(), audience);
    ours.then(|| Secret::new(value).ok()).flatten()
}

/// An upstream's 401 or 403 to a forwarded token (answered with
/// [`Error::UpstreamDenied`]) becomes the gateway's own challenge: its
/// `WWW-Authenticate` and metadata, never the upstream's.
fn challenge_upstream_refusal(route: &crate::config::Route, mut resp: Response<Body>) -> Response<Body> {
    let status = resp.status().as_u16();
    let Some(policy) = &route.auth else { return resp };
    if matches!(status, 401 | 403) && !resp.headers().contains_key(http::header::WWW_AUTHENTICATE) {
        let e = Error::UpstreamDenied { status, client_token: true };
        resp.headers_mut().insert(http::header::WWW_AUTHENTICATE, crate::auth::challenge(policy, &e));
    }
    resp
}

/// Runs `work` until it has written its answer (then on in a task of its
/// own if it goes on streaming, keeping the request's forwarded token); the answer.
async fn answer_of(work: Work, answer: tokio::sync::oneshot::Receiver<Response<Body>>) -> Response<Body> {
    let work: Work = match client_token() {
        Some(token) => Box::pin(CLIENT_TOKEN.scope(Some(token), work)),
        None => work,
    };
    match (Inline { work: Some(work), answer }).await {
        Ok(resp) => resp,
        Err(_) => reply::json_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            &error_body(None, &Error::Internal("reply dropped".into()), SUPPORTED_VERSIONS),
        ),
    }
}

/// The JSON-RPC error answer for `err`, echoing `id`.
fn error_response(id: Option<&serde_json::Value>, err: &Error) -> Response<Body> {
    reply::error(id, err)
}

/// What a call holds while it runs: its concurrency permits and, for a retry
/// that may be forwarded with its body, the body's share of the body budget.
pub(crate) struct Admission {
    _call: Permits,
    _body: Option<crate::body::Share>,
}

/// A call's concurrency permits: the gateway's, and once admitted on its
/// route (modern calls; legacy ones are admitted by their cell), its slot
/// of the upstream's `max_concurrent_requests`.
struct Permits {
    _gateway: OwnedSemaphorePermit,
    _upstream: Option<crate::bridge::Admitted>,
}

/// What a modern call asks of its route: a retry that resumes a call parked
/// in a gateway (`resumes`, its state opened) is never refused (nor
/// counted), so that the parked call is not stranded; a replay-mode or
/// URL-elicitation retry re-runs the tool, and a 2026 upstream's retry is a
/// new stateless request to it: they count.
fn ask<'c>(resumes: bool, target: &Target, call: &'c front::Call) -> crate::bridge::Ask<'c> {
    let tool = call.name.as_deref().filter(|_| call.method == front::Method::ToolsCall);
    crate::bridge::Ask { tool, resumes: resumes && !target.route.replays(tool) }
}

/// The 403 of the gateway's own pages to a host the Host rule refuses.
fn host_refused() -> Response<Body> {
    let text = "forbidden: this Host is not allowed here (server.allowed_hosts; by default loopback names \
                and the address the gateway listens on)\n";
    reply::text(StatusCode::FORBIDDEN, "text/plain", text.into())
}

/// The two ends of a client connection.
#[derive(Debug, Clone, Copy)]
pub struct Peer {
    /// The client's address.
    pub remote: SocketAddr,
    /// The gateway's address it connected to (a wildcard listener's
    /// interface address).
    pub local: SocketAddr,
}

/// Which listener a connection came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    /// Clients, `/metrics`, health.
    Public,
    /// Retries forwarded by other replicas (cluster mode).
    Internal,
}

impl Listener {
    /// For the logs.
    fn as_str(self) -> &'static str {
        match self {
            Listener::Public => "public",
            Listener::Internal => "internal",
        }
    }
}

/// Open requests get this long to finish once the listeners close.
const GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// Accepts connections until `stop` fires, then gives open ones a short grace.
/// At most `max_connections` are open at once: at the cap the gateway stops
/// accepting (the kernel's backlog holds the rest) and says so once per
/// interval. With `tls`, each connection's handshake runs in its own task first.
pub async fn serve(
    gateway: Arc<Gateway>,
    listener: TcpListener,
    stop: CancellationToken,
    kind: Listener,
    tls: Option<tokio_rustls::TlsAcceptor>,
) {
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let limits = gateway.connections.clone();
    let builders = Arc::new(crate::conn::builders(&limits));
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    let (at_cap, accept_failed) = (RateLimitedLog::new(LOG_INTERVAL), RateLimitedLog::new(LOG_INTERVAL));
    let mut backoff = ACCEPT_BACKOFF_MIN;
    loop {
        let slot = match slots.clone().try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => {
                if let Some(suppressed) = at_cap.allow() {
                    tracing::warn!(
                        listener = kind.as_str(),
                        max = limits.max_connections,
                        suppressed,
                        "connection cap reached; not accepting"
                    );
                }
                tokio::select! {
                    _ = stop.cancelled() => break,
                    slot = slots.clone().acquire_owned() => slot.expect("never closed"),
                }
            }
        };
        let (stream, remote): (_, SocketAddr) = tokio::select! {
            _ = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => { backoff = ACCEPT_BACKOFF_MIN; a }
                Err(e) => {
                    // Out of file descriptors, mostly: wait for some to close.
                    if let Some(suppressed) = accept_failed.allow() {
                        tracing::warn!(listener = kind.as_str(), error = %e, suppressed, "accept failed");
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let Ok(local) = stream.local_addr() else { continue };
        let conn = Connection {
            gateway: gateway.clone(),
            peer: Peer { remote, local },
            kind,
            builders: builders.clone(),
            watcher: graceful.watcher(),
            limits: limits.clone(),
        };
        tokio::spawn(conn.run(stream, tls.clone(), slot));
    }
    drop(listener);
    tokio::select! {
        closed = tokio::time::timeout(GRACE, graceful.shutdown()) => if closed.is_err() {
            tracing::warn!(listener = kind.as_str(), "connections still open after the grace period");
        },
        _ = gateway.hurry.cancelled() => {}
    }
}

/// One accepted client connection, served in a task of its own.
struct Connection {
    gateway: Arc<Gateway>,
    peer: Peer,
    kind: Listener,
    builders: Arc<crate::conn::Builders>,
    watcher: hyper_util::server::graceful::Watcher,
    limits: Arc<ConnLimits>,
}

impl Connection {
    /// Serves the connection until it ends, the client overstays (a slow
    /// head, idle too long), or shutdown's grace ends it; then frees its slot.
    async fn run(
        self,
        stream: tokio::net::TcpStream,
        tls: Option<tokio_rustls::TlsAcceptor>,
        slot: OwnedSemaphorePermit,
    ) {
        let watch = crate::conn::Watch::new();
        let (gw, kind, requests, peer) = (self.gateway.clone(), self.kind, watch.clone(), self.peer);
        let service = hyper::service::service_fn(move |req: Request<Incoming>| {
            let (gw, busy) = (gw.clone(), requests.begin());
            let record = crate::observe::Record::new(req.headers(), gw.sinks.clone());
            async move {
                let resp = match kind {
                    Listener::Public => record.clone().scope(gw.handle(req, peer)).await,
                    Listener::Internal => record.clone().scope(gw.internal(req)).await,
                };
                let mut resp = resp?;
                record.set_status(resp.status());
                resp.headers_mut().insert(crate::observe::REQUEST_ID, record.id().clone());
                Ok::<_, Infallible>(resp.map(|body| Tracked::new(body, busy, record)))
            }
        });
        let metrics = &self.gateway.metrics;
        metrics.client_connections_open.inc();
        let serve = self.builders.serve(stream, tls, watch.clone(), service, self.watcher);
        tokio::select! {
            _ = serve => {}
            why = watch.overstayed(&self.limits) => {
                metrics.client_connections_ended.get_or_create(&EndedLabels { reason: why.reason() }).inc();
            }
        }
        metrics.client_connections_open.dec();
        drop(slot);
    }
}

/// Log lines an attacker can cause (cap reached, accept failures) at most this often.
const LOG_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);
const ACCEPT_BACKOFF_MIN: std::time::Duration = std::time::Duration::from_millis(10);
const ACCEPT_BACKOFF_MAX: std::time::Duration = std::time::Duration::from_millis(500);

type Work = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// Runs a call in the handler's own task until its answer is ready: a call
/// answered with one JSON body costs no task of its own. Once the answer is an
/// SSE stream (the call goes on writing it), or if the handler is dropped
/// because the client left, the call moves to a task of its own, where it
/// notices the client is gone and cancels upstream rather than being dropped
/// mid-flight.
struct Inline {
    work: Option<Work>,
    answer: tokio::sync::oneshot::Receiver<Response<Body>>,
}

impl std::future::Future for Inline {
    type Output = Result<Response<Body>, tokio::sync::oneshot::error::RecvError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        if self.work.is_some() {
            // The answer's sender is the work, polled right below: its send
            // would wake this very task while it runs, and tokio answers such
            // a wake by queueing the task again and waking another worker to
            // take it (a futex and an eventfd write per request when the
            // runtime is not busy). So the answer's waker is a no-op while the
            // work runs; the real one is registered again after it.
            let mut quiet = std::task::Context::from_waker(std::task::Waker::noop());
            if let std::task::Poll::Ready(answer) = std::pin::Pin::new(&mut self.answer).poll(&mut quiet) {
                if let Some(work) = self.work.take() {
                    tokio::spawn(work);
                }
                return std::task::Poll::Ready(answer);
            }
        }
        if let Some(work) = self.work.as_mut() {
            if work.as_mut().poll(cx).is_ready() {
                self.work = None;
            }
        }
        let answer = std::pin::Pin::new(&mut self.answer).poll(cx);
        if answer.is_ready() {
            if let Some(work) = self.work.take() {
                tokio::spawn(work);
            }
        }
        answer
    }
}

impl Drop for Inline {
    fn drop(&mut self) {
        if let Some(work) = self.work.take() {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(work);
            }
        }
    }
}

/// The host a request names: its URI's authority (HTTP/2, absolute form)
/// or its `Host` header.
fn request_host(req: &Request<Incoming>) -> Option<&str> {
    req.uri()
        .authority()
        .map(http::uri::Authority::as_str)
        .or_else(|| req.headers().get(http::header::HOST).and_then(|v| v.to_str().ok()))
}
