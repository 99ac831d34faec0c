//! Stdio upstreams (DESIGN §12): the [`Channel`] of programs spoken to over
//! stdin/stdout. A process is one legacy session by construction.
//!
//! - A [`Fleet`] is one upstream's processes, whichever routes use it:
//!   at most `max_processes` alive (spares and stopping ones included, a
//!   place freed only once its process is reaped), spares spawned ahead,
//!   a command that keeps failing backed off, idle processes stopped.
//! - A session the gateway opens (`initialize`) is a *family*: the process
//!   that answered, and more started with the same `initialize` when calls
//!   need a process to themselves ([`Channel::send_alone`]), up to the
//!   caller's share. Stdio links a message to a request only by response
//!   id and progress token; so a request that must get the questions and
//!   log lines that name no request has its process to itself until its
//!   response, and other requests share processes.
//! - A 2026 server's processes (`generation = "modern"`) are no sessions:
//!   one pool, any process serving any request ([`stateless`]).
//! - The gateway writes only ids it minted: requests' ids come from the
//!   session half, and a question a process asks gets a gateway id before
//!   it is passed on; the answer is written back under the process's own.

mod process;
mod stateless;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use serde_json::Value;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::channel::{
    Answer, Channel, Messages, Pending, SendError, Sent, SessionWire, Stateless, StreamEnd,
};
use super::health::Health;
use crate::config::{StdioCommand, Upstream};
use crate::metrics::{Metrics, SpawnLabels, UpstreamNameLabels};
use process::{Process, Unlinked};

/// How long a request waits for a process (the upstream's cap, or the
/// caller's share) before it is refused.
pub const ADMISSION_WAIT: Duration = Duration::from_secs(2);
/// The first delay after a failed start; it doubles per failure.
const BACKOFF_FIRST: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(10);
/// A process is stopped to make room for another session only once idle
/// this long: a call's requests (its tool list, then the call) come in a
/// row on the same session.
const EVICT_AFTER: Duration = Duration::from_millis(250);
/// A process that exits on its own sooner than this after it started
/// counts as a failed start (backoff); once one has lived this long, the
/// failures are forgotten.
const HEALTHY_AFTER: Duration = Duration::from_secs(10);

/// A stdio upstream as one route's channel (a route's health and
/// configuration over its upstream's shared [`Fleet`]).
#[derive(Clone)]
pub struct Stdio(Arc<Inner>);

struct Inner {
    fleet: Arc<Fleet>,
    upstream: Upstream,
    /// `stdio:<upstream name>`: sealed into tokens that must come back here.
    instance: String,
    health: Health,
}

impl Stdio {
    pub fn new(fleet: Arc<Fleet>, upstream: Upstream, metrics: &Metrics, route: &str) -> Stdio {
        let instance = format!("stdio:{}", upstream.name);
        let health = Health::new(metrics, route, &upstream.name, &instance);
        Stdio(Arc::new(Inner { fleet, upstream, instance, health }))
    }

    pub fn fleet(&self) -> &Arc<Fleet> {
        &self.0.fleet
    }

