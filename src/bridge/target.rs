//! Resolved routes: each route with the handle of its upstream and what the
//! upstream was found to speak. Built once; a lookup on the request path
//! either finds a target or answers 404, it cannot miss in between.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::Generation;
use crate::config::{Config, LegacyClientMode, Route, UpstreamGeneration};
use crate::error::Error;
use crate::metrics::{GenerationLabels, MemberLabels, Metrics, RouteUpstreamLabels};
use crate::ratelimit::RateLimits;
use crate::upstream::credentials::Credentials;
use crate::upstream::probe::{self, Found};
use crate::upstream::stdio::Fleet;
use crate::upstream::{Channel, SendError, Stdio, Transport};

/// A resolved route: its configuration and the handles of its upstream's instances.
pub struct Target {
    pub route: Arc<Route>,
    /// One client per instance, in the configured order (at least one
    /// for an HTTP upstream; none for a stdio one).
    instances: Arc<[Transport]>,
    /// A stdio upstream's processes (DESIGN §12), instead of instances.
    stdio: Option<Stdio>,
    /// Round-robin position over the instances.
    next: AtomicUsize,
    /// What the upstream speaks (configured, or found by probing).
    pub detected: Arc<Detected>,
    /// The route's rate limits.
    limits: Arc<RateLimits>,
    /// The upstream's `max_concurrent_requests` (shared by its routes).
    slots: Option<Arc<Semaphore>>,
    /// `sessionless_upstream_busy_total` for this route.
    busy: Counter,
    /// `sessionless_upstream_breaker_open`, and what it says.
    breaker: Gauge,
    breaker_was_open: AtomicBool,
    /// The route's request counters and duration histograms, resolved once.
    pub counts: Counts,
    /// Requests the upstream failed lately (for `/status`): kept by a
    /// reload that keeps the upstream.
    pub errors: Arc<crate::status::Recent>,
    /// A federated route's members, in the configured order (DESIGN §11);
    /// empty for a route onto one upstream. A federated target has no
    /// instances of its own.
    pub members: Vec<MemberTarget>,
}

/// A federated route's member: its name (its prefix), its own target, and
/// whether it answered lately (`sessionless_federation_member_up`).
pub struct MemberTarget {
    pub name: String,
    pub target: Arc<Target>,
    pub up: Gauge,
}

/// A request's labels besides its route: client and upstream generation,
/// method, outcome.
pub type CountKey = (Generation, Generation, &'static str, &'static str);

/// Label sets whose handles a route keeps; past this many (an unusual mix
/// of methods and outcomes) the families are asked each time.
const MAX_CACHED_COUNTS: usize = 64;

/// A route's `sessionless_requests_total` counter and request duration
/// histogram per [`CountKey`], taken from their families the first time:
/// counting a request then hashes no label set and copies no route id.
/// Read-mostly: requests share the read lock; a new label set writes once.
#[derive(Default)]
pub struct Counts(RwLock<Vec<(CountKey, Counter, Histogram)>>);

impl Counts {
    /// Counts one request of `route` (the id these handles are labelled with).
    pub fn count(&self, metrics: &Metrics, route: &str, key: CountKey, seconds: f64) {
        {
            let cached = self.0.read().unwrap_or_else(|e| e.into_inner());
            if let Some((_, requests, duration)) = cached.iter().find(|(k, ..)| *k == key) {
                requests.inc();
                duration.observe(seconds);
                return;
            }
        }
        let (client, upstream, method, outcome) = key;
        let labels = crate::metrics::RequestLabels {
            route: route.to_string(),
            method,
            generation: client.as_str(),
            upstream: upstream.as_str(),
            outcome,
        };
        let requests = metrics.requests.get_or_create(&labels).clone();
        let duration_labels =
            crate::metrics::MethodLabels { route: route.to_string(), method: method.into() };
        let duration = metrics.request_duration.get_or_create(&duration_labels).clone();
        requests.inc();
        duration.observe(seconds);
        let mut cached = self.0.write().unwrap_or_else(|e| e.into_inner());
        if cached.len() < MAX_CACHED_COUNTS && !cached.iter().any(|(k, ..)| *k == key) {
            cached.push((key, requests, duration));
        }
    }
}

