//! Whether one upstream instance can be reached: the one health mechanism per
//! instance. A connection that cannot be made marks the instance down; new
//! work skips it until a probe finds it answering again (the gateway's
//! health task probes down instances, see `bridge::Targets::watch`).

use std::sync::atomic::{AtomicBool, Ordering};

use prometheus_client::metrics::gauge::Gauge;

pub struct Health {
    down: AtomicBool,
    /// `sessionless_upstream_instance_up` for this instance.
    gauge: Gauge,
    /// For the logs: route and instance.
    route: String,
    instance: String,
}

impl Health {
    pub fn new(gauge: Gauge, route: String, instance: String) -> Health {
        gauge.set(1);
        Health { down: AtomicBool::new(false), gauge, route, instance }
    }

    pub fn is_up(&self) -> bool {
        !self.down.load(Ordering::Acquire)
    }

    /// A connection to the instance could not be made.
    pub fn failed(&self) {
        if !self.down.swap(true, Ordering::AcqRel) {
            self.gauge.set(0);
            tracing::warn!(route = %self.route, instance = %self.instance,
                "upstream instance unreachable: skipped until a probe finds it answering");
        }
    }

    /// A probe found the instance answering.
    pub fn recovered(&self) {
        if self.down.swap(false, Ordering::AcqRel) {
            self.gauge.set(1);
            tracing::info!(route = %self.route, instance = %self.instance, "upstream instance answers again");
        }
    }
}
