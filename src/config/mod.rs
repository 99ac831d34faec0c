//! Configuration: the routing file (TOML) validated into a fully-defaulted
//! runtime table, or the same table built from `--upstream`.

mod check;
pub mod cidr;
pub mod file;
pub mod keys;
mod outside;
mod raw;
pub mod secret;
mod stdio;
pub mod tls;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use http::Uri;

pub use check::Checked;
pub use outside::{Need, Outside, Source};
pub use raw::RawConfig;

pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
/// Paths the gateway answers itself on its public listener: no route may take them.
pub const RESERVED_PATHS: [&str; 4] = ["/metrics", "/healthz", "/readyz", "/status"];
pub use crate::versions::LEGACY as LEGACY_VERSIONS;

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

pub mod auth;
pub mod telemetry;
pub use auth::{AuthKind, AuthPolicy, JwksSource, JwtPolicy, SecretSource};
pub use telemetry::{Readiness, Telemetry};

#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    pub allowed_origins: Vec<String>,
    /// `None`: any Host is accepted.
    pub allowed_hosts: Option<Vec<String>>,
    /// `allowed_hosts` as the file writes it (`None`: unset). `/status` and
    /// `/metrics` accept these hosts, or, when unset, loopback names and the
    /// address the connection came in on, whatever the listener.
    pub ops_hosts: Option<Vec<String>>,
    /// Peers that may read `/status` (others get 404).
    pub status_allowed: Vec<cidr::Cidr>,
    pub drain_timeout: Duration,
    pub keepalive_interval: Duration,
    pub connections: ConnLimits,
    pub routes: Vec<Arc<Route>>,
    pub pool: PoolConfig,
    pub limits: Limits,
    pub keys: Vec<SealKey>,
    pub cluster: Option<Cluster>,
    pub legacy: LegacyClients,
    /// When `/readyz` answers 200.
    pub readiness: Readiness,
    pub telemetry: Telemetry,
    /// TLS on the public listener (`crate::tls` serves it; a reload swaps the pair).
    pub tls: Option<ServerTls>,
    /// CORS on `/.well-known/` and every route without its own.
    pub cors: Option<Arc<Cors>>,
}

/// Legacy (2025 session) clients: their session tokens and how fast they
/// may open sessions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LegacyClients {
    pub session_ttl: Duration,
    pub max_new_sessions_per_minute: u32,
    pub max_new_sessions_per_principal_per_minute: u32,
}

/// Cluster mode: who this replica is and how replicas reach each other.
#[derive(Clone)]
pub struct Cluster {
    pub instance_id: String,
    pub internal_listen: SocketAddr,
    /// `host:port` other replicas use for this one's internal listener.
    pub advertise: String,
    /// Shared secrets, newest first: the first signs forwarded retries, every
    /// one verifies (rotation). Never sent anywhere.
    pub secrets: Vec<Vec<u8>>,
    pub connect_timeout: Duration,
    /// TLS on the internal listener and to the other replicas' ones.
    pub tls: Option<ClusterTls>,
}

pub use tls::{ClusterTls, ServerTls};

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("instance_id", &self.instance_id)
            .field("internal_listen", &self.internal_listen)
            .field("advertise", &self.advertise)
            .field("secrets", &format_args!("<{} redacted>", self.secrets.len()))
            .field("connect_timeout", &self.connect_timeout)
            .field("tls", &self.tls)
            .finish()
    }
}

/// Where a call paused on a question lives until the retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Continuity {
    /// In this replica's memory (a parked flow); the retry is forwarded here.
    Park,
    /// Nowhere: the retry re-runs the call, answering from the sealed answers.
    Replay,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    pub name: String,
    /// Its instances (at least one): the endpoint URL of each, distinct.
    pub urls: Vec<Uri>,
    /// Which generation the upstream speaks, or how to find out.
    pub generation: UpstreamGeneration,
    /// How legacy clients reach a 2026 upstream that also serves them.
    pub legacy_clients: LegacyClientMode,
    pub protocol_version: String,
    pub connect_timeout: Duration,
    pub response_timeout: Duration,
    pub call_timeout: Duration,
    /// Requests it may have in flight through the gateway; `None`: no limit of its own.
    pub max_concurrent_requests: Option<usize>,
    /// Headers added to every request to it; values read when the gateway
    /// starts (`crate::upstream::credentials`).
    pub headers: Vec<UpstreamHeader>,
    /// `Some(audience)`: the client's verified bearer token is sent to it
    /// (only on `jwt` routes whose audience this is, checked at load).
    pub forward_authorization: Option<String>,
    /// A program spawned and spoken to over stdio instead of `urls` (which
    /// is then empty).
    pub stdio: Option<Arc<StdioCommand>>,
}

pub use stdio::{EnvValue, StdioCommand};

/// A header added to an upstream's requests, and where its value is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamHeader {
    pub name: http::HeaderName,
    pub source: SecretSource,
}

/// `legacy_clients` in an upstream's configuration: how legacy clients
/// reach an upstream that serves the session era (one that serves only
/// 2026 is always translated).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LegacyClientMode {
    /// To the upstream's own session support.
    Relay,
    /// As typed calls, their sessions kept in sealed tokens: stateless 2026
    /// calls on a 2026 upstream, calls on pooled sessions on a legacy one.
    Translate,
}

/// `generation` in an upstream's configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamGeneration {
    /// Probed with `server/discover`.
    Auto,
    Legacy,
    Modern,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheScope {
    Private,
    Public,
}

impl CacheScope {
    pub fn as_str(self) -> &'static str {
        match self {
            CacheScope::Private => "private",
            CacheScope::Public => "public",
        }
    }
}