/// What a request asks of its route, for [`Target::admit`].
#[derive(Debug, Clone, Copy)]
pub struct Ask<'a> {
    /// The tool, for a `tools/call`.
    pub tool: Option<&'a str>,
    /// The retry of a call held in a gateway, waiting for it (a parked
    /// flow's `requestState`): never refused, so that the call is not
    /// stranded; it takes a concurrency slot when one is free.
    pub resumes: bool,
}

impl<'a> Ask<'a> {
    /// A new request: `tool` is `params.name`, kept for `tools/call` only.
    pub fn new(method: &str, tool: Option<&'a str>) -> Ask<'a> {
        Ask { tool: tool.filter(|_| method == "tools/call"), resumes: false }
    }
}

/// A request's slot of its upstream's `max_concurrent_requests`, held as
/// long as its answer.
pub struct Admitted {
    _slot: Option<OwnedSemaphorePermit>,
}

impl Target {
    /// The target of route `r`, taking over from `same` (the old target of
    /// its id, when its upstream and header values did not change) its
    /// instances, what the upstream speaks, its breaker mark and, when they
    /// did not change, its rate limits' state.
    fn carry(
        r: &Arc<Route>,
        config: &Config,
        metrics: &Metrics,
        credentials: &Credentials,
        same: Option<&Arc<Target>>,
        slots: Option<Arc<Semaphore>>,
        fleet: Option<&Arc<Fleet>>,
    ) -> Target {
        let max = config.limits.max_upstream_response_bytes;
        let stdio = fleet.map(|fleet| match same.and_then(|t| t.stdio.as_ref()) {
            Some(kept) if Arc::ptr_eq(kept.fleet(), fleet) => kept.clone(),
            _ => Stdio::new(fleet.clone(), r.upstream.clone(), metrics, &r.id),
        });
        let instances = match same {
            Some(t) => t.instances.clone(),
            None => (r.upstream.urls.iter())
                .map(|url| Transport::new(r.upstream.clone(), url, max, metrics, &r.id, credentials.clone()))
                .collect(),
        };
        let labels = RouteUpstreamLabels { route: r.id.clone(), upstream: r.upstream.name.clone() };
        let breaker = metrics.upstream_breaker_open.get_or_create(&labels).clone();
        let was_open = same.is_some_and(|t| t.breaker_was_open.load(Ordering::Acquire));
        breaker.set(i64::from(was_open));
        let limits = same
            .filter(|t| t.route.rate_limit == r.rate_limit && t.route.tool_rate_limits == r.tool_rate_limits)
            .map(|t| t.limits.clone());
        Target {
            route: r.clone(),
            instances,
            stdio,
            next: AtomicUsize::new(0),
            detected: same
                .map(|t| t.detected.clone())
                .unwrap_or_else(|| Arc::new(Detected::new(r.upstream.generation, metrics.clone(), r))),
            limits: limits
                .unwrap_or_else(|| Arc::new(RateLimits::new(r, config.limits.max_rate_limit_keys, metrics))),
            slots,
            busy: metrics.upstream_busy.get_or_create(&labels).clone(),
            breaker,
            breaker_was_open: AtomicBool::new(was_open),
            counts: Counts::default(),
            errors: same.map(|t| t.errors.clone()).unwrap_or_default(),
            members: Vec::new(),
        }
    }

    /// The target of federated route `r` over its members' targets: no
    /// instances, slots or breaker of its own (each member has them); its
    /// rate limits carried over from `same` when unchanged.
    fn over_members(
        r: &Arc<Route>,
        config: &Config,
        metrics: &Metrics,
        members: Vec<MemberTarget>,
        same: Option<&Arc<Target>>,
    ) -> Target {
        let limits = same
            .filter(|t| t.route.rate_limit == r.rate_limit && t.route.tool_rate_limits == r.tool_rate_limits)
            .map(|t| t.limits.clone());
        // Never probed nor exported: each member has its own, under its own route.
        let unexported = Metrics::register(&mut prometheus_client::registry::Registry::default());
        Target {
            route: r.clone(),
            instances: Arc::from([]),
            stdio: None,
            next: AtomicUsize::new(0),
            detected: Arc::new(Detected::new(r.upstream.generation, unexported, r)),
            limits: limits
                .unwrap_or_else(|| Arc::new(RateLimits::new(r, config.limits.max_rate_limit_keys, metrics))),
            slots: None,
            busy: Counter::default(),
            breaker: Gauge::default(),
            breaker_was_open: AtomicBool::new(false),
            counts: Counts::default(),
            errors: Arc::default(),
            members,
        }
    }