    /// `check-config --probe`: starts a process, initializes it, lists its
    /// tools and stops it. What it found, or why not.
    pub async fn probe(&self) -> Result<String, String> {
        let upstream = &self.0.upstream;
        if upstream.generation == crate::config::UpstreamGeneration::Modern {
            return self.probe_stateless().await;
        }
        let init = serde_json::json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": upstream.protocol_version,
            "capabilities": {},
            "clientInfo": {"name": "sessionless-check-config", "version": env!("CARGO_PKG_VERSION")},
        }});
        let bytes = |m: &Value| serde_json::to_vec(m).unwrap_or_default();
        let opened = self.send(&SessionWire::default(), &bytes(&init)).await;
        let found = async {
            let sent = opened.map_err(|e| {
                format!("could not start ({})", crate::upstream::map_send_error(e, false).reason())
            })?;
            let (Answer::Json(answer), Some(id)) = (sent.answer, sent.session) else {
                return Err("no answer to initialize".to_string());
            };
            let wire = SessionWire { id: Some(id), version: None, owner: None };
            let version =
                answer.pointer("/result/protocolVersion").and_then(Value::as_str).unwrap_or("?").to_string();
            let initialized = serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
            self.send(&wire, &bytes(&initialized)).await.map_err(|_| "gone after initialize".to_string())?;
            let list = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}});
            let sent =
                self.send(&wire, &bytes(&list)).await.map_err(|_| "gone after initialize".to_string())?;
            let Answer::Stream(mut stream) = sent.answer else {
                return Err("no answer to tools/list".into());
            };
            let listed = loop {
                let next = tokio::time::timeout(upstream.response_timeout, stream.next()).await;
                match next {
                    Ok(Ok(msg)) if msg.get("id") == Some(&Value::from(1)) => break msg,
                    Ok(Ok(_)) => continue,
                    _ => return Err("no answer to tools/list".into()),
                }
            };
            let tools: Vec<&str> =
                (listed.pointer("/result/tools").and_then(Value::as_array).into_iter().flatten())
                    .filter_map(|t| t.get("name").and_then(Value::as_str))
                    .collect();
            self.close(&wire).await;
            Ok(format!("legacy over stdio (protocol {version}), {} tools: {}", tools.len(), tools.join(", ")))
        }
        .await;
        self.0.fleet.stop_all(&tokio_util::sync::CancellationToken::new()).await;
        found
    }

    async fn write(&self, session: &SessionWire, message: &[u8], alone: bool) -> Result<Sent, SendError> {
        let fleet = &self.0.fleet;
        let msg: Value = serde_json::from_slice(message).map_err(|_| SendError::Invalid("encode"))?;
        let Some(id) = &session.id else {
            let sent = fleet.open(message, &msg, session.owner.clone()).await;
            match &sent {
                Ok(_) => self.0.health.recovered(),
                Err(SendError::Start { .. }) => self.0.health.failed("its process does not start"),
                Err(_) => {}
            }
            return sent;
        };
        let family = fleet.family(id).ok_or(SendError::SessionGone)?;
        let method = msg.get("method").and_then(Value::as_str);
        match (method, msg.get("id")) {
            (Some(_), Some(request_id)) => {
                let request_id = request_id.as_u64().ok_or(SendError::Invalid("request id"))?;
                let token = msg.pointer("/params/_meta/progressToken").map(Value::to_string);
                let deadline = Instant::now() + ADMISSION_WAIT;
                let (process, rx) = family.take(fleet, request_id, token, alone, deadline).await?;
                // The reader first: if this call is dropped while the line
                // waits for the writer, the reader unlinks the request.
                let reader = Reader { rx, process, id: request_id };
                if matches!(method, Some("tools/call" | "prompts/get" | "resources/read")) {
                    reader.process.may_ask(request_id);
                }
                if reader.process.write(message).await.is_err() {
                    return Err(SendError::SessionGone);
                }
                Ok(Sent { answer: Answer::Stream(Box::new(reader)), session: None })
            }
            (None, Some(answer_id)) => {
                // An answer to a question: to the process that asked it, under its own id.
                let minted = answer_id.as_u64().ok_or(SendError::Invalid("answer id"))?;
                let asked = family.live().into_iter().find_map(|p| p.answered(minted).map(|own| (p, own)));
                if let Some((process, own)) = asked {
                    let mut msg = msg;
                    msg["id"] = own;
                    let bytes = serde_json::to_vec(&msg).map_err(|_| SendError::Invalid("encode"))?;
                    process.write(&bytes).await.map_err(|()| SendError::SessionGone)?;
                }
                Ok(Sent { answer: Answer::Accepted, session: None })
            }
            (Some(method), None) => {
                let live = family.live();
                if live.is_empty() {
                    return Err(SendError::SessionGone);
                }
                if method == "notifications/initialized" {
                    family.initialized.store(true, Ordering::Release);
                }
                // A cancellation goes to the process that carries the request.
                let carrier = msg.pointer("/params/requestId").and_then(Value::as_u64);
                for p in live.iter().filter(|p| carrier.is_none_or(|id| p.carries(id))) {
                    let _ = p.write(message).await;
                }
                Ok(Sent { answer: Answer::Accepted, session: None })
            }
            (None, None) => Err(SendError::Invalid("not a JSON-RPC message")),
        }
    }
}