/// A resolved route: passed down the request path instead of config look-ups.
#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    /// The request path it serves.
    pub path: String,
    /// The host it serves (lowercase, no port); `None`: any host that no
    /// other route of the same path names.
    pub host: Option<String>,
    /// Who the route is, in metrics, logs, caches and everything sealed:
    /// its path, or its host and path.
    pub id: String,
    pub upstream: Upstream,
    pub ttl_ms: u64,
    pub cache_scope: CacheScope,
    /// Requests one principal may make on this route; `None`: unlimited.
    pub rate_limit: Option<RateLimit>,
    /// Calls of one tool one principal may make on this route, by tool name.
    pub tool_rate_limits: Vec<(String, RateLimit)>,
    pub discover_ttl: Duration,
    pub continuity: Continuity,
    /// Tools that use replay mode on a `Park` route.
    pub replay_tools: Vec<String>,
    pub replay_ttl: Duration,
    /// Who may call: `None` for anyone (no policy, or `type = "none"`).
    pub auth: Option<Arc<AuthPolicy>>,
    /// What each caller may call (empty: everything).
    pub rules: Arc<[crate::authz::Rule]>,
    /// Browsers allowed to call (the route's own, or the server's); `None`: no CORS.
    pub cors: Option<Arc<Cors>>,
    /// A federated route's members (DESIGN §11), each a route of its own
    /// onto one upstream; empty for a route onto one upstream. On a
    /// federated route, `upstream` is its first member's and unused.
    pub members: Vec<Member>,
    /// How long a federated list waits for a member.
    pub federation_list_timeout: Duration,
    /// A member's route: the id of the federated route it belongs to.
    pub member_of: Option<String>,
}

/// One upstream of a federated route, under its name (its prefix).
#[derive(Debug, Clone, PartialEq)]
pub struct Member {
    pub name: String,
    /// The member's own route: the federated route's options onto the
    /// member's upstream, under the id `<route id>#<member>`.
    pub route: Arc<Route>,
}

/// A member's name: its prefix, which can never hold the separator.
pub fn valid_member_name(name: &str) -> bool {
    let b = name.as_bytes();
    (1..=16).contains(&b.len())
        && b[0].is_ascii_lowercase()
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

impl Route {
    /// Whether the route fronts several upstreams.
    pub fn federated(&self) -> bool {
        !self.members.is_empty()
    }

    /// Whether a call to `tool` (`None` for prompts and resources) runs in replay mode.
    pub fn replays(&self, tool: Option<&str>) -> bool {
        self.continuity == Continuity::Replay
            || tool.is_some_and(|t| self.replay_tools.iter().any(|r| r == t))
    }
}

/// Who may call from a browser (`crate::cors` answers for it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cors {
    /// `None`: any origin (`*`, only without credentials).
    pub origins: Option<Vec<String>>,
    /// `Access-Control-Allow-Credentials: true` (cookies, TLS client certificates).
    pub allow_credentials: bool,
    /// How long a browser may keep a preflight's answer.
    pub max_age_s: u64,
}

/// A rate limit: a sustained rate and a burst (see `crate::ratelimit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    pub per_minute: std::num::NonZeroU32,
    pub burst: std::num::NonZeroU32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolConfig {
    pub max_sessions: usize,
    pub idle_timeout: Duration,
}

/// What one client connection may cost: time to send a request, idle time,
/// header and h2 sizes, and how many connections there may be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnLimits {
    pub header_read_timeout: Duration,
    pub body_timeout: Duration,
    pub body_idle_timeout: Duration,
    pub client_idle_timeout: Duration,
    /// An answer the client has not read on for this long ends its
    /// connection: the idle timeout, or two SSE keep-alive intervals if longer.
    pub answer_stall_timeout: Duration,
    pub max_connections: usize,
    pub max_header_bytes: usize,
    pub h2_max_concurrent_streams: u32,
    pub h2_max_body_bytes_in_flight: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    pub max_body_bytes: usize,
    pub max_upstream_response_bytes: usize,
    pub max_concurrent_requests: usize,
    pub max_buffered_body_bytes: usize,
    pub max_listen_streams: usize,
    pub max_listen_streams_per_principal: usize,
    pub max_parked_flows: usize,
    pub parked_flow_ttl: Duration,
    pub max_parked_flows_per_principal: usize,
    pub max_sessions_per_principal: usize,
    /// Principals each rate limit tracks one by one.
    pub max_rate_limit_keys: usize,
}

pub use crate::seal::SealKey;

impl Config {
    /// The configuration of `sessionless --upstream URL`: one route `/mcp`.
    pub fn single(upstream: &str, listen: SocketAddr) -> Result<Config, ConfigError> {
        let raw = RawConfig {
            server: raw::RawServer { listen: Some(listen.to_string()), ..Default::default() },
            upstreams: vec![raw::RawUpstream {
                name: "default".into(),
                url: Some(upstream.into()),
                urls: None,
                legacy_clients: None,
                protocol_version: None,
                generation: None,
                connect_timeout_ms: None,
                response_timeout_ms: None,
                call_timeout_ms: None,
                headers: None,
                forward_authorization: None,
                audience: None,
                max_concurrent_requests: None,
                command: None,
                cwd: None,
                env: None,
                max_processes: None,
                process_idle_timeout_ms: None,
                start_timeout_ms: None,
                spare_processes: None,
            }],
            routes: vec![raw::RawRoute {
                path: "/mcp".into(),
                upstream: Some("default".into()),
                members: None,
                federation_list_timeout_ms: None,
                ttl_ms: None,
                cache_scope: None,
                continuity: None,
                replay_tools: None,
                replay_ttl_ms: None,
                rate_limit: None,
                tool_rate_limits: None,
                host: None,
                discover_ttl_ms: None,
                auth: None,
                cors: None,
                rules: Vec::new(),
            }],
            ..Default::default()
        };
        validate(raw, "", &Outside::required())
    }