    /// Whether the route fronts several upstreams (its calls go through the federation).
    pub fn federated(&self) -> bool {
        !self.members.is_empty()
    }

    /// The instance for new work: the next one that is up, round-robin.
    /// When none is up, the next one anyway (a down mark may be stale, and
    /// the request gets a clear error if it is not).
    pub fn pick(&self) -> &Transport {
        let n = self.instances.len();
        let start = if n == 1 { 0 } else { self.next.fetch_add(1, Ordering::Relaxed) };
        (0..n)
            .map(|i| &self.instances[(start + i) % n])
            .find(|t| t.health().is_up())
            .unwrap_or(&self.instances[start % n])
    }

    /// The instance named `name` (a URL sealed into a token), if this
    /// route still has it.
    pub fn instance(&self, name: &str) -> Option<&Transport> {
        self.instances.iter().find(|t| t.instance() == name)
    }

    pub fn instances(&self) -> &[Transport] {
        &self.instances
    }

    /// The message channel of the instance named `name`, for the
    /// legacy-session half: an HTTP instance, or a stdio upstream's processes.
    pub fn channel(&self, name: &str) -> Option<&dyn Channel> {
        match &self.stdio {
            Some(stdio) => (stdio.instance() == name).then_some(stdio as &dyn Channel),
            None => self.instance(name).map(|t| t as &dyn Channel),
        }
    }

    /// A stdio upstream's processes, if the route's upstream is one.
    pub fn stdio(&self) -> Option<&Stdio> {
        self.stdio.as_ref()
    }

