//! Whether one upstream instance can be reached: the one health mechanism per
//! instance. A connection that cannot be made marks the instance down; new
//! work skips it until a probe finds it answering again (the gateway's
//! health task probes down instances, see `bridge::Targets::watch`). A down
//! instance whose probe failed too is confirmed down: when every instance of
//! an upstream is, its circuit breaker is open (`bridge::Target::breaker_open`).

use std::sync::atomic::{AtomicU8, Ordering};

use prometheus_client::metrics::gauge::Gauge;

use crate::metrics::{InstanceLabels, Metrics};

const UP: u8 = 0;
/// A connection failed; no probe has failed since.
const DOWN: u8 = 1;
/// A connection failed, and so did a probe after it.
const CONFIRMED: u8 = 2;

pub struct Health {
    state: AtomicU8,
    /// `sessionless_upstream_instance_up` for this instance.
    gauge: Gauge,
    /// For the logs: route, upstream and instance.
    labels: InstanceLabels,
    /// Why the last connection could not be made, in words.
    why: std::sync::Mutex<Option<String>>,
}

/// An error reaching an upstream, in words a user acts on.
pub fn io_words(e: &std::io::Error) -> String {
    use std::io::ErrorKind::*;
    match e.kind() {
        ConnectionRefused => "connection refused (is the server running, and on that port?)".into(),
        TimedOut => "connection timed out (a firewall, or a wrong address?)".into(),
        ConnectionReset | ConnectionAborted => "connection reset by the server".into(),
        HostUnreachable | NetworkUnreachable => "host unreachable".into(),
        AddrNotAvailable => "address not available".into(),
        NotFound => "host name not found (DNS)".into(),
        PermissionDenied => "permission denied".into(),
        _ => e.to_string(),
    }
}

impl Health {
    /// The health of `instance` of `upstream` on `route`, up until a
    /// connection fails; its gauge registered in `metrics`.
    pub fn new(metrics: &Metrics, route: &str, upstream: &str, instance: &str) -> Health {
        let labels =
            InstanceLabels { route: route.into(), upstream: upstream.into(), instance: instance.into() };
        let gauge = metrics.upstream_instance_up.get_or_create(&labels).clone();
        gauge.set(1);
        Health { state: AtomicU8::new(UP), gauge, labels, why: Default::default() }
    }

    pub fn is_up(&self) -> bool {
        self.state.load(Ordering::Acquire) == UP
    }

    /// Why the last connection could not be made, in words.
    pub fn why(&self) -> Option<String> {
        self.why.lock().ok().and_then(|w| w.clone())
    }

    /// Down, and a probe since found it still not answering.
    pub fn is_confirmed_down(&self) -> bool {
        self.state.load(Ordering::Acquire) == CONFIRMED
    }

    /// A connection to the instance could not be made (`why`, in words).
    pub fn failed(&self, why: &str) {
        if let Ok(mut last) = self.why.lock() {
            if last.as_deref() != Some(why) {
                *last = Some(why.to_string());
            }
        }
        if self.state.compare_exchange(UP, DOWN, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            self.gauge.set(0);
            let InstanceLabels { route, upstream, instance } = &self.labels;
            tracing::warn!(%route, %upstream, %instance, error = why,
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
            let InstanceLabels { route, upstream, instance } = &self.labels;
            tracing::info!(%route, %upstream, %instance, "upstream instance answers again");
        }
    }
}
