//! The life of a call paused on questions (MRTR): parking it with an
//! `input_required` round, resuming it on the client's retry (here, on the
//! owner replica, or from the upstream's resumable stream when the owner is
//! gone), replay mode, and declining what a flow waits for when the retry
//! never comes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Map, Value};

use super::call::{self, Done, InFlight};
use super::mrtr::{self, ParkedFlow};
use super::session::Session;
use super::state::{self, FlowState, Rejected};
use super::streams::Streams;
use super::{translate, Bridge, Ctx};
use crate::cluster::{ForwardError, Refused};
use crate::config::Route;
use crate::error::Error;
use crate::front::Call;
use crate::metrics::{MethodLabels, Metrics, QuotaLabels};
use crate::park;
use crate::reply::Reply;
use crate::sealed::Purpose;
use crate::upstream::channel::{self, SendError, SessionWire};

/// Longest time an abandoned flow's upstream stream is read after its
/// questions were declined, so the upstream can finish its call cleanly.
const ABANDON_DRAIN: Duration = Duration::from_secs(30);

/// Flows declined at once at shutdown.
const ABANDON_CONCURRENCY: usize = 64;

/// How long declining the flows still parked at shutdown may take in all
/// (an upstream that does not answer must not hold the exit).
const SHUTDOWN_DECLINES: Duration = Duration::from_secs(5);

/// What a retry's `requestState` asks for.
pub(super) enum Resumed {
    /// The retry was answered (here, or by the owner replica).
    Done(Done),
    /// Run the call again from the start (a URL-elicitation round's retry).
    Reissue,
    /// Run the call again, answering its questions from these answers (replay mode).
    Replay(BTreeMap<String, Value>),
}

/// A new round's `input_required` result, or why the call ended instead.
type Round = Result<Map<String, Value>, Error>;

/// A round whose state would be longer than a `requestState` may be: the
/// call ends (its questions declined), with this answer.
fn too_large() -> Error {
    Error::InvalidRequest("this call's questions and answers are too large to carry in a requestState".into())
}

impl ParkedFlow {
    /// Reads the upstream's stream on, for the call `cx` (the original or a retry).
    async fn read_on(&mut self, legacy: &Bridge, cx: Ctx<'_>, reply: &mut Reply) -> Done {
        let flight = InFlight {
            call: cx.call,
            session: &self.session,
            wire: &self.wire,
            upstream_id: self.upstream_id,
            progress_token: self.progress_token.clone(),
            keepalive: legacy.services.keepalive,
            deadline: self.deadline,
            metrics: &legacy.services.metrics,
        };
        call::read_stream(&flight, &mut self.stream, reply).await
    }

    /// Posts `answers` (input key → legacy result) for pending questions;
    /// one not sent is sent once more while the instance is up. The error:
    /// `NotSent` when the instance could not be reached before any answer
    /// reached it (after one did, the call's outcome is unknown: `Broken`).
    async fn deliver(&mut self, answers: BTreeMap<String, Value>) -> Result<(), SendError> {
        let link = &*self.session.channel;
        let mut delivered = false;
        for (key, result) in answers {
            let Some(question) = self.pending.remove(&key) else { continue };
            let response = json!({"jsonrpc": "2.0", "id": question.upstream_id, "result": result});
            match channel::once_more(link.health(), || channel::post(link, &self.wire, &response)).await {
                Ok(_) => delivered = true,
                Err(e) => {
                    crate::log_limited!(
                        tracing::Level::WARN,
                        outcome = e.as_str(),
                        "could not deliver an answer upstream: {}",
                        e.words()
                    );
                    return Err(if delivered { SendError::Broken } else { e });
                }
            }
        }
        Ok(())
    }

    /// Declines every pending question on the client's behalf.
    async fn decline_pending(&mut self, metrics: &Metrics) {
        for question in std::mem::take(&mut self.pending).into_values() {
            let msg = json!({"id": question.upstream_id, "method": question.method});
            let _ = channel::post(&*self.session.channel, &self.wire, &mrtr::decline(&msg)).await;
            metrics
                .upstream_requests_declined
                .get_or_create(&MethodLabels {
                    route: self.session.key.route.clone(),
                    method: question.method.into(),
                })
                .inc();
        }
    }

