//! Legacy sessions: what `initialize` fixed (version, client capabilities),
//! per-session state (log level, counter), the server→client requests waiting
//! for an answer, in-flight streamed calls that `notifications/cancelled` can
//! stop, and the bounded, idle-expiring store that holds them all.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use serde_json::Value;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

/// Log levels in RFC 5424 order, as `logging/setLevel` names them.
pub(super) const LEVELS: [&str; 8] =
    ["debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"];
pub(super) const INFO: u8 = 1;

/// The client's answer to a server→client request: `result` or `error`.
pub(super) type ClientAnswer = Result<Value, Value>;

/// One legacy session.
pub(super) struct Session {
    pub id: Arc<str>,
    pub version: &'static str,
    /// The client declared form elicitation at initialize.
    pub elicitation: bool,
    level: AtomicU8,
    counter: AtomicU64,
    last_used_ms: AtomicU64,
    next_server_id: AtomicU64,
    next_stream: AtomicU64,
    pending: Mutex<HashMap<u64, oneshot::Sender<ClientAnswer>>>,
    inflight: Mutex<HashMap<String, (u64, CancellationToken)>>,
    get_stream: Mutex<Option<CancellationToken>>,
    /// Cancelled when the session ends (DELETE, eviction, expiry, shutdown).
    closed: CancellationToken,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Session {
    pub(super) fn new(version: &'static str, elicitation: bool, parent: &CancellationToken) -> Self {
        let id: Arc<str> = format!("{:032x}", rand::random::<u128>()).into();
        Self {
            id,
            version,
            elicitation,
            level: AtomicU8::new(INFO),
            counter: AtomicU64::new(0),
            last_used_ms: AtomicU64::new(0),
            next_server_id: AtomicU64::new(1),
            next_stream: AtomicU64::new(1),
            pending: Mutex::new(HashMap::new()),
            inflight: Mutex::new(HashMap::new()),
            get_stream: Mutex::new(None),
            closed: parent.child_token(),
        }
    }

    pub(super) fn set_level(&self, level: u8) {
        self.level.store(level, Ordering::Relaxed);
    }

    /// Whether a message at `level` passes the session's `logging/setLevel`.
    pub(super) fn logs(&self, level: u8) -> bool {
        level >= self.level.load(Ordering::Relaxed)
    }

    pub(super) fn bump_counter(&self) -> u64 {
        self.counter.fetch_add(1, Ordering::Relaxed) + 1
    }

    pub(super) fn next_stream(&self) -> u64 {
        self.next_stream.fetch_add(1, Ordering::Relaxed)
    }

    pub(super) fn close(&self) {
        self.closed.cancel();
    }

    /// Registers a server→client request; the guard forgets it when dropped.
    pub(super) fn expect_answer(&self) -> (u64, oneshot::Receiver<ClientAnswer>, PendingGuard<'_>) {
        let id = self.next_server_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        lock(&self.pending).insert(id, tx);
        (id, rx, PendingGuard { session: self, id })
    }

    /// Delivers a posted JSON-RPC response; false if nothing was waiting for it.
    pub(super) fn deliver(&self, id: &Value, answer: ClientAnswer) -> bool {
        let Some(id) = id.as_u64().or_else(|| id.as_str().and_then(|s| s.parse().ok())) else {
            return false;
        };
        match lock(&self.pending).remove(&id) {
            Some(tx) => tx.send(answer).is_ok(),
            None => false,
        }
    }

    /// Tracks a streamed call under its canonical request id; `tag` (the
    /// call's stream number) tells apart two calls that reuse one id.
    pub(super) fn track(&self, key: String, tag: u64) -> InflightGuard<'_> {
        let token = self.closed.child_token();
        lock(&self.inflight).insert(key.clone(), (tag, token.clone()));
        InflightGuard { session: self, key, tag, token }
    }

    /// `notifications/cancelled`: stops the call if it is still running.
    pub(super) fn cancel(&self, key: &str) -> bool {
        match lock(&self.inflight).get(key) {
            Some((_, token)) => {
                token.cancel();
                true
            }
            None => false,
        }
    }

    /// A new standalone GET stream replaces (ends) the previous one.
    pub(super) fn open_get_stream(&self) -> CancellationToken {
        let token = self.closed.child_token();
        if let Some(old) = lock(&self.get_stream).replace(token.clone()) {
            old.cancel();
        }
        token
    }
}

/// Removes a pending server→client request when its waiter goes away.
pub(super) struct PendingGuard<'s> {
    session: &'s Session,
    id: u64,
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        lock(&self.session.pending).remove(&self.id);
    }
}

/// Removes an in-flight call's cancellation entry when the call ends.
pub(super) struct InflightGuard<'s> {
    session: &'s Session,
    key: String,
    tag: u64,
    pub token: CancellationToken,
}

impl Drop for InflightGuard<'_> {
    fn drop(&mut self) {
        let mut inflight = lock(&self.session.inflight);
        // A client may reuse a request id; only remove our own entry.
        if inflight.get(&self.key).is_some_and(|(tag, _)| *tag == self.tag) {
            inflight.remove(&self.key);
        }
    }
}

/// Bounded session store: at most `max` sessions (oldest evicted first), each
/// dropped after `idle` without use.
pub(super) struct Store {
    map: DashMap<Arc<str>, Arc<Session>>,
    order: Mutex<VecDeque<Arc<str>>>,
    max: usize,
    idle: Duration,
    epoch: Instant,
}

impl Store {
    pub(super) fn new(max: usize, idle: Duration) -> Self {
        Self {
            map: DashMap::new(),
            order: Mutex::new(VecDeque::new()),
            max: max.max(1),
            idle,
            epoch: Instant::now(),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn expired(&self, session: &Session, now: u64) -> bool {
        let idle = u64::try_from(self.idle.as_millis()).unwrap_or(u64::MAX);
        now.saturating_sub(session.last_used_ms.load(Ordering::Relaxed)) > idle
    }

    pub(super) fn insert(&self, session: Arc<Session>) {
        session.last_used_ms.store(self.now_ms(), Ordering::Relaxed);
        let mut order = lock(&self.order);
        while self.map.len() >= self.max {
            let Some(oldest) = order.pop_front() else {
                break;
            };
            if let Some((_, old)) = self.map.remove(&oldest) {
                old.close();
            }
        }
        // Deleted sessions linger in `order`; compact once they dominate it.
        if order.len() >= self.max.saturating_mul(2) {
            order.retain(|id| self.map.contains_key(id));
        }
        order.push_back(session.id.clone());
        self.map.insert(session.id.clone(), session);
    }

    /// Looks a session up and marks it used; expired sessions are removed.
    pub(super) fn get(&self, id: &str) -> Option<Arc<Session>> {
        let session = self.map.get(id).map(|s| Arc::clone(s.value()))?;
        let now = self.now_ms();
        if self.expired(&session, now) {
            self.remove(id);
            return None;
        }
        session.last_used_ms.store(now, Ordering::Relaxed);
        Some(session)
    }

    pub(super) fn remove(&self, id: &str) -> bool {
        match self.map.remove(id) {
            Some((_, session)) => {
                session.close();
                true
            }
            None => false,
        }
    }

    /// Drops every session idle for longer than the limit.
    pub(super) fn sweep(&self) {
        let now = self.now_ms();
        self.map.retain(|_, session| {
            let keep = !self.expired(session, now);
            if !keep {
                session.close();
            }
            keep
        });
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.map.len()
    }
}