    /// Reads and validates a routing file, and what it names outside itself
    /// (keys, secrets, TLS and auth files); errors name the file and line.
    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        let text = read_file(path)?;
        Config::from_toml(&text).map_err(|e| ConfigError(format!("{}: {}", path.display(), e.0)))
    }

    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        validate(parse(text)?, text, &Outside::required())
    }

    /// The route serving `path` for a request to `host` (see [`Route::serves`]).
    pub fn route_for(&self, host: Option<&str>, path: &str) -> Option<&Arc<Route>> {
        route_for(&self.routes, host, path, |r| r)
    }
}

/// Of `items`, the one whose route serves `path` on `host`: a route naming
/// the host wins over one naming none.
pub fn route_for<'a, T>(
    items: &'a [T],
    host: Option<&str>,
    path: &str,
    route: impl Fn(&T) -> &Route,
) -> Option<&'a T> {
    let mut fallback = None;
    for item in items {
        let r = route(item);
        if r.path != path {
            continue;
        }
        match (&r.host, host) {
            (None, _) => fallback = fallback.or(Some(item)),
            (Some(want), Some(got)) if want == got => return Some(item),
            _ => {}
        }
    }
    fallback
}

/// A request's host as routes name it: the authority's host, lowercase,
/// without the port.
pub fn request_host(authority: &str) -> String {
    let host = match authority.rfind(':') {
        // `[::1]:8080` or `host:8080`; a bare IPv6 literal has its `]` last.
        Some(i) if !authority[i..].contains(']') => &authority[..i],
        _ => authority,
    };
    host.to_ascii_lowercase()
}

/// A route's `host`: a DNS name or an IP literal, no scheme, port or path.
fn route_host(h: &str, text: &str) -> Result<String, ConfigError> {
    let ok = !h.is_empty()
        && h.len() <= 253
        && h.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'[' | b']' | b':'))
        && (h.starts_with('[') || !h.contains(':'));
    if !ok {
        return Err(ConfigError(format!(
            "{}invalid route host `{h}` (a host name without scheme, port or path)",
            at(text, "host")
        )));
    }
    Ok(h.to_ascii_lowercase())
}

fn read_file(path: &Path) -> Result<String, ConfigError> {
    file::read_to_string(path, file::Kind::Routing).map_err(|e| ConfigError(e.to_string()))
}

fn parse(text: &str) -> Result<RawConfig, ConfigError> {
    toml::from_str(text).map_err(|e| ConfigError(e.to_string()))
}

fn ms(v: Option<u64>, default: u64) -> Duration {
    Duration::from_millis(v.unwrap_or(default))
}

/// "line N: " for the first line of `text` containing `needle`, to point at a bad key.
/// A listen address: `IP:PORT`, `[IPv6]:PORT`, or `localhost:PORT` (the
/// IPv4 loopback). The error says what to write.
pub fn listen_address(text: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = text.parse() {
        return Ok(addr);
    }
    let port = text.strip_prefix("localhost:").map(str::parse::<u16>);
    match port {
        Some(Ok(port)) => Ok(SocketAddr::from(([127, 0, 0, 1], port))),
        _ => Err(format!(
            "invalid listen address `{text}`: give IP:PORT, e.g. 127.0.0.1:8080 (this machine only), \
             0.0.0.0:8080 (every interface) or localhost:8080"
        )),
    }
}

fn at(text: &str, needle: &str) -> String {
    text.lines().position(|l| l.contains(needle)).map(|n| format!("line {}: ", n + 1)).unwrap_or_default()
}

