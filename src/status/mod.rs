//! `/status`: what the gateway runs and how its upstreams are doing, for a
//! person (HTML, server-rendered, no script, no external asset) or a
//! program (JSON with `Accept: application/json`). Read from what the
//! gateway keeps anyway (the live routing table, instance health, metric
//! handles) plus two small records of its own: recent errors per upstream
//! ([`Recent`]) and the reloads ([`Reloads`]). Who may read it is checked
//! by the server (`[server] status_allowed`, the Host rule of
//! [`crate::guard::ops_host`]) before anything here runs.

mod html;
pub mod recent;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use http::{HeaderMap, StatusCode};
use serde::Serialize;

pub use recent::Recent;

use crate::bridge::Target;
use crate::config::{Continuity, UpstreamGeneration};
use crate::live::{Live, Reloaded};
use crate::metrics::{Metrics, RouteLabels, SpawnLabels, UpstreamLabels};
use crate::reply::{self, Body};
use crate::upstream::Channel as _;

/// The whole page, as JSON has it.
#[derive(Debug, Serialize)]
pub struct Page {
    pub version: &'static str,
    /// Unix time the gateway started, and seconds since.
    pub started_at: u64,
    pub uptime_s: u64,
    /// Shutting down: new calls are refused while paused ones finish.
    pub draining: bool,
    pub listeners: Vec<Bound>,
    pub config: ConfigState,
    /// Calls paused on a question for the user, held in this replica.
    pub parked_flows: usize,
    /// Upstream sessions (and stdio processes' sessions) in the pool.
    pub pooled_sessions: usize,
    pub client_connections: i64,
    pub routes: Vec<RouteState>,
}

/// A listener the gateway bound.
#[derive(Debug, Clone, Serialize)]
pub struct Bound {
    /// `public` (clients, these pages) or `internal` (cluster forwarding).
    pub kind: &'static str,
    pub address: SocketAddr,
    pub tls: bool,
}

/// The configuration's generation and its reloads.
#[derive(Debug, Clone, Serialize)]
pub struct ConfigState {
    /// 1 at start, one more per applied reload.
    pub generation: u64,
    /// Unix time the running configuration was loaded.
    pub loaded_at: u64,
    pub reloads_applied: u64,
    pub reloads_rejected: u64,
    /// The last reload, applied or not; none since start.
    pub last_reload: Option<LastReload>,
}

#[derive(Debug, Clone, Serialize)]
pub struct LastReload {
    pub at: u64,
    /// `applied` or `rejected` (the running configuration stayed).
    pub outcome: &'static str,
    /// What changed, or why it was rejected.
    pub detail: String,
    /// Settings the reload could not apply (a restart does).
    pub needs_restart: Vec<&'static str>,
}

#[derive(Debug, Serialize)]
pub struct RouteState {
    /// Its id in metrics and logs: the path, or host and path.
    pub route: String,
    pub path: String,
    pub host: Option<String>,
    /// The auth policy's name; none: anyone may call.
    pub auth: Option<String>,
    pub continuity: &'static str,
    pub federated: bool,
    /// Its upstream, or a federated route's members in order.
    pub upstreams: Vec<UpstreamState>,
}

#[derive(Debug, Serialize)]
pub struct UpstreamState {
    pub name: String,
    /// `http` or `stdio`.
    pub kind: &'static str,
    /// A stdio upstream's program (its file name; arguments are not shown).
    pub command: Option<String>,
    /// A stdio upstream's live processes (spares and stopping ones included), and its cap.
    pub processes: Option<usize>,
    pub max_processes: Option<usize>,
    /// What it speaks: `legacy`, `modern`, `refused` or `unknown` (not
    /// probed yet, or unreachable).
    pub generation: &'static str,
    /// `auto` (probed) or as configured.
    pub generation_setting: &'static str,
    /// `up` while some instance takes work, else `down`.
    pub state: &'static str,
    /// Every instance down and confirmed by a probe: new work gets 503.
    pub breaker_open: bool,
    pub instances: Vec<InstanceState>,
    pub instances_up: usize,
    pub instances_down: usize,
    /// Its sessions in the pool.
    pub pooled_sessions: i64,
    /// Client requests it failed (unreachable, timed out, invalid answer,
    /// breaker open, start failed…) in the last five minutes.
    pub errors_last_5m: u64,
    /// HTTP upstreams: requests sent, by status class (`2xx`, `404`, `4xx`,
    /// `5xx`) or failure (`timeout`, `connect_error`, `broken`,
    /// `foreign_answer`), all instances, since the gateway started.
    /// Stdio upstreams: process starts by outcome.
    pub requests: BTreeMap<&'static str, u64>,
}