    /// Declines what an abandoned flow waits for, then reads its stream to the
    /// end (declining anything else it asks) so the upstream finishes cleanly.
    async fn abandon(mut self, metrics: Metrics) {
        self.decline_pending(&metrics).await;
        let until = (tokio::time::Instant::now() + ABANDON_DRAIN).min(self.deadline);
        let drain = async {
            while let Ok(msg) = self.stream.next().await {
                let is_request = msg.get("method").is_some() && msg.get("id").is_some();
                if is_request {
                    call::respond_upstream(&self.session, &self.wire, &msg).await;
                } else if msg.get("id").and_then(Value::as_u64) == Some(self.upstream_id) {
                    return;
                }
            }
        };
        let _ = tokio::time::timeout_at(until, drain).await;
    }
}

impl Bridge {
    fn rejected(&self, cx: Ctx<'_>, why: Rejected) -> Error {
        why.refuse(Purpose::FlowState, &cx.route.id, &self.services.metrics)
    }

    /// An answer that could not be delivered upstream: the instance holding
    /// the call is gone (nothing was sent; the client starts again), or the
    /// answer may have reached it (never sent twice).
    fn undelivered(&self, cx: Ctx<'_>, e: SendError) -> Error {
        match e {
            SendError::NotSent => self.rejected(cx, Rejected::InstanceGone),
            _ => Error::OutcomeUnknown,
        }
    }

    fn count_parked(&self) {
        self.services.metrics.parked_flows_open.set(self.parked.len() as i64);
    }

    /// Acts on a retry's `requestState` (opened once for the call, see
    /// [`state::opened`]). Nothing is sent upstream unless the state opens and
    /// matches the retry (route, method, principal, name, arguments, expiry).
    pub(super) async fn resume(&self, cx: Ctx<'_>, reply: &mut Reply) -> Result<Resumed, Error> {
        let Some(opened) = state::opened(&self.services.sealer, &cx.route.id, cx.call) else {
            return Err(self.rejected(cx, Rejected::Malformed));
        };
        if !cx.call.method.allows_input() {
            return Err(self.rejected(cx, Rejected::OtherRequest));
        }
        let st = opened.map_err(|why| self.rejected(cx, why))?;
        let digest = state::params_digest(&cx.call.params);
        let expect = state::Expect {
            route: &cx.route.id,
            method: cx.call.method.as_str(),
            principal: &cx.caller.principal,
            name: cx.call.name.as_deref(),
            params_digest: &digest,
            now_ms: state::now_ms(),
        };
        state::check(st, &expect).map_err(|why| self.rejected(cx, why))?;
        if cx.caller.forwarded {
            // Admitted by `admit_forwarded`: a flow parked here, nothing else.
            if !st.parks() || st.owner != self.services.instance {
                return Err(self.rejected(cx, Rejected::FlowGone));
            }
            return self.resume_here(cx, st, reply).await.map(Resumed::Done);
        }
        if st.reissue {
            mrtr::answers_by_key(st.questions.keys(), &cx.call.params)?;
            return Ok(Resumed::Reissue);
        }
        if let Some(mut book) = st.answers.clone() {
            book.extend(mrtr::answers_by_key(st.questions.keys(), &cx.call.params)?);
            return Ok(Resumed::Replay(book));
        }
        if st.owner != self.services.instance {
            return self.resume_elsewhere(cx, st, reply).await.map(Resumed::Done);
        }
        self.resume_here(cx, st, reply).await.map(Resumed::Done)
    }

    /// The internal listener's check (cluster mode), before anything runs: a
    /// forwarded request must be the retry of a call paused on this replica
    /// (a park-mode `requestState` that opens, owned by this instance at this
    /// address) for the signed principal. Expiry, arguments and whether the
    /// flow is still parked are left to [`Bridge::resume`], whose answers to
    /// those are the client's.
    /// Whether `call` is the retry of a call parked in a gateway (its
    /// `requestState` opens as a park-mode round): such a retry resumes work
    /// already admitted. A URL-elicitation or replay state re-runs the call.
    /// The state is opened once, here, and carried with `call`.
    pub fn resumes_parked(&self, route: &Route, call: &Call) -> bool {
        state::opened(&self.services.sealer, &route.id, call).is_some_and(|st| st.is_ok_and(|st| st.parks()))
    }

    pub fn admit_forwarded(&self, route: &Route, call: &Call, principal: &str) -> Result<(), Refused> {
        if !call.method.allows_input() {
            return Err(Refused::NotARetry);
        }
        let Some(Ok(st)) = state::opened(&self.services.sealer, &route.id, call) else {
            return Err(Refused::NotARetry);
        };
        if !st.parks() {
            return Err(Refused::NotARetry);
        }
        if st.principal != principal {
            return Err(Refused::WrongPrincipal);
        }
        let here = self.services.cluster.as_ref().map(|c| c.advertise());
        if here.is_none() || !st.owned_by(&self.services.instance, here) {
            return Err(Refused::NotOwner);
        }
        Ok(())
    }

