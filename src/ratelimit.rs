//! Rate limits, per route: how many requests one principal may make
//! (`rate_limit`), and how many calls of one tool (`tool_rate_limits`).
//! Exact keyed GCRA limits (governor): a principal's `burst` requests pass at
//! once, then one more per `60 s / per_minute`; a refusal says how long
//! until the next one would pass (`Retry-After`, whole seconds rounded up).
//!
//! Keys are bounded and expire. A key is a keyed hash of the principal
//! (never the principal itself). Each limit tracks at most `max_keys`
//! principals one by one; a principal first seen while that many are tracked
//! is not tracked on its own: every such principal shares one allowance (the
//! size of one principal's), so a flood of new principals fails closed for
//! the newcomers and never resets, evicts or slows down a tracked one.
//! [`RateLimits::sweep`] (every few seconds, from the gateway's task; see
//! `bridge::Targets::sweep_rate_limits`) forgets every principal whose
//! allowance is whole again, which makes room.
//!
//! What counts, and what is never refused, is decided by the callers (see
//! `bridge::Target::admit`): answers to questions and retries that resume a
//! held call are not counted.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::middleware::NoOpMiddleware;
use governor::nanos::Nanos;
use governor::state::keyed::{DashMapStateStore, ShrinkableKeyedStateStore};
use governor::state::{InMemoryState, NotKeyed, StateStore};
use governor::{Quota, RateLimiter};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;

use crate::config::{RateLimit, Route};
use crate::metrics::{Metrics, RateLimitLabels};

/// Which limit refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The principal's requests on the route.
    Principal,
    /// The principal's calls of one tool.
    Tool,
    /// The allowance shared by principals beyond the ones tracked.
    Overflow,
}

impl Kind {
    /// A bounded label, for metrics and the error's `data.limit`.
    pub fn label(self) -> &'static str {
        match self {
            Kind::Principal => "principal",
            Kind::Tool => "tool",
            Kind::Overflow => "overflow",
        }
    }

    /// What was spent, for the error message.
    pub fn describe(self) -> &'static str {
        match self {
            Kind::Principal => "this caller's requests on this endpoint",
            Kind::Tool => "this caller's calls of this tool",
            Kind::Overflow => "too many callers at once; new ones share one allowance",
        }
    }
}

/// A refusal: which limit, and how long until a request would pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused {
    pub kind: Kind,
    pub retry_after: Duration,
}

impl Refused {
    /// `Retry-After`: whole seconds, rounded up, at least one.
    pub fn retry_after_secs(&self) -> u64 {
        let nanos = self.retry_after.as_nanos();
        nanos.div_ceil(1_000_000_000).max(1) as u64
    }
}

impl From<Refused> for crate::error::Error {
    fn from(refused: Refused) -> Self {
        crate::error::Error::RateLimited(crate::error::Limited {
            limit: refused.kind.label(),
            what: refused.kind.describe(),
            retry_after_secs: refused.retry_after_secs(),
        })
    }
}

/// The limits of one route.
pub struct RateLimits<C: Clock = DefaultClock> {
    route: Option<Limit<C>>,
    tools: HashMap<String, Limit<C>>,
    /// Keys are `seed`-keyed hashes of the principal.
    seed: RandomState,
    refused: [Counter; 3],
    /// Principals tracked, by the route limit and by all tool limits.
    keys: [Gauge; 2],
}

impl RateLimits<DefaultClock> {
    pub fn new(route: &Route, max_keys: usize, metrics: &Metrics) -> RateLimits {
        // One clock for every route: a new one calibrates with `cpuid`,
        // slow under a hypervisor (a third of loading 40,000 routes).
        static CLOCK: std::sync::OnceLock<DefaultClock> = std::sync::OnceLock::new();
        RateLimits::with_clock(route, max_keys, metrics, CLOCK.get_or_init(DefaultClock::default).clone())
    }
}

impl<C: Clock + Clone> RateLimits<C> {
    /// The limits of `route`, on `clock` (a fake one in tests).
    pub fn with_clock(route: &Route, max_keys: usize, metrics: &Metrics, clock: C) -> RateLimits<C> {
        let labels = |kind: Kind| RateLimitLabels { route: route.id.clone(), limit: kind.label() };
        let counter = |kind| metrics.rate_limited.get_or_create(&labels(kind)).clone();
        let gauge = |kind| metrics.rate_limit_keys.get_or_create(&labels(kind)).clone();
        let limit = |l: &RateLimit| Limit::new(l, max_keys, clock.clone());
        RateLimits {
            route: route.rate_limit.as_ref().map(limit),
            tools: route.tool_rate_limits.iter().map(|(tool, l)| (tool.clone(), limit(l))).collect(),
            seed: RandomState::new(),
            refused: [counter(Kind::Principal), counter(Kind::Tool), counter(Kind::Overflow)],
            keys: [gauge(Kind::Principal), gauge(Kind::Tool)],
        }
    }

