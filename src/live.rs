//! The live configuration (issue 14): the part of the gateway a reload
//! replaces at once — the routes with their upstream handles, the auth
//! verifiers, the listener's certificate, and the settings read per
//! request — and the reload itself. The configuration is plain values
//! (DESIGN §10); each generation's runtime objects are built here from it,
//! by the modules that own them, off the async workers on a reload.
//!
//! A reload parses and validates the new file, builds the next [`Live`]
//! beside the current one (carrying over each unchanged upstream's
//! instances, probed generation and rate limits), then swaps it in with one
//! atomic store. A request keeps the route it was given (its upstream
//! handles included) until it ends, so in-flight requests and parked flows
//! are untouched. A route the new
//! file removes stays reachable for the retries of calls parked on it, for
//! as long as a parked flow may live, and for nothing else.
//!
//! Settings sized into the running process (listeners, TLS on or off,
//! cluster, limits, connection limits, pool, legacy session quotas, timers,
//! the OTLP exporter) are not applied: the reload says they need a
//! restart, and keeps the running ones. A new certificate pair is.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::auth::Auth;
use crate::bridge::{Target, Targets};
use crate::config::Config;
use crate::metrics::Metrics;
use crate::seal::Sealer;

/// One generation of the configuration.
pub struct Live {
    pub config: Arc<Config>,
    pub targets: Arc<Targets>,
    pub auth: Arc<Auth>,
    /// The public listener's pair (`[server.tls]`), built.
    pub tls: Option<crate::tls::ServerTls>,
    /// Routes removed by a reload, kept for the retries of calls parked on them.
    retired: Vec<Retired>,
    /// Whether some route names a host (lookups then need the request's).
    by_host: bool,
    /// Ends this generation's tasks (health probes, rate-limit sweeps,
    /// JWKS refreshes) once it is replaced, or with the gateway.
    tasks: CancellationToken,
}

/// A route removed by a reload: served, with the verifiers of the
/// generation it came from, for the retries of calls parked on it until
/// `until`.
#[derive(Clone)]
struct Retired {
    target: Arc<Target>,
    auth: Arc<Auth>,
    until: Instant,
}

/// A route found for a request.
pub struct Found {
    pub target: Arc<Target>,
    /// Removed by a reload: only the retry of a call parked on it is served,
    /// checked by the verifiers it had (its policy may be gone now).
    pub retired: Option<Arc<Auth>>,
}

impl Live {
    /// The first generation.
    pub fn new(config: Config, metrics: &Metrics, stop: &CancellationToken) -> Result<Live, String> {
        let targets = Arc::new(Targets::new(&config, metrics)?);
        let auth = Arc::new(Auth::new(&config, metrics.clone(), None)?);
        let tls = server_tls(&config)?;
        Ok(Live::assemble(config, targets, auth, tls, Vec::new(), stop))
    }

    fn assemble(
        config: Config,
        targets: Arc<Targets>,
        auth: Arc<Auth>,
        tls: Option<crate::tls::ServerTls>,
        retired: Vec<Retired>,
        stop: &CancellationToken,
    ) -> Live {
        Live {
            by_host: targets.by_host() || retired.iter().any(|r| r.target.route.host.is_some()),
            config: Arc::new(config),
            targets,
            auth,
            tls,
            retired,
            tasks: stop.child_token(),
        }
    }