    /// The flow is parked in this process: deliver the answers and read on.
    async fn resume_here(&self, cx: Ctx<'_>, st: &FlowState, reply: &mut Reply) -> Result<Done, Error> {
        let _busy = Resuming::new(&self.resuming);
        let Some((mut flow, expires)) = self.parked.take(&st.flow) else {
            return Err(self.rejected(cx, Rejected::FlowGone));
        };
        self.count_parked();
        if flow.round != st.round {
            self.put_back(st.flow.clone(), &cx.caller.principal, flow, expires);
            return Err(self.rejected(cx, Rejected::StaleRound));
        }
        let answers = match answers(&flow, cx.call) {
            Ok(a) => a,
            Err(e) => {
                self.put_back(st.flow.clone(), &cx.caller.principal, flow, expires);
                return Err(e);
            }
        };
        if let Err(e) = flow.deliver(answers).await {
            return Err(self.undelivered(cx, e));
        }
        let done = if flow.pending.is_empty() {
            flow.read_on(self, cx, reply).await
        } else {
            // Some answers are missing: ask for them again in a new round.
            Done::Input(Vec::new())
        };
        Ok(self.conclude(cx, Some(st.flow.clone()), flow, done, reply).await)
    }

    /// The flow belongs to another replica: forward the retry to it; if it is
    /// gone, take the call over from the upstream's resumable stream.
    async fn resume_elsewhere(&self, cx: Ctx<'_>, st: &FlowState, reply: &mut Reply) -> Result<Done, Error> {
        let owner = &st.owner_address;
        if let (Some(owner), Some(cluster), false) = (owner, &self.services.cluster, cx.caller.forwarded) {
            let forward = cluster.forward(
                owner,
                &cx.route.id,
                &cx.caller.principal,
                None,
                &cx.caller.headers,
                cx.caller.body.clone(),
            );
            let forwarded = tokio::select! {
                forwarded = forward => forwarded,
                // Dropping the forwarded request tells the owner its client left.
                _ = reply.closed() => return Ok(Done::Cancelled),
            };
            match forwarded {
                Ok(response) => return Ok(Done::Relay(response)),
                Err(ForwardError::OwnerGone) => {
                    crate::log_limited!(
                        tracing::Level::INFO,
                        owner = %owner,
                        "owner replica unreachable; resuming the upstream stream here"
                    );
                }
                Err(ForwardError::Refused) => return Err(Error::ReplicaRefused),
                Err(ForwardError::Broken) => return Err(Error::OutcomeUnknown),
            }
        }
        self.resume_orphan(cx, st, reply).await
    }

    /// The owner is gone: post the answers on the upstream session and resume
    /// its stream with `Last-Event-ID`. Without event ids (or if resuming
    /// fails) the client is told to start again; nothing is re-run silently.
    async fn resume_orphan(&self, cx: Ctx<'_>, st: &FlowState, reply: &mut Reply) -> Result<Done, Error> {
        let (Some(last_event), Some(upstream_id)) = (&st.last_event_id, st.upstream_id) else {
            return Err(self.rejected(cx, Rejected::FlowLost));
        };
        let _busy = Resuming::new(&self.resuming);
        let answers = mrtr::answers_by_key(st.questions.keys(), &cx.call.params)?;
        if answers.len() != st.questions.len() {
            // The questions themselves were held by the owner: they cannot be asked again.
            return Err(self.rejected(cx, Rejected::FlowLost));
        }
        // The session lives on the instance that opened it.
        let Some(link) = cx.target.channel(&st.instance) else {
            return Err(self.rejected(cx, Rejected::FlowLost));
        };
        let wire =
            SessionWire { id: st.session_id.clone(), version: st.session_version.clone(), owner: None };
        // Answers first, then the resumption: a server that keeps events (the
        // TypeScript SDK's event store) stores what the call sends after the
        // answer and replays it on the GET; resuming first loses those events
        // there. The cost: a server that sends event ids but keeps no events
        // has the answers when the client is told to start again.
        for (key, result) in &answers {
            let response = json!({"jsonrpc": "2.0", "id": st.questions[key], "result": result});
            if channel::post(link, &wire, &response).await.is_err() {
                return Err(self.rejected(cx, Rejected::FlowLost));
            }
        }
        let Ok(post) = link.messages(&wire, Some(last_event)).await else {
            return Err(self.rejected(cx, Rejected::FlowLost));
        };
        let capabilities = super::session::CapabilitiesText::of(&cx.call.meta.capabilities);
        let key = Self::key(cx.route, cx.call, cx.caller, link, &capabilities);
        let init = match self.pool.acquire(link, key).await {
            Ok(s) => s.init.clone(),
            Err(_) => Arc::new(json!({})),
        };
        let session = Arc::new(Session::adopt(link, key.to_owned(), wire.clone(), init));
        let mut flow = ParkedFlow {
            session,
            wire,
            stream: Streams { post, get: None },
            _exclusive: None,
            upstream_id,
            progress_token: cx.call.meta.progress_token.as_ref().map(|_| json!(format!("sl-{upstream_id}"))),
            pending: BTreeMap::new(),
            round: st.round,
            minted: st.questions.len() as u32,
            // A server may take the resumption GET without replaying anything
            // (event ids do not prove it keeps events): bound the wait.
            deadline: tokio::time::Instant::now() + cx.route.upstream.response_timeout,
        };
        let done = flow.read_on(self, cx, reply).await;
        Ok(self.conclude(cx, Some(st.flow.clone()), flow, done, reply).await)
    }

