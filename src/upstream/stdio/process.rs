//! One spawned stdio server: started without a shell in its own process
//! group with only the environment it is given, its stdout read as one
//! JSON-RPC message per line (each capped), its stderr read line by line
//! into the gateway's log (lines capped, rate limited), and stopped by its
//! owner task (TERM to the group, KILL after a grace period, reaped).

use std::collections::HashMap;
use std::process::Stdio as Piped;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::{mpsc, Notify, OwnedSemaphorePermit};
use tokio_util::sync::CancellationToken;

use rustix::process::{Pid, Signal};

use crate::config::StdioCommand;
use crate::upstream::channel::StreamEnd;

/// How long a process has between TERM and KILL.
pub const STOP_GRACE: Duration = Duration::from_secs(5);
/// How long a write may wait for the process to read its input; a
/// process that reads nothing for this long is stopped.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// Whole lines queued for a process's writer. A line is queued whole or
/// not at all: a caller that leaves never leaves half a line behind.
const WRITE_QUEUE: usize = 16;
/// After the process exits, how long what it wrote last is still read
/// (a grandchild may hold its stdout open).
const EXIT_DRAIN: Duration = Duration::from_millis(200);
/// A stderr line is cut at this many bytes.
const STDERR_LINE: usize = 2048;
/// Stderr lines logged per process and second; the rest are counted.
const STDERR_PER_SECOND: u32 = 20;
/// Messages buffered for one request's reader; a reader that falls this
/// far behind (a parked call whose server keeps talking) loses
/// notifications, and its stream ends on a request or response.
const SINK_DEPTH: usize = 256;

/// `message` and a newline.
fn line(message: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(message.len() + 1);
    out.extend_from_slice(message);
    out.push(b'\n');
    out
}

/// Where a message for a request goes, with its size in bytes (counted
/// against the process's budget until read).
pub type Sink = mpsc::Sender<(Value, usize)>;

/// What a reader receives.
pub type Inbox = mpsc::Receiver<(Value, usize)>;

/// A lock that a panic elsewhere does not poison for everyone else.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// At most so many log lines a second from one process; the rest counted.
pub struct Limiter {
    window: Instant,
    logged: u32,
    dropped: u64,
}

impl Limiter {
    pub fn new() -> Limiter {
        Limiter { window: Instant::now(), logged: 0, dropped: 0 }
    }

    /// Whether a line may be logged now; `Some(n)` when a new second began
    /// and `n` lines were dropped in the last.
    pub fn allow(&mut self) -> (bool, Option<u64>) {
        let mut dropped = None;
        if self.window.elapsed() >= Duration::from_secs(1) {
            dropped = Some(self.dropped).filter(|n| *n > 0);
            (self.window, self.logged, self.dropped) = (Instant::now(), 0, 0);
        }
        if self.logged >= STDERR_PER_SECOND {
            self.dropped += 1;
            return (false, dropped);
        }
        self.logged += 1;
        (true, dropped)
    }
}

impl Default for Limiter {
    fn default() -> Limiter {
        Limiter::new()
    }
}

/// What the process's messages are linked to.
#[derive(Default)]
struct Links {
    /// In-flight requests by the id written (the gateway's), with whether
    /// the request has the process to itself.
    requests: HashMap<u64, Sink>,
    /// Progress tokens written, to the request that carried them.
    tokens: HashMap<String, u64>,
    /// The request that has the process to itself: it gets what names no request.
    alone: Option<u64>,
    /// In-flight requests that may ask the user something (a tool call, a
    /// prompt, a read): a question from a process where one of them is
    /// alone in flight is its.
    asking: std::collections::HashSet<u64>,
    /// The session's own stream ([`crate::upstream::Channel::messages`]).
    own: Option<Sink>,
    /// Requests the process wrote that a reader took, by the id the
    /// gateway gave them (unique in the gateway) to the process's own id.
    asked: HashMap<u64, Value>,
}

/// Questions one process may have open with the gateway's readers.
const MAX_ASKED: usize = 256;

