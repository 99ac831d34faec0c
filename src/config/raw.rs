//! The routing file as written: serde structs that reject unknown keys.
//! Validated into [`super::Config`] by `super::validate`.

use serde::Deserialize;
use std::collections::BTreeMap;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    #[serde(default)]
    pub server: RawServer,
    #[serde(default)]
    pub upstreams: Vec<RawUpstream>,
    #[serde(default)]
    pub routes: Vec<RawRoute>,
    #[serde(default)]
    pub pool: RawPool,
    #[serde(default)]
    pub limits: RawLimits,
    #[serde(default)]
    pub keys: Vec<RawKey>,
    /// Legacy (2025 session) clients.
    #[serde(default)]
    pub legacy: RawLegacy,
    /// Cluster mode: replicas forward retries to the replica holding the flow.
    pub cluster: Option<RawCluster>,
    /// Authentication policies by name (`[auth.<name>]`), named by routes.
    #[serde(default)]
    pub auth: BTreeMap<String, super::auth::RawAuth>,
    /// OTLP export and the per-tool latency allowlist.
    #[serde(default)]
    pub telemetry: super::telemetry::RawTelemetry,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawServer {
    pub listen: Option<String>,
    /// Origins allowed in the `Origin` header besides loopback ones.
    pub allowed_origins: Option<Vec<String>>,
    /// Host header values allowed; default: loopback hosts when the listener is loopback, any otherwise.
    pub allowed_hosts: Option<Vec<String>>,
    /// Peers (IP addresses or CIDR ranges) that may read `/status`; default loopback.
    pub status_allowed: Option<Vec<String>>,
    pub drain_timeout_ms: Option<u64>,
    /// SSE comment interval on long answers (not a connection timeout).
    pub keepalive_interval_ms: Option<u64>,
    /// Time a client connection may take to send a request head.
    pub header_read_timeout_ms: Option<u64>,
    /// Time a client may take to send a whole request body.
    pub body_timeout_ms: Option<u64>,
    /// Longest pause between two pieces of a request body.
    pub body_idle_timeout_ms: Option<u64>,
    /// A client connection with no request in flight is closed after this long.
    pub client_idle_timeout_ms: Option<u64>,
    /// Largest request head (HTTP/1.1) or header list (h2).
    pub max_header_bytes: Option<usize>,
    /// h2: concurrent streams per connection.
    pub h2_max_concurrent_streams: Option<u32>,
    /// h2: request body bytes a connection may have in flight (its flow-control window).
    pub h2_max_body_bytes_in_flight: Option<u32>,
    /// When `/readyz` is 200: "always" (default), "any_upstream", "all_upstreams".
    pub readiness: Option<String>,
    /// TLS on the listener (`[server.tls]`).
    pub tls: Option<RawServerTls>,
    /// CORS for browser clients, every route's default (`[server.cors]`).
    pub cors: Option<RawCors>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawServerTls {
    /// The certificate chain (PEM), leaf first.
    pub cert_file: String,
    /// Its private key (PEM).
    pub key_file: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCors {
    /// Origins (`https://app.example`) browsers may call from; `["*"]` for any.
    pub allowed_origins: Vec<String>,
    /// `Access-Control-Allow-Credentials` (not with `*`); default false.
    pub allow_credentials: Option<bool>,
    /// How long a browser keeps a preflight's answer (default 600 s, at most a day).
    pub max_age_s: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawUpstream {
    pub name: String,
    /// The upstream's MCP endpoint; or `urls`, several instances of one server.
    pub url: Option<String>,
    pub urls: Option<Vec<String>>,
    /// Legacy version offered at `initialize` (default 2025-11-25).
    pub protocol_version: Option<String>,
    /// "auto" (default: found by probing `server/discover`), "legacy" or "modern".
    pub generation: Option<String>,
    /// "relay" (default) or "translate": legacy clients of a 2026 upstream
    /// that also serves them.
    pub legacy_clients: Option<String>,
    pub connect_timeout_ms: Option<u64>,
    /// Time allowed until the upstream starts answering a request.
    pub response_timeout_ms: Option<u64>,
    /// Time allowed for a whole call, stream included.
    pub call_timeout_ms: Option<u64>,
    /// Headers added to every request to this upstream, by name:
    /// `{ value_env = "VAR" }` or `{ value_file = "path" }` (never inline).
    /// Read as TOML values, so that an inline secret is refused without
    /// the parser quoting its line.
    pub headers: Option<BTreeMap<String, toml::Value>>,
    /// Send the client's bearer token to this upstream: only on routes
    /// whose `jwt` policy's audience is `audience` (the upstream is the
    /// resource server the token was issued for).
    pub forward_authorization: Option<bool>,
    /// The audience (resource) the upstream's tokens are issued for.
    pub audience: Option<String>,
    /// Requests this upstream may have in flight through the gateway (503 above); default unlimited.
    pub max_concurrent_requests: Option<usize>,
    /// A program speaking MCP on stdin/stdout, as argv (no shell), instead of `url` (DESIGN §12).
    pub command: Option<Vec<String>>,
    /// The program's working directory.
    pub cwd: Option<String>,
    /// The program's environment, by name: `{ value = "…" }` (not secret),
    /// `{ value_env = "VAR" }` or `{ value_file = "path" }`.
    pub env: Option<BTreeMap<String, toml::Value>>,
    /// Live processes of this upstream, spares and stopping ones included (default 16).
    pub max_processes: Option<usize>,
    /// An idle process is stopped after this long (default: `[pool] idle_timeout_ms`).
    pub process_idle_timeout_ms: Option<u64>,
    /// Spawn to a completed `initialize` (default 30 s).
    pub start_timeout_ms: Option<u64>,
    /// Processes spawned ahead (not yet initialized), claimed by the next key that needs one.
    pub spare_processes: Option<usize>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRoute {
    /// The MCP endpoint path on the gateway, e.g. "/mcp".
    pub path: String,
    /// The one upstream the route fronts (or `members`).
    pub upstream: Option<String>,
    /// A federated route's upstreams (DESIGN §11), instead of `upstream`.
    pub members: Option<Vec<String>>,
    /// How long a federated list waits for a member (default 5 s).
    pub federation_list_timeout_ms: Option<u64>,
    /// `ttlMs` on cacheable results the upstream leaves unset (default 0).
    pub ttl_ms: Option<u64>,
    /// `cacheScope` on cacheable results ("private" by default, or "public").
    pub cache_scope: Option<String>,
    /// "park" (default: a paused call waits in this replica) or "replay"
    /// (nothing is parked; the retry re-runs the call with the answers so far).
    pub continuity: Option<String>,
    /// Tools run in replay mode on a "park" route.
    pub replay_tools: Option<Vec<String>>,
    /// How long a replay-mode `requestState` stays usable (default 60 s).
    pub replay_ttl_ms: Option<u64>,
    /// Requests one principal may make on this route (429 above); default unlimited.
    pub rate_limit: Option<RawRateLimit>,
    /// Calls of one tool one principal may make on this route, by tool name.
    pub tool_rate_limits: Option<BTreeMap<String, RawRateLimit>>,
    /// Route by Host header: not supported yet.
    pub host: Option<String>,
    /// How long the gateway keeps a discover answer (default 60 s).
    pub discover_ttl_ms: Option<u64>,
    /// The authentication policy (an `[auth.<name>]`); none when absent.
    pub auth: Option<String>,
    /// CORS for this route, instead of `[server.cors]`.
    pub cors: Option<RawCors>,
    /// Authorization rules (`[[routes.rules]]`), the first match decides.
    #[serde(default)]
    pub rules: Vec<RawRule>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRule {
    /// "allow" or "deny".
    pub effect: String,
    /// Patterns (`*` matches any run of characters) of what it names.
    #[serde(default)]
    pub tools: Vec<String>,
    #[serde(default)]
    pub prompts: Vec<String>,
    #[serde(default)]
    pub resources: Vec<String>,
    /// Whom it applies to (any of these; none: everyone).
    #[serde(default)]
    pub principals: Vec<String>,
    #[serde(default)]
    pub groups: Vec<String>,
    #[serde(default)]
    pub scopes: Vec<String>,
}

/// `{ per_minute = 600, burst = 60 }`: a sustained rate, and how many
/// requests may come at once.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRateLimit {
    pub per_minute: u32,
    /// Default: `per_minute` (a whole minute's allowance at once).
    pub burst: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPool {
    pub max_sessions: Option<usize>,
    pub idle_timeout_ms: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLimits {
    pub max_body_bytes: Option<usize>,
    pub max_upstream_response_bytes: Option<usize>,
    pub max_concurrent_requests: Option<usize>,
    /// Request body bytes all requests may hold at once.
    pub max_buffered_body_bytes: Option<usize>,
    pub max_listen_streams: Option<usize>,
    /// Long-lived streams one principal may hold.
    pub max_listen_streams_per_principal: Option<usize>,
    /// Calls paused on a question for the user (MRTR), at most.
    pub max_parked_flows: Option<usize>,
    /// How long a paused call waits for the client's retry.
    pub parked_flow_ttl_ms: Option<u64>,
    /// Paused calls one principal may hold.
    pub max_parked_flows_per_principal: Option<usize>,
    /// Pooled upstream sessions one principal may hold.
    pub max_sessions_per_principal: Option<usize>,
    /// Open client connections; over it the gateway stops accepting.
    pub max_connections: Option<usize>,
    /// Principals each rate limit tracks one by one; beyond, new ones share one allowance.
    pub max_rate_limit_keys: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLegacy {
    /// How long a legacy client's session id (a sealed token) stays valid.
    pub session_ttl_ms: Option<u64>,
    /// New legacy sessions per minute, on this replica.
    pub max_new_sessions_per_minute: Option<u32>,
    /// New legacy sessions per minute one principal may open, on this replica.
    pub max_new_sessions_per_principal_per_minute: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawKey {
    pub id: String,
    /// Environment variable holding the key (base64url, 32 bytes).
    pub env: Option<String>,
    /// File holding the key (base64url, 32 bytes).
    pub file: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCluster {
    /// This replica's name; default: $SESSIONLESS_INSTANCE_ID, then $HOSTNAME.
    pub instance_id: Option<String>,
    /// Where the internal listener (forwarded retries) binds.
    pub internal_listen: String,
    /// The address other replicas reach it at; default: $SESSIONLESS_ADVERTISE_ADDR,
    /// then `internal_listen` (for Kubernetes: the pod IP and port).
    pub advertise: Option<String>,
    /// The shared secret that forwarded retries are signed with (HMAC), from
    /// the environment or a file; several, comma-separated, while rotating
    /// (the first signs, every one verifies).
    pub secret_env: Option<String>,
    pub secret_file: Option<String>,
    /// Time allowed to reach the owner replica before the retry is handled here.
    pub connect_timeout_ms: Option<u64>,
    /// TLS between replicas: the internal listener's certificate chain and
    /// key (PEM), and the CA (PEM) a forwarding replica verifies owners
    /// against. All three or none.
    pub tls_cert_file: Option<String>,
    pub tls_key_file: Option<String>,
    pub tls_ca_file: Option<String>,
    /// The name owners' certificates are checked for; default: the host of
    /// the owner's advertised address.
    pub tls_server_name: Option<String>,
}