#[derive(Debug, Serialize)]
pub struct InstanceState {
    /// Its URL, or `stdio:<upstream>`.
    pub instance: String,
    pub up: bool,
}

/// The reloads since start: what `/status` says about the configuration.
pub struct Reloads(Mutex<ConfigState>);

impl Reloads {
    pub fn new() -> Reloads {
        Reloads(Mutex::new(ConfigState {
            generation: 1,
            loaded_at: crate::seal::unix_now(),
            reloads_applied: 0,
            reloads_rejected: 0,
            last_reload: None,
        }))
    }

    pub fn applied(&self, report: &Reloaded) {
        let mut state = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let at = crate::seal::unix_now();
        state.generation += 1;
        state.reloads_applied += 1;
        state.loaded_at = at;
        let needs_restart = report.needs_restart.clone();
        state.last_reload =
            Some(LastReload { at, outcome: "applied", detail: report.to_string(), needs_restart });
    }

    pub fn rejected(&self, why: &str) {
        let mut state = self.0.lock().unwrap_or_else(|e| e.into_inner());
        state.reloads_rejected += 1;
        let detail = why.chars().take(MAX_DETAIL).collect();
        let at = crate::seal::unix_now();
        state.last_reload = Some(LastReload { at, outcome: "rejected", detail, needs_restart: Vec::new() });
    }

    fn now(&self) -> ConfigState {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Default for Reloads {
    fn default() -> Self {
        Reloads::new()
    }
}

/// A rejected reload's reason is shown up to this many characters.
const MAX_DETAIL: usize = 2000;

/// What the page is made of besides the live configuration.
pub struct Sources<'a> {
    pub live: &'a Live,
    pub metrics: &'a Metrics,
    pub listeners: &'a [Bound],
    pub reloads: &'a Reloads,
    pub started: std::time::SystemTime,
    pub draining: bool,
    pub parked_flows: usize,
    pub pooled_sessions: usize,
}

impl Page {
    pub fn gather(s: &Sources<'_>) -> Page {
        let since = |t: std::time::SystemTime| t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let started_at = since(s.started).as_secs();
        let routes = s.live.targets.all().map(|t| route(t, s.metrics)).collect();
        Page {
            version: env!("CARGO_PKG_VERSION"),
            started_at,
            uptime_s: s.started.elapsed().map(|d| d.as_secs()).unwrap_or_default(),
            draining: s.draining,
            listeners: s.listeners.to_vec(),
            config: s.reloads.now(),
            parked_flows: s.parked_flows,
            pooled_sessions: s.pooled_sessions,
            client_connections: s.metrics.client_connections_open.get(),
            routes,
        }
    }

