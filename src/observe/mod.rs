//! One record per client request: its request id, its trace hop, and what
//! the pipeline made of it (route, cell, method, outcome, HTTP status). The
//! record lives as long as the request's work and its answer's body; when
//! the last of them ends it writes the access line (target
//! `sessionless::access`) and, when OTLP is configured, the request's span.
//! The pipeline reaches it through a task-local ([`current`]), set around
//! the handler and carried into the work a streamed answer moves to.

pub mod traceparent;

#[cfg(feature = "otlp")]
pub mod otlp;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;
#[cfg(feature = "otlp")]
use std::time::SystemTime;

use http::{HeaderMap, HeaderValue};

pub use traceparent::Hop;

/// A client's `x-request-id` is kept when it is a token of at most this many bytes.
pub const MAX_REQUEST_ID: usize = 128;

pub const REQUEST_ID: http::HeaderName = http::HeaderName::from_static("x-request-id");

tokio::task_local! {
    static CURRENT: Arc<Record>;
}

/// Where finished records go (read per request from the gateway).
#[derive(Clone, Default)]
pub struct Sinks {
    #[cfg(feature = "otlp")]
    pub spans: Option<otlp::Exporter>,
}

impl Sinks {
    #[cfg(feature = "otlp")]
    fn tracing(&self) -> bool {
        self.spans.is_some()
    }

    #[cfg(not(feature = "otlp"))]
    fn tracing(&self) -> bool {
        false
    }
}

pub struct Record {
    id: HeaderValue,
    started: Instant,
    /// The span's start (read only when spans are exported).
    #[cfg(feature = "otlp")]
    wall: SystemTime,
    access: bool,
    sinks: Sinks,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    hop: Option<Hop>,
    status: u16,
    counted: Option<Counted>,
    /// The called tool; `labelled`: it is on the latency allowlist.
    tool: Option<(String, bool)>,
    principal: &'static str,
}

/// What `Services::count` saw.
pub struct Counted {
    pub route: String,
    pub method: &'static str,
    pub generation: &'static str,
    pub upstream: &'static str,
    pub outcome: &'static str,
}

impl Record {
    /// The record of a request with these headers: its id (the client's, if
    /// a sane token), its trace context from the `traceparent` header (or a
    /// new trace when spans are exported).
    pub fn new(headers: &HeaderMap, sinks: Sinks) -> Arc<Record> {
        let access = tracing::enabled!(target: "sessionless::access", tracing::Level::INFO);
        let id = headers.get(&REQUEST_ID).filter(|v| sane_id(v.as_bytes())).cloned().unwrap_or_else(new_id);
        let hop = traceparent::from_headers(headers).or_else(|| sinks.tracing().then(Hop::root));
        let state = Mutex::new(State { hop, principal: "-", ..State::default() });
        Arc::new(Record {
            id,
            started: Instant::now(),
            #[cfg(feature = "otlp")]
            wall: SystemTime::now(),
            access,
            sinks,
            state,
        })
    }

    pub fn id(&self) -> &HeaderValue {
        &self.id
    }

    pub fn set_status(&self, status: http::StatusCode) {
        self.lock().status = status.as_u16();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `work` with this record as the current one.
    pub fn scope<F: std::future::Future>(
        self: Arc<Self>,
        work: F,
    ) -> impl std::future::Future<Output = F::Output> {
        CURRENT.scope(self, work)
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        let state = std::mem::take(self.state.get_mut().unwrap_or_else(|e| e.into_inner()));
        let Some(c) = &state.counted else { return };
        let micros = self.started.elapsed().as_micros() as u64;
        if self.access {
            let trace_id = state.hop.as_ref().map(|h| crate::seal::hex(&h.trace_id));
            tracing::info!(
                target: "sessionless::access",
                request_id = self.id.to_str().unwrap_or("-"),
                route = c.route,
                method = c.method,
                generation = c.generation,
                upstream = c.upstream,
                outcome = c.outcome,
                status = state.status,
                micros,
                principal = state.principal,
                tool = state.tool.as_ref().filter(|t| t.1).map(|t| t.0.as_str()),
                trace_id,
                "request"
            );
        }
        #[cfg(feature = "otlp")]
        if let (Some(spans), Some(hop)) = (&self.sinks.spans, &state.hop) {
            spans.finished(otlp::Finished {
                hop,
                counted: c,
                status: state.status,
                tool: state.tool.as_ref().map(|t| t.0.as_str()),
                start: self.wall,
                micros,
            });
        }
    }
}

/// Runs `f` on the current request's record, if there is one.
fn with_current<T>(f: impl FnOnce(&Record) -> T) -> Option<T> {
    CURRENT.try_with(|r| f(r)).ok()
}

/// The current record, for work that moves to a task of its own.
pub fn current() -> Option<Arc<Record>> {
    CURRENT.try_with(Arc::clone).ok()
}

/// `work` with the current record (if any) carried along: for work that
/// may be spawned off the handler's task.
pub fn carry<F>(work: F) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    match current() {
        Some(record) => Box::pin(record.scope(work)),
        None => Box::pin(work),
    }
}