impl Channel for Stdio {
    fn send<'a>(
        &'a self,
        session: &'a SessionWire,
        message: &'a [u8],
    ) -> Pending<'a, Result<Sent, SendError>> {
        Box::pin(self.write(session, message, false))
    }

    fn send_alone<'a>(
        &'a self,
        session: &'a SessionWire,
        message: &'a [u8],
    ) -> Pending<'a, Result<Sent, SendError>> {
        Box::pin(self.write(session, message, true))
    }

    fn links_all(&self) -> bool {
        false
    }

    fn send_stateless<'a>(&'a self, request: &'a Stateless<'a>) -> Pending<'a, Result<Sent, SendError>> {
        Box::pin(self.write_stateless(request))
    }

    fn messages<'a>(
        &'a self,
        session: &'a SessionWire,
        _resume: Option<&'a str>,
    ) -> Pending<'a, Result<Box<dyn Messages>, SendError>> {
        Box::pin(async move {
            let id = session.id.as_deref().ok_or(SendError::SessionGone)?;
            let family = self.0.fleet.family(id).ok_or(SendError::SessionGone)?;
            let process = family.live().into_iter().next().ok_or(SendError::SessionGone)?;
            let rx = process.own().ok_or(SendError::SessionGone)?;
            Ok(Box::new(Reader { rx, process, id: 0 }) as Box<dyn Messages>)
        })
    }

    fn close<'a>(&'a self, session: &'a SessionWire) -> Pending<'a, ()> {
        Box::pin(async move {
            if let Some(id) = &session.id {
                self.0.fleet.close(id);
            }
        })
    }

    fn distrust(&self) {}

    fn instance(&self) -> &str {
        &self.0.instance
    }

    fn identity(&self) -> *const () {
        Arc::as_ptr(&self.0).cast()
    }

    fn handle(&self) -> Arc<dyn Channel> {
        Arc::new(self.clone())
    }

    fn health(&self) -> &Health {
        &self.0.health
    }

    fn upstream(&self) -> &Upstream {
        &self.0.upstream
    }
}

/// What a process links to one request (or its session's own stream); the
/// link is dropped with the reader, which releases a process held alone.
struct Reader {
    rx: process::Inbox,
    process: Arc<Process>,
    /// The request's id; 0 for the session's own stream.
    id: u64,
}

impl Messages for Reader {
    fn next(&mut self) -> Pending<'_, Result<Value, StreamEnd>> {
        Box::pin(async move {
            match self.rx.recv().await {
                Some((msg, size)) => {
                    self.process.taken(size);
                    Ok(msg)
                }
                None if self.process.is_ended() => Err(self.process.end()),
                None => Err(StreamEnd::Closed),
            }
        })
    }

    fn resume_point(&self) -> Option<&str> {
        None
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        if self.id != 0 {
            self.process.unlink(self.id);
        }
        // What it never read leaves the process's budget.
        self.rx.close();
        while let Ok((_, size)) = self.rx.try_recv() {
            self.process.taken(size);
        }
    }
}

/// One upstream's processes, shared by the routes that use it.
pub struct Fleet {
    name: Arc<str>,
    command: Arc<StdioCommand>,
    env: Vec<(String, String)>,
    /// A stdout line's cap (`max_upstream_response_bytes`).
    max_line: usize,
    /// Processes one session may have (the caller's share of sessions).
    share: usize,
    /// One permit per live process, held until it is reaped.
    places: Arc<Semaphore>,
    families: Mutex<HashMap<String, Arc<Family>>>,
    spares: Mutex<Vec<Arc<Process>>>,
    /// Processes alive (for stopping them all), by pid.
    live: Mutex<HashMap<u32, Weak<Process>>>,
    starts: Mutex<Starts>,
    /// One unproven start at a time (first ever, or after a failure).
    probe: tokio::sync::Mutex<()>,
    /// No new sessions; processes stop once idle.
    retired: AtomicBool,
    /// A place or a process of a family came free.
    freed: Arc<Notify>,
    /// Callers waiting for a place.
    waiting: AtomicUsize,
    spawns: SpawnCounts,
    gauge: Gauge,
}

/// How the command's starts have gone lately.
#[derive(Default)]
struct Starts {
    /// Failed starts since the last good one.
    failures: u32,
    /// Whether a start has ever succeeded since the last failure.
    proven: bool,
    /// No start before this (backoff).
    not_before: Option<Instant>,
}

struct SpawnCounts {
    started: Counter,
    exited: Counter,
    start_timeout: Counter,
    spawn_error: Counter,
    refused: Counter,
    backoff: Counter,
}

/// A session: the processes started with one `initialize`.
struct Family {
    /// The `initialize` request, replayed to each process it gains.
    init: Vec<u8>,
    /// Who its processes are for.
    owner: Option<Arc<str>>,
    processes: Mutex<Vec<Arc<Process>>>,
    /// Processes being started for it.
    growing: AtomicUsize,
    /// Whether `notifications/initialized` was sent (replayed likewise).
    initialized: AtomicBool,
}

impl Family {
    /// Its processes that are alive.
    fn live(&self) -> Vec<Arc<Process>> {
        let mut processes = self.processes.lock().expect("family lock");
        processes.retain(|p| !p.is_ended());
        processes.clone()
    }