/// The one validation of a routing file; what it names outside itself is
/// read through `outside` (required to run, optional to check).
fn validate(raw: RawConfig, text: &str, outside: &Outside) -> Result<Config, ConfigError> {
    let policies = auth::policies(&raw.auth, text, outside)?;
    let listen_text = raw.server.listen.as_deref().unwrap_or(DEFAULT_LISTEN);
    let listen =
        listen_address(listen_text).map_err(|why| ConfigError(format!("{}{why}", at(text, "listen"))))?;
    let pool_idle = ms(raw.pool.idle_timeout_ms, 300_000);
    let upstreams = (raw.upstreams.iter())
        .map(|u| upstream(u, text, outside, pool_idle))
        .collect::<Result<Vec<_>, _>>()?;
    let server_cors = raw.server.cors.as_ref().map(|c| cors(c, text)).transpose()?;
    let routes = routes(&raw.routes, &upstreams, &policies, server_cors.as_ref(), text)?;
    let connections = conn_limits(&raw.server, &raw.limits, text)?;
    let max_body_bytes = raw.limits.max_body_bytes.unwrap_or(4 << 20);
    let max_buffered_body_bytes = raw.limits.max_buffered_body_bytes.unwrap_or(256 << 20);
    if max_buffered_body_bytes < max_body_bytes {
        return Err(ConfigError(format!(
            "{}max_buffered_body_bytes must be at least max_body_bytes ({max_body_bytes})",
            at(text, "max_buffered_body_bytes")
        )));
    }
    let status_allowed = match &raw.server.status_allowed {
        None => cidr::loopback(),
        Some(list) => list
            .iter()
            .map(|c| cidr::Cidr::parse(c))
            .collect::<Result<_, _>>()
            .map_err(|e| ConfigError(format!("{}status_allowed: {e}", at(text, "status_allowed"))))?,
    };
    let ops_hosts = raw.server.allowed_hosts.clone();
    let allowed_hosts = match raw.server.allowed_hosts {
        Some(h) => Some(h),
        None if listen.ip().is_loopback() => {
            Some(["localhost", "127.0.0.1", "[::1]"].iter().map(|s| s.to_string()).collect())
        }
        None => None,
    };
    let readiness = telemetry::readiness(raw.server.readiness.as_deref(), text)?;
    let telemetry = telemetry::telemetry(&raw.telemetry, text)?;
    Ok(Config {
        readiness,
        telemetry,
        listen,
        allowed_origins: raw.server.allowed_origins.unwrap_or_default(),
        allowed_hosts,
        ops_hosts,
        status_allowed,
        drain_timeout: ms(raw.server.drain_timeout_ms, 10_000),
        keepalive_interval: ms(raw.server.keepalive_interval_ms, 15_000),
        connections,
        routes,
        pool: PoolConfig {
            max_sessions: raw.pool.max_sessions.unwrap_or(1024).max(1),
            idle_timeout: ms(raw.pool.idle_timeout_ms, 300_000),
        },
        limits: Limits {
            max_body_bytes,
            max_upstream_response_bytes: raw.limits.max_upstream_response_bytes.unwrap_or(16 << 20),
            max_concurrent_requests: raw.limits.max_concurrent_requests.unwrap_or(4096),
            max_buffered_body_bytes,
            max_listen_streams: raw.limits.max_listen_streams.unwrap_or(256),
            max_listen_streams_per_principal: raw
                .limits
                .max_listen_streams_per_principal
                .unwrap_or(64)
                .max(1),
            max_parked_flows: raw.limits.max_parked_flows.unwrap_or(10_000),
            parked_flow_ttl: ms(raw.limits.parked_flow_ttl_ms, 300_000),
            max_parked_flows_per_principal: raw.limits.max_parked_flows_per_principal.unwrap_or(100).max(1),
            max_sessions_per_principal: raw.limits.max_sessions_per_principal.unwrap_or(32).max(1),
            max_rate_limit_keys: raw.limits.max_rate_limit_keys.unwrap_or(10_000).max(1),
        },
        legacy: LegacyClients {
            session_ttl: ms(raw.legacy.session_ttl_ms, 86_400_000).max(Duration::from_secs(1)),
            max_new_sessions_per_minute: raw.legacy.max_new_sessions_per_minute.unwrap_or(6000).max(1),
            max_new_sessions_per_principal_per_minute: raw
                .legacy
                .max_new_sessions_per_principal_per_minute
                .unwrap_or(120)
                .max(1),
        },
        cluster: raw.cluster.as_ref().map(|c| cluster(c, text, &raw.keys, outside)).transpose()?,
        keys: raw
            .keys
            .iter()
            .filter_map(|k| load_key(k, text, outside).transpose())
            .collect::<Result<_, _>>()?,
        tls: raw.server.tls.as_ref().map(|t| tls::server(t, text, outside)).transpose()?.flatten(),
        cors: server_cors,
    })
}

/// The routes, each id once. Upstreams and policies are looked up by name
/// in maps, so that a file of tens of thousands of routes loads in linear
/// time (the first upstream of a name wins, as it always has).
fn routes(
    raw: &[raw::RawRoute],
    upstreams: &[Upstream],
    policies: &[Arc<AuthPolicy>],
    server_cors: Option<&Arc<Cors>>,
    text: &str,
) -> Result<Vec<Arc<Route>>, ConfigError> {
    if raw.is_empty() {
        return Err(ConfigError("no routes: add a [[routes]] table".into()));
    }
    let mut by_name: HashMap<&str, &Upstream> = HashMap::new();
    for u in upstreams {
        if by_name.insert(u.name.as_str(), u).is_some() {
            let line = text
                .lines()
                .enumerate()
                .filter(|(_, l)| l.trim_start().starts_with("name") && l.contains(&format!("\"{}\"", u.name)))
                .nth(1)
                .map(|(n, _)| format!("line {}: ", n + 1))
                .unwrap_or_default();
            return Err(ConfigError(format!("{line}duplicate upstream name `{}`", u.name)));
        }
    }
    let policies: HashMap<&str, &Arc<AuthPolicy>> = policies.iter().map(|p| (p.name.as_str(), p)).collect();
    let mut ids = HashSet::new();
    let mut routes = Vec::with_capacity(raw.len());
    for r in raw {
        let mut route = route(r, &by_name, &policies, text)?;
        if !ids.insert(route.id.clone()) {
            return Err(ConfigError(format!("{}duplicate route `{}`", at(text, &r.path), route.id)));
        }
        route.cors = match &r.cors {
            Some(c) => Some(cors(c, text)?),
            None => server_cors.cloned(),
        };
        routes.push(Arc::new(route));
    }
    Ok(routes)
}

/// A `cors` table: bare origins, or `*` alone and without credentials.
fn cors(c: &raw::RawCors, text: &str) -> Result<Arc<Cors>, ConfigError> {
    let err = |why: String| ConfigError(format!("{}cors: {why}", at(text, "allowed_origins")));
    let any = c.allowed_origins.iter().any(|o| o == "*");
    let credentials = c.allow_credentials.unwrap_or(false);
    if c.allowed_origins.is_empty() {
        return Err(err("allowed_origins is empty (leave the table out to turn CORS off)".into()));
    }
    if any && (c.allowed_origins.len() > 1 || credentials) {
        return Err(err("`*` stands alone, and never with allow_credentials".into()));
    }
    if let Some(bad) = c.allowed_origins.iter().find(|o| !any && !valid_origin(o)) {
        return Err(err(format!("`{bad}` is not an origin (scheme://host[:port], no path)")));
    }
    let max_age_s = c.max_age_s.unwrap_or(600);
    if max_age_s > 86_400 {
        return Err(err("max_age_s is at most 86400".into()));
    }
    Ok(Arc::new(Cors {
        origins: (!any).then(|| c.allowed_origins.clone()),
        allow_credentials: credentials,
        max_age_s,
    }))
}