    /// Whether the route has no limit at all.
    pub fn is_empty(&self) -> bool {
        self.route.is_none() && self.tools.is_empty()
    }

    /// Counts one request of `principal` (a call of `tool`, if any): the
    /// tool's limit first, then the route's. Refused requests are counted
    /// in `sessionless_rate_limited_total`.
    pub fn check(&self, principal: &str, tool: Option<&str>) -> Result<(), Refused> {
        if self.is_empty() {
            return Ok(());
        }
        let key = self.seed.hash_one(principal);
        let tool_limit = tool.and_then(|t| self.tools.get(t));
        let checked = match tool_limit.map(|l| l.check(key, Kind::Tool)) {
            Some(Err(refused)) => Err(refused),
            _ => self.route.as_ref().map_or(Ok(()), |l| l.check(key, Kind::Principal)),
        };
        if let Err(refused) = checked {
            self.refused[refused.kind as usize].inc();
        }
        checked
    }

    /// Forgets the principals whose allowance is whole again (they are
    /// indistinguishable from ones never seen) and updates the key gauges.
    pub fn sweep(&self) {
        let route = self.route.as_ref().map_or(0, Limit::sweep);
        let tools: usize = self.tools.values().map(Limit::sweep).sum();
        self.keys[0].set(route as i64);
        self.keys[1].set(tools as i64);
    }
}

/// One limit: a GCRA state per principal, at most `max` of them, and one
/// shared by the principals beyond.
struct Limit<C: Clock> {
    limiter: RateLimiter<u64, Keys, C, NoOpMiddleware<C::Instant>>,
    keys: Keys,
}

impl<C: Clock> Limit<C> {
    fn new(l: &RateLimit, max: usize, clock: C) -> Limit<C> {
        let quota = Quota::per_minute(l.per_minute).allow_burst(l.burst);
        let keys = Keys(Arc::new(KeysInner {
            map: DashMapStateStore::default(),
            overflow: InMemoryState::default(),
            max,
        }));
        Limit { limiter: RateLimiter::new(quota, keys.clone(), clock), keys }
    }

    fn check(&self, key: u64, kind: Kind) -> Result<(), Refused> {
        let kind = if self.keys.tracks(&key) { kind } else { Kind::Overflow };
        self.limiter.check_key(&key).map_err(|not_until| {
            let retry_after = not_until.wait_time_from(self.limiter.clock().now());
            Refused { kind, retry_after }
        })
    }

    /// Principals still tracked after the sweep.
    fn sweep(&self) -> usize {
        self.limiter.retain_recent();
        self.limiter.shrink_to_fit();
        self.limiter.len()
    }
}

/// The state store of one limit: governor's keyed map, bounded.
#[derive(Clone)]
struct Keys(Arc<KeysInner>);

struct KeysInner {
    map: DashMapStateStore<u64>,
    /// The state of every principal beyond `max` (one allowance for all).
    overflow: InMemoryState,
    max: usize,
}

impl Keys {
    /// Whether `key` has (or may get) a state of its own. Requests racing
    /// at the cap may overshoot it by their number.
    fn tracks(&self, key: &u64) -> bool {
        self.0.map.contains_key(key) || self.0.map.len() < self.0.max
    }
}

impl StateStore for Keys {
    type Key = u64;

    fn measure_and_replace<T, F, E>(&self, key: &u64, f: F) -> Result<T, E>
    where
        F: Fn(Option<Nanos>) -> Result<(T, Nanos), E>,
    {
        if self.tracks(key) {
            self.0.map.measure_and_replace(key, f)
        } else {
            self.0.overflow.measure_and_replace(&NotKeyed::NonKey, f)
        }
    }
}

impl ShrinkableKeyedStateStore<u64> for Keys {
    fn retain_recent(&self, drop_below: Nanos) {
        self.0.map.retain_recent(drop_below);
    }

    fn shrink_to_fit(&self) {
        self.0.map.shrink_to_fit();
    }

    fn len(&self) -> usize {
        self.0.map.len()
    }

    fn is_empty(&self) -> bool {
        self.0.map.is_empty()
    }
}

#[cfg(test)]
mod tests;