    /// A process for request `id`, linked: with `alone`, one with nothing
    /// else alone on it and no request in flight (started for it when the
    /// session has fewer than its share); otherwise the least loaded one.
    async fn take(
        &self,
        fleet: &Arc<Fleet>,
        id: u64,
        token: Option<String>,
        alone: bool,
        deadline: Instant,
    ) -> Result<(Arc<Process>, process::Inbox), SendError> {
        loop {
            let freed = fleet.freed.notified();
            let grow = {
                let mut processes = self.processes.lock().expect("family lock");
                // A process being stopped takes no request (it would refuse the link).
                processes.retain(|p| !p.is_ended() && !p.stop_asked());
                if processes.is_empty() && self.growing.load(Ordering::Acquire) == 0 {
                    return Err(SendError::SessionGone);
                }
                // A process held alone takes no other request: what names no
                // request goes to its holder, and must be the holder's.
                let pick = match alone {
                    true => processes.iter().find(|p| p.load() == (0, false)),
                    false => processes.iter().filter(|p| !p.load().1).min_by_key(|p| p.load().0),
                };
                if let Some(p) = pick {
                    if let Some(rx) = p.link(id, token.clone(), alone) {
                        return Ok((p.clone(), rx));
                    }
                    continue;
                }
                let room = processes.len() + self.growing.load(Ordering::Acquire) < fleet.share;
                let grow = room && !fleet.retired.load(Ordering::Acquire);
                if grow {
                    self.growing.fetch_add(1, Ordering::AcqRel);
                }
                grow
            };
            if grow {
                // Counted down however this ends (the caller may leave mid-start).
                let _growing = Growing(&self.growing);
                let process = fleet.start_for(self, deadline).await?;
                self.processes.lock().expect("family lock").push(process);
                fleet.freed.notify_waiters();
                continue;
            }
            if tokio::time::timeout_at(deadline, freed).await.is_err() {
                return Err(SendError::Share);
            }
        }
    }
}

/// One more of something (a process being started for a family, a caller
/// waiting for a place), counted down however it ends.
struct Growing<'a>(&'a AtomicUsize);

impl<'a> Growing<'a> {
    fn new(count: &'a AtomicUsize) -> Growing<'a> {
        count.fetch_add(1, Ordering::AcqRel);
        Growing(count)
    }
}

impl Drop for Growing<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A process being started: stopped if the start does not finish (its
/// caller left), so that no process is left in no family.
struct Starting(Option<Arc<Process>>);

impl Starting {
    fn done(mut self) -> Arc<Process> {
        self.0.take().expect("a started process")
    }
}

impl Drop for Starting {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            p.stop();
        }
    }
}