    /// [`Target::on_instance`] for the legacy-session half: `work` gets the
    /// instance's message channel.
    pub async fn on_channel<'t, T, E, Fut>(
        &'t self,
        work: impl Fn(&'t dyn Channel) -> Fut,
        not_sent: impl Fn(&E) -> bool,
    ) -> (Result<T, E>, &'t dyn Channel)
    where
        Fut: std::future::Future<Output = Result<T, E>>,
    {
        if let Some(stdio) = &self.stdio {
            return (work(stdio).await, stdio);
        }
        let (result, instance) = self.on_instance(|t| work(t), not_sent).await;
        (result, instance)
    }

    /// Runs `work` on the next instance that is up; when it fails without
    /// having sent anything (`not_sent`) and the instance is now down, once
    /// more on the next instance. The result and the instance it came from.
    pub async fn on_instance<'t, T, E, Fut>(
        &'t self,
        work: impl Fn(&'t Transport) -> Fut,
        not_sent: impl Fn(&E) -> bool,
    ) -> (Result<T, E>, &'t Transport)
    where
        Fut: std::future::Future<Output = Result<T, E>>,
    {
        let first = self.pick();
        let result = work(first).await;
        if result.as_ref().is_err_and(&not_sent) && !first.health().is_up() {
            let next = self.pick();
            if !std::ptr::eq(next, first) {
                return (work(next).await, next);
            }
        }
        (result, first)
    }

    /// Admits a request's asks (several for a legacy batch; none for answers
    /// and notifications): refused with 503 while the breaker is open or the
    /// upstream has all its slots in use, with 429 by a rate limit. Asks that
    /// resume a held call are never refused, nor counted.
    pub fn admit(&self, principal: &str, asks: &[Ask<'_>]) -> Result<Admitted, Error> {
        let new_work = asks.iter().any(|a| !a.resumes);
        if new_work && self.breaker_open() {
            return Err(Error::CircuitOpen);
        }
        let slot = match &self.slots {
            Some(slots) if !asks.is_empty() => match slots.clone().try_acquire_owned() {
                Ok(slot) => Some(slot),
                Err(_) if !new_work => None,
                Err(_) => {
                    self.busy.inc();
                    return Err(Error::UpstreamBusy);
                }
            },
            _ => None,
        };
        for ask in asks.iter().filter(|a| !a.resumes) {
            self.limits.check(principal, ask.tool)?;
        }
        Ok(Admitted { _slot: slot })
    }

    /// The circuit breaker: open while every instance is down and a probe
    /// has confirmed it. New work is then refused (503) without a
    /// connection attempt; the health task's probe closes it.
    pub fn breaker_open(&self) -> bool {
        !self.instances.is_empty() && self.instances.iter().all(|i| i.health().is_confirmed_down())
    }

    /// Sets the breaker gauge (the health task, after each round of probes).
    fn export_breaker(&self) {
        let open = self.breaker_open();
        if self.breaker_was_open.swap(open, Ordering::AcqRel) != open {
            self.breaker.set(i64::from(open));
            let (route, upstream) = (&self.route.id, &self.route.upstream.name);
            if open {
                tracing::warn!(%route, %upstream, "every upstream instance is down: new work refused (503)");
            } else {
                tracing::info!(%route, %upstream, "an upstream instance answers: new work accepted again");
            }
        }
    }

    /// The upstream's generation, probing an instance first if it is not known yet.
    pub async fn generation(&self) -> Result<Generation, Error> {
        match self.detected.known() {
            Some(Ok(g)) => Ok(g),
            // A probe is a connection attempt too.
            _ if self.breaker_open() => Err(Error::CircuitOpen),
            // Only a probe takes a turn of the round-robin. Boxed: a probe
            // is an upstream exchange, and every request's future would
            // otherwise have room for one (and be copied with it).
            _ => Box::pin(self.detected.generation(self.pick())).await,
        }
    }

    /// Whether legacy clients are translated into stateless calls (a 2026
    /// upstream that serves only that era, or one configured so) rather
    /// than relayed to the upstream's own session support.
    pub fn translates_legacy(&self) -> bool {
        self.federated()
            || self.route.upstream.legacy_clients == LegacyClientMode::Translate
            || self.detected.modern_only()
    }

    /// Takes note of how a request went: an upstream that could not be
    /// reached (`Error::UpstreamUnreachable`) may come back as another
    /// generation, so it is probed again.
    pub fn observed(&self, unreachable: bool) {
        if unreachable {
            self.detected.suspect();
        }
    }
}

/// One set of slots per upstream with `max_concurrent_requests`, whichever
/// routes use it; the old set while the limit is the same (its permits are
/// in use). Routes of one name share their upstream, so the first of each
/// name stands for all.
fn slots<'a>(config: &'a Config, old: Option<&Targets>) -> HashMap<&'a str, Arc<Semaphore>> {
    let mut old_slots: HashMap<&str, (Option<usize>, Option<&Arc<Semaphore>>)> = HashMap::new();
    for t in old.into_iter().flat_map(Targets::all).flat_map(|t| match t.federated() {
        false => vec![t],
        true => t.members.iter().map(|m| &m.target).collect(),
    }) {
        let u = &t.route.upstream;
        old_slots.entry(u.name.as_str()).or_insert((u.max_concurrent_requests, t.slots.as_ref()));
    }
    let mut slots = HashMap::new();
    let onto_one = config.routes.iter().flat_map(|r| match r.federated() {
        false => vec![r],
        true => r.members.iter().map(|m| &m.route).collect(),
    });
    for u in onto_one.map(|r| &r.upstream) {
        let Some(n) = u.max_concurrent_requests else { continue };
        slots.entry(u.name.as_str()).or_insert_with(|| match old_slots.get(u.name.as_str()) {
            Some((Some(m), Some(kept))) if *m == n => Arc::clone(kept),
            _ => Arc::new(Semaphore::new(n)),
        });
    }
    slots
}

/// One fleet per stdio upstream, whichever routes use it: the old one
/// while its command and environment are the same (its processes carry
/// on), a new one otherwise. The environment's secrets are read here (at
/// start and on each reload); one that cannot be read is an error naming it.
fn fleets<'a>(
    config: &'a Config,
    metrics: &Metrics,
    old: Option<&Targets>,
) -> Result<HashMap<&'a str, Arc<Fleet>>, String> {
    let mut fleets = HashMap::new();
    let onto_one = config.routes.iter().flat_map(|r| match r.federated() {
        false => vec![r],
        true => r.members.iter().map(|m| &m.route).collect(),
    });
    for u in onto_one.map(|r| &r.upstream) {
        let Some(command) = &u.stdio else { continue };
        if fleets.contains_key(u.name.as_str()) {
            continue;
        }
        let env = command.environment().map_err(|e| format!("upstream `{}`: {e}", u.name))?;
        let max_line = config.limits.max_upstream_response_bytes;
        let share = config.limits.max_sessions_per_principal;
        let kept = old.and_then(|o| o.fleet(&u.name)).filter(|f| f.runs(command, &env, max_line, share));
        let fleet = kept.unwrap_or_else(|| Fleet::new(u, command.clone(), env, max_line, share, metrics));
        fleets.insert(u.name.as_str(), fleet);
    }
    Ok(fleets)
}

