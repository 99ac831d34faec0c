//! Log lines that a client, an upstream or a peer can cause at will (a refused
//! request, a failed accept, an upstream that fails on demand) are written at
//! most once per interval per call site; the lines in between are counted and
//! reported with the next one. Metrics count every occurrence.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// One line per call site per this interval, at most.
pub const INTERVAL: Duration = Duration::from_secs(10);

pub struct RateLimitedLog {
    interval_ms: u64,
    /// Milliseconds since the process epoch of the last line, plus one (0: never).
    last: AtomicU64,
    suppressed: AtomicU64,
}

impl RateLimitedLog {
    pub const fn new(interval: Duration) -> RateLimitedLog {
        RateLimitedLog {
            interval_ms: interval.as_millis() as u64,
            last: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// `Some(lines suppressed since the last one)` when a line may be written now.
    pub fn allow(&self) -> Option<u64> {
        let now = now_ms();
        let last = self.last.load(Ordering::Relaxed);
        let due = last == 0 || now.saturating_sub(last) >= self.interval_ms;
        if !due || self.last.compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed).is_err() {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Some(self.suppressed.swap(0, Ordering::Relaxed))
    }
}

fn now_ms() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1
}

/// `tracing::event!` at most once per [`INTERVAL`] from this call site, with a
/// `suppressed` field counting the lines skipped since the last one.
#[macro_export]
macro_rules! log_limited {
    ($level:expr, $($arg:tt)+) => {{
        static LIMIT: $crate::ratelog::RateLimitedLog = $crate::ratelog::RateLimitedLog::new($crate::ratelog::INTERVAL);
        if let Some(suppressed) = LIMIT.allow() {
            tracing::event!($level, suppressed, $($arg)+);
        }
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_and_the_rest_counted() {
        let log = RateLimitedLog::new(Duration::from_secs(3600));
        assert_eq!(log.allow(), Some(0));
        for _ in 0..100 {
            assert_eq!(log.allow(), None);
        }
        let log = RateLimitedLog::new(Duration::ZERO);
        assert_eq!(log.allow(), Some(0));
        assert_eq!(log.allow(), Some(0));
    }

    #[test]
    fn a_line_logged_by_another_thread_in_between_is_no_underflow() {
        let log = RateLimitedLog::new(Duration::from_secs(3600));
        // As if another thread stored a later time between our clock read and our load.
        log.last.store(now_ms() + 1000, Ordering::Relaxed);
        assert_eq!(log.allow(), None);
    }
}
