//! Parked flows: upstream calls paused on a question for the user, waiting for
//! the client's retry. A concurrent map with a TTL per entry and a hard cap;
//! the bridge takes expired entries out with [`ParkingLot::expired`] and
//! declines what they were waiting for upstream.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use dashmap::DashMap;
use tokio::time::Instant;

struct Entry<T> {
    expires: Instant,
    value: T,
}

pub struct ParkingLot<T> {
    map: DashMap<String, Entry<T>>,
    len: AtomicUsize,
    /// Set at shutdown: nothing parks any more.
    closed: std::sync::atomic::AtomicBool,
    cap: usize,
    ttl: Duration,
}

impl<T> ParkingLot<T> {
    pub fn new(cap: usize, ttl: Duration) -> ParkingLot<T> {
        ParkingLot {
            map: DashMap::new(),
            len: AtomicUsize::new(0),
            closed: std::sync::atomic::AtomicBool::new(false),
            cap,
            ttl,
        }
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    pub fn is_full(&self) -> bool {
        self.len.load(Ordering::Acquire) >= self.cap || self.closed.load(Ordering::Acquire)
    }

    /// Refuses every later `park` (shutdown: what is left gets declined).
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    pub fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Parks `value` under `id` until the TTL passes. Gives it back when the lot is full.
    pub fn park(&self, id: String, value: T) -> Result<Instant, T> {
        self.park_until(id, value, Instant::now() + self.ttl)
    }

    /// Parks `value` until `expires` (a flow put back keeps its first expiry).
    pub fn park_until(&self, id: String, value: T, expires: Instant) -> Result<Instant, T> {
        if self.closed.load(Ordering::Acquire) {
            return Err(value);
        }
        // Reserve a place first so that concurrent parkers cannot overshoot the cap.
        if self.len.fetch_add(1, Ordering::AcqRel) >= self.cap {
            self.len.fetch_sub(1, Ordering::AcqRel);
            return Err(value);
        }
        if let Some(old) = self.map.insert(id, Entry { expires, value }) {
            drop(old);
            self.len.fetch_sub(1, Ordering::AcqRel);
        }
        Ok(expires)
    }

    /// Takes the flow out (single use): a second take of the same id finds
    /// nothing. Returns it with its expiry.
    pub fn take(&self, id: &str) -> Option<(T, Instant)> {
        let (_, entry) = self.map.remove(id)?;
        self.len.fetch_sub(1, Ordering::AcqRel);
        Some((entry.value, entry.expires))
    }

    /// Removes and returns every flow whose TTL has passed.
    pub fn expired(&self) -> Vec<T> {
        let now = Instant::now();
        let ids: Vec<String> =
            self.map.iter().filter(|e| e.expires <= now).map(|e| e.key().clone()).collect();
        ids.iter()
            .filter_map(|id| self.map.remove_if(id, |_, e| e.expires <= now))
            .map(|(_, e)| {
                self.len.fetch_sub(1, Ordering::AcqRel);
                e.value
            })
            .collect()
    }

    /// Removes and returns every flow (shutdown).
    pub fn drain(&self) -> Vec<T> {
        let ids: Vec<String> = self.map.iter().map(|e| e.key().clone()).collect();
        ids.iter().filter_map(|id| self.take(id).map(|(v, _)| v)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn single_use_ttl_and_cap() {
        let lot = ParkingLot::new(2, Duration::from_secs(60));
        assert!(lot.park("a".into(), 1).is_ok());
        assert!(lot.park("b".into(), 2).is_ok());
        assert_eq!(lot.park("c".into(), 3), Err(3), "cap reached");
        assert_eq!(lot.take("a").map(|(v, _)| v), Some(1));
        assert!(lot.take("a").is_none(), "single use");
        assert!(lot.park("c".into(), 3).is_ok());
        assert!(lot.expired().is_empty());
        lot.close();
        assert_eq!(lot.park("d".into(), 4), Err(4), "closed at shutdown");
        tokio::time::advance(Duration::from_secs(61)).await;
        let mut gone = lot.expired();
        gone.sort();
        assert_eq!(gone, vec![2, 3]);
        assert!(lot.is_empty());
    }
}