/// A message the process wrote that the gateway must answer or place.
pub enum Unlinked {
    /// A request nobody can answer (its id as the process wrote it).
    Request { id: Value, method: String },
    /// A notification no request is linked to.
    Notification(Value),
}

/// A running (or stopping) process.
pub struct Process {
    pub pid: u32,
    /// Who the process is for (the principal whose session it serves);
    /// unset for a spare until it is claimed.
    owner: std::sync::OnceLock<Arc<str>>,
    /// Whole lines to the writer task, which owns stdin.
    lines: mpsc::Sender<Vec<u8>>,
    links: Mutex<Links>,
    /// Set once the process is ending: its output is no longer read.
    ended: CancellationToken,
    /// Asks the owner task to stop the process.
    stop: CancellationToken,
    /// Asks it to skip the TERM grace: KILL now (a shutdown told to hurry).
    kill: CancellationToken,
    /// Why its streams ended, when not by plain exit.
    end: Mutex<StreamEnd>,
    /// When it last had no request in flight, ms since `epoch`.
    idle_since: AtomicU64,
    epoch: Instant,
    /// Whether `initialize` has been answered.
    pub initialized: AtomicBool,
    /// Told when a request is answered or let go (a process may be free).
    freed: Arc<Notify>,
    /// Whether a request has been linked since `initialize` was answered.
    used: AtomicBool,
    /// Bytes of messages waiting in readers' queues, and the most allowed.
    queued: Arc<std::sync::atomic::AtomicUsize>,
    budget: usize,
    /// Whether its failure to start has been counted (once).
    failure_counted: AtomicBool,
    /// Its log lines that name no request, rate limited.
    pub log_limit: Mutex<Limiter>,
}

/// What [`spawn`] started: the process, and its owner's parts.
pub struct Spawned {
    pub process: Arc<Process>,
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<Vec<u8>>,
    stdout: tokio::process::ChildStdout,
    stderr: tokio::process::ChildStderr,
}

/// Starts `command` with exactly `env`, in its own process group, without a shell.
/// `owner`: the principal the process is for; `budget`: the bytes its
/// readers may have waiting.
pub fn spawn(
    command: &StdioCommand,
    env: &[(String, String)],
    freed: Arc<Notify>,
    owner: Option<Arc<str>>,
    budget: usize,
) -> std::io::Result<Spawned> {
    let mut cmd = Command::new(&command.argv[0]);
    cmd.args(&command.argv[1..])
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Piped::piped())
        .stdout(Piped::piped())
        .stderr(Piped::piped())
        .process_group(0)
        .kill_on_drop(true);
    if let Some(cwd) = &command.cwd {
        cmd.current_dir(cwd);
    }
    let mut child = cmd.spawn()?;
    let pid = child.id().unwrap_or(0);
    let (stdin, stdout, stderr) = (child.stdin.take(), child.stdout.take(), child.stderr.take());
    let (Some(stdin), Some(stdout), Some(stderr)) = (stdin, stdout, stderr) else {
        return Err(std::io::Error::other("no pipes"));
    };
    let (tx, lines) = mpsc::channel(WRITE_QUEUE);
    let epoch = Instant::now();
    let process = Arc::new(Process {
        pid,
        owner: owner.map(std::sync::OnceLock::from).unwrap_or_default(),
        lines: tx,
        links: Mutex::new(Links::default()),
        ended: CancellationToken::new(),
        stop: CancellationToken::new(),
        kill: CancellationToken::new(),
        end: Mutex::new(StreamEnd::Closed),
        idle_since: AtomicU64::new(0),
        epoch,
        initialized: AtomicBool::new(false),
        freed,
        used: AtomicBool::new(false),
        queued: Default::default(),
        budget,
        failure_counted: AtomicBool::new(false),
        log_limit: Mutex::new(Limiter::new()),
    });
    Ok(Spawned { process, child, stdin, lines, stdout, stderr })
}

impl Process {
    /// Who it is for, once known.
    pub fn owner(&self) -> Option<&Arc<str>> {
        self.owner.get()
    }

    /// A spare claimed for `owner`.
    pub fn claim(&self, owner: Option<&Arc<str>>) {
        if let Some(owner) = owner {
            let _ = self.owner.set(owner.clone());
        }
    }

