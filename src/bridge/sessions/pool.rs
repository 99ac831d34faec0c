//! Pooled legacy sessions keyed by (route, principal, capabilities, version).
//! Bounded per principal, then globally: at either bound the least recently
//! used idle session (the principal's own, or anyone's) is closed; when every
//! such session is busy, new keys are refused (429 for a principal's share,
//! 503 for the whole pool) rather than grown.

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tokio::sync::OnceCell;

use super::session::{InitError, KeyRef, PoolKey, Session};
use crate::error::Error;
use crate::metrics::{Metrics, QuotaLabels, ReasonLabels};
use crate::upstream::Channel;

type HashMap<K, V> = hashbrown::HashMap<K, V>;

struct Slot {
    cell: OnceCell<Arc<Session>>,
}

pub struct Pool {
    slots: Mutex<HashMap<PoolKey, Arc<Slot>>>,
    max: usize,
    per_principal: usize,
    idle: Duration,
    epoch: Instant,
    metrics: Metrics,
    /// `initialize` results seen lately, shared by the sessions whose server
    /// answered alike (a server answers every session the same): a pooled
    /// session or a held listen stream then keeps a pointer, not a tree of
    /// its own (about 1.8 KiB).
    inits: Mutex<Vec<Weak<serde_json::Value>>>,
}

/// How many distinct `initialize` results [`Pool`] remembers for sharing.
const SHARED_INITS: usize = 32;

impl Pool {
    pub fn new(max: usize, per_principal: usize, idle: Duration, metrics: Metrics) -> Pool {
        Pool {
            slots: Mutex::new(HashMap::default()),
            max,
            per_principal,
            idle,
            epoch: Instant::now(),
            metrics,
            inits: Mutex::new(Vec::new()),
        }
    }

    /// `init`, or an equal result another session already holds.
    fn shared_init(&self, init: Arc<serde_json::Value>) -> Arc<serde_json::Value> {
        let mut inits = self.inits.lock().expect("inits lock");
        inits.retain(|seen| seen.strong_count() > 0);
        if let Some(same) = inits.iter().filter_map(Weak::upgrade).find(|seen| *seen == init) {
            return same;
        }
        if inits.len() >= SHARED_INITS {
            inits.remove(0);
        }
        inits.push(Arc::downgrade(&init));
        init
    }

    pub fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// The pooled session for `key`, opened on first use.
    pub async fn acquire(&self, channel: &dyn Channel, key: KeyRef<'_>) -> Result<Arc<Session>, Error> {
        loop {
            let slot = self.slot(key)?;
            let open = || Box::pin(self.open(channel, key.to_owned()));
            let session = match slot.cell.get_or_try_init(open).await {
                Ok(s) => s.clone(),
                Err(e) => {
                    self.forget_unopened(key, &slot);
                    return Err(e);
                }
            };
            // Opened through a channel a reload has since replaced (its
            // upstream's settings or header values changed): new calls get a
            // new session; calls still on the old one finish on it.
            if !session.channel.same(channel) {
                self.forget_replaced(&session);
                continue;
            }
            session.last_used.store(self.now_ms(), std::sync::atomic::Ordering::Relaxed);
            return Ok(session);
        }
    }

    /// Takes `session` out of the pool without closing it (calls may still
    /// be running or parked on it); the upstream's idle timeout ends it.
    fn forget_replaced(&self, session: &Arc<Session>) {
        self.take_out(session);
    }

    /// Removes `session`'s slot if it still holds `session`.
    fn take_out(&self, session: &Arc<Session>) {
        let mut slots = self.slots.lock().expect("pool lock");
        let same =
            slots.get(&session.key).and_then(|slot| slot.cell.get()).is_some_and(|s| Arc::ptr_eq(s, session));
        if same {
            slots.remove(&session.key);
            self.metrics.sessions_open.get_or_create(&Metrics::route(&session.key.route)).dec();
        }
    }

