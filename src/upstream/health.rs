//! Whether one upstream instance can be reached: the one health mechanism per
//! instance. A connection that cannot be made marks the instance down; new
//! work skips it until a probe finds it answering again (the gateway's
//! health task probes down instances, see `bridge::Targets::watch`). A down
//! instance whose probe failed too is confirmed down: when every instance of
//! an upstream is, its circuit breaker is open (`bridge::Target::breaker_open`).

use std::sync::atomic::{AtomicU8, Ordering};

use prometheus_client::metrics::gauge::Gauge;

const UP: u8 = 0;
/// A connection failed; no probe has failed since.
const DOWN: u8 = 1;
/// A connection failed, and so did a probe after it.
const CONFIRMED: u8 = 2;

pub struct Health {
    state: AtomicU8,
    /// `sessionless_upstream_instance_up` for this instance.
    gauge: Gauge,
    /// For the logs: route and instance.
    route: String,
    instance: String,
}

impl Health {
    pub fn new(gauge: Gauge, route: String, instance: String) -> Health {
        gauge.set(1);
        Health { state: AtomicU8::new(UP), gauge, route, instance }
    }

    pub fn is_up(&self) -> bool {
        self.state.load(Ordering::Acquire) == UP
    }

    /// Down, and a probe since found it still not answering.
    pub fn is_confirmed_down(&self) -> bool {
        self.state.load(Ordering::Acquire) == CONFIRMED
    }

    /// A connection to the instance could not be made.
    pub fn failed(&self) {
        if self.state.compare_exchange(UP, DOWN, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            self.gauge.set(0);
            tracing::warn!(route = %self.route, instance = %self.instance,
                "upstream instance unreachable: skipped until a probe finds it answering");
        }
    }

    /// A probe of the down instance failed too.
    pub fn probe_failed(&self) {
        let _ = self.state.compare_exchange(DOWN, CONFIRMED, Ordering::AcqRel, Ordering::Acquire);
    }

    /// A probe found the instance answering.
    pub fn recovered(&self) {
        if self.state.swap(UP, Ordering::AcqRel) != UP {
            self.gauge.set(1);
            tracing::info!(route = %self.route, instance = %self.instance, "upstream instance answers again");
        }
    }
}
