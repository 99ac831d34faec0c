//! Parked flows: upstream calls paused on a question for the user, waiting for
//! the client's retry. A concurrent map with a TTL per entry; its places come
//! from [`Places`], shared by every lot of the gateway (a hard cap, and a cap
//! per principal so that one caller cannot fill them for the others);
//! the bridge takes expired entries out with [`ParkingLot::expired`] and
//! declines what they were waiting for upstream.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dashmap::DashMap;
use tokio::time::Instant;

struct Entry<T> {
    expires: Instant,
    owner: Arc<str>,
    value: T,
}

/// Why a flow could not be parked (defined beside the error it becomes).
pub use crate::error::Declined as Refused;

/// The places every parking lot of the gateway draws from: one global cap
/// and one share per principal, whichever cell parks (a shared service).
pub struct Places {
    len: AtomicUsize,
    /// Places held per principal (no entry at zero).
    owners: Mutex<HashMap<Arc<str>, usize>>,
    /// Set at shutdown: nothing parks any more.
    closed: AtomicBool,
    cap: usize,
    per_owner: usize,
}

impl Places {
    pub fn new(cap: usize, per_owner: usize) -> Arc<Places> {
        Arc::new(Places {
            len: AtomicUsize::new(0),
            owners: Mutex::new(HashMap::new()),
            closed: AtomicBool::new(false),
            cap,
            per_owner,
        })
    }

    /// Places held, in every lot.
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether `owner` could park now.
    pub fn admits(&self, owner: &str) -> Result<(), Refused> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Refused::Closed);
        }
        if self.owners.lock().expect("owners lock").get(owner).is_some_and(|n| *n >= self.per_owner) {
            return Err(Refused::PrincipalFull);
        }
        if self.len.load(Ordering::Acquire) >= self.cap {
            return Err(Refused::Full);
        }
        Ok(())
    }

    /// Refuses every later reservation (shutdown: what is left gets declined).
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    /// Takes a place for `owner` until the guard is dropped (a stream, say).
    pub fn hold(self: &Arc<Self>, owner: &str) -> Result<Held, Refused> {
        let owner = self.reserve(owner)?;
        Ok(Held { places: self.clone(), owner })
    }

    /// Takes a place for `owner`; the interned owner name to release it with.
    fn reserve(&self, owner: &str) -> Result<Arc<str>, Refused> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Refused::Closed);
        }
        let mut owners = self.owners.lock().expect("owners lock");
        let held = owners.get(owner).copied().unwrap_or(0);
        if held >= self.per_owner {
            return Err(Refused::PrincipalFull);
        }
        // Reserve first so that concurrent parkers cannot overshoot the cap.
        if self.len.fetch_add(1, Ordering::AcqRel) >= self.cap {
            self.len.fetch_sub(1, Ordering::AcqRel);
            return Err(Refused::Full);
        }
        let key = owners.get_key_value(owner).map(|(k, _)| k.clone()).unwrap_or_else(|| owner.into());
        owners.insert(key.clone(), held + 1);
        Ok(key)
    }

    /// One place of `owner` was given back.
    fn release(&self, owner: &Arc<str>) {
        self.len.fetch_sub(1, Ordering::AcqRel);
        let mut owners = self.owners.lock().expect("owners lock");
        if let Some(n) = owners.get_mut(owner) {
            *n -= 1;
            if *n == 0 {
                owners.remove(owner);
            }
        }
    }
}

/// A place of [`Places`], given back when dropped.
pub struct Held {
    places: Arc<Places>,
    owner: Arc<str>,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.places.release(&self.owner);
    }
}

/// Paused things of one kind, by id, each holding a place of [`Places`].
pub struct ParkingLot<T> {
    map: DashMap<String, Entry<T>>,
    places: Arc<Places>,
    ttl: Duration,
}