    /// Queues one message as one line for the writer; `Err` when the
    /// process is gone or stopping, or has not read its input for
    /// [`WRITE_TIMEOUT`] (it is then stopped). Cancel-safe: the line is
    /// queued whole or not at all.
    pub async fn write(&self, message: &[u8]) -> Result<(), ()> {
        if self.ended.is_cancelled() || self.stop.is_cancelled() {
            return Err(());
        }
        match tokio::time::timeout(WRITE_TIMEOUT, self.lines.send(line(message))).await {
            Ok(sent) => sent.map_err(|_| ()),
            Err(_) => {
                tracing::warn!(pid = self.pid, "upstream process does not read its input: stopped");
                self.stop();
                Err(())
            }
        }
    }

    /// Queues a line without waiting: a process whose queue is full reads
    /// nothing and is stopped.
    pub fn try_write(&self, message: &[u8]) {
        if let Err(mpsc::error::TrySendError::Full(_)) = self.lines.try_send(line(message)) {
            tracing::warn!(pid = self.pid, "upstream process does not read its input: stopped");
            self.stop();
        }
    }

    /// Links request `id` (and its progress `token`) to a new stream; with
    /// `alone`, what names no request goes to it too. `None` when the
    /// process is ending.
    pub fn link(&self, id: u64, token: Option<String>, alone: bool) -> Option<Inbox> {
        let mut links = lock(&self.links);
        // Checked under the lock [`Process::stop_if_idle`] takes.
        if self.ended.is_cancelled() || self.stop.is_cancelled() {
            return None;
        }
        let (tx, rx) = mpsc::channel(SINK_DEPTH);
        if self.initialized.load(Ordering::Acquire) {
            self.used.store(true, Ordering::Release);
        }
        links.requests.insert(id, tx);
        if let Some(token) = token {
            links.tokens.insert(token, id);
        }
        if alone {
            links.alone = Some(id);
        }
        Some(rx)
    }

    /// Marks request `id` as one that may ask the user something.
    pub fn may_ask(&self, id: u64) {
        let mut links = lock(&self.links);
        if links.requests.contains_key(&id) {
            links.asking.insert(id);
        }
    }

