//! How fast legacy sessions may be opened, per principal and overall: a
//! fixed one-minute window. Without a session table the gateway cannot count
//! open sessions, so it bounds how many it lets a caller open; the upstream's
//! idle timeout bounds how long the abandoned ones live. One window serves
//! both legacy cells (relayed and translated sessions count alike).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

const WINDOW: Duration = Duration::from_secs(60);

pub struct Creations {
    state: Mutex<Window>,
    max: u32,
    per_principal: u32,
}

struct Window {
    started: Instant,
    total: u32,
    /// At most `max` entries: each holds at least one creation of the window.
    by_principal: HashMap<String, u32>,
}

impl Creations {
    pub fn new(max: u32, per_principal: u32) -> Creations {
        let state = Window { started: Instant::now(), total: 0, by_principal: HashMap::new() };
        Creations { state: Mutex::new(state), max, per_principal }
    }

    /// Counts one creation for `principal` on `route`; a refusal is counted
    /// in `sessionless_quota_exceeded_total` and is 429 `too_many_sessions`.
    pub fn admit_counted(
        &self,
        principal: &str,
        route: &str,
        metrics: &crate::metrics::Metrics,
    ) -> Result<(), crate::error::Error> {
        self.admit(principal).map_err(|quota| {
            let labels = crate::metrics::QuotaLabels { route: route.to_string(), quota };
            metrics.quota_exceeded.get_or_create(&labels).inc();
            crate::error::Error::TooManyNewSessions
        })
    }

    /// Counts one creation for `principal`, or names the quota it would exceed.
    pub fn admit(&self, principal: &str) -> Result<(), &'static str> {
        let mut w = self.state.lock().expect("quota lock");
        if w.started.elapsed() >= WINDOW {
            w.started = Instant::now();
            w.total = 0;
            w.by_principal.clear();
        }
        if w.by_principal.get(principal).is_some_and(|n| *n >= self.per_principal) {
            return Err("new_sessions_per_principal");
        }
        if w.total >= self.max {
            return Err("new_sessions");
        }
        w.total += 1;
        *w.by_principal.entry(principal.to_string()).or_default() += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_principal_and_everyone_have_their_caps() {
        let q = Creations::new(3, 2);
        assert_eq!(q.admit("a"), Ok(()));
        assert_eq!(q.admit("a"), Ok(()));
        assert_eq!(q.admit("a"), Err("new_sessions_per_principal"));
        assert_eq!(q.admit("b"), Ok(()));
        assert_eq!(q.admit("c"), Err("new_sessions"));
    }
}
