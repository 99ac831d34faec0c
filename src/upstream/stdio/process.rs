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
/// How long a write may wait for the process to read its input.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// A stderr line is cut at this many bytes.
const STDERR_LINE: usize = 2048;
/// Stderr lines logged per process and second; the rest are counted.
const STDERR_PER_SECOND: u32 = 20;
/// Messages buffered for one request's reader; a reader that falls this
/// far behind (a parked call whose server keeps talking) loses
/// notifications, and its stream ends on a request or response.
const SINK_DEPTH: usize = 256;

/// Where a message for a request goes.
pub type Sink = mpsc::Sender<Value>;

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
    stdin: tokio::sync::Mutex<Option<ChildStdin>>,
    links: Mutex<Links>,
    /// Set once the process is ending: its output is no longer read.
    ended: CancellationToken,
    /// Asks the owner task to stop the process.
    stop: CancellationToken,
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
}

/// What [`spawn`] started: the process, and its owner's parts.
pub struct Spawned {
    pub process: Arc<Process>,
    child: Child,
    stdout: tokio::process::ChildStdout,
    stderr: tokio::process::ChildStderr,
}

/// Starts `command` with exactly `env`, in its own process group, without a shell.
pub fn spawn(command: &StdioCommand, env: &[(String, String)], freed: Arc<Notify>) -> std::io::Result<Spawned> {
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
    let (Some(stdout), Some(stderr)) = (stdout, stderr) else {
        return Err(std::io::Error::other("no pipes"));
    };
    let epoch = Instant::now();
    let process = Arc::new(Process {
        pid,
        stdin: tokio::sync::Mutex::new(stdin),
        links: Mutex::new(Links::default()),
        ended: CancellationToken::new(),
        stop: CancellationToken::new(),
        end: Mutex::new(StreamEnd::Closed),
        idle_since: AtomicU64::new(0),
        epoch,
        initialized: AtomicBool::new(false),
        freed,
        used: AtomicBool::new(false),
    });
    Ok(Spawned { process, child, stdout, stderr })
}

impl Process {
    /// Writes one message as one line; `Err` when the process is gone, or
    /// has not read its input for [`WRITE_TIMEOUT`] (it is then stopped).
    pub async fn write(&self, line: &[u8]) -> Result<(), ()> {
        if self.ended.is_cancelled() {
            return Err(());
        }
        let mut out = Vec::with_capacity(line.len() + 1);
        out.extend_from_slice(line);
        out.push(b'\n');
        let written = tokio::time::timeout(WRITE_TIMEOUT, async {
            let mut stdin = self.stdin.lock().await;
            let pipe = stdin.as_mut().ok_or(())?;
            pipe.write_all(&out).await.map_err(|_| ())?;
            pipe.flush().await.map_err(|_| ())
        })
        .await;
        match written {
            Ok(result) => result,
            Err(_) => {
                tracing::warn!(pid = self.pid, "upstream process does not read its input: stopped");
                self.stop();
                Err(())
            }
        }
    }