    /// Drops a slot whose session could not be opened, so that an upstream
    /// outage does not fill the pool with empty slots nothing can evict.
    fn forget_unopened(&self, key: KeyRef<'_>, slot: &Arc<Slot>) {
        let mut slots = self.slots.lock().expect("pool lock");
        if slots.get(&key).is_some_and(|s| Arc::ptr_eq(s, slot) && s.cell.get().is_none()) {
            slots.remove(&key);
        }
    }

    /// A session of its own (not pooled), for a listen stream or a call that
    /// must not share its session. The caller closes it with [`Pool::close`].
    pub async fn open_exclusive(&self, channel: &dyn Channel, key: PoolKey) -> Result<Arc<Session>, Error> {
        self.open(channel, key).await
    }

    async fn open(&self, channel: &dyn Channel, key: PoolKey) -> Result<Arc<Session>, Error> {
        let route = key.route.clone();
        match Session::open(channel, key, self.now_ms()).await {
            Ok(mut s) => {
                s.init = self.shared_init(s.init);
                self.metrics.sessions_initialized.get_or_create(&Metrics::route(&route)).inc();
                self.metrics.sessions_open.get_or_create(&Metrics::route(&route)).inc();
                Ok(Arc::new(s))
            }
            Err(InitError::Post(e)) => Err(super::map_send_error(e, false)),
            Err(InitError::Refused(why)) => Err(Error::UpstreamInvalid(why)),
        }
    }

    fn slot(&self, key: KeyRef<'_>) -> Result<Arc<Slot>, Error> {
        let mut slots = self.slots.lock().expect("pool lock");
        if let Some(slot) = slots.get(&key) {
            return Ok(slot.clone());
        }
        let held = slots.keys().filter(|k| k.principal == key.principal).count();
        if held >= self.per_principal {
            let quota = QuotaLabels { route: key.route.to_string(), quota: "sessions_per_principal" };
            let Some(victim) = lru_idle(&slots, |k| k.principal == key.principal) else {
                self.metrics.quota_exceeded.get_or_create(&quota).inc();
                return Err(Error::TooManySessions);
            };
            self.evict(&mut slots, &victim);
        } else if slots.len() >= self.max {
            let victim = lru_idle(&slots, |_| true).ok_or(Error::Overloaded)?;
            self.evict(&mut slots, &victim);
        }
        let slot = Arc::new(Slot { cell: OnceCell::new() });
        slots.insert(key.to_owned(), slot.clone());
        Ok(slot)
    }

    fn evict(&self, slots: &mut HashMap<PoolKey, Arc<Slot>>, victim: &PoolKey) {
        if let Some(old) = slots.remove(victim).and_then(|s| s.cell.get().cloned()) {
            self.spawn_close(old, "evicted");
        }
    }

    /// Forgets `session` (after the upstream answered 404 for it).
    pub fn invalidate(&self, session: &Arc<Session>) {
        self.take_out(session);
        self.metrics.sessions_expired.get_or_create(&Metrics::route(&session.key.route)).inc();
    }

    fn spawn_close(&self, session: Arc<Session>, reason: &'static str) {
        let metrics = self.metrics.clone();
        tokio::spawn(async move { close(&metrics, &session, reason).await });
    }

    /// Closes an exclusive session.
    pub async fn close(&self, session: &Session, reason: &'static str) {
        close(&self.metrics, session, reason).await
    }

    /// Closes sessions idle longer than the idle timeout. Returns how many.
    pub fn reap_idle(&self) -> usize {
        let cutoff = self.now_ms().saturating_sub(self.idle.as_millis() as u64);
        let victims: Vec<Arc<Session>> = {
            let mut slots = self.slots.lock().expect("pool lock");
            let keys: Vec<PoolKey> = slots
                .iter()
                .filter(|(_, slot)| {
                    slot.cell.get().is_some_and(|s| {
                        Arc::strong_count(s) == 1
                            && s.last_used.load(std::sync::atomic::Ordering::Relaxed) < cutoff
                    })
                })
                .map(|(k, _)| k.clone())
                .collect();
            keys.iter().filter_map(|k| slots.remove(k).and_then(|s| s.cell.get().cloned())).collect()
        };
        let n = victims.len();
        for s in victims {
            self.spawn_close(s, "idle");
        }
        n
    }