    /// Forgets request `id` (answered, or its reader gone).
    pub fn unlink(&self, id: u64) {
        let mut links = lock(&self.links);
        links.asking.remove(&id);
        if links.requests.remove(&id).is_some() {
            links.tokens.retain(|_, r| *r != id);
            if links.alone == Some(id) {
                links.alone = None;
            }
            if links.requests.is_empty() {
                self.idle_since.store(self.epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
            }
            drop(links);
            self.freed.notify_waiters();
        }
    }

    /// The session's own stream; a second replaces the first.
    pub fn own(&self) -> Option<Inbox> {
        if self.ended.is_cancelled() {
            return None;
        }
        let (tx, rx) = mpsc::channel(SINK_DEPTH);
        lock(&self.links).own = Some(tx);
        Some(rx)
    }

    /// Requests in flight, and whether one has the process to itself.
    pub fn load(&self) -> (usize, bool) {
        let links = lock(&self.links);
        (links.requests.len(), links.alone.is_some())
    }

    /// How long nothing has been in flight on it and nobody has read its
    /// own stream; `None` while something is.
    pub fn idle(&self) -> Option<Duration> {
        let links = lock(&self.links);
        Self::idle_in(&links, self)
    }

    fn idle_in(links: &Links, p: &Process) -> Option<Duration> {
        let reading = links.own.as_ref().is_some_and(|s| !s.is_closed());
        let since = p.idle_since.load(Ordering::Relaxed);
        let now = p.epoch.elapsed().as_millis() as u64;
        (links.requests.is_empty() && !reading).then(|| Duration::from_millis(now.saturating_sub(since)))
    }

    /// Whether it was initialized less than `spared` ago and has had no
    /// request since (its session's first call is on its way).
    pub fn fresh(&self, spared: Duration) -> bool {
        let idle = self.idle().unwrap_or_default();
        self.initialized.load(Ordering::Acquire) && !self.used.load(Ordering::Acquire) && idle < spared
    }

    /// Stops the process if it has been idle for at least `idle`: checked
    /// and done under the lock [`Process::link`] takes, so that no request
    /// is linked to a process being stopped.
    pub fn stop_if_idle(&self, idle: Duration) -> bool {
        let links = lock(&self.links);
        let stop = Self::idle_in(&links, self).is_some_and(|d| d >= idle);
        if stop {
            self.stop.cancel();
        }
        stop
    }

    pub fn is_ended(&self) -> bool {
        self.ended.is_cancelled()
    }

    /// Why the streams of a request on it ended.
    pub fn end(&self) -> StreamEnd {
        *lock(&self.end)
    }

    /// Whether the gateway asked it to stop.
    pub fn stop_asked(&self) -> bool {
        self.stop.is_cancelled()
    }

    /// Asks the owner task to stop the process (TERM, then KILL).
    pub fn stop(&self) {
        self.stop.cancel();
    }

    /// Stops the process without waiting for it to exit on TERM: KILL now.
    pub fn kill(&self) {
        self.kill.cancel();
        self.stop.cancel();
    }

    /// Places one message from the process: a response or progress to its
    /// request, what names no request to the request that has the process
    /// to itself or to the session's own stream; what is left is returned.
    fn place(&self, msg: Value, size: usize) -> Result<Option<Unlinked>, StreamEnd> {
        use std::sync::atomic::Ordering::AcqRel;
        let notification = msg.get("id").is_none();
        if self.queued.load(Ordering::Acquire) + size > self.budget {
            // Readers hold as much as they may: a notification is dropped; a
            // request or response cannot be, so the process is ended.
            return match notification {
                true => Ok(None),
                false => Err(StreamEnd::TooLarge),
            };
        }
        let sent = |sink: &Sink, msg: Value| match sink.try_send((msg, size)) {
            Ok(()) => {
                self.queued.fetch_add(size, AcqRel);
                Ok(())
            }
            Err(mpsc::error::TrySendError::Full((msg, _)) | mpsc::error::TrySendError::Closed((msg, _))) => {
                Err(msg)
            }
        };
        let mut links = lock(&self.links);
        let method = msg.get("method").and_then(Value::as_str);
        let id = msg.get("id");
        match (method, id) {
            // A response: to its request, which it ends.
            (None, Some(id)) => {
                let Some(id) = id.as_u64() else { return Ok(None) };
                let Some(sink) = links.requests.remove(&id) else { return Ok(None) };
                links.asking.remove(&id);
                links.tokens.retain(|_, r| *r != id);
                if links.alone == Some(id) {
                    links.alone = None;
                }
                if links.requests.is_empty() {
                    self.idle_since.store(self.epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
                }
                // A reader that fell behind gets its stream ended instead.
                let _ = sent(&sink, msg);
                drop(links);
                self.freed.notify_waiters();
                Ok(None)
            }
            (Some("notifications/progress"), None) => {
                let Some(token) = msg.pointer("/params/progressToken").map(Value::to_string) else {
                    return Ok(None);
                };
                let Some(request) = links.tokens.get(&token).copied() else { return Ok(None) };
                if let Some(sink) = links.requests.get(&request) {
                    let _ = sent(sink, msg);
                }
                Ok(None)
            }
            (Some(method), id) => {
                let method = method.to_string();
                let id = id.cloned();
                // The request that has the process to itself; else a lone
                // request in flight (a question it did not declare it can
                // answer is then refused to it as missing, as over HTTP);
                // else the session's own stream.
                let lone = match (&id, links.requests.len()) {
                    (Some(_), 1) => links.requests.iter().next().filter(|(r, _)| links.asking.contains(r)),
                    _ => None,
                }
                .map(|(_, sink)| sink);
                let held = links.alone.and_then(|a| links.requests.get(&a));
                let to = held.or(lone).or(links.own.as_ref()).cloned();
                let Some(sink) = to.filter(|s| !s.is_closed()) else {
                    return Ok(Some(unlinked(msg, id, &method)));
                };
                let mut msg = msg;
                // A question gets an id of the gateway's: its answer comes
                // back through the session, which finds the process by it.
                let minted = match &id {
                    Some(_) if links.asked.len() >= MAX_ASKED => return Ok(Some(unlinked(msg, id, &method))),
                    Some(original) => {
                        let minted = crate::upstream::answers::mint_id();
                        links.asked.insert(minted, original.clone());
                        msg["id"] = Value::from(minted);
                        Some(minted)
                    }
                    None => None,
                };
                match sent(&sink, msg) {
                    Ok(()) => Ok(None),
                    Err(msg) => {
                        if let Some(minted) = minted {
                            links.asked.remove(&minted);
                        }
                        Ok(Some(unlinked(msg, id, &method)))
                    }
                }
            }
            (None, None) => Ok(None),
        }
    }

    /// A message a reader took: its bytes leave the budget.
    pub fn taken(&self, size: usize) {
        self.queued.fetch_sub(size, Ordering::AcqRel);
    }

    /// Claims the counting of its failure to start (true once).
    pub fn claim_failure(&self) -> bool {
        !self.failure_counted.swap(true, Ordering::AcqRel)
    }

    /// How long ago it was spawned.
    pub fn age(&self) -> Duration {
        self.epoch.elapsed()
    }

    /// The process's own id for the question the gateway named `minted`
    /// (an answer to it is on its way), if this process asked it.
    pub fn answered(&self, minted: u64) -> Option<Value> {
        lock(&self.links).asked.remove(&minted)
    }

    /// Whether request `id` (the gateway's) is in flight here.
    pub fn carries(&self, id: u64) -> bool {
        lock(&self.links).requests.contains_key(&id)
    }

    /// Ends every stream linked to the process.
    fn end_links(&self, why: StreamEnd) {
        *lock(&self.end) = why;
        self.ended.cancel();
        let mut links = lock(&self.links);
        links.requests.clear();
        links.tokens.clear();
        links.alone = None;
        links.own = None;
        links.asked.clear();
        links.asking.clear();
    }
}

fn unlinked(msg: Value, id: Option<Value>, method: &str) -> Unlinked {
    match id {
        Some(id) => Unlinked::Request { id, method: method.to_string() },
        None => Unlinked::Notification(msg),
    }
}

/// The owner task of one process: reads its output until it ends, exits
/// or is asked to stop, then stops it and reaps it (and KILLs what is left
/// of its group). `permit` (its place in the upstream's count) is released
/// only once it is reaped. `done` runs last. A panic on the way still ends
/// its streams, KILLs its group, frees its place and runs `done`.
pub async fn own(
    spawned: Spawned,
    upstream: Arc<str>,
    max_line: usize,
    permit: OwnedSemaphorePermit,
    unlinked: impl Fn(&Arc<Process>, Unlinked) + Send,
    done: impl FnOnce(&Arc<Process>) + Send + 'static,
) {
    let Spawned { process, mut child, stdin, lines, stdout, stderr } = spawned;
    let pid = process.pid;
    let _cleanup = Cleanup { process: process.clone(), permit: Some(permit), done: Some(Box::new(done)) };
    let _stderr = AbortOnDrop(tokio::spawn(log_stderr(stderr, upstream.clone(), pid)));
    let writer = AbortOnDrop(tokio::spawn(write_lines(stdin, lines, process.clone())));
    let mut stdout = BufReader::with_capacity(64 * 1024, stdout);
    let mut line = Vec::new();
    let mut exited = None;
    // Once it has exited: what it wrote last is read until this deadline.
    let mut drain_until: Option<tokio::time::Instant> = None;
    let why = loop {
        let drained = async {
            match drain_until {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let read = tokio::select! {
            _ = process.stop.cancelled() => break StreamEnd::Closed,
            status = child.wait(), if exited.is_none() => {
                exited = Some(status);
                drain_until = Some(tokio::time::Instant::now() + EXIT_DRAIN);
                continue;
            }
            _ = drained => break StreamEnd::Closed,
            read = read_line(&mut stdout, &mut line, max_line) => read,
        };
        match read {
            Ok(true) => {}
            Ok(false) | Err(LineError::Io) => break StreamEnd::Closed,
            Err(LineError::TooLong) => {
                tracing::warn!(%upstream, pid, max_line, "upstream process wrote a line over the size cap: process stopped");
                break StreamEnd::TooLarge;
            }
        }
        let msg = serde_json::from_slice::<Value>(&line)
            .ok()
            .filter(|m| m.is_object() && m.get("jsonrpc").and_then(Value::as_str) == Some("2.0"));
        match msg {
            None => {
                let (log, dropped) = lock(&process.log_limit).allow();
                if log {
                    tracing::warn!(%upstream, pid, bytes = line.len(), dropped_before = dropped.unwrap_or(0),
                        "upstream process wrote a line that is not a JSON-RPC message: dropped");
                }
            }
            Some(msg) => match process.place(msg, line.len()) {
                Ok(Some(left)) => unlinked(&process, left),
                Ok(None) => {}
                Err(why) => {
                    tracing::warn!(%upstream, pid, "upstream process wrote more than its readers may hold: process stopped");
                    break why;
                }
            },
        }
        // One large answer does not keep a large buffer for the process's life.
        if line.capacity() > 1 << 20 {
            line = Vec::new();
        }
    };
    if why != StreamEnd::Closed {
        // Ended by the gateway (a line over the cap), not by itself.
        process.stop();
    }
    process.end_links(why);
    // The MCP stdio shutdown: stdin closed (the writer ends), TERM, then KILL.
    drop(writer);
    signal_group(pid, Signal::TERM);
    if exited.is_none() {
        exited = tokio::select! {
            exited = tokio::time::timeout(STOP_GRACE, child.wait()) => exited.ok(),
            _ = process.kill.cancelled() => None,
        };
    }
    // Whatever is left of the group (a grandchild, a child ignoring TERM).
    signal_group(pid, Signal::KILL);
    if exited.is_none() {
        let _ = child.kill().await;
    }
    let status = child.wait().await;
    let status = match &status {
        Ok(status) => status.to_string(),
        Err(e) => e.to_string(),
    };
    tracing::debug!(%upstream, pid, %status, "upstream process reaped");
}

/// What ends a process's owner task, however it ends.
struct Cleanup {
    process: Arc<Process>,
    permit: Option<OwnedSemaphorePermit>,
    done: Option<Done>,
}

/// What runs once a process is gone.
type Done = Box<dyn FnOnce(&Arc<Process>) + Send>;

impl Drop for Cleanup {
    fn drop(&mut self) {
        if !self.process.is_ended() {
            self.process.end_links(StreamEnd::Closed);
        }
        signal_group(self.process.pid, Signal::KILL);
        drop(self.permit.take());
        if let Some(done) = self.done.take() {
            done(&self.process);
        }
    }
}

/// A task that ends with its handle.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The writer task: whole lines to stdin, in order. A process that does
/// not read a line within [`WRITE_TIMEOUT`] is stopped.
async fn write_lines(mut stdin: ChildStdin, mut lines: mpsc::Receiver<Vec<u8>>, process: Arc<Process>) {
    while let Some(line) = lines.recv().await {
        match tokio::time::timeout(WRITE_TIMEOUT, stdin.write_all(&line)).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return,
            Err(_) => {
                tracing::warn!(pid = process.pid, "upstream process does not read its input: stopped");
                process.stop();
                return;
            }
        }
    }
}

/// Sends `signal` to the process group led by `pid` (never to group 0 or 1).
fn signal_group(pid: u32, signal: Signal) {
    let Some(pid) = i32::try_from(pid).ok().filter(|p| *p > 1).and_then(Pid::from_raw) else { return };
    // ESRCH (the group is gone) is the common case after the leader exited alone.
    let _ = rustix::process::kill_process_group(pid, signal);
}

enum LineError {
    TooLong,
    Io,
}

/// Reads one line (without its newline) into `line`, at most `cap` bytes:
/// `Ok(false)` at the end of the stream.
async fn read_line<R: AsyncBufRead + Unpin>(
    r: &mut R,
    line: &mut Vec<u8>,
    cap: usize,
) -> Result<bool, LineError> {
    line.clear();
    loop {
        let available = r.fill_buf().await.map_err(|_| LineError::Io)?;
        if available.is_empty() {
            return Ok(!line.is_empty());
        }
        let (take, end) = match available.iter().position(|b| *b == b'\n') {
            Some(i) => (i, true),
            None => (available.len(), false),
        };
        if line.len() + take > cap {
            return Err(LineError::TooLong);
        }
        line.extend_from_slice(&available[..take]);
        r.consume(take + usize::from(end));
        if end {
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            if line.iter().all(u8::is_ascii_whitespace) {
                line.clear();
                continue;
            }
            return Ok(true);
        }
    }
}

/// Reads stderr to its end: each line (cut at [`STDERR_LINE`] bytes) into
/// the log, tagged with the upstream and pid, at most [`STDERR_PER_SECOND`]
/// a second; the rest are counted and the count logged. Memory: one buffer
/// of the reader's size and one line.
async fn log_stderr(stderr: tokio::process::ChildStderr, upstream: Arc<str>, pid: u32) {
    let mut r = BufReader::with_capacity(8 * 1024, stderr);
    let mut line = Vec::with_capacity(STDERR_LINE);
    let mut limiter = Limiter::new();
    loop {
        line.clear();
        let mut cut = false;
        loop {
            let Ok(available) = r.fill_buf().await else { return };
            if available.is_empty() {
                if line.is_empty() {
                    return;
                }
                break;
            }
            let (take, end) = match available.iter().position(|b| *b == b'\n') {
                Some(i) => (i, true),
                None => (available.len(), false),
            };
            let room = STDERR_LINE.saturating_sub(line.len());
            line.extend_from_slice(&available[..take.min(room)]);
            cut |= take > room;
            r.consume(take + usize::from(end));
            if end {
                break;
            }
        }
        let (log, dropped) = limiter.allow();
        if let Some(dropped) = dropped {
            tracing::warn!(%upstream, pid, dropped, "upstream stderr lines not logged (rate limit)");
        }
        if log {
            let text = String::from_utf8_lossy(&line);
            tracing::info!(%upstream, pid, cut, "upstream stderr: {}", text.trim_end());
        }
    }
}

/// The answer to a request the process wrote that no call can take: `ping`
/// is answered; anything else is refused, so the process is never left waiting.
pub fn refusal(id: &Value, method: &str) -> Vec<u8> {
    let msg = match method {
        "ping" => json!({"jsonrpc": "2.0", "id": id, "result": {}}),
        _ => json!({"jsonrpc": "2.0", "id": id, "error": {
            "code": -32601,
            "message": "no client can answer this request on this session (sessionless gateway)"
        }}),
    };
    serde_json::to_vec(&msg).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn lines(input: &[u8], cap: usize) -> Vec<Result<Vec<u8>, &'static str>> {
        let mut r = BufReader::with_capacity(4, input);
        let mut out = Vec::new();
        let mut line = Vec::new();
        loop {
            match read_line(&mut r, &mut line, cap).await {
                Ok(true) => out.push(Ok(line.clone())),
                Ok(false) => return out,
                Err(LineError::TooLong) => {
                    out.push(Err("too long"));
                    return out;
                }
                Err(LineError::Io) => return out,
            }
        }
    }

    #[tokio::test]
    async fn lines_are_split_capped_and_blank_ones_skipped() {
        let got = lines(b"{\"a\":1}\r\n\n  \n{\"b\":22}\nlast", 8).await;
        assert_eq!(got, vec![Ok(b"{\"a\":1}".to_vec()), Ok(b"{\"b\":22}".to_vec()), Ok(b"last".to_vec())]);
        let got = lines(b"123456789\nok\n", 8).await;
        assert_eq!(got, vec![Err("too long")]);
        // The cap counts the line, not the newline.
        assert_eq!(lines(b"12345678\n", 8).await, vec![Ok(b"12345678".to_vec())]);
    }
}