/// A configured origin: `*`, or `scheme://host[:port]` with nothing after.
fn valid_origin(origin: &str) -> bool {
    let Some((scheme, rest)) = origin.split_once("://") else { return false };
    matches!(scheme, "http" | "https")
        && !rest.is_empty()
        && !rest.contains(['/', '?', '#', '@', ' '])
        && rest.parse::<http::uri::Authority>().is_ok()
}

fn conn_limits(s: &raw::RawServer, l: &raw::RawLimits, text: &str) -> Result<ConnLimits, ConfigError> {
    let max_header_bytes = s.max_header_bytes.unwrap_or(64 * 1024);
    if max_header_bytes < 8 * 1024 {
        return Err(ConfigError(format!(
            "{}max_header_bytes must be at least 8192",
            at(text, "max_header_bytes")
        )));
    }
    let window = s.h2_max_body_bytes_in_flight.unwrap_or(1 << 20);
    if !(65_535..=(1 << 31) - 1).contains(&window) {
        return Err(ConfigError(format!(
            "{}h2_max_body_bytes_in_flight must be between 65535 and 2^31-1",
            at(text, "h2_max_body_bytes_in_flight")
        )));
    }
    let client_idle_timeout = ms(s.client_idle_timeout_ms, 60_000).max(Duration::from_millis(1));
    Ok(ConnLimits {
        header_read_timeout: ms(s.header_read_timeout_ms, 10_000).max(Duration::from_millis(1)),
        body_timeout: ms(s.body_timeout_ms, 30_000).max(Duration::from_millis(1)),
        body_idle_timeout: ms(s.body_idle_timeout_ms, 10_000).max(Duration::from_millis(1)),
        client_idle_timeout,
        answer_stall_timeout: client_idle_timeout.max(2 * ms(s.keepalive_interval_ms, 15_000)),
        max_connections: l.max_connections.unwrap_or(4096).max(1),
        max_header_bytes,
        h2_max_concurrent_streams: s.h2_max_concurrent_streams.unwrap_or(100).max(1),
        h2_max_body_bytes_in_flight: window,
    })
}

fn upstream(
    u: &raw::RawUpstream,
    text: &str,
    outside: &Outside,
    pool_idle: Duration,
) -> Result<Upstream, ConfigError> {
    if u.command.is_some() {
        return stdio::upstream(u, text, outside, pool_idle);
    }
    if let Some(key) = stdio::only_beside_command(u) {
        return Err(ConfigError(format!(
            "{}upstream `{}`: `{key}` is for a stdio upstream (one with `command`)",
            at(text, key),
            u.name
        )));
    }
    let headers = upstream_headers(u, text, outside)?;
    let forward_authorization = match (u.forward_authorization, &u.audience) {
        (Some(true), Some(aud)) => Some(aud.clone()),
        (Some(true), None) => {
            return Err(ConfigError(format!(
                "{}upstream `{}`: forward_authorization needs `audience` (the resource its tokens are \
                 issued for)",
                at(text, "forward_authorization"),
                u.name
            )))
        }
        _ => None,
    };
    if forward_authorization.is_some() && headers.iter().any(|h| h.name == http::header::AUTHORIZATION) {
        return Err(ConfigError(format!(
            "{}upstream `{}`: an Authorization header and forward_authorization exclude each other",
            at(text, "forward_authorization"),
            u.name
        )));
    }
    let urls: Vec<&String> = match (&u.url, &u.urls) {
        (Some(url), None) => vec![url],
        (None, Some(urls)) if !urls.is_empty() => urls.iter().collect(),
        _ => {
            return Err(ConfigError(format!(
                "{}upstream `{}` needs `url`, or `urls` (a non-empty list of its instances), not both",
                at(text, &u.name),
                u.name
            )))
        }
    };
    let urls = urls.into_iter().map(|url| instance_url(url, text)).collect::<Result<Vec<Uri>, _>>()?;
    for (i, url) in urls.iter().enumerate() {
        if urls[..i].contains(url) {
            return Err(ConfigError(format!(
                "{}upstream url `{url}` is listed twice",
                at(text, &url.to_string())
            )));
        }
    }
    let protocol_version = u.protocol_version.clone().unwrap_or_else(|| LEGACY_VERSIONS[0].into());
    if !LEGACY_VERSIONS.contains(&protocol_version.as_str()) {
        return Err(ConfigError(format!(
            "{}upstream protocol_version must be one of {LEGACY_VERSIONS:?}",
            at(text, "protocol_version")
        )));
    }
    let generation = match u.generation.as_deref() {
        None | Some("auto") => UpstreamGeneration::Auto,
        Some("legacy") => UpstreamGeneration::Legacy,
        Some("modern") => UpstreamGeneration::Modern,
        Some(other) => {
            return Err(ConfigError(format!(
                "{}generation must be \"auto\", \"legacy\" or \"modern\", not `{other}`",
                at(text, "generation")
            )))
        }
    };
    let legacy_clients = match u.legacy_clients.as_deref() {
        None | Some("relay") => LegacyClientMode::Relay,
        Some("translate") => LegacyClientMode::Translate,
        Some(other) => {
            return Err(ConfigError(format!(
                "{}legacy_clients must be \"relay\" or \"translate\", not `{other}`",
                at(text, "legacy_clients")
            )))
        }
    };
    Ok(Upstream {
        name: u.name.clone(),
        urls,
        generation,
        legacy_clients,
        protocol_version,
        connect_timeout: ms(u.connect_timeout_ms, 5_000),
        response_timeout: ms(u.response_timeout_ms, 30_000),
        call_timeout: ms(u.call_timeout_ms, 600_000),
        max_concurrent_requests: match u.max_concurrent_requests {
            Some(0) => {
                return Err(ConfigError(format!(
                    "{}max_concurrent_requests must be at least 1",
                    at(text, "max_concurrent_requests")
                )))
            }
            n => n,
        },
        headers,
        forward_authorization,
        stdio: None,
    })
}