    /// Puts a flow back after a retry that could not use it (wrong round,
    /// malformed answers): the legitimate retry may still come until the
    /// flow's first expiry.
    fn put_back(&self, id: String, owner: &str, flow: ParkedFlow, expires: tokio::time::Instant) {
        if let Err((flow, _)) = self.parked.park_until(id, owner, flow, expires) {
            tokio::spawn(flow.abandon(self.services.metrics.clone()));
        }
        self.count_parked();
    }

    /// Finishes a flow's turn: parks it on a new round of questions, or shapes
    /// its final answer. When the flow cannot be parked (the caller's share
    /// or the whole lot is full, or shutdown), its questions are declined on
    /// the client's behalf and the upstream's stream is read to its end, so
    /// the upstream finishes cleanly; the client is told that, not handed an
    /// answer shaped by a decline it never chose.
    pub(super) async fn conclude(
        &self,
        cx: Ctx<'_>,
        flow_id: Option<String>,
        mut flow: ParkedFlow,
        mut done: Done,
        reply: &mut Reply,
    ) -> Done {
        let mut refused = None;
        loop {
            let Done::Input(questions) = done else {
                return match refused {
                    Some(why) => Done::Failed(Error::QuestionDeclined(why)),
                    None => self.shape(cx, &flow.session, &flow.wire, done),
                };
            };
            flow.add_questions(questions);
            if refused.is_none() {
                match self.park_round(cx, flow_id.clone(), flow) {
                    Ok(round) => return round.map_or_else(Done::Failed, Done::Result),
                    Err((back, why)) => {
                        flow = *back;
                        self.count_refused(cx, why);
                        refused = Some(why);
                    }
                }
            }
            flow.decline_pending(&self.services.metrics).await;
            done = flow.read_on(self, cx, reply).await;
        }
    }

    fn count_refused(&self, cx: Ctx<'_>, why: park::Refused) {
        let quota = match why {
            park::Refused::PrincipalFull => "parked_flows_per_principal",
            park::Refused::Full => "parked_flows",
            park::Refused::Closed => return,
        };
        self.services
            .metrics
            .quota_exceeded
            .get_or_create(&QuotaLabels { route: cx.route.id.clone(), quota })
            .inc();
    }

    /// Replay mode's counterpart of [`Bridge::conclude`]: questions already
    /// answered in `book` are answered at once; a new question ends the run
    /// (declined upstream, call cancelled) with a round whose sealed state
    /// carries every answer so far. Nothing is parked.
    pub(super) async fn conclude_replay(
        &self,
        cx: Ctx<'_>,
        mut flow: ParkedFlow,
        mut done: Done,
        book: &BTreeMap<String, Value>,
        reply: &mut Reply,
    ) -> Done {
        loop {
            let Done::Input(questions) = done else {
                return self.shape(cx, &flow.session, &flow.wire, done);
            };
            flow.add_questions(questions);
            let known: BTreeMap<String, Value> =
                flow.pending.keys().filter_map(|k| book.get(k).map(|a| (k.clone(), a.clone()))).collect();
            if let Err(e) = flow.deliver(known).await {
                return Done::Failed(self.undelivered(cx, e));
            }
            if flow.pending.is_empty() {
                done = flow.read_on(self, cx, reply).await;
                continue;
            }
            let result = self.replay_round(cx, &flow, book);
            flow.decline_pending(&self.services.metrics).await;
            let flight = InFlight {
                call: cx.call,
                session: &flow.session,
                wire: &flow.wire,
                upstream_id: flow.upstream_id,
                progress_token: None,
                keepalive: self.services.keepalive,
                deadline: flow.deadline,
                metrics: &self.services.metrics,
            };
            call::cancel(&flight, "replay mode: the call runs again on the retry");
            return result.map_or_else(|_| Done::Failed(too_large()), Done::Result);
        }
    }