/// How often down instances are probed.
const HEALTH_INTERVAL: Duration = Duration::from_secs(1);
/// How often rate limits forget the principals whose allowance is whole.
const RATE_LIMIT_SWEEP: Duration = Duration::from_secs(10);
/// The longest a health probe waits for an answer.
const HEALTH_PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// The routing table: every route with its upstream handles, built once,
/// and indexed by id and by path (a request's lookup, and a reload's
/// carrying over, do not scan every route).
pub struct Targets {
    all: Vec<Arc<Target>>,
    by_id: HashMap<String, Arc<Target>>,
    /// The routes of each path, in the file's order.
    by_path: HashMap<String, Vec<Arc<Target>>>,
}

impl Targets {
    /// Reads the upstreams' configured header values: a missing one is an
    /// error naming the upstream, header and variable or file.
    pub fn new(config: &Config, metrics: &Metrics) -> Result<Targets, String> {
        Targets::carry(config, metrics, None)
    }

    /// The routing table of `config` (a reload), carrying over from `old`
    /// what each route of the same id, the same upstream settings and the
    /// same header values already has: its instances (their health marks
    /// and connections), what the upstream speaks, its upstream slots, and
    /// its rate limits' state when they are unchanged. Everything else
    /// starts afresh. Header values are read again (a rotated upstream key),
    /// once per upstream.
    pub fn carry<'a>(
        config: &'a Config,
        metrics: &Metrics,
        old: Option<&Targets>,
    ) -> Result<Targets, String> {
        let slots = slots(config, old);
        let fleets = fleets(config, metrics, old)?;
        let mut credentials: HashMap<&str, Credentials> = HashMap::new();
        let mut all = Vec::with_capacity(config.routes.len());
        let mut onto_one = |r: &'a Arc<Route>| -> Result<Arc<Target>, String> {
            let credentials = match credentials.entry(&r.upstream.name) {
                Entry::Occupied(e) => e.into_mut(),
                Entry::Vacant(e) => e.insert(Credentials::load(&r.upstream)?),
            };
            let fleet = fleets.get(r.upstream.name.as_str());
            let same = old.and_then(|o| o.by_id(&r.id)).filter(|t| {
                t.route.upstream == r.upstream
                    && (t.instances.first().is_some_and(|i| i.credentials() == &*credentials)
                        || t.stdio.as_ref().zip(fleet).is_some_and(|(s, f)| Arc::ptr_eq(s.fleet(), f)))
            });
            let slots = slots.get(r.upstream.name.as_str()).cloned();
            Ok(Arc::new(Target::carry(r, config, metrics, credentials, same, slots, fleet)))
        };
        for r in &config.routes {
            if !r.federated() {
                all.push(onto_one(r)?);
                continue;
            }
            let mut members = Vec::with_capacity(r.members.len());
            for m in &r.members {
                let target = onto_one(&m.route)?;
                let labels = MemberLabels { route: r.id.clone(), member: m.name.clone() };
                let up = metrics.federation_member_up.get_or_create(&labels).clone();
                let was = old.and_then(|o| o.by_id(&m.route.id)).is_some();
                if !was {
                    up.set(1);
                }
                members.push(MemberTarget { name: m.name.clone(), target, up });
            }
            let same = old.and_then(|o| o.by_id(&r.id));
            all.push(Arc::new(Target::over_members(r, config, metrics, members, same)));
        }
        Ok(Targets::index(all))
    }

    /// Indexes the targets by id (a member's target too, by its own id) and
    /// by path (the routes a request can name: a member's target is
    /// reached through its federated route only).
    fn index(all: Vec<Arc<Target>>) -> Targets {
        let mut by_id = HashMap::with_capacity(all.len());
        let mut by_path: HashMap<String, Vec<Arc<Target>>> = HashMap::new();
        for t in &all {
            by_id.insert(t.route.id.clone(), t.clone());
            by_path.entry(t.route.path.clone()).or_default().push(t.clone());
            for m in &t.members {
                by_id.insert(m.target.route.id.clone(), m.target.clone());
            }
        }
        Targets { all, by_id, by_path }
    }

    /// The target serving `path` on `host` (the request's host, as
    /// [`crate::config::request_host`] gives it; only needed when
    /// [`Targets::by_host`]).
    pub fn get(&self, host: Option<&str>, path: &str) -> Option<&Arc<Target>> {
        crate::config::route_for(self.by_path.get(path)?, host, path, |t| &t.route)
    }

    /// The target whose route is `id` (as sealed or forwarded).
    pub fn by_id(&self, id: &str) -> Option<&Arc<Target>> {
        self.by_id.get(id)
    }

    /// Whether some route names a host (then lookups need the request's).
    pub fn by_host(&self) -> bool {
        self.all.iter().any(|t| t.route.host.is_some())
    }

    /// Every route's target (a federated route's included).
    pub fn all(&self) -> impl Iterator<Item = &Arc<Target>> {
        self.all.iter()
    }

    /// The fleet of the stdio upstream named `name`, if a route uses one.
    fn fleet(&self, name: &str) -> Option<Arc<Fleet>> {
        self.onto_upstreams()
            .filter(|t| t.route.upstream.name == name)
            .find_map(|t| t.stdio.as_ref().map(|s| s.fleet().clone()))
    }

    /// Every stdio upstream's fleet, once each.
    pub fn fleets(&self) -> Vec<Arc<Fleet>> {
        let mut out: Vec<Arc<Fleet>> = Vec::new();
        for f in self.onto_upstreams().filter_map(|t| t.stdio.as_ref().map(Stdio::fleet)) {
            if !out.iter().any(|o| Arc::ptr_eq(o, f)) {
                out.push(f.clone());
            }
        }
        out
    }

    /// After a reload: the fleets `old` had that this table does not keep
    /// take no new sessions, and stop each process once it is idle.
    /// Returns them.
    pub fn retire_fleets_of(&self, old: &Targets) -> Vec<Arc<Fleet>> {
        let kept = self.fleets();
        let retired: Vec<Arc<Fleet>> =
            old.fleets().into_iter().filter(|f| !kept.iter().any(|k| Arc::ptr_eq(k, f))).collect();
        retired.iter().for_each(|f| f.retire());
        retired
    }

    /// Stops every stdio upstream's processes (shutdown), waiting until they are reaped.
    pub async fn stop_processes(&self, hurry: &tokio_util::sync::CancellationToken) {
        futures_util::future::join_all(self.fleets().iter().map(|f| f.stop_all(hurry))).await;
    }

    /// Every target onto one upstream: each route's, with a federated
    /// route's members in its place (what has instances to probe).
    pub fn onto_upstreams(&self) -> impl Iterator<Item = &Arc<Target>> {
        self.all.iter().flat_map(|t| {
            let members = t.members.iter().map(|m| &m.target);
            std::iter::once(t).filter(|t| !t.federated()).chain(members)
        })
    }

    /// The health task: probes every down instance each interval and takes
    /// it back into service once it answers (any MCP answer will do; a
    /// probe leaves no session behind). Ends with `stop`.
    pub async fn watch(self: Arc<Self>, stop: tokio_util::sync::CancellationToken) {
        let mut tick = tokio::time::interval(HEALTH_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let down = self.onto_upstreams().flat_map(|t| t.instances.iter()).filter(|i| !i.health().is_up());
            let probes = down.map(|instance| async move {
                match tokio::time::timeout(HEALTH_PROBE_TIMEOUT, probe::probe(instance)).await {
                    Ok(Ok(_)) => instance.health().recovered(),
                    _ => instance.health().probe_failed(),
                }
            });
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = futures_util::future::join_all(probes) => {}
            }
            self.onto_upstreams().for_each(|t| t.export_breaker());
        }
    }

    /// The rate limits' sweep: forgets, every few seconds, the principals
    /// whose allowance is whole again. Ends with `stop`.
    pub async fn sweep_rate_limits(self: Arc<Self>, stop: tokio_util::sync::CancellationToken) {
        if self.all().all(|t| t.limits.is_empty()) {
            return;
        }
        let mut tick = tokio::time::interval(RATE_LIMIT_SWEEP);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            self.all().for_each(|t| t.limits.sweep());
        }
    }
}