    /// The page as JSON, or as HTML unless `Accept` names `application/json`.
    pub fn respond(&self, headers: &HeaderMap) -> http::Response<Body> {
        let mut resp = if wants_json(headers) {
            let body = serde_json::to_string_pretty(self).unwrap_or_default();
            reply::text(StatusCode::OK, "application/json", body + "\n")
        } else {
            let mut resp = reply::text(StatusCode::OK, "text/html; charset=utf-8", html::render(self));
            let h = resp.headers_mut();
            // No script, no frame, nothing fetched from anywhere: the page is inert.
            h.insert(http::header::CONTENT_SECURITY_POLICY, http::HeaderValue::from_static(html::CSP));
            h.insert(http::header::X_FRAME_OPTIONS, http::HeaderValue::from_static("DENY"));
            h.insert(http::header::REFERRER_POLICY, http::HeaderValue::from_static("no-referrer"));
            resp
        };
        let h = resp.headers_mut();
        h.insert(http::header::CACHE_CONTROL, http::HeaderValue::from_static("no-store"));
        h.insert(http::header::VARY, http::HeaderValue::from_static("Accept"));
        h.insert(http::header::X_CONTENT_TYPE_OPTIONS, http::HeaderValue::from_static("nosniff"));
        resp
    }
}

/// Whether the client asked for JSON (`Accept: application/json`); a
/// browser's `Accept` does not name it.
fn wants_json(headers: &HeaderMap) -> bool {
    let ranges = headers.get_all(http::header::ACCEPT).into_iter().filter_map(|v| v.to_str().ok());
    ranges.flat_map(|v| v.split(',')).any(|range| {
        let essence = range.split(';').next().unwrap_or("").trim();
        essence.eq_ignore_ascii_case("application/json")
    })
}

fn route(t: &Arc<Target>, metrics: &Metrics) -> RouteState {
    let r = &t.route;
    let upstreams = match t.federated() {
        false => vec![upstream(t, metrics)],
        true => t.members.iter().map(|m| upstream(&m.target, metrics)).collect(),
    };
    RouteState {
        route: r.id.clone(),
        path: r.path.clone(),
        host: r.host.clone(),
        auth: r.auth.as_ref().map(|p| p.name.clone()),
        continuity: match r.continuity {
            Continuity::Park => "park",
            Continuity::Replay => "replay",
        },
        federated: t.federated(),
        upstreams,
    }
}

/// One upstream of a route (its own target: a federated route's member has one).
fn upstream(t: &Target, metrics: &Metrics) -> UpstreamState {
    let u = &t.route.upstream;
    let instances: Vec<InstanceState> = match t.stdio() {
        Some(stdio) => {
            vec![InstanceState { instance: stdio.instance().to_string(), up: stdio.health().is_up() }]
        }
        None => (t.instances().iter())
            .map(|i| InstanceState { instance: i.instance().to_string(), up: i.health().is_up() })
            .collect(),
    };
    let up = instances.iter().filter(|i| i.up).count();
    let generation = match t.detected.known() {
        Some(Ok(g)) => g.as_str(),
        Some(Err(_)) => "refused",
        None => "unknown",
    };
    let pooled = metrics.sessions_open.get(&RouteLabels { route: t.route.id.clone() }).map(|g| g.get());
    UpstreamState {
        name: u.name.clone(),
        kind: if u.stdio.is_some() { "stdio" } else { "http" },
        command: u.stdio.as_ref().map(|c| program_name(&c.argv)),
        processes: t.stdio().map(|s| s.fleet().processes()),
        max_processes: u.stdio.as_ref().map(|c| c.max_processes),
        generation,
        generation_setting: match u.generation {
            UpstreamGeneration::Auto => "auto",
            UpstreamGeneration::Legacy => "legacy",
            UpstreamGeneration::Modern => "modern",
        },
        state: if up > 0 { "up" } else { "down" },
        breaker_open: t.breaker_open(),
        instances_up: up,
        instances_down: instances.len() - up,
        instances,
        pooled_sessions: pooled.unwrap_or(0),
        errors_last_5m: t.errors.count(),
        requests: match t.stdio() {
            Some(_) => spawns(&u.name, metrics),
            None => sent(t, metrics),
        },
    }
}

/// A program's name without its directory (`/usr/bin/python3` → `python3`).
fn program_name(argv: &[String]) -> String {
    let program = argv.first().map(String::as_str).unwrap_or("");
    std::path::Path::new(program).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

/// An HTTP upstream's requests by status, over its instances.
fn sent(t: &Target, metrics: &Metrics) -> BTreeMap<&'static str, u64> {
    const STATUSES: [&str; 8] =
        ["2xx", "404", "4xx", "5xx", "timeout", "connect_error", "broken", "foreign_answer"];
    let mut out = BTreeMap::new();
    for status in STATUSES {
        let n = (t.instances().iter())
            .filter_map(|i| {
                let labels =
                    UpstreamLabels { route: t.route.id.clone(), instance: i.instance().to_string(), status };
                metrics.upstream_requests.get(&labels).map(|c| c.get())
            })
            .sum();
        out.insert(status, n);
    }
    out
}

/// A stdio upstream's process starts by outcome.
fn spawns(name: &str, metrics: &Metrics) -> BTreeMap<&'static str, u64> {
    const OUTCOMES: [&str; 6] = ["started", "exited", "start_timeout", "spawn_error", "refused", "backoff"];
    let get = |outcome| {
        let labels = SpawnLabels { upstream: name.to_string(), outcome };
        metrics.stdio_spawns.get(&labels).map(|c| c.get()).unwrap_or(0)
    };
    OUTCOMES.into_iter().map(|o| (o, get(o))).collect()
}

#[cfg(test)]
mod tests;