    fn replay_round(
        &self,
        cx: Ctx<'_>,
        flow: &ParkedFlow,
        book: &BTreeMap<String, Value>,
    ) -> Result<Map<String, Value>, Rejected> {
        let mut st = self.new_state(cx, flow, crate::bridge::random_id(), cx.route.replay_ttl);
        st.questions = flow.pending.keys().map(|k| (k.clone(), Value::Null)).collect();
        st.answers = Some(book.clone());
        st.upstream_id = None;
        st.last_event_id = None;
        let sealed = state::seal(&self.services.sealer, &st)?;
        self.count_round(cx);
        Ok(translate::input_required(&flow.session.init, flow.input_requests(), sealed))
    }

    /// The sealed state for `flow`'s current round.
    fn new_state(&self, cx: Ctx<'_>, flow: &ParkedFlow, id: String, ttl: Duration) -> FlowState {
        let now = state::now_ms();
        FlowState {
            route: cx.route.id.clone(),
            instance: flow.session.channel.instance().to_string(),
            session_id: flow.wire.id.clone(),
            session_version: flow.wire.version.clone(),
            owner: self.services.instance.clone(),
            owner_address: self.services.cluster.as_ref().map(|c| c.advertise().to_string()),
            upstream_id: Some(flow.upstream_id),
            last_event_id: flow.stream.post.resume_point().map(str::to_string),
            flow: id,
            questions: flow.pending.iter().map(|(k, q)| (k.clone(), q.upstream_id.clone())).collect(),
            principal: cx.caller.principal.clone(),
            method: cx.call.method.as_str().to_string(),
            name: cx.call.name.clone(),
            params_digest: state::params_digest(&cx.call.params),
            issued_ms: now,
            expires_ms: now + ttl.as_millis() as u64,
            round: flow.round,
            reissue: false,
            answers: None,
        }
    }

    fn count_round(&self, cx: Ctx<'_>) {
        self.services
            .metrics
            .mrtr_rounds
            .get_or_create(&MethodLabels {
                route: cx.route.id.clone(),
                method: cx.call.method.as_str().into(),
            })
            .inc();
    }

    /// Parks `flow` for a new round and returns the `input_required` result
    /// (or, when its state cannot be sealed, abandons it and returns why);
    /// gives the flow back when it cannot be parked.
    fn park_round(
        &self,
        cx: Ctx<'_>,
        flow_id: Option<String>,
        mut flow: ParkedFlow,
    ) -> Result<Round, (Box<ParkedFlow>, park::Refused)> {
        if let Err(why) = self.parked.admits(&cx.caller.principal) {
            return Err((Box::new(flow), why));
        }
        flow.round += 1;
        let id = flow_id.unwrap_or_else(crate::bridge::random_id);
        let st = self.new_state(cx, &flow, id.clone(), self.parked.ttl());
        let Ok(sealed) = state::seal(&self.services.sealer, &st) else {
            tokio::spawn(flow.abandon(self.services.metrics.clone()));
            return Ok(Err(too_large()));
        };
        let requests = flow.input_requests();
        let init = flow.session.init.clone();
        self.parked.park(id, &cx.caller.principal, flow).map_err(|(flow, why)| (Box::new(flow), why))?;
        self.count_parked();
        self.count_round(cx);
        Ok(Ok(translate::input_required(&init, requests, sealed)))
    }