/// `[upstreams.headers]`: names checked, values only located (an inline
/// value is refused without being repeated).
/// An upstream's `headers`: each value's variable or file recorded in
/// `outside` (listed by `check-config`) and checked when it is there;
/// the gateway reads them again when it starts and on each reload.
fn upstream_headers(
    u: &raw::RawUpstream,
    text: &str,
    outside: &Outside,
) -> Result<Vec<UpstreamHeader>, ConfigError> {
    let mut out = Vec::new();
    for (name, spec) in u.headers.iter().flatten() {
        let err = |why: &str| {
            ConfigError(format!("{}upstream `{}`: header `{name}`: {why}", at(text, name), u.name))
        };
        let parsed = http::HeaderName::from_bytes(name.as_bytes()).map_err(|_| err("not a header name"))?;
        if secret::refused_name(&parsed) {
            return Err(err("the gateway sets this header itself (or it is hop-by-hop)"));
        }
        let text_of = |k: &str| spec.get(k).and_then(toml::Value::as_str).map(str::to_string);
        let keys_ok =
            spec.as_table().is_some_and(|t| t.keys().all(|k| k == "value_env" || k == "value_file"));
        let source = match (keys_ok, text_of("value_env"), text_of("value_file")) {
            (true, Some(var), None) => SecretSource::Env(var),
            (true, None, Some(file)) => SecretSource::File(file.into()),
            _ => {
                return Err(err("needs exactly one of { value_env = \"VAR\" } or { value_file = \"path\" } \
                     (values are never written in this file)"))
            }
        };
        if out.iter().any(|h: &UpstreamHeader| h.name == parsed) {
            return Err(err("named twice"));
        }
        let what = format!("upstream `{}` header {parsed}", u.name);
        if let Some(value) = outside.read(&what, source.clone(), file::Kind::Secret).map_err(|e| err(&e))? {
            secret::Secret::new(&value).map_err(|why| err(&format!("the value {why}")))?;
        }
        out.push(UpstreamHeader { name: parsed, source });
    }
    Ok(out)
}

/// A route's authorization rules.
fn rules(raw: &[raw::RawRule], text: &str) -> Result<Arc<[crate::authz::Rule]>, ConfigError> {
    raw.iter()
        .map(|r| {
            let allow = match r.effect.as_str() {
                "allow" => true,
                "deny" => false,
                other => {
                    return Err(ConfigError(format!(
                        "{}a rule's effect must be \"allow\" or \"deny\", not `{other}`",
                        at(text, "effect")
                    )))
                }
            };
            if r.tools.is_empty() && r.prompts.is_empty() && r.resources.is_empty() {
                return Err(ConfigError(format!(
                    "{}a rule names tools, prompts or resources (patterns; `*` for all)",
                    at(text, "effect")
                )));
            }
            Ok(crate::authz::Rule {
                allow,
                tools: r.tools.clone(),
                prompts: r.prompts.clone(),
                resources: r.resources.clone(),
                principals: r.principals.clone(),
                groups: r.groups.clone(),
                scopes: r.scopes.clone(),
            })
        })
        .collect()
}

/// One instance's URL: http(s) with a host and no credentials (they would
/// never be sent, and the URL names the instance in metrics and logs).
fn instance_url(url: &str, text: &str) -> Result<Uri, ConfigError> {
    let no_scheme = !url.contains("://");
    let parsed: Uri = url.parse().map_err(|_| {
        let why = match no_scheme {
            true => "it needs http:// or https:// in front, e.g. http://127.0.0.1:9000/mcp",
            false => "it is not a URL (http://host:port/path)",
        };
        ConfigError(format!("{}invalid upstream url `{url}`: {why}", at(text, url)))
    })?;
    if !matches!(parsed.scheme_str(), Some("http" | "https")) || parsed.host().is_none() {
        return Err(ConfigError(format!(
            "{}upstream url `{url}` needs http:// or https:// and a host, e.g. http://127.0.0.1:9000/mcp",
            at(text, url)
        )));
    }
    if parsed.query().is_some() {
        return Err(ConfigError(format!(
            "{}upstream urls carry no query (the URL names the instance in metrics and /readyz)",
            at(text, url)
        )));
    }
    if parsed.authority().is_some_and(|a| a.as_str().contains('@')) {
        return Err(ConfigError(format!(
            "{}upstream urls carry no credentials (they would never be sent)",
            at(text, url)
        )));
    }
    Ok(parsed)
}

