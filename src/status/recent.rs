//! Recent errors of one upstream, for `/status`: a count per minute in a
//! ring of a few minutes, so that "errors lately" costs a fixed 96 bytes
//! per upstream whatever the traffic, and forgets on its own.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

/// How many minutes the count covers (the current one included).
pub const MINUTES: u64 = 5;
const SLOTS: usize = MINUTES as usize + 1;

/// Errors counted in one-minute slots; one more slot than the window, so
/// that the slot being reused is never one still counted.
#[derive(Default)]
pub struct Recent {
    slots: [Slot; SLOTS],
}

#[derive(Default)]
struct Slot {
    /// The minute (since the process's epoch) this slot counts, plus one
    /// (zero: never used).
    minute: AtomicU64,
    count: AtomicU64,
}

impl Recent {
    /// One more error now.
    pub fn add(&self) {
        self.add_at(minute_now());
    }

    /// Errors in the last [`MINUTES`] minutes (the current one included).
    pub fn count(&self) -> u64 {
        self.count_at(minute_now())
    }

    fn add_at(&self, minute: u64) {
        let slot = &self.slots[(minute % SLOTS as u64) as usize];
        let stamp = minute + 1;
        let seen = slot.minute.load(Ordering::Acquire);
        // The first error of a new minute resets its slot; an error counted
        // by a racing thread in between may be lost (a count, not a ledger).
        if seen != stamp
            && slot.minute.compare_exchange(seen, stamp, Ordering::AcqRel, Ordering::Acquire).is_ok()
        {
            slot.count.store(0, Ordering::Release);
        }
        slot.count.fetch_add(1, Ordering::AcqRel);
    }

    fn count_at(&self, minute: u64) -> u64 {
        let oldest = (minute + 1).saturating_sub(MINUTES - 1);
        (self.slots.iter())
            .filter(|s| (oldest..=minute + 1).contains(&s.minute.load(Ordering::Acquire)))
            .map(|s| s.count.load(Ordering::Acquire))
            .sum()
    }
}

/// Minutes since the first time anything asked (a monotonic clock).
fn minute_now() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_secs() / 60
}

/// The reasons (`Error::reason`) of requests an upstream failed, as
/// opposed to the client's mistakes and the gateway's own limits.
const UPSTREAM_FAILURES: [&str; 10] = [
    "upstream_unreachable",
    "upstream_refused",
    "upstream_timeout",
    "upstream_invalid",
    "upstream_too_large",
    "upstream_start_timeout",
    "upstream_start_failed",
    "upstream_refused_credentials",
    "outcome_unknown",
    "circuit_open",
];

/// Whether a request that ended with `outcome` (a metric outcome) is an
/// error of its upstream's.
pub fn upstream_failed(outcome: &str) -> bool {
    outcome != "ok" && UPSTREAM_FAILURES.contains(&outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_the_last_minutes_and_forgets_older_ones() {
        let r = Recent::default();
        assert_eq!(r.count_at(0), 0);
        r.add_at(0);
        r.add_at(0);
        r.add_at(3);
        assert_eq!(r.count_at(3), 3);
        assert_eq!(r.count_at(4), 3, "minute 0 is still within five minutes of minute 4");
        assert_eq!(r.count_at(5), 1, "minute 0 has left the window");
        r.add_at(6);
        assert_eq!(r.count_at(6), 2);
        assert_eq!(r.count_at(20), 0);
        // Minute 12 reuses minute 0's and 6's slot: the old count is gone.
        r.add_at(12);
        assert_eq!(r.count_at(12), 1);
    }
}