    /// Closes every pooled session (graceful shutdown).
    pub async fn close_all(&self) {
        let all: Vec<Arc<Session>> = {
            let mut slots = self.slots.lock().expect("pool lock");
            slots.drain().filter_map(|(_, s)| s.cell.get().cloned()).collect()
        };
        let closing = all.iter().map(|s| close(&self.metrics, s, "shutdown"));
        futures_util::future::join_all(closing).await;
    }

    pub fn len(&self) -> usize {
        self.slots.lock().expect("pool lock").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Runs the idle reaper until `shutdown` fires.
    pub async fn run_reaper(self: Arc<Self>, shutdown: tokio_util::sync::CancellationToken) {
        let mut tick = tokio::time::interval((self.idle / 4).max(Duration::from_millis(250)));
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => { self.reap_idle(); }
            }
        }
    }
}

/// The least recently used idle session among the keys `which` picks.
fn lru_idle(slots: &HashMap<PoolKey, Arc<Slot>>, which: impl Fn(&PoolKey) -> bool) -> Option<PoolKey> {
    slots
        .iter()
        .filter(|(k, _)| which(k))
        .filter_map(|(k, slot)| {
            let s = slot.cell.get()?;
            (Arc::strong_count(s) == 1).then(|| (k, s.last_used.load(std::sync::atomic::Ordering::Relaxed)))
        })
        .min_by_key(|(_, used)| *used)
        .map(|(k, _)| k.clone())
}

async fn close(metrics: &Metrics, session: &Session, reason: &'static str) {
    session.channel.close(&session.wire).await;
    let route = Metrics::route(&session.key.route);
    metrics.sessions_open.get_or_create(&route).dec();
    metrics.sessions_closed.get_or_create(&ReasonLabels { route: session.key.route.clone(), reason }).inc();
}

/// An exclusive session, closed upstream (DELETE) when this guard is dropped:
/// whoever ends the call, the session does not outlive it.
pub struct Exclusive {
    pool: Arc<Pool>,
    session: Arc<Session>,
}

impl Exclusive {
    pub fn new(pool: Arc<Pool>, session: Arc<Session>) -> Exclusive {
        Exclusive { pool, session }
    }
}

impl Drop for Exclusive {
    fn drop(&mut self) {
        let (pool, session) = (self.pool.clone(), self.session.clone());
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move { pool.close(&session, "exclusive").await });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::upstream::Transport;

    #[tokio::test]
    async fn an_unreachable_upstream_leaves_no_empty_slot_behind() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let config =
            Config::single(&format!("http://127.0.0.1:{port}/mcp"), "127.0.0.1:0".parse().unwrap()).unwrap();
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = Metrics::register(&mut registry);
        let upstream = &config.routes[0].upstream;
        let transport = Transport::new(
            upstream.clone(),
            &upstream.urls[0],
            1 << 20,
            &metrics,
            "/mcp",
            Default::default(),
        );
        let pool = Pool::new(2, 2, Duration::from_secs(60), metrics);
        for principal in ["a", "b", "c"] {
            let key = PoolKey {
                route: "/mcp".into(),
                instance: transport.instance().into(),
                principal: principal.into(),
                capabilities: "{}".into(),
                version: "2026-07-28".into(),
            };
            assert!(pool.acquire(&transport, key.as_ref()).await.is_err());
        }
        assert!(pool.is_empty(), "failed opens must not fill the pool");
    }
}