fn route(
    r: &raw::RawRoute,
    upstreams: &HashMap<&str, &Upstream>,
    policies: &HashMap<&str, &Arc<AuthPolicy>>,
    text: &str,
) -> Result<Route, ConfigError> {
    let host = r.host.as_deref().map(|h| route_host(h, text)).transpose()?;
    let continuity = match r.continuity.as_deref() {
        None | Some("park") => Continuity::Park,
        Some("replay") => Continuity::Replay,
        Some(other) => {
            return Err(ConfigError(format!(
                "{}continuity must be \"park\" or \"replay\", not `{other}`",
                at(text, "continuity")
            )))
        }
    };
    if !r.path.starts_with('/') {
        return Err(ConfigError(format!(
            "{}invalid route path `{}` (a path starts with `/`, e.g. \"/mcp\")",
            at(text, &r.path),
            r.path
        )));
    }
    if RESERVED_PATHS.contains(&r.path.as_str()) {
        return Err(ConfigError(format!(
            "{}route path `{}` is the gateway's own ({} are reserved): choose another path",
            at(text, &format!("\"{}\"", r.path)),
            r.path,
            RESERVED_PATHS.join(", ")
        )));
    }
    let known = |name: &str| {
        upstreams
            .get(name)
            .copied()
            .ok_or_else(|| ConfigError(format!("{}unknown upstream `{name}`", at(text, name))))
    };
    let members: Vec<&Upstream> = match (&r.upstream, &r.members) {
        (Some(name), None) => vec![known(name)?],
        (None, Some(names)) if !names.is_empty() => {
            let mut seen = HashSet::new();
            for name in names {
                if !valid_member_name(name) {
                    return Err(ConfigError(format!(
                        "{}member `{name}`: a member's name is its prefix and must match ^[a-z][a-z0-9-]{{0,15}}$",
                        at(text, name)
                    )));
                }
                if !seen.insert(name.as_str()) {
                    return Err(ConfigError(format!(
                        "{}member `{name}` is listed twice",
                        at(text, "members")
                    )));
                }
            }
            names.iter().map(|n| known(n)).collect::<Result<_, _>>()?
        }
        (None, Some(_)) => {
            return Err(ConfigError(format!("{}`members` needs at least one upstream", at(text, "members"))))
        }
        _ => {
            return Err(ConfigError(format!(
                "{}route `{}` needs either `upstream` or `members`",
                at(text, &r.path),
                r.path
            )))
        }
    };
    let upstream = members[0];
    let cache_scope = match r.cache_scope.as_deref() {
        None | Some("private") => CacheScope::Private,
        Some("public") => CacheScope::Public,
        Some(other) => {
            return Err(ConfigError(format!(
                "{}cache_scope must be \"private\" or \"public\", not `{other}`",
                at(text, "cache_scope")
            )))
        }
    };
    let auth = match &r.auth {
        None => None,
        Some(name) => Some(
            policies
                .get(name.as_str())
                .map(|p| Arc::clone(p))
                .ok_or_else(|| ConfigError(format!("{}unknown auth policy `{name}`", at(text, "auth"))))?,
        ),
    };
    for upstream in &members {
        let Some(aud) = &upstream.forward_authorization else { continue };
        let jwt_audience = auth.as_ref().and_then(|p| match &p.kind {
            AuthKind::Jwt(j) => Some(j.audience.as_str()),
            _ => None,
        });
        if jwt_audience != Some(aud.as_str()) {
            return Err(ConfigError(format!(
                "{}route `{}`: upstream `{}` takes the client's token (forward_authorization), so the \
                 route needs a jwt auth policy whose audience is the upstream's `{aud}`",
                at(text, &r.path),
                r.path,
                upstream.name
            )));
        }
    }
    if r.path.starts_with("/.well-known/") {
        return Err(ConfigError(format!(
            "{}route paths under /.well-known/ are the gateway's",
            at(text, &r.path)
        )));
    }
    Ok(Route {
        id: match &host {
            Some(h) => format!("{h}{}", r.path),
            None => r.path.clone(),
        },
        host,
        path: r.path.clone(),
        upstream: upstream.clone(),
        auth: auth.clone().filter(|p| !matches!(p.kind, AuthKind::None)),
        rules: {
            let rules = rules(&r.rules, text)?;
            let names_callers = rules
                .iter()
                .any(|r| !(r.principals.is_empty() && r.groups.is_empty() && r.scopes.is_empty()));
            if names_callers && auth.as_ref().is_none_or(|p| matches!(p.kind, AuthKind::None)) {
                return Err(ConfigError(format!(
                    "{}rules that name principals, groups or scopes need an auth policy on the route \
                     (without one, any caller can claim to be anyone)",
                    at(text, "effect")
                )));
            }
            rules
        },
        ttl_ms: r.ttl_ms.unwrap_or(0),
        cache_scope,
        rate_limit: r.rate_limit.map(|l| rate_limit(l, "rate_limit", text)).transpose()?,
        tool_rate_limits: r
            .tool_rate_limits
            .iter()
            .flatten()
            .map(|(tool, l)| Ok((tool.clone(), rate_limit(*l, tool, text)?)))
            .collect::<Result<_, ConfigError>>()?,
        discover_ttl: ms(r.discover_ttl_ms, 60_000),
        continuity,
        replay_tools: r.replay_tools.clone().unwrap_or_default(),
        replay_ttl: ms(r.replay_ttl_ms, 60_000),
        cors: None,
        members: Vec::new(),
        federation_list_timeout: ms(r.federation_list_timeout_ms, 5_000),
        member_of: None,
    })
    .map(|route| match &r.members {
        Some(_) => federate(route, &members),
        None => route,
    })
}

