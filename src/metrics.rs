//! Prometheus metrics: one `Metrics` struct registered once into a registry
//! that the gateway owns (no globals). Labels are bounded: route paths come
//! from the config, methods from a fixed set, outcomes from error reasons.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Request duration buckets, seconds: sub-millisecond proxying up to long tool calls.
pub const DURATION_BUCKETS: [f64; 14] =
    [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0, 120.0];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub route: String,
    pub method: &'static str,
    /// The client's generation.
    pub generation: &'static str,
    /// The upstream's generation.
    pub upstream: &'static str,
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MethodLabels {
    pub route: String,
    pub method: std::borrow::Cow<'static, str>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    pub route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UpstreamLabels {
    pub route: String,
    /// The upstream instance (its URL).
    pub instance: String,
    pub status: &'static str,
}

/// A federated route's member.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MemberLabels {
    pub route: String,
    pub member: String,
}

/// A federated route's member and how one exchange with it ended.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MemberOutcomeLabels {
    pub route: String,
    pub member: String,
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SpawnLabels {
    pub upstream: String,
    /// `started`, `exited`, `start_timeout`, `spawn_error`, `refused`, `backoff`.
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UpstreamNameLabels {
    pub upstream: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct InstanceLabels {
    pub route: String,
    pub upstream: String,
    /// The upstream instance (its URL).
    pub instance: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub route: String,
    pub reason: &'static str,
}

/// The internal listener's refusals (cluster mode): no route label, the
/// request was refused before its route was trusted.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusedLabels {
    pub reason: &'static str,
}

/// An outcome alone (configuration reloads: applied or rejected).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeOnlyLabels {
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HeaderLabels {
    pub header: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EndedLabels {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QuotaLabels {
    pub route: String,
    pub quota: &'static str,
}

/// A rate limit of a route: `principal`, `tool` or `overflow` (see `crate::ratelimit`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RateLimitLabels {
    pub route: String,
    pub limit: &'static str,
}

/// A route's upstream, as a whole (all its instances).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteUpstreamLabels {
    pub route: String,
    pub upstream: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpenedLabels {
    pub route: String,
    /// The version the client asked for at `initialize` (a bounded set):
    /// `2026-07-28` is a modern client that fell back to the legacy handshake.
    pub requested: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GenerationLabels {
    pub route: String,
    pub upstream: String,
    pub generation: &'static str,
}

/// A tool on the latency allowlist (`[telemetry] latency_tools`): the
/// config bounds the label's values.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ToolLabels {
    pub route: String,
    pub tool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    pub version: &'static str,
    /// Cargo features that change what the binary can do (`otlp`), comma-separated.
    pub features: &'static str,
}

type HistogramFamily = Family<MethodLabels, Histogram, fn() -> Histogram>;

#[derive(Clone)]
pub struct Metrics {
    pub requests: Family<RequestLabels, Counter>,
    pub request_duration: HistogramFamily,
    pub upstream_requests: Family<UpstreamLabels, Counter>,
    pub sessions_open: Family<RouteLabels, Gauge>,
    pub sessions_initialized: Family<RouteLabels, Counter>,
    pub sessions_expired: Family<RouteLabels, Counter>,
    pub sessions_reinitialized: Family<RouteLabels, Counter>,
    pub sessions_closed: Family<ReasonLabels, Counter>,
    pub stale_headers_dropped: Family<HeaderLabels, Counter>,
    pub upstream_requests_declined: Family<MethodLabels, Counter>,
    pub upstream_cancellations: Family<RouteLabels, Counter>,
    pub request_state_rejected: Family<ReasonLabels, Counter>,
    pub listen_streams_open: Family<RouteLabels, Gauge>,
    pub mrtr_rounds: Family<MethodLabels, Counter>,
    pub parked_flows_open: Gauge,
    pub parked_flows_expired: Family<RouteLabels, Counter>,
    pub client_connections_open: Gauge,
    pub client_connections_ended: Family<EndedLabels, Counter>,
    pub quota_exceeded: Family<QuotaLabels, Counter>,
    pub rate_limited: Family<RateLimitLabels, Counter>,
    pub rate_limit_keys: Family<RateLimitLabels, Gauge>,
    pub upstream_breaker_open: Family<RouteUpstreamLabels, Gauge>,
    pub upstream_busy: Family<RouteUpstreamLabels, Counter>,
    pub internal_refused: Family<RefusedLabels, Counter>,
    pub legacy_sessions_opened: Family<OpenedLabels, Counter>,
    pub session_tokens_rejected: Family<ReasonLabels, Counter>,
    pub upstream_generation: Family<GenerationLabels, Gauge>,
    pub upstream_instance_up: Family<InstanceLabels, Gauge>,
    pub stdio_spawns: Family<SpawnLabels, Counter>,
    pub stdio_processes: Family<UpstreamNameLabels, Gauge>,
    pub federation_member_up: Family<MemberLabels, Gauge>,
    pub federation_member_requests: Family<MemberOutcomeLabels, Counter>,
    pub questions_pushed: Family<MethodLabels, Counter>,
    pub auth_failures: Family<ReasonLabels, Counter>,
    pub answers_routed: Family<ReasonLabels, Counter>,
    pub config_reloads: Family<OutcomeOnlyLabels, Counter>,
    pub config_restart_required: Gauge,
    pub config_last_reload: Gauge,
    pub tool_call_duration: Family<ToolLabels, Histogram, fn() -> Histogram>,
    pub build_info: Family<BuildLabels, Gauge>,
}

fn duration_histogram() -> Histogram {
    Histogram::new(DURATION_BUCKETS)
}

impl Metrics {
    pub fn register(registry: &mut Registry) -> Metrics {
        let m = Metrics {
            requests: Family::default(),
            request_duration: Family::new_with_constructor(duration_histogram),
            upstream_requests: Family::default(),
            sessions_open: Family::default(),
            sessions_initialized: Family::default(),
            sessions_expired: Family::default(),
            sessions_reinitialized: Family::default(),
            sessions_closed: Family::default(),
            stale_headers_dropped: Family::default(),
            upstream_requests_declined: Family::default(),
            upstream_cancellations: Family::default(),
            request_state_rejected: Family::default(),
            listen_streams_open: Family::default(),
            mrtr_rounds: Family::default(),
            parked_flows_open: Gauge::default(),
            parked_flows_expired: Family::default(),
            client_connections_open: Gauge::default(),
            client_connections_ended: Family::default(),
            quota_exceeded: Family::default(),
            rate_limited: Family::default(),
            rate_limit_keys: Family::default(),
            upstream_breaker_open: Family::default(),
            upstream_busy: Family::default(),
            internal_refused: Family::default(),
            legacy_sessions_opened: Family::default(),
            session_tokens_rejected: Family::default(),
            upstream_generation: Family::default(),
            upstream_instance_up: Family::default(),
            stdio_spawns: Family::default(),
            stdio_processes: Family::default(),
            federation_member_up: Family::default(),
            federation_member_requests: Family::default(),
            questions_pushed: Family::default(),
            auth_failures: Family::default(),
            answers_routed: Family::default(),
            config_reloads: Family::default(),
            config_restart_required: Gauge::default(),
            config_last_reload: Gauge::default(),
            tool_call_duration: Family::new_with_constructor(duration_histogram),
            build_info: Family::default(),
        };
        let features = if cfg!(feature = "otlp") { "otlp" } else { "" };
        m.build_info.get_or_create(&BuildLabels { version: env!("CARGO_PKG_VERSION"), features }).set(1);
        let r = registry.sub_registry_with_prefix("sessionless");
        r.register("requests", "Client requests by generation and outcome", m.requests.clone());
        r.register(
            "request_duration_seconds",
            "Time from request to the last byte of the answer",
            m.request_duration.clone(),
        );
        r.register(
            "upstream_requests",
            "HTTP requests sent upstream by status class",
            m.upstream_requests.clone(),
        );
        r.register("upstream_sessions_open", "Legacy upstream sessions held", m.sessions_open.clone());
        r.register("upstream_sessions_initialized", "Legacy sessions opened", m.sessions_initialized.clone());
        r.register("upstream_sessions_expired", "Upstream 404s on a session", m.sessions_expired.clone());
        r.register(
            "upstream_sessions_reinitialized",
            "Requests resent on a fresh session after a 404",
            m.sessions_reinitialized.clone(),
        );
        r.register("upstream_sessions_closed", "Sessions closed, by reason", m.sessions_closed.clone());
        r.register(
            "stale_session_headers_dropped",
            "Mcp-Session-Id / Last-Event-ID headers dropped from modern requests",
            m.stale_headers_dropped.clone(),
        );
        r.register(
            "upstream_requests_declined",
            "Server-initiated upstream requests declined on the client's behalf",
            m.upstream_requests_declined.clone(),
        );
        r.register(
            "upstream_cancellations",
            "notifications/cancelled sent upstream after a client went away",
            m.upstream_cancellations.clone(),
        );
        r.register(
            "request_state_rejected",
            "requestState values rejected, by reason",
            m.request_state_rejected.clone(),
        );
        r.register("listen_streams_open", "subscriptions/listen streams open", m.listen_streams_open.clone());
        r.register("mrtr_rounds", "input_required rounds sent to clients", m.mrtr_rounds.clone());
        r.register("parked_flows_open", "Upstream calls paused on a question", m.parked_flows_open.clone());
        r.register(
            "parked_flows_expired",
            "Paused calls whose retry never came (questions declined upstream)",
            m.parked_flows_expired.clone(),
        );
        r.register("client_connections_open", "Client connections open", m.client_connections_open.clone());
        r.register(
            "client_connections_ended",
            "Client connections the gateway ended: slow request head or idle",
            m.client_connections_ended.clone(),
        );
        r.register(
            "quota_exceeded",
            "Requests refused or questions declined because a per-principal quota was reached",
            m.quota_exceeded.clone(),
        );
        r.register(
            "rate_limited",
            "Requests refused with 429 by a route's rate limit: principal, tool, or overflow (principals beyond the ones tracked)",
            m.rate_limited.clone(),
        );
        r.register(
            "rate_limit_keys",
            "Principals tracked one by one by a route's rate limits (route limit; all tool limits), as of the last sweep",
            m.rate_limit_keys.clone(),
        );
        r.register(
            "upstream_breaker_open",
            "1 while every instance of a route's upstream is down and confirmed by a probe: new work gets 503 without a connection attempt",
            m.upstream_breaker_open.clone(),
        );
        r.register(
            "upstream_busy",
            "Requests refused with 503 because the upstream had max_concurrent_requests in flight",
            m.upstream_busy.clone(),
        );
        r.register(
            "internal_refused",
            "Requests refused by the internal listener (cluster mode), by reason",
            m.internal_refused.clone(),
        );
        r.register(
            "legacy_sessions_opened",
            "Legacy client sessions opened (relayed initialize), by the version the client asked for",
            m.legacy_sessions_opened.clone(),
        );
        r.register(
            "legacy_session_tokens_rejected",
            "Legacy session ids refused with 404, by reason",
            m.session_tokens_rejected.clone(),
        );
        r.register(
            "upstream_generation",
            "1 for what each upstream was found (or configured) to speak: unknown, legacy, modern, refused",
            m.upstream_generation.clone(),
        );
        r.register(
            "upstream_instance_up",
            "1 while an upstream instance takes new work, 0 from a failed connection until a probe finds it answering",
            m.upstream_instance_up.clone(),
        );
        r.register(
            "stdio_spawns",
            "Starts of stdio upstream processes by outcome: started (initialize answered), exited, \
             start_timeout, spawn_error, refused (initialize refused), backoff (not spawned: the command \
             keeps failing)",
            m.stdio_spawns.clone(),
        );
        r.register(
            "stdio_processes",
            "Live processes of a stdio upstream: spares and stopping ones included, until reaped",
            m.stdio_processes.clone(),
        );
        r.register(
            "federation_member_up",
            "1 while a federated route's member answers, 0 from a failed or timed-out call or list until one succeeds",
            m.federation_member_up.clone(),
        );
        r.register(
            "federation_member_requests",
            "Calls and lists a federated route sent to each member, by outcome (ok, or the error's reason)",
            m.federation_member_requests.clone(),
        );
        r.register(
            "legacy_questions_pushed",
            "Questions of a 2026 upstream (input_required) pushed to legacy clients as server requests, by method",
            m.questions_pushed.clone(),
        );
        r.register(
            "auth_failures",
            "Requests refused by authentication (401, by reason) or authorization (403 insufficient_scope)",
            m.auth_failures.clone(),
        );
        r.register(
            "legacy_answers_routed",
            "Legacy clients' answers to pushed questions, by where they went: here, forwarded, received (from another replica), no_round, owner_gone, no_owner",
            m.answers_routed.clone(),
        );
        r.register(
            "config_reloads",
            "Configuration reloads (file change or SIGHUP), by outcome: applied, or rejected (the running configuration stays)",
            m.config_reloads.clone(),
        );
        r.register(
            "config_restart_required",
            "1 when the last applied reload changed settings that only a restart applies (listeners, cluster, limits)",
            m.config_restart_required.clone(),
        );
        r.register(
            "config_last_reload_success_timestamp_seconds",
            "Unix time the configuration was last loaded: at start, then by each applied reload",
            m.config_last_reload.clone(),
        );
        r.register(
            "tool_call_duration_seconds",
            "tools/call time to the last byte of the answer, for the tools on the latency allowlist",
            m.tool_call_duration.clone(),
        );
        r.register(
            "build_info",
            "1, labelled with the version and features of this build",
            m.build_info.clone(),
        );
        m
    }

    pub fn route(route: &str) -> RouteLabels {
        RouteLabels { route: route.to_string() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_the_prefix() {
        let mut reg = Registry::default();
        let m = Metrics::register(&mut reg);
        m.requests
            .get_or_create(&RequestLabels {
                route: "/mcp".into(),
                method: "tools/call",
                generation: "modern",
                upstream: "legacy",
                outcome: "ok",
            })
            .inc();
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &reg).unwrap();
        assert!(out.contains("sessionless_requests_total{"), "{out}");
    }
}