impl<T> ParkingLot<T> {
    /// A lot that draws from `places` (shared with the gateway's other lots).
    pub fn new(places: Arc<Places>, ttl: Duration) -> ParkingLot<T> {
        ParkingLot { map: DashMap::new(), places, ttl }
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Whether `owner` could park a flow now.
    pub fn admits(&self, owner: &str) -> Result<(), Refused> {
        self.places.admits(owner)
    }

    /// Refuses every later `park`, in every lot (shutdown).
    pub fn close(&self) {
        self.places.close();
    }

    /// Entries in this lot.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Parks `value` under `id` for `owner` until the TTL passes. Gives it
    /// back, with the reason, when the places or the owner's share are spent.
    pub fn park(&self, id: String, owner: &str, value: T) -> Result<Instant, (T, Refused)> {
        self.park_until(id, owner, value, Instant::now() + self.ttl)
    }

    /// Parks `value` until `expires` (a flow put back keeps its first expiry).
    pub fn park_until(
        &self,
        id: String,
        owner: &str,
        value: T,
        expires: Instant,
    ) -> Result<Instant, (T, Refused)> {
        let owner = match self.places.reserve(owner) {
            Ok(owner) => owner,
            Err(why) => return Err((value, why)),
        };
        if let Some(old) = self.map.insert(id, Entry { expires, owner, value }) {
            self.places.release(&old.owner);
            drop(old);
        }
        Ok(expires)
    }

    /// Takes the flow out (single use): a second take of the same id finds
    /// nothing. Returns it with its expiry.
    pub fn take(&self, id: &str) -> Option<(T, Instant)> {
        let (_, entry) = self.map.remove(id)?;
        self.places.release(&entry.owner);
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
                self.places.release(&e.owner);
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
        let lot = ParkingLot::new(Places::new(2, 2), Duration::from_secs(60));
        assert!(lot.park("a".into(), "p", 1).is_ok());
        assert!(lot.park("b".into(), "q", 2).is_ok());
        assert_eq!(lot.park("c".into(), "r", 3), Err((3, Refused::Full)), "cap reached");
        assert_eq!(lot.admits("r"), Err(Refused::Full));
        assert_eq!(lot.take("a").map(|(v, _)| v), Some(1));
        assert!(lot.take("a").is_none(), "single use");
        assert!(lot.park("c".into(), "r", 3).is_ok());
        assert!(lot.expired().is_empty());
        lot.close();
        assert_eq!(lot.park("d".into(), "p", 4), Err((4, Refused::Closed)), "closed at shutdown");
        tokio::time::advance(Duration::from_secs(61)).await;
        let mut gone = lot.expired();
        gone.sort();
        assert_eq!(gone, vec![2, 3]);
        assert!(lot.is_empty());
        assert!(lot.places.owners.lock().unwrap().is_empty(), "no count left behind");
        assert!(lot.places.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn one_principal_cannot_take_the_others_share() {
        let lot = ParkingLot::new(Places::new(10, 3), Duration::from_secs(60));
        for i in 0..3 {
            assert!(lot.park(format!("a{i}"), "greedy", i).is_ok());
        }
        assert_eq!(lot.admits("greedy"), Err(Refused::PrincipalFull));
        assert_eq!(lot.park("a3".into(), "greedy", 3), Err((3, Refused::PrincipalFull)));
        assert_eq!(lot.admits("other"), Ok(()));
        assert!(lot.park("b0".into(), "other", 10).is_ok(), "another principal still parks");
        lot.take("a0");
        assert!(lot.park("a3".into(), "greedy", 3).is_ok(), "a freed place is usable again");
        assert_eq!(lot.len(), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn lots_sharing_places_share_the_caps() {
        let places = Places::new(3, 2);
        let (a, b) = (
            ParkingLot::new(places.clone(), Duration::from_secs(60)),
            ParkingLot::new(places.clone(), Duration::from_secs(60)),
        );
        assert!(a.park("1".into(), "p", 1).is_ok());
        assert_eq!(b.park("2".into(), "p", 2).map(|_| ()), Ok(()));
        assert_eq!(b.park("3".into(), "p", 3), Err((3, Refused::PrincipalFull)), "one share across lots");
        assert!(b.park("3".into(), "q", 3).is_ok());
        assert_eq!(a.park("4".into(), "r", 4), Err((4, Refused::Full)), "one cap across lots");
        assert_eq!((a.len(), b.len(), places.len()), (1, 2, 3));
        a.close();
        assert_eq!(b.admits("z"), Err(Refused::Closed), "closed for every lot");
    }

    #[test]
    fn a_held_place_is_given_back_when_dropped() {
        let places = Places::new(2, 1);
        let held = places.hold("p").unwrap();
        assert_eq!(places.hold("p").err(), Some(Refused::PrincipalFull));
        let other = places.hold("q").unwrap();
        assert_eq!(places.hold("r").err(), Some(Refused::Full));
        drop((held, other));
        assert!(places.is_empty() && places.owners.lock().unwrap().is_empty());
    }
}