/// `work`, spawned on behalf of the current request but not part of its
/// answer (a cancellation sent in the background): the request's trace hop
/// goes with it, its record does not (the access line does not wait for it).
pub fn with_hop<F: std::future::Future>(work: F) -> impl std::future::Future<Output = F::Output> {
    let hop = hop();
    let record = Arc::new(Record {
        id: HeaderValue::from_static("-"),
        started: Instant::now(),
        #[cfg(feature = "otlp")]
        wall: SystemTime::now(),
        access: false,
        sinks: Sinks::default(),
        state: Mutex::new(State { hop, principal: "-", ..State::default() }),
    });
    CURRENT.scope(record, work)
}

/// What the pipeline counted (one place: `Services::count`); nothing is
/// copied when no access line or span will be written.
pub fn counted(c: impl FnOnce() -> Counted) {
    with_current(|r| {
        if r.access || r.sinks.tracing() {
            r.lock().counted = Some(c());
        }
    });
}

/// The called tool, and whether the latency allowlist labels it.
pub fn called_tool(tool: &str, labelled: bool) {
    with_current(|r| {
        if labelled || r.sinks.tracing() || r.access {
            r.lock().tool = Some((tool.to_string(), labelled));
        }
    });
}

/// The current request's tool, when the latency allowlist labels it.
pub fn labelled_tool() -> Option<String> {
    with_current(|r| r.lock().tool.as_ref().filter(|t| t.1).map(|t| t.0.clone())).flatten()
}

/// The kind of caller (never the principal itself): `anonymous`, `key`,
/// `jwt`, or `bearer` (a route without a policy: an unverified token's digest).
pub fn principal(principal: &str) {
    let kind = match principal.split_once(':') {
        _ if principal == "anonymous" => "anonymous",
        Some(("key", _)) => "key",
        Some(("jwt", _)) => "jwt",
        _ => "bearer",
    };
    with_current(|r| r.lock().principal = kind);
}

/// A trace context found in a modern request's `_meta` (it wins over the header).
pub fn meta_traceparent(meta: &serde_json::Map<String, serde_json::Value>) {
    let Some(parent) = meta.get("traceparent").and_then(|v| v.as_str()).and_then(traceparent::parse) else {
        return;
    };
    let state = meta.get("tracestate").and_then(|v| v.as_str());
    with_current(|r| r.lock().hop = Some(Hop::child_of(&parent, state)));
}

/// The current request's hop: what goes upstream as `traceparent` and
/// `tracestate` (header, and `_meta` where the gateway writes it).
pub fn hop() -> Option<Hop> {
    with_current(|r| r.lock().hop.clone()).flatten()
}

fn sane_id(id: &[u8]) -> bool {
    !id.is_empty()
        && id.len() <= MAX_REQUEST_ID
        && id.iter().all(|c| c.is_ascii_alphanumeric() || b"-_.:".contains(c))
}

/// A new request id: a per-process random prefix and a counter (unique
/// across replicas with overwhelming odds, and cheap).
fn new_id() -> HeaderValue {
    static PREFIX: OnceLock<u64> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let prefix = *PREFIX.get_or_init(|| rand::RngCore::next_u64(&mut rand::thread_rng()));
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    // 16 hex digits of the process's random prefix, 8 of the count (which
    // wraps after 2^32 requests; the prefix keeps ids apart across replicas).
    let mut text = [0u8; 24];
    crate::seal::hex_into(&prefix.to_be_bytes(), &mut text[..16]);
    crate::seal::hex_into(&(n as u32).to_be_bytes(), &mut text[16..]);
    HeaderValue::from_bytes(&text).expect("hex is a header value")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_kept_only_when_sane() {
        let mut h = HeaderMap::new();
        h.insert(REQUEST_ID, HeaderValue::from_static("abc-123_x.y:z"));
        assert_eq!(Record::new(&h, Sinks::default()).id(), "abc-123_x.y:z");
        for bad in ["", "a b", "a\"b", &"x".repeat(MAX_REQUEST_ID + 1)] {
            h.insert(REQUEST_ID, HeaderValue::from_str(bad).unwrap());
            let id = Record::new(&h, Sinks::default()).id().clone();
            assert_ne!(id, bad);
            assert_eq!(id.len(), 24, "{id:?}");
        }
        let other = Record::new(&HeaderMap::new(), Sinks::default());
        assert_ne!(other.id(), Record::new(&HeaderMap::new(), Sinks::default()).id());
    }
}
