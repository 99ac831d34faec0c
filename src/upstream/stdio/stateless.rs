//! A stdio upstream that speaks 2026-07-28 (`generation = "modern"`): no
//! session, so its processes are one pool and any live process serves any
//! request, the least loaded first. The pool is a [`Family`] whose
//! "initialize" is a `server/discover`: a process is started (under the
//! fleet's cap, backoff and start timeout) and proven by its answer, and
//! one more is started while every process is busy.
//!
//! Each request is written under an id and a progress token of the
//! gateway's own (a process serves many callers), linked back by them and
//! handed to the caller under its own. Log lines name no request: a call
//! that asks for them (`logLevel`) has a process to itself; any other
//! goes to the gateway's log. A 2026 server asks nothing mid-call (its
//! questions are `input_required` results), so nothing else is linked.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use serde_json::{json, Value};
use tokio::time::Instant;

use super::process::{self, Process};
use super::{Family, Fleet, Growing, Reader, Stdio, ADMISSION_WAIT};
use crate::upstream::answers::mint_id;
use crate::upstream::channel::{Answer, Messages, Pending, SendError, Sent, Stateless, StreamEnd};

/// The pool's key among the fleet's families (session keys are hex).
pub(super) const POOL: &str = "stateless";

const LOG_LEVEL: &str = "io.modelcontextprotocol/logLevel";

impl Stdio {
    /// Writes a 2026 request on a process of the pool; its messages come
    /// back under the caller's id and token.
    pub(super) async fn write_stateless(&self, request: &Stateless<'_>) -> Result<Sent, SendError> {
        let mut msg: Value =
            serde_json::from_slice(request.body).map_err(|_| SendError::Invalid("encode"))?;
        let id = msg.get("id").cloned().ok_or(SendError::Invalid("not a request"))?;
        let minted = mint_id();
        msg["id"] = Value::from(minted);
        let meta = msg.pointer_mut("/params/_meta").and_then(Value::as_object_mut);
        let alone = meta.as_ref().is_some_and(|m| m.contains_key(LOG_LEVEL));
        let token =
            meta.and_then(|m| m.get_mut("progressToken")).map(|t| std::mem::replace(t, json!(mint_id())));
        let linked =
            msg.pointer("/params/_meta/progressToken").filter(|_| token.is_some()).map(Value::to_string);
        let bytes = serde_json::to_vec(&msg).map_err(|_| SendError::Invalid("encode"))?;
        let fleet = &self.0.fleet;
        let pool = fleet.pool().ok_or(SendError::NotSent)?;
        let taken = pool.any(fleet, minted, linked, alone, Instant::now() + ADMISSION_WAIT).await;
        match &taken {
            Ok(_) => self.0.health.recovered(),
            Err(SendError::Start { .. }) => self.0.health.failed("its process does not start"),
            Err(_) => {}
        }
        let (process, rx) = taken?;
        // The reader first: if this call is dropped while the line waits
        // for the writer, the reader unlinks the request.
        let reader = Reader { rx, process, id: minted };
        if reader.process.write(&bytes).await.is_err() {
            return Err(SendError::NotSent);
        }
        let relinked = Relinked { reader, id, token, alone, answered: false };
        Ok(Sent { answer: Answer::Stream(Box::new(relinked)), session: None })
    }
}

impl Stdio {
    /// `check-config --probe` of a modern upstream: a process started
    /// (proven by `server/discover`), its tools listed, all stopped.
    pub(super) async fn probe_stateless(&self) -> Result<String, String> {
        let found = async {
            let meta = json!({"io.modelcontextprotocol/protocolVersion": crate::front::MODERN_VERSION,
                "io.modelcontextprotocol/clientCapabilities": {}});
            let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": meta}});
            let body = serde_json::to_vec(&list).map_err(|e| e.to_string())?;
            let request = Stateless { method: "tools/list", name: None, params: &[], body: &body };
            let sent = self.write_stateless(&request).await;
            let why = |e| format!("could not start ({})", crate::upstream::map_send_error(e, false).reason());
            let Answer::Stream(mut stream) = sent.map_err(why)?.answer else {
                return Err("no answer to tools/list".to_string());
            };
            let listed = tokio::time::timeout(self.0.upstream.response_timeout, stream.next()).await;
            let Ok(Ok(listed)) = listed else { return Err("no answer to tools/list".to_string()) };
            let tools: Vec<&str> =
                (listed.pointer("/result/tools").and_then(Value::as_array).into_iter().flatten())
                    .filter_map(|t| t.get("name").and_then(Value::as_str))
                    .collect();
            Ok(format!(
                "modern over stdio ({}), {} tools: {}",
                crate::front::MODERN_VERSION,
                tools.len(),
                tools.join(", ")
            ))
        }
        .await;
        self.0.fleet.stop_all(&tokio_util::sync::CancellationToken::new()).await;
        found
    }
}

impl Fleet {
    /// The pool of a modern fleet's processes; `None` once retired.
    fn pool(&self) -> Option<Arc<Family>> {
        if self.retired.load(Ordering::Acquire) {
            return None;
        }
        let mut families = self.families.lock().expect("families lock");
        let pool = families.entry(POOL.to_string()).or_insert_with(|| {
            Arc::new(Family {
                init: discover(),
                // Anyone's: a 2026 server's processes hold nothing of a caller.
                owner: None,
                processes: Default::default(),
                growing: Default::default(),
                initialized: Default::default(),
            })
        });
        Some(pool.clone())
    }
}