impl Fleet {
    /// The processes of `upstream` (a stdio one), none started yet but its
    /// spares. `env`: the child's environment, read from the configuration.
    pub fn new(
        upstream: &Upstream,
        command: Arc<StdioCommand>,
        env: Vec<(String, String)>,
        max_line: usize,
        share: usize,
        metrics: &Metrics,
    ) -> Arc<Fleet> {
        let name: Arc<str> = upstream.name.as_str().into();
        let count = |outcome: &'static str| {
            metrics
                .stdio_spawns
                .get_or_create(&SpawnLabels { upstream: upstream.name.clone(), outcome })
                .clone()
        };
        let spawns = SpawnCounts {
            started: count("started"),
            exited: count("exited"),
            start_timeout: count("start_timeout"),
            spawn_error: count("spawn_error"),
            refused: count("refused"),
            backoff: count("backoff"),
        };
        let gauge = metrics
            .stdio_processes
            .get_or_create(&UpstreamNameLabels { upstream: upstream.name.clone() })
            .clone();
        let fleet = Arc::new(Fleet {
            name,
            places: Arc::new(Semaphore::new(command.max_processes)),
            command,
            env,
            max_line,
            share: share.max(1),
            families: Mutex::new(HashMap::new()),
            spares: Mutex::new(Vec::new()),
            live: Mutex::new(HashMap::new()),
            starts: Mutex::new(Starts::default()),
            probe: tokio::sync::Mutex::new(()),
            retired: AtomicBool::new(false),
            freed: Arc::new(Notify::new()),
            waiting: AtomicUsize::new(0),
            spawns,
            gauge,
        });
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(Fleet::tend(Arc::downgrade(&fleet)));
        }
        fleet
    }

    /// Whether this fleet runs `command` with `env` (a reload keeps it then).
    pub fn runs(
        &self,
        command: &StdioCommand,
        env: &[(String, String)],
        max_line: usize,
        share: usize,
    ) -> bool {
        *self.command == *command
            && self.env == env
            && self.max_line == max_line
            && self.share == share.max(1)
    }

    fn family(&self, id: &str) -> Option<Arc<Family>> {
        self.families.lock().expect("families lock").get(id).cloned()
    }

    /// Opens a session: a process (a spare, or a new one) answers `init`.
    async fn open(
        self: &Arc<Self>,
        init: &[u8],
        msg: &Value,
        owner: Option<Arc<str>>,
    ) -> Result<Sent, SendError> {
        if self.retired.load(Ordering::Acquire) {
            return Err(SendError::NotSent);
        }
        if msg.get("method").and_then(Value::as_str) != Some("initialize") {
            return Err(SendError::SessionGone);
        }
        let family = Family {
            init: init.to_vec(),
            owner: owner.clone(),
            processes: Mutex::new(Vec::new()),
            growing: AtomicUsize::new(0),
            initialized: AtomicBool::new(false),
        };
        let deadline = Instant::now() + ADMISSION_WAIT;
        let (process, answer) = self.start(&family, deadline).await?;
        family.processes.lock().expect("family lock").push(process);
        let id = format!("{:032x}", rand::random::<u128>());
        self.families.lock().expect("families lock").insert(id.clone(), Arc::new(family));
        Ok(Sent { answer: Answer::Json(answer), session: Some(id) })
    }

    /// A process for `family`, initialized as its first was.
    async fn start_for(
        self: &Arc<Self>,
        family: &Family,
        deadline: Instant,
    ) -> Result<Arc<Process>, SendError> {
        let (process, _) = self.start(family, deadline).await?;
        if family.initialized.load(Ordering::Acquire) {
            let note = br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
            process.write(note).await.map_err(|()| SendError::Start { timed_out: false })?;
        }
        Ok(process)
    }

    /// A process that has answered `family`'s `initialize`, and its answer.
    async fn start(
        self: &Arc<Self>,
        family: &Family,
        deadline: Instant,
    ) -> Result<(Arc<Process>, Value), SendError> {
        // Until the command has started once (since it last failed), one start at a time.
        let proven = || self.starts.lock().expect("starts lock").proven;
        let _probe = match proven() {
            true => None,
            // Once the start ahead has proven the command, no need to queue.
            false => Some(self.probe.lock().await).filter(|_| !proven()),
        };
        self.backing_off()?;
        let began = Instant::now();
        let process = match self.claim_spare(family.owner.as_ref()) {
            Some(p) => p,
            None => self.spawn(deadline, family.owner.clone()).await?,
        };
        let starting = Starting(Some(process.clone()));
        let init_id = serde_json::from_slice::<Value>(&family.init)
            .ok()
            .and_then(|m| m.get("id").and_then(Value::as_u64))
            .unwrap_or(0);
        let Some(mut rx) = process.link(init_id, None, false) else {
            return Err(self.failed(&process, &self.spawns.exited, "exited before initialize"));
        };
        if process.write(&family.init).await.is_err() {
            return Err(self.failed(&process, &self.spawns.exited, "exited before initialize"));
        }
        let until = began + self.command.start_timeout;
        let answer = match tokio::time::timeout_at(until, rx.recv()).await {
            Err(_) => {
                let e =
                    self.failed(&process, &self.spawns.start_timeout, "did not answer initialize in time");
                return Err(match e {
                    SendError::Start { .. } => SendError::Start { timed_out: true },
                    other => other,
                });
            }
            Ok(None) => {
                return Err(self.failed(&process, &self.spawns.exited, "exited before answering initialize"))
            }
            Ok(Some((answer, size))) => {
                process.taken(size);
                answer
            }
        };
        drop(rx);
        if answer.get("result").is_none() {
            self.spawns.refused.inc();
            process.stop();
            tracing::warn!(upstream = %self.name, pid = process.pid, "upstream process refused initialize");
            return Err(SendError::Invalid("initialize refused"));
        }
        process.initialized.store(true, Ordering::Release);
        self.spawns.started.inc();
        {
            // Failures are forgotten once a process has lived a while ([`Fleet::tend`]).
            let mut starts = self.starts.lock().expect("starts lock");
            (starts.proven, starts.not_before) = (true, None);
        }
        // Off the call's path, and off the async workers: spawning blocks
        // the thread until the child has started its program.
        let fleet = self.clone();
        tokio::task::spawn_blocking(move || fleet.top_up());
        Ok((starting.done(), answer))
    }

    /// Refuses a start while the command is backed off.
    fn backing_off(&self) -> Result<(), SendError> {
        let starts = self.starts.lock().expect("starts lock");
        match starts.not_before {
            Some(t) if Instant::now() < t => {
                self.spawns.backoff.inc();
                Err(SendError::Start { timed_out: false })
            }
            _ => Ok(()),
        }
    }

    /// A failed start: the process stopped, the command backed off.
    fn failed(&self, process: &Process, count: &Counter, why: &str) -> SendError {
        process.stop();
        // Once per process, whether its start or its owner task saw it first.
        if process.claim_failure() {
            count.inc();
            let delay = self.back_off();
            tracing::warn!(upstream = %self.name, pid = process.pid, command = %self.command.argv[0],
                retry_in_ms = delay.as_millis() as u64, "upstream process {why}");
        }
        SendError::Start { timed_out: false }
    }

    /// A process that exited on its own soon after it started: the first
    /// is replaced at once; from the second on (until one lives
    /// [`HEALTHY_AFTER`]), starts are backed off.
    fn crashed(&self) {
        let mut starts = self.starts.lock().expect("starts lock");
        starts.failures = starts.failures.saturating_add(1);
        if starts.failures >= 2 {
            let delay = BACKOFF_FIRST.saturating_mul(1 << (starts.failures - 2).min(6)).min(BACKOFF_MAX);
            starts.not_before = Some(Instant::now() + delay);
            tracing::warn!(upstream = %self.name, crashes = starts.failures, retry_in_ms = delay.as_millis() as u64,
                "upstream processes keep exiting soon after they start");
        }
    }

    /// One more failed start: no start until the (doubling) delay has passed.
    fn back_off(&self) -> Duration {
        let mut starts = self.starts.lock().expect("starts lock");
        starts.failures = starts.failures.saturating_add(1);
        starts.proven = false;
        let delay =
            BACKOFF_FIRST.saturating_mul(1 << starts.failures.saturating_sub(1).min(6)).min(BACKOFF_MAX);
        starts.not_before = Some(Instant::now() + delay);
        delay
    }

    /// A spare that is still alive, claimed for `owner`, if any (and the
    /// owner may have one more process).
    fn claim_spare(&self, owner: Option<&Arc<str>>) -> Option<Arc<Process>> {
        if owner.is_some_and(|o| self.owned_by(o) >= self.per_owner()) {
            return None;
        }
        // The oldest first: it has had the longest to start its program.
        let mut spares = self.spares.lock().expect("spares lock");
        while !spares.is_empty() {
            let p = spares.remove(0);
            if !p.is_ended() && !p.stop_asked() {
                p.claim(owner);
                return Some(p);
            }
        }
        None
    }

    /// Processes one principal may have: its session share (below
    /// `max_processes`, it keeps one caller from holding every process).
    fn per_owner(&self) -> usize {
        self.share.min(self.command.max_processes)
    }

    /// Live processes that are `owner`'s (stopping ones included).
    fn owned_by(&self, owner: &Arc<str>) -> usize {
        let live = self.live.lock().expect("live lock");
        live.values().filter_map(Weak::upgrade).filter(|p| p.owner() == Some(owner)).count()
    }

    /// Spawns a process once a place is free (stopping an idle one to make
    /// room), waiting until `deadline` at most.
    async fn spawn(
        self: &Arc<Self>,
        deadline: Instant,
        owner: Option<Arc<str>>,
    ) -> Result<Arc<Process>, SendError> {
        // The caller's own share first: one of its idle processes makes room,
        // or one of its calls ends; else 429.
        if let Some(o) = &owner {
            loop {
                if self.owned_by(o) < self.per_owner() {
                    break;
                }
                let freed = self.freed.notified();
                self.make_room(Some(o));
                tokio::select! {
                    _ = freed => {}
                    _ = tokio::time::sleep(EVICT_AFTER / 4) => {}
                    _ = tokio::time::sleep_until(deadline) => return Err(SendError::Share),
                }
            }
        }
        let place = match self.places.clone().try_acquire_owned() {
            Ok(place) => place,
            Err(_) => {
                // In line for a place (first come, first served), stopping an
                // idle process each time a request ends and one may have gone idle.
                let queued = self.places.clone().acquire_owned();
                tokio::pin!(queued);
                let _waiting = Growing::new(&self.waiting);
                loop {
                    let freed = self.freed.notified();
                    self.make_room(None);
                    tokio::select! {
                        place = &mut queued => match place {
                            Ok(place) => break place,
                            Err(_) => return Err(SendError::NotSent),
                        },
                        _ = freed => continue,
                        // A process may have been idle long enough by now.
                        _ = tokio::time::sleep(EVICT_AFTER / 4) => continue,
                        _ = tokio::time::sleep_until(deadline) => return Err(SendError::Busy),
                    }
                }
            }
        };
        self.spawn_with(place, owner)
    }

    fn spawn_with(
        self: &Arc<Self>,
        place: OwnedSemaphorePermit,
        owner: Option<Arc<str>>,
    ) -> Result<Arc<Process>, SendError> {
        // Retired (a reload, shutdown) while this one waited for a place.
        if self.retired.load(Ordering::Acquire) {
            return Err(SendError::NotSent);
        }
        let budget = self.max_line.saturating_mul(2);
        let spawned = match process::spawn(&self.command, &self.env, self.freed.clone(), owner, budget) {
            Ok(s) => s,
            Err(e) => {
                self.spawns.spawn_error.inc();
                let delay = self.back_off();
                tracing::warn!(upstream = %self.name, program = %self.command.argv[0], error = %e,
                    retry_in_ms = delay.as_millis() as u64, "upstream process could not be spawned");
                return Err(SendError::Start { timed_out: false });
            }
        };
        let process = spawned.process.clone();
        self.gauge.inc();
        self.live.lock().expect("live lock").insert(process.pid, Arc::downgrade(&process));
        tracing::debug!(upstream = %self.name, pid = process.pid, "upstream process spawned");
        let weak = Arc::downgrade(self);
        let weak_done = weak.clone();
        let gauge = self.gauge.clone();
        let unlinked = move |p: &Arc<Process>, left: Unlinked| {
            let Some(fleet) = weak.upgrade() else { return };
            fleet.unlinked(p, left);
        };
        let done = move |p: &Arc<Process>| {
            gauge.dec();
            if let Some(fleet) = weak_done.upgrade() {
                fleet.live.lock().expect("live lock").remove(&p.pid);
                // A process that exited on its own before answering
                // initialize (a spare): the command is failing. One that
                // exits soon after it: once is replaced at once, again and
                // again is backed off.
                if !p.stop_asked() && p.claim_failure() {
                    if !p.initialized.load(Ordering::Acquire) {
                        fleet.spawns.exited.inc();
                        fleet.back_off();
                    } else if p.age() < HEALTHY_AFTER {
                        fleet.crashed();
                    }
                }
                fleet.freed.notify_waiters();
            }
        };
        tokio::spawn(process::own(spawned, self.name.clone(), self.max_line, place, unlinked, done));
        Ok(process)
    }

    /// What a process wrote that no request takes: a request refused (or a
    /// `ping` answered), a notification logged.
    fn unlinked(&self, process: &Arc<Process>, left: Unlinked) {
        match left {
            Unlinked::Request { id, method } => {
                tracing::debug!(upstream = %self.name, pid = process.pid, %method,
                    "upstream process asked what no call can answer: refused");
                // Queued without waiting: a process that reads nothing is stopped.
                process.try_write(&process::refusal(&id, &method));
            }
            Unlinked::Notification(msg) => {
                let method = msg.get("method").and_then(Value::as_str).unwrap_or_default();
                if method == "notifications/message" {
                    let level = msg.pointer("/params/level").and_then(Value::as_str).unwrap_or("info");
                    let (log, dropped) = process.log_limit.lock().unwrap_or_else(|e| e.into_inner()).allow();
                    if log {
                        let data = msg.pointer("/params/data").map(Value::to_string).unwrap_or_default();
                        let cut = data
                            .char_indices()
                            .map(|(i, _)| i)
                            .take_while(|i| *i <= 2048)
                            .last()
                            .unwrap_or(0);
                        let data = if data.len() > 2048 { &data[..cut] } else { &data[..] };
                        tracing::info!(upstream = %self.name, pid = process.pid, level,
                            dropped_before = dropped.unwrap_or(0), "upstream log: {data}");
                    }
                } else {
                    tracing::debug!(upstream = %self.name, pid = process.pid, method, "upstream notification dropped");
                }
            }
        }
    }

    /// At the cap (or `owner`'s share): stops a spare, or the process idle
    /// longest (`owner`'s own); its place comes free once it is reaped. No
    /// more are stopping at once than callers wait for a place.
    fn make_room(&self, owner: Option<&Arc<str>>) {
        let stopping = {
            let live = self.live.lock().expect("live lock");
            live.values().filter_map(Weak::upgrade).filter(|p| p.stop_asked()).count()
        };
        if stopping >= self.waiting.load(Ordering::Acquire).max(1) {
            return;
        }
        if owner.is_none() {
            if let Some(p) = self.spares.lock().expect("spares lock").pop() {
                p.stop();
                return;
            }
        }
        let idle = {
            let families = self.families.lock().expect("families lock");
            let mine = |f: &&Arc<Family>| owner.is_none() || f.owner.as_ref() == owner;
            let processes =
                families.values().filter(mine).flat_map(|f| f.processes.lock().expect("family lock").clone());
            // A session just opened has not had its first call yet: spared a while.
            let evictable = |p: &Arc<Process>| !p.fresh(ADMISSION_WAIT);
            let idle = processes.filter(evictable).filter_map(|p| Some((p.idle()?, p)));
            idle.max_by_key(|(idle, _)| *idle).filter(|(idle, _)| *idle >= EVICT_AFTER)
        };
        // Still idle (a request may have been linked since): stopped.
        if let Some((idle, p)) = idle {
            if !p.stop_asked() && p.stop_if_idle(idle) {
                tracing::debug!(upstream = %self.name, pid = p.pid, "idle upstream process stopped to make room");
            }
        }
    }

    /// Spawns spares up to `spare_processes`, without waiting for a place.
    fn top_up(self: &Arc<Self>) {
        // Not while the command is failing (a spare that exits at once would be a spawn loop).
        if self.retired.load(Ordering::Acquire) || self.starts.lock().expect("starts lock").failures > 0 {
            return;
        }
        loop {
            let mut spares = self.spares.lock().expect("spares lock");
            spares.retain(|p| !p.is_ended());
            if spares.len() >= self.command.spare_processes {
                return;
            }
            let Ok(place) = self.places.clone().try_acquire_owned() else { return };
            drop(spares);
            let Ok(p) = self.spawn_with(place, None) else { return };
            self.spares.lock().expect("spares lock").push(p);
        }
    }

    /// Ends session `id`: its processes are stopped.
    fn close(&self, id: &str) {
        let family = self.families.lock().expect("families lock").remove(id);
        for p in family.iter().flat_map(|f| f.live()) {
            tracing::debug!(upstream = %self.name, pid = p.pid, "session closed: upstream process stopped");
            p.stop();
        }
    }

    /// No new sessions: every process stops once it has nothing in flight
    /// (a parked call keeps its process until answered or expired).
    pub fn retire(&self) {
        self.retired.store(true, Ordering::Release);
        for p in self.spares.lock().expect("spares lock").drain(..) {
            p.stop();
        }
        self.stop_idle(Duration::ZERO);
    }

    /// Stops every process now and waits (bounded) until all are reaped.
    /// Stops every process (TERM, KILL after the grace); once `hurry` is
    /// cancelled, KILL at once.
    pub async fn stop_all(&self, hurry: &tokio_util::sync::CancellationToken) {
        self.retired.store(true, Ordering::Release);
        let until = Instant::now() + process::STOP_GRACE + Duration::from_secs(2);
        // Again until every place is back: a start that was waiting for a
        // place when this began may have spawned since.
        while self.processes() > 0 && Instant::now() < until {
            for p in self.live.lock().expect("live lock").values().filter_map(Weak::upgrade) {
                match hurry.is_cancelled() {
                    true => p.kill(),
                    false => p.stop(),
                }
            }
            let freed = self.freed.notified();
            tokio::select! {
                _ = tokio::time::timeout(Duration::from_millis(100), freed) => {}
                _ = hurry.cancelled(), if !hurry.is_cancelled() => {}
            }
        }
        if self.processes() > 0 {
            tracing::warn!(upstream = %self.name, "upstream processes still stopping at exit");
        }
    }

    /// Live processes (spares and stopping ones included).
    pub fn processes(&self) -> usize {
        self.command.max_processes - self.places.available_permits()
    }

    fn stop_idle(&self, idle: Duration) {
        let mut families = self.families.lock().expect("families lock");
        families.retain(|key, f| {
            let mut processes = f.processes.lock().expect("family lock");
            processes.retain(|p| !p.stop_if_idle(idle) && !p.stop_asked() && !p.is_ended());
            // A modern fleet's pool stays, empty or not (a request may be taking it).
            !processes.is_empty() || f.growing.load(Ordering::Acquire) > 0 || key == stateless::POOL
        });
    }

    /// The fleet's upkeep, until the fleet is dropped: idle processes
    /// stopped, spares kept up.
    async fn tend(fleet: Weak<Fleet>) {
        let Some(idle) = fleet.upgrade().map(|f| f.command.idle_timeout) else { return };
        let every = (idle / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(fleet) = fleet.upgrade() else { return };
            let retired = fleet.retired.load(Ordering::Acquire);
            fleet.stop_idle(if retired { Duration::ZERO } else { idle });
            let healthy = {
                let live = fleet.live.lock().expect("live lock");
                let mut processes = live.values().filter_map(Weak::upgrade);
                processes.any(|p| p.initialized.load(Ordering::Acquire) && p.age() >= HEALTHY_AFTER)
            };
            if healthy {
                fleet.starts.lock().expect("starts lock").failures = 0;
            }
            if retired {
                if fleet.processes() == 0 {
                    return;
                }
            } else {
                fleet.top_up();
            }
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for p in self.live.get_mut().expect("live lock").values().filter_map(Weak::upgrade) {
            p.stop();
        }
    }
}