    /// The route serving a request for `path`; `host` is asked for only
    /// when some route names a host.
    pub fn route<'a>(&self, host: impl FnOnce() -> Option<&'a str>, path: &str) -> Option<Found> {
        let host = if self.by_host { host().map(crate::config::request_host) } else { None };
        if let Some(target) = self.targets.get(host.as_deref(), path) {
            return Some(Found { target: target.clone(), retired: None });
        }
        if self.retired.is_empty() {
            return None;
        }
        let now = Instant::now();
        let retired: Vec<_> = self.retired.iter().filter(|r| r.until > now).collect();
        let r = crate::config::route_for(&retired, host.as_deref(), path, |r| &r.target.route)?;
        Some(Found { target: r.target.clone(), retired: Some(r.auth.clone()) })
    }

    /// The route of `id` (as sealed or forwarded by another replica),
    /// retired ones included.
    pub fn route_by_id(&self, id: &str) -> Option<Found> {
        if let Some(target) = self.targets.by_id(id) {
            return Some(Found { target: target.clone(), retired: None });
        }
        let now = Instant::now();
        self.retired
            .iter()
            .find(|r| r.target.route.id == id && r.until > now)
            .map(|r| Found { target: r.target.clone(), retired: Some(r.auth.clone()) })
    }

    /// Starts this generation's background tasks: the health probes of
    /// down instances, the rate limits' sweep, the JWKS refreshes, and the
    /// first probe of every upstream whose generation is not known yet.
    pub fn start(&self) {
        let stop = &self.tasks;
        for target in self.targets.onto_upstreams() {
            if target.detected.known().is_none() {
                let target = target.clone();
                tokio::spawn(async move { target.generation().await });
            }
        }
        tokio::spawn(self.targets.clone().sweep_rate_limits(stop.clone()));
        tokio::spawn(self.targets.clone().watch(stop.clone()));
        for verifier in self.auth.verifiers() {
            tokio::spawn(verifier.clone().run_refresh(stop.clone()));
        }
    }

    /// Ends this generation's tasks (it was replaced).
    fn retire(&self) {
        self.tasks.cancel();
    }
}

/// What a reload did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Reloaded {
    /// Route ids added, removed, and changed.
    pub added: Vec<String>,
    pub removed: Vec<String>,
    pub changed: Vec<String>,
    /// Whether the sealing keys changed.
    pub keys: bool,
    /// Settings that changed in the file but need a restart (kept as running).
    pub needs_restart: Vec<&'static str>,
}

impl std::fmt::Display for Reloaded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let list = |v: &[String]| if v.is_empty() { "none".to_string() } else { v.join(" ") };
        write!(
            f,
            "routes added: {}; removed: {}; changed: {}; sealing keys {}",
            list(&self.added),
            list(&self.removed),
            list(&self.changed),
            if self.keys { "replaced" } else { "unchanged" }
        )?;
        if !self.needs_restart.is_empty() {
            write!(f, "; need a restart (running values kept): {}", self.needs_restart.join(", "))?;
        }
        Ok(())
    }
}

/// The settings of `next` a reload cannot apply, named; `next` gets the
/// running values for them, so that the live config says what runs.
fn keep_running(current: &Config, next: &mut Config) -> Vec<&'static str> {
    let mut changed = Vec::new();
    macro_rules! keep {
        ($($field:ident),*) => {$(
            if current.$field != next.$field {
                changed.push(stringify!($field));
                next.$field = current.$field.clone();
            }
        )*};
    }
    keep!(listen, drain_timeout, keepalive_interval, connections, pool, limits, legacy);
    // The span exporter is started once (readiness and latency_tools are read per request).
    if current.telemetry.otlp != next.telemetry.otlp {
        changed.push("telemetry.otlp");
        next.telemetry.otlp = current.telemetry.otlp.clone();
    }
    if !same_cluster(current, next) {
        changed.push("cluster");
    }
    next.cluster = current.cluster.clone();
    if next.tls.is_some() != current.tls.is_some() {
        // The listener was bound with TLS or without.
        changed.push(if current.tls.is_some() { "server.tls (removed)" } else { "server.tls (added)" });
        next.tls = current.tls.clone();
    }
    if next.keys.is_empty() && !current.keys.is_empty() {
        // An ephemeral key would strand every sealed value, on every replica.
        changed.push("keys (all removed)");
        next.keys = current.keys.clone();
    }
    changed
}