/// What proves a process of a modern fleet started: `server/discover` answered.
fn discover() -> Vec<u8> {
    let msg = json!({"jsonrpc": "2.0", "id": 0, "method": "server/discover", "params": {"_meta": {
        "io.modelcontextprotocol/protocolVersion": crate::front::MODERN_VERSION,
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "sessionless", "version": env!("CARGO_PKG_VERSION")},
    }}});
    serde_json::to_vec(&msg).expect("serialises")
}

impl Family {
    /// A process of the pool for request `id`, linked: with `alone`, one
    /// with nothing in flight; otherwise the least loaded. While every
    /// process is busy one more is started (in the background when a busy
    /// one can take the request now); with none free, a request waits for
    /// one until `deadline`.
    async fn any(
        self: &Arc<Self>,
        fleet: &Arc<Fleet>,
        id: u64,
        token: Option<String>,
        alone: bool,
        deadline: Instant,
    ) -> Result<(Arc<Process>, process::Inbox), SendError> {
        let mut may_grow = true;
        loop {
            let freed = fleet.freed.notified();
            let (pick, grow) = {
                let mut processes = self.processes.lock().expect("family lock");
                // A process being stopped takes no request (it would refuse the link).
                processes.retain(|p| !p.is_ended() && !p.stop_asked());
                let pick = match alone {
                    true => processes.iter().find(|p| p.load() == (0, false)),
                    false => processes.iter().filter(|p| !p.load().1).min_by_key(|p| p.load().0),
                };
                let growing = self.growing.load(Ordering::Acquire);
                let busy = pick.is_none_or(|p| p.load().0 > 0);
                let room = processes.len() + growing < fleet.command.max_processes;
                // A busy process takes the request now: one start at a time beside it.
                let grow = may_grow && busy && room && (pick.is_none() || growing == 0);
                let grow = grow && !fleet.retired.load(Ordering::Acquire);
                if grow {
                    self.growing.fetch_add(1, Ordering::AcqRel);
                }
                (pick.cloned(), grow)
            };
            if grow && pick.is_some() {
                let (pool, fleet) = (self.clone(), fleet.clone());
                tokio::spawn(async move {
                    let _ = pool.grow(&fleet, Instant::now() + ADMISSION_WAIT).await;
                });
            }
            if let Some(p) = pick {
                match p.link(id, token.clone(), alone) {
                    Some(rx) => return Ok((p, rx)),
                    None => continue,
                }
            }
            if grow {
                match self.grow(fleet, deadline).await {
                    Ok(()) => continue,
                    Err(e) if self.live().is_empty() => return Err(e),
                    Err(_) => may_grow = false,
                }
            }
            if tokio::time::timeout_at(deadline, freed).await.is_err() {
                return Err(SendError::Busy);
            }
        }
    }

    /// One more process, started and proven; `growing` was counted for it
    /// (and is counted down however this ends: the caller may leave mid-start).
    async fn grow(&self, fleet: &Arc<Fleet>, deadline: Instant) -> Result<(), SendError> {
        let _growing = Growing(&self.growing);
        let process = fleet.start_for(self, deadline).await?;
        self.processes.lock().expect("family lock").push(process);
        fleet.freed.notify_waiters();
        Ok(())
    }
}

/// A 2026 request's messages under the caller's id and progress token. A
/// request dropped before its answer (the caller left, or timed out) is
/// cancelled on the process, as stdio cancels.
struct Relinked {
    reader: Reader,
    /// The caller's id.
    id: Value,
    /// The caller's progress token.
    token: Option<Value>,
    /// Whether it asked for log lines (and has the process to itself).
    alone: bool,
    answered: bool,
}

impl Messages for Relinked {
    fn next(&mut self) -> Pending<'_, Result<Value, StreamEnd>> {
        Box::pin(async move {
            loop {
                let mut msg = self.reader.next().await?;
                let method = msg.get("method").and_then(Value::as_str).map(str::to_string);
                match (method, msg.get("id").and_then(Value::as_u64)) {
                    (None, _) => {
                        msg["id"] = self.id.clone();
                        self.answered = true;
                    }
                    // Not a 2026 server's: refused, so that it is not left waiting.
                    (Some(method), Some(minted)) => {
                        let process = &self.reader.process;
                        if let Some(own) = process.answered(minted) {
                            process.try_write(&process::refusal(&own, &method));
                        }
                        continue;
                    }
                    (Some(method), None) if method == "notifications/progress" => {
                        if let (Some(token), Some(t)) =
                            (&self.token, msg.pointer_mut("/params/progressToken"))
                        {
                            *t = token.clone();
                        }
                    }
                    (Some(method), None) if method == "notifications/message" && self.alone => {}
                    // What names no request reaches this one only for being
                    // alone in flight (a list change, say): not the caller's.
                    (Some(method), None) => {
                        let pid = self.reader.process.pid;
                        tracing::debug!(pid, method, "upstream notification dropped");
                        continue;
                    }
                }
                return Ok(msg);
            }
        })
    }

    fn resume_point(&self) -> Option<&str> {
        None
    }
}

impl Drop for Relinked {
    fn drop(&mut self) {
        let process = &self.reader.process;
        if self.answered || process.is_ended() {
            return;
        }
        let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": self.reader.id, "reason": "the client left"}});
        process.try_write(&serde_json::to_vec(&cancel).unwrap_or_default());
    }
}