/// A federated route: its members' routes (the route's options onto each
/// member's upstream; rate limits and rules stay on the federated route,
/// which names tools as it advertises them).
fn federate(mut route: Route, members: &[&Upstream]) -> Route {
    route.members = members
        .iter()
        .map(|upstream| {
            let prefix = format!("{}__", upstream.name);
            let member = Route {
                id: format!("{}#{}", route.id, upstream.name),
                upstream: (*upstream).clone(),
                rate_limit: None,
                tool_rate_limits: Vec::new(),
                rules: Arc::from([]),
                replay_tools: route
                    .replay_tools
                    .iter()
                    .filter_map(|t| t.strip_prefix(&prefix).map(str::to_string))
                    .collect(),
                members: Vec::new(),
                member_of: Some(route.id.clone()),
                ..route.clone()
            };
            Member { name: upstream.name.clone(), route: Arc::new(member) }
        })
        .collect();
    route
}

/// A rate limit as written: both numbers at least 1; `burst` defaults to `per_minute`.
fn rate_limit(l: raw::RawRateLimit, key: &str, text: &str) -> Result<RateLimit, ConfigError> {
    use std::num::NonZeroU32;
    let per_minute = NonZeroU32::new(l.per_minute);
    let burst = l.burst.map_or(per_minute, NonZeroU32::new);
    match (per_minute, burst) {
        (Some(per_minute), Some(burst)) => Ok(RateLimit { per_minute, burst }),
        _ => Err(ConfigError(format!("{}per_minute and burst must be at least 1", at(text, key)))),
    }
}

fn cluster(
    c: &raw::RawCluster,
    text: &str,
    keys: &[raw::RawKey],
    outside: &Outside,
) -> Result<Cluster, ConfigError> {
    let where_ = at(text, "[cluster]");
    if keys.is_empty() {
        return Err(ConfigError(format!(
            "{where_}cluster mode needs [[keys]] shared by every replica (requestState opens anywhere)"
        )));
    }
    let internal_listen: SocketAddr = c.internal_listen.parse().map_err(|_| {
        ConfigError(format!("{}invalid internal_listen `{}`", at(text, "internal_listen"), c.internal_listen))
    })?;
    let id = "cluster instance id (when cluster.instance_id is not set)";
    let instance_id =
        match c.instance_id.clone().or_else(|| outside.default_from(id, "SESSIONLESS_INSTANCE_ID")) {
            Some(id) => id,
            None => match outside.default_from(id, "HOSTNAME") {
                Some(id) => id,
                None if outside.is_required() => {
                    return Err(ConfigError(format!(
                    "{where_}cluster.instance_id is not set (nor $SESSIONLESS_INSTANCE_ID, nor $HOSTNAME)"
                )))
                }
                None => String::new(),
            },
        };
    let from_env = match &c.advertise {
        Some(_) => None,
        None => outside.default_from(
            "cluster advertise address (when cluster.advertise is not set)",
            "SESSIONLESS_ADVERTISE_ADDR",
        ),
    };
    let advertise = c.advertise.clone().or(from_env).unwrap_or_else(|| c.internal_listen.clone());
    let reachable = advertise
        .parse::<SocketAddr>()
        .map(|a| a.port() != 0 && !a.ip().is_unspecified())
        .unwrap_or_else(|_| !advertise.ends_with(":0") && advertise.contains(':'));
    // Offline, an address the environment will give is not the file's fault.
    let from_file = c.advertise.is_some() || outside.is_required();
    if !reachable && from_file {
        return Err(ConfigError(format!(
            "{where_}cluster advertise address `{advertise}` is not one other replicas can reach: \
             set cluster.advertise or $SESSIONLESS_ADVERTISE_ADDR (host:port, not 0.0.0.0, not port 0)"
        )));
    }
    let source = match (&c.secret_env, &c.secret_file) {
        (Some(var), None) => Source::Env(var.clone()),
        (None, Some(file)) => Source::File(file.into()),
        _ => {
            return Err(ConfigError(format!(
                "{where_}cluster needs exactly one of secret_env or secret_file (never inline)"
            )))
        }
    };
    let secret = outside
        .read("cluster secret", source, file::Kind::Secret)
        .map_err(|e| ConfigError(format!("{where_}cluster secret: {e}")))?;
    let secrets: Vec<Vec<u8>> =
        secret.iter().flat_map(|s| s.split(',')).map(|s| s.trim().as_bytes().to_vec()).collect();
    if secrets.iter().any(|s| s.len() < 16) {
        return Err(ConfigError(format!(
            "{where_}cluster secret must be at least 16 bytes (each one, when several are comma-separated)"
        )));
    }
    Ok(Cluster {
        instance_id,
        internal_listen,
        advertise,
        secrets,
        connect_timeout: ms(c.connect_timeout_ms, 1_000),
        tls: tls::cluster(c, text, outside)?,
    })
}

/// A sealing key; `None` when it is missing and `outside` does not require it.
fn load_key(k: &raw::RawKey, text: &str, outside: &Outside) -> Result<Option<SealKey>, ConfigError> {
    let where_ = at(text, &k.id);
    let source = match (&k.env, &k.file) {
        (Some(var), None) => Source::Env(var.clone()),
        (None, Some(file)) => Source::File(file.into()),
        _ => {
            return Err(ConfigError(format!(
                "{where_}key `{}` needs exactly one of `env` or `file` (keys never sit in this file)",
                k.id
            )))
        }
    };
    let what = format!("sealing key `{}`", k.id);
    let Some(encoded) = outside
        .read(&what, source, file::Kind::Secret)
        .map_err(|e| ConfigError(format!("{where_}{what}: {e}")))?
    else {
        return Ok(None);
    };
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(encoded.trim().trim_end_matches('='))
        .ok()
        .and_then(|b| <[u8; 32]>::try_from(b).ok())
        .ok_or_else(|| ConfigError(format!("{where_}key `{}` must be 32 bytes, base64url", k.id)))?;
    Ok(Some(SealKey { id: k.id.clone(), bytes }))
}

#[cfg(test)]
mod tests;