/// Cluster settings compared as written (TLS material is compared by
/// whether it is there; changed certificate files need a restart).
fn same_cluster(a: &Config, b: &Config) -> bool {
    match (&a.cluster, &b.cluster) {
        (None, None) => true,
        (Some(a), Some(b)) => {
            a.instance_id == b.instance_id
                && a.internal_listen == b.internal_listen
                && a.advertise == b.advertise
                && a.secrets == b.secrets
                && a.connect_timeout == b.connect_timeout
                && a.tls.is_some() == b.tls.is_some()
        }
        _ => false,
    }
}

/// Builds the generation after `current` from `next`. Nothing is applied
/// yet: the caller swaps it in (then calls [`commit`]).
pub fn prepare(
    current: &Live,
    mut next: Config,
    metrics: &Metrics,
    stop: &CancellationToken,
) -> Result<(Live, Reloaded), String> {
    let needs_restart = keep_running(&current.config, &mut next);
    let auth = Arc::new(Auth::new(&next, metrics.clone(), Some(&current.auth))?);
    let targets = Arc::new(Targets::carry(&next, metrics, Some(&current.targets))?);
    let tls = server_tls(&next)?;
    let mut report = Reloaded { needs_restart, keys: next.keys != current.config.keys, ..Default::default() };
    for t in targets.all() {
        match current.targets.by_id(&t.route.id) {
            None => report.added.push(t.route.id.clone()),
            Some(old) if *old.route != *t.route => report.changed.push(t.route.id.clone()),
            Some(_) => {}
        }
    }
    // Removed routes: kept for their parked flows' retries; earlier
    // retirees until their own deadline, unless the route came back.
    let until = Instant::now() + current.config.limits.parked_flow_ttl + RETIRED_SLACK;
    let mut retired: Vec<Retired> = current
        .retired
        .iter()
        .filter(|r| r.until > Instant::now() && targets.by_id(&r.target.route.id).is_none())
        .cloned()
        .collect();
    for t in current.targets.all() {
        if targets.by_id(&t.route.id).is_none() {
            report.removed.push(t.route.id.clone());
            retired.push(Retired { target: t.clone(), auth: current.auth.clone(), until });
        }
    }
    Ok((Live::assemble(next, targets, auth, tls, retired, stop), report))
}

/// After the swap: the new generation's tasks start, the old one's end,
/// the sealer takes the new keys, and the listener the new certificate.
/// Returns the stdio fleets the new generation no longer uses (retired:
/// each process stops once idle).
pub fn commit(
    old: &Live,
    new: &Live,
    sealer: &Sealer,
    certs: Option<&crate::tls::Certs>,
) -> Vec<Arc<crate::upstream::stdio::Fleet>> {
    new.start();
    old.retire();
    let retired = new.targets.retire_fleets_of(&old.targets);
    if new.config.keys != old.config.keys {
        sealer.replace(new.config.keys.clone());
    }
    if let (Some(certs), Some(tls)) = (certs, &new.tls) {
        certs.swap(tls);
    }
    retired
}

/// The listener's pair, built from the configuration's chain and key.
fn server_tls(config: &Config) -> Result<Option<crate::tls::ServerTls>, String> {
    config.tls.as_ref().map(crate::tls::ServerTls::build).transpose()
}

/// What building the gateway from `config` would refuse that validating
/// it did not (`check-config`): the runtime objects that need no secret,
/// no network and no task — the TLS pairs, the cluster's TLS, the keys of
/// JWKS files. Material `check-config` found absent is not built.
pub fn check(config: &Config) -> Result<(), String> {
    server_tls(config)?;
    if let Some(tls) = config.cluster.as_ref().and_then(|c| c.tls.as_ref()) {
        crate::cluster::tls::ClusterTls::build(tls)?;
    }
    crate::auth::check(config)
}

/// A retired route outlives its last possible parked flow by this much.
const RETIRED_SLACK: Duration = Duration::from_secs(5);