/// A request's error while the probe's answer was an HTTP status that is
/// no MCP answer: what it saw.
fn probe_error(status: u16) -> Error {
    match status {
        404 => Error::UpstreamInvalid("404 Not Found at the upstream's URL: is its path right?"),
        _ => Error::UpstreamInvalid("the upstream's URL answers, but not as an MCP server"),
    }
}

const UNKNOWN: u8 = 0;
const LEGACY: u8 = 1;
const MODERN: u8 = 2;
const REFUSED: u8 = 3;

/// After a probe that could not reach the upstream, requests are answered
/// 502 for this long before the next probe (an outage does not become a
/// probe per request).
const PROBE_BACKOFF: Duration = Duration::from_secs(1);
/// How long a request waits for a probe another request started.
const PROBE_WAIT: Duration = Duration::from_secs(2);
/// A refused upstream is asked again after this long (it may be upgraded).
const REFUSED_RECHECK: Duration = Duration::from_secs(30);

/// An upstream's generation: fixed by the configuration, or probed on first
/// need and cached until something suggests the upstream changed.
pub struct Detected {
    auto: bool,
    state: AtomicU8,
    /// A modern upstream found to list no 2025 version: it cannot serve
    /// legacy clients itself.
    modern_only: std::sync::atomic::AtomicBool,
    /// Held while a probe runs (one at a time); the last failed probe.
    probing: tokio::sync::Mutex<Option<Instant>>,
    /// What a refused upstream speaks, for `/readyz` and the logs, and when.
    refused: Mutex<(Vec<String>, Option<Instant>)>,
    /// What the last failed probe saw, in words (until one succeeds).
    last_failure: Mutex<Option<String>>,
    /// The HTTP status of the last failed probe, when it had one.
    last_status: Mutex<Option<u16>>,
    metrics: Metrics,
    route: String,
    upstream: String,
}