    /// Links request `id` (and its progress `token`) to a new stream; with
    /// `alone`, what names no request goes to it too. `None` when the
    /// process is ending.
    pub fn link(&self, id: u64, token: Option<String>, alone: bool) -> Option<mpsc::Receiver<Value>> {
        let mut links = self.links.lock().expect("links lock");
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

    /// Forgets request `id` (answered, or its reader gone).
    pub fn unlink(&self, id: u64) {
        let mut links = self.links.lock().expect("links lock");
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
    pub fn own(&self) -> Option<mpsc::Receiver<Value>> {
        if self.ended.is_cancelled() {
            return None;
        }
        let (tx, rx) = mpsc::channel(SINK_DEPTH);
        self.links.lock().expect("links lock").own = Some(tx);
        Some(rx)
    }

    /// Requests in flight, and whether one has the process to itself.
    pub fn load(&self) -> (usize, bool) {
        let links = self.links.lock().expect("links lock");
        (links.requests.len(), links.alone.is_some())
    }

    /// How long nothing has been in flight on it and nobody has read its
    /// own stream; `None` while something is.
    pub fn idle(&self) -> Option<Duration> {
        let links = self.links.lock().expect("links lock");
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
        let links = self.links.lock().expect("links lock");
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
        *self.end.lock().expect("end lock")
    }

    /// Whether the gateway asked it to stop.
    pub fn stop_asked(&self) -> bool {
        self.stop.is_cancelled()
    }

    /// Asks the owner task to stop the process (TERM, then KILL).
    pub fn stop(&self) {
        self.stop.cancel();
    }

    /// Places one message from the process: a response or progress to its
    /// request, what names no request to the request that has the process
    /// to itself or to the session's own stream; what is left is returned.
    fn place(&self, msg: Value) -> Option<Unlinked> {
        let mut links = self.links.lock().expect("links lock");
        let method = msg.get("method").and_then(Value::as_str);
        let id = msg.get("id");
        match (method, id) {
            // A response: to its request, which it ends.
            (None, Some(id)) => {
                let id = id.as_u64()?;
                let sink = links.requests.remove(&id)?;
                links.tokens.retain(|_, r| *r != id);
                if links.alone == Some(id) {
                    links.alone = None;
                }
                if links.requests.is_empty() {
                    self.idle_since.store(self.epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
                }
                // A reader that fell behind gets its stream ended instead.
                let _ = sink.try_send(msg);
                drop(links);
                self.freed.notify_waiters();
                None
            }
            (Some("notifications/progress"), None) => {
                let token = msg.pointer("/params/progressToken").map(Value::to_string)?;
                let request = *links.tokens.get(&token)?;
                if let Some(sink) = links.requests.get(&request) {
                    let _ = sink.try_send(msg);
                }
                None
            }
            (Some(method), id) => {
                let method = method.to_string();
                let id = id.cloned();
                let to = links.alone.and_then(|a| links.requests.get(&a)).or(links.own.as_ref()).cloned();
                let Some(sink) = to.filter(|s| !s.is_closed()) else { return Some(unlinked(msg, id, &method)) };
                let mut msg = msg;
                // A question gets an id of the gateway's: its answer comes
                // back through the session, which finds the process by it.
                let minted = match &id {
                    Some(_) if links.asked.len() >= MAX_ASKED => return Some(unlinked(msg, id, &method)),
                    Some(original) => {
                        let minted = crate::upstream::answers::mint_id();
                        links.asked.insert(minted, original.clone());
                        msg["id"] = Value::from(minted);
                        Some(minted)
                    }
                    None => None,
                };
                match sink.try_send(msg) {
                    Ok(()) => None,
                    Err(mpsc::error::TrySendError::Full(msg) | mpsc::error::TrySendError::Closed(msg)) => {
                        if let Some(minted) = minted {
                            links.asked.remove(&minted);
                        }
                        Some(unlinked(msg, id, &method))
                    }
                }
            }
            (None, None) => None,
        }
    }

    /// The process's own id for the question the gateway named `minted`
    /// (an answer to it is on its way), if this process asked it.
    pub fn answered(&self, minted: u64) -> Option<Value> {
        self.links.lock().expect("links lock").asked.remove(&minted)
    }

    /// Whether request `id` (the gateway's) is in flight here.
    pub fn carries(&self, id: u64) -> bool {
        self.links.lock().expect("links lock").requests.contains_key(&id)
    }

    /// Ends every stream linked to the process.
    fn end_links(&self, why: StreamEnd) {
        *self.end.lock().expect("end lock") = why;
        self.ended.cancel();
        let mut links = self.links.lock().expect("links lock");
        links.requests.clear();
        links.tokens.clear();
        links.alone = None;
        links.own = None;
        links.asked.clear();
    }
}

fn unlinked(msg: Value, id: Option<Value>, method: &str) -> Unlinked {
    match id {
        Some(id) => Unlinked::Request { id, method: method.to_string() },
        None => Unlinked::Notification(msg),
    }
}

/// The owner task of one process: reads its output until it ends or is
/// asked to stop, then stops it and reaps it (and KILLs what is left of
/// its group). `permit` (its place in the upstream's count) is released
/// only once it is reaped. `done` runs last.
pub async fn own(
    spawned: Spawned,
    upstream: Arc<str>,
    max_line: usize,
    permit: OwnedSemaphorePermit,
    unlinked: impl Fn(&Arc<Process>, Unlinked) + Send,
    done: impl FnOnce(&Arc<Process>) + Send,
) {
    let Spawned { process, mut child, stdout, stderr } = spawned;
    let pid = process.pid;
    let stderr_task = tokio::spawn(log_stderr(stderr, upstream.clone(), pid));
    let mut stdout = BufReader::with_capacity(64 * 1024, stdout);
    let mut line = Vec::new();
    let why = loop {
        tokio::select! {
            _ = process.stop.cancelled() => break StreamEnd::Closed,
            read = read_line(&mut stdout, &mut line, max_line) => match read {
                Ok(true) => {}
                Ok(false) => break StreamEnd::Closed,
                Err(LineError::TooLong) => {
                    tracing::warn!(%upstream, pid, max_line,
                        "upstream process wrote a line over the size cap: process stopped");
                    break StreamEnd::TooLarge;
                }
                Err(LineError::Io) => break StreamEnd::Closed,
            },
        }
        let Ok(msg) = serde_json::from_slice::<Value>(&line) else {
            tracing::warn!(%upstream, pid, bytes = line.len(), "upstream process wrote a line that is not JSON: dropped");
            continue;
        };
        if !msg.is_object() || msg.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
            tracing::warn!(%upstream, pid, "upstream process wrote JSON that is not a JSON-RPC message: dropped");
            continue;
        }
        if let Some(left) = process.place(msg) {
            unlinked(&process, left);
        }
        // One large answer does not keep a large buffer for the process's life.
        if line.capacity() > 1 << 20 {
            line = Vec::new();
        }
    };
    process.end_links(why);
    // The MCP stdio shutdown: close stdin, then TERM, then KILL.
    process.stdin.lock().await.take();
    signal_group(pid, Signal::TERM);
    let exited = tokio::time::timeout(STOP_GRACE, child.wait()).await;
    // Whatever is left of the group (a grandchild, a child ignoring TERM).
    signal_group(pid, Signal::KILL);
    if exited.is_err() {
        let _ = child.kill().await;
    }
    let status = child.wait().await;
    stderr_task.abort();
    tracing::debug!(%upstream, pid, ?status, "upstream process reaped");
    drop(permit);
    done(&process);
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
async fn read_line<R: AsyncBufRead + Unpin>(r: &mut R, line: &mut Vec<u8>, cap: usize) -> Result<bool, LineError> {
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
    let mut window = Instant::now();
    let (mut logged, mut dropped) = (0u32, 0u64);
    loop {
        line.clear();
        let mut cut = false;
        loop {
            let Ok(available) = r.fill_buf().await else { return };
            if available.is_empty() {
                if !line.is_empty() {
                    break;
                }
                if dropped > 0 {
                    tracing::warn!(%upstream, pid, dropped, "upstream stderr lines not logged (rate limit)");
                }
                return;
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
        if window.elapsed() >= Duration::from_secs(1) {
            if dropped > 0 {
                tracing::warn!(%upstream, pid, dropped, "upstream stderr lines not logged (rate limit)");
            }
            window = Instant::now();
            (logged, dropped) = (0, 0);
        }
        if logged >= STDERR_PER_SECOND {
            dropped += 1;
            continue;
        }
        logged += 1;
        let text = String::from_utf8_lossy(&line);
        let text = text.trim_end();
        tracing::info!(%upstream, pid, cut, "upstream stderr: {text}");
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