    /// A 2025-11-25 upstream's -32042 (URL elicitation required) as a round of
    /// URL-mode elicitations; the retry re-issues the call (nothing is parked,
    /// and `notifications/elicitation/complete` is never passed on).
    pub(super) fn url_round(&self, cx: Ctx<'_>, init: &Value, data: Option<&Value>) -> Done {
        let elicitations = data.and_then(|d| d.get("elicitations")).and_then(Value::as_array);
        let (Some(elicitations), true) =
            (elicitations.filter(|e| !e.is_empty()), cx.call.method.allows_input())
        else {
            return Done::Failed(Error::UpstreamInvalid("URL elicitation required"));
        };
        let declared = cx.call.meta.capabilities.get("elicitation").and_then(|e| e.get("url"));
        if declared.is_none() {
            return Done::Failed(Error::MissingCapability(json!({"elicitation": {"url": {}}})));
        }
        let mut requests = Map::new();
        let mut keys = BTreeMap::new();
        for (i, e) in elicitations.iter().enumerate() {
            let key = format!("elicitation_{}", i + 1);
            let mut params = e.clone();
            if let Some(p) = params.as_object_mut() {
                p.insert("mode".into(), json!("url"));
            }
            requests.insert(key.clone(), mrtr::input_request("elicitation/create", Some(&params)));
            keys.insert(key, Value::Null);
        }
        let now = state::now_ms();
        let st = FlowState {
            route: cx.route.id.clone(),
            instance: String::new(),
            session_id: None,
            session_version: None,
            owner: self.services.instance.clone(),
            owner_address: None,
            upstream_id: None,
            last_event_id: None,
            flow: crate::bridge::random_id(),
            questions: keys,
            principal: cx.caller.principal.clone(),
            method: cx.call.method.as_str().to_string(),
            name: cx.call.name.clone(),
            params_digest: state::params_digest(&cx.call.params),
            issued_ms: now,
            expires_ms: now + self.parked.ttl().as_millis() as u64,
            round: 1,
            reissue: true,
            answers: None,
        };
        let Ok(sealed) = state::seal(&self.services.sealer, &st) else {
            return Done::Failed(too_large());
        };
        self.count_round(cx);
        Done::Result(translate::input_required(init, Value::Object(requests), sealed))
    }

    /// Declines the questions of parked flows whose TTL passed, until
    /// `shutdown`; then declines every flow still parked, for at most
    /// [`SHUTDOWN_DECLINES`] in all (a second once `hurry` is cancelled).
    pub async fn run_flow_reaper(
        self: Arc<Self>,
        shutdown: tokio_util::sync::CancellationToken,
        hurry: tokio_util::sync::CancellationToken,
    ) {
        let period = (self.parked.ttl() / 10).clamp(Duration::from_millis(50), Duration::from_secs(1));
        let mut tick = tokio::time::interval(period);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tick.tick() => {}
            }
            let expired = self.parked.expired();
            if expired.is_empty() {
                continue;
            }
            self.count_parked();
            for flow in expired {
                let route = Metrics::route(&flow.session.key.route);
                self.services.metrics.parked_flows_expired.get_or_create(&route).inc();
                tokio::spawn(flow.abandon(self.services.metrics.clone()));
            }
        }
        self.parked.close();
        let left = self.parked.drain();
        self.count_parked();
        // The process is exiting: decline, without reading the streams on. A
        // bounded number at a time: each decline needs an upstream connection
        // of its own (the parked ones are busy), so all at once would spike memory.
        let declines = futures_util::StreamExt::for_each_concurrent(
            futures_util::stream::iter(left),
            ABANDON_CONCURRENCY,
            |mut f| {
                let metrics = self.services.metrics.clone();
                async move { f.decline_pending(&metrics).await }
            },
        );
        if crate::shutdown::bounded(declines, SHUTDOWN_DECLINES, &hurry).await.is_none() {
            tracing::warn!(
                "parked calls still being declined upstream at exit: left to the upstream's timeouts"
            );
        }
    }
}

/// Counts a flow being resumed (out of the parking lot) for as long as it lives.
struct Resuming<'a>(&'a std::sync::atomic::AtomicUsize);

impl<'a> Resuming<'a> {
    fn new(count: &'a std::sync::atomic::AtomicUsize) -> Resuming<'a> {
        count.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        Resuming(count)
    }
}

impl Drop for Resuming<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// The retry's answers to the flow's pending questions, as legacy results.
/// Missing answers are left pending; unknown keys are ignored.
fn answers(flow: &ParkedFlow, call: &crate::front::Call) -> Result<BTreeMap<String, Value>, Error> {
    let Some(Value::Object(responses)) = call.params.get("inputResponses") else {
        return Ok(BTreeMap::new());
    };
    flow.pending
        .iter()
        .filter_map(|(key, question)| {
            let answer = responses.get(key)?;
            Some(mrtr::legacy_answer(key, &question.method, answer).map(|r| (key.clone(), r)))
        })
        .collect()
}