impl Detected {
    fn new(setting: UpstreamGeneration, metrics: Metrics, route: &Route) -> Detected {
        let state = match setting {
            UpstreamGeneration::Auto => UNKNOWN,
            UpstreamGeneration::Legacy => LEGACY,
            UpstreamGeneration::Modern => MODERN,
        };
        let d = Detected {
            auto: setting == UpstreamGeneration::Auto,
            state: AtomicU8::new(state),
            modern_only: std::sync::atomic::AtomicBool::new(false),
            last_failure: Mutex::new(None),
            last_status: Mutex::new(None),
            probing: tokio::sync::Mutex::new(None),
            refused: Mutex::new((Vec::new(), None)),
            metrics,
            route: route.id.clone(),
            upstream: route.upstream.name.clone(),
        };
        d.export(state);
        d
    }

    /// Whether the upstream was found to speak only the stateless era.
    pub fn modern_only(&self) -> bool {
        self.modern_only.load(Ordering::Acquire)
    }

    /// What is known now, without asking: `None` before the first probe.
    pub fn known(&self) -> Option<Result<Generation, Vec<String>>> {
        match self.state.load(Ordering::Acquire) {
            LEGACY => Some(Ok(Generation::Legacy)),
            MODERN => Some(Ok(Generation::Modern)),
            REFUSED => Some(Err(self.refused.lock().map(|r| r.0.clone()).unwrap_or_default())),
            _ => None,
        }
    }

    /// The upstream's generation, probing it first if it is not known yet.
    pub async fn generation(&self, upstream: &Transport) -> Result<Generation, Error> {
        match self.known() {
            Some(Ok(g)) => return Ok(g),
            Some(Err(_)) if !self.recheck_refused() => return Err(Error::UpstreamRefused),
            _ => {}
        }
        // One probe at a time; the others wait for it a little, not for
        // as long as a hung upstream takes to time out.
        let Ok(mut last_failure) = tokio::time::timeout(PROBE_WAIT, self.probing.lock()).await else {
            return Err(Error::UpstreamUnreachable);
        };
        // Another request may have probed while this one waited.
        match self.known() {
            Some(Ok(g)) => return Ok(g),
            Some(Err(_)) => return Err(Error::UpstreamRefused),
            None => {}
        }
        if last_failure.is_some_and(|at| at.elapsed() < PROBE_BACKOFF) {
            // What the last probe saw, until the next one.
            return Err(match *self.last_status.lock().unwrap_or_else(|e| e.into_inner()) {
                Some(status) => probe_error(status),
                None => Error::UpstreamUnreachable,
            });
        }
        match probe::probe(upstream).await {
            Ok(found) => {
                *last_failure = None;
                if let Ok(mut words) = self.last_failure.lock() {
                    *words = None;
                }
                // What this probe found (another request may mark the
                // upstream suspect again at once).
                let generation = match &found {
                    Found::Legacy => Ok(Generation::Legacy),
                    Found::Modern { .. } => Ok(Generation::Modern),
                    Found::OtherRevision(_) => Err(Error::UpstreamRefused),
                };
                self.settle(found);
                generation
            }
            Err(e) => {
                *last_failure = Some(Instant::now());
                let words = match (e, upstream.health().why()) {
                    (SendError::NotSent, Some(why)) => format!("could not connect: {why}"),
                    _ => e.words(),
                };
                if let Ok(mut last) = self.last_failure.lock() {
                    *last = Some(words.clone());
                }
                crate::log_limited!(
                    tracing::Level::WARN,
                    route = %self.route,
                    upstream = %self.upstream,
                    url = %upstream.instance(),
                    outcome = e.as_str(),
                    "could not find out what the upstream speaks: {words}; asked again on the next request"
                );
                let status = match e {
                    SendError::Status(status) => Some(status),
                    _ => None,
                };
                *self.last_status.lock().unwrap_or_else(|e| e.into_inner()) = status;
                Err(status.map_or_else(|| crate::upstream::map_send_error(e, false), probe_error))
            }
        }
    }

    fn settle(&self, found: Found) {
        let state = match &found {
            Found::Legacy => LEGACY,
            Found::Modern { legacy_too } => {
                self.modern_only.store(!legacy_too, Ordering::Release);
                MODERN
            }
            Found::OtherRevision(supported) => {
                if let Ok(mut r) = self.refused.lock() {
                    *r = (supported.clone(), Some(Instant::now()));
                }
                tracing::error!(
                    route = %self.route,
                    upstream = %self.upstream,
                    ?supported,
                    "the upstream speaks another revision of the stateless protocol, not {}: refused",
                    crate::front::MODERN_VERSION
                );
                REFUSED
            }
        };
        if !matches!(found, Found::OtherRevision(_)) {
            tracing::info!(route = %self.route, upstream = %self.upstream, generation = %found, "upstream probed");
        }
        self.state.store(state, Ordering::Release);
        self.export(state);
    }

    /// Whether a refused upstream is due to be asked again (then it is
    /// unknown until the probe says otherwise).
    fn recheck_refused(&self) -> bool {
        let due = self.refused.lock().is_ok_and(|r| r.1.is_some_and(|at| at.elapsed() >= REFUSED_RECHECK));
        due && self.state.compare_exchange(REFUSED, UNKNOWN, Ordering::AcqRel, Ordering::Acquire).is_ok()
    }

    /// Something suggests the upstream changed (it could not be reached: it
    /// may come back upgraded): probe again before the next request.
    pub fn suspect(&self) {
        if self.auto && self.state.swap(UNKNOWN, Ordering::AcqRel) != UNKNOWN {
            tracing::info!(route = %self.route, upstream = %self.upstream, "upstream will be probed again");
            self.export(UNKNOWN);
        }
    }

    fn export(&self, state: u8) {
        for (value, name) in
            [(UNKNOWN, "unknown"), (LEGACY, "legacy"), (MODERN, "modern"), (REFUSED, "refused")]
        {
            let labels = GenerationLabels {
                route: self.route.clone(),
                upstream: self.upstream.clone(),
                generation: name,
            };
            self.metrics.upstream_generation.get_or_create(&labels).set(i64::from(value == state));
        }
    }

    /// Whether the last probe failed and none has succeeded since (its
    /// answer was no MCP, or nothing answered): its requests fail.
    pub fn unusable(&self) -> bool {
        self.known().is_none() && self.last_failure.lock().is_ok_and(|w| w.is_some())
    }

    /// What `/readyz` and `check-config --probe` say about the upstream.
    pub fn describe(&self) -> String {
        match self.known() {
            Some(Ok(g)) => g.as_str().to_string(),
            Some(Err(supported)) => format!("refused (speaks {})", supported.join(", ")),
            None => match self.last_failure.lock().ok().and_then(|w| w.clone()) {
                Some(why) => format!("unusable: {why}"),
                None => "unknown (not probed yet)".into(),
            },
        }
    }
}
