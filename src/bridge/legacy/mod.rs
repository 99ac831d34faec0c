//! The legacy bridge: runs modern calls on pooled legacy sessions.

mod call;
mod cursor;
mod listen;
mod mrtr;
mod pool;
mod session;
mod state;
mod tool_headers;
mod translate;
mod transport;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dashmap::DashMap;
use http::{HeaderMap, StatusCode};
use serde_json::{json, Value};

use crate::config::{Config, Route};
use crate::error::{error_body, Error};
use crate::front::{Call, Method, SUPPORTED_VERSIONS};
use crate::metrics::{MethodLabels, Metrics, ReasonLabels};
use crate::park::ParkingLot;
use crate::reply::Reply;
use crate::seal::Sealer;
use call::{Done, InFlight};
use mrtr::ParkedFlow;
use pool::Exclusive;
pub use pool::Pool;
use session::{legacy_capabilities, PoolKey, Session};
use transport::{PostError, SessionWire, Transport};

/// Who is calling, as far as the upstream session pool is concerned.
#[derive(Debug, Clone)]
pub struct Caller {
    /// Digest of the bearer token, or "anonymous".
    pub principal: String,
    /// Only the `Mcp-Param-*` headers of the request.
    pub param_headers: HeaderMap,
}

pub struct Legacy {
    pool: Arc<Pool>,
    transports: HashMap<String, Transport>,
    /// (route, capabilities) → when fetched, `InitializeResult`.
    discover: DashMap<(String, String), (Instant, Arc<Value>)>,
    tool_headers: tool_headers::Cache,
    sealer: Arc<Sealer>,
    metrics: Metrics,
    keepalive: Duration,
    listen_slots: Arc<tokio::sync::Semaphore>,
    /// Fires at shutdown: ends listen streams.
    shutdown: tokio_util::sync::CancellationToken,
    /// Calls paused on questions for the user, by flow id.
    parked: ParkingLot<ParkedFlow>,
    /// This replica's name in `requestState`.
    instance: String,
}

/// Maps a transport failure to the client-facing error. `sent`: the request
/// may have reached the upstream, so its outcome is unknown.
pub(crate) fn map_post_error(e: PostError, sent: bool) -> Error {
    match e {
        PostError::NotSent => Error::UpstreamUnreachable,
        PostError::Timeout => Error::UpstreamTimeout,
        PostError::Broken if sent => Error::OutcomeUnknown,
        PostError::Broken => Error::UpstreamUnreachable,
        PostError::SessionGone => Error::UpstreamInvalid("session lost"),
        PostError::Status(_) => Error::UpstreamInvalid("error status"),
        PostError::Invalid(why) => Error::UpstreamInvalid(why),
        PostError::TooLarge => Error::UpstreamTooLarge,
    }
}

impl Legacy {
    pub fn new(
        config: &Config,
        sealer: Arc<Sealer>,
        metrics: Metrics,
        shutdown: tokio_util::sync::CancellationToken,
    ) -> Legacy {
        let transports = config
            .routes
            .iter()
            .map(|r| {
                let t = Transport::new(
                    r.upstream.clone(),
                    config.limits.max_upstream_response_bytes,
                    metrics.clone(),
                    r.path.clone(),
                );
                (r.path.clone(), t)
            })
            .collect();
        Legacy {
            pool: Arc::new(Pool::new(
                config.pool.max_sessions,
                config.pool.idle_timeout,
                metrics.clone(),
            )),
            transports,
            discover: DashMap::new(),
            tool_headers: tool_headers::Cache::default(),
            sealer,
            metrics,
            keepalive: config.keepalive_interval,
            listen_slots: Arc::new(tokio::sync::Semaphore::new(
                config.limits.max_listen_streams,
            )),
            shutdown,
            parked: ParkingLot::new(
                config.limits.max_parked_flows,
                config.limits.parked_flow_ttl,
            ),
            instance: random_id(),
        }
    }

    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    fn key(route: &Route, call: &Call, caller: &Caller) -> PoolKey {
        PoolKey {
            route: route.path.clone(),
            principal: caller.principal.clone(),
            capabilities: legacy_capabilities(&call.meta.capabilities),
            version: call.meta.protocol_version.clone(),
        }
    }

    /// Serves one call to the end, writing its answer to `reply`.
    /// Returns the outcome label for metrics.
    pub async fn serve(
        &self,
        route: Arc<Route>,
        call: Call,
        caller: Caller,
        mut reply: Reply,
    ) -> &'static str {
        let done = match call.method {
            Method::Discover => self.discover(&route, &call, &caller).await,
            Method::SubscriptionsListen => return self.listen(&route, &call, &caller, reply).await,
            _ => self.forward(&route, &call, &caller, &mut reply).await,
        };
        let (status, body, outcome) = match done {
            Done::Result(result) => (
                StatusCode::OK,
                json!({"jsonrpc": "2.0", "id": call.id, "result": result}),
                "ok",
            ),
            Done::Failed(err) => (
                err.status(),
                error_body(Some(&call.id), &err, SUPPORTED_VERSIONS),
                err.reason(),
            ),
            Done::Cancelled => return "cancelled",
            Done::Input(_) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                error_body(
                    Some(&call.id),
                    &Error::Internal("unparked questions".into()),
                    SUPPORTED_VERSIONS,
                ),
                "internal",
            ),
        };
        reply.finish(status, &body).await;
        outcome
    }

    async fn discover(&self, route: &Route, call: &Call, caller: &Caller) -> Done {
        let key = Self::key(route, call, caller);
        let cache_key = (route.path.clone(), key.capabilities.clone());
        let cached = self
            .discover
            .get(&cache_key)
            .filter(|e| e.0.elapsed() < route.discover_ttl)
            .map(|e| e.1.clone());
        let init = match cached {
            Some(init) => init,
            None => match self.pool.acquire(&self.transports[&route.path], key).await {
                Ok(session) => {
                    self.discover
                        .insert(cache_key, (Instant::now(), session.init.clone()));
                    session.init.clone()
                }
                Err(e) => return Done::Failed(e),
            },
        };
        Done::Result(translate::discover(route, &init, SUPPORTED_VERSIONS))
    }

    async fn forward(
        &self,
        route: &Route,
        call: &Call,
        caller: &Caller,
        reply: &mut Reply,
    ) -> Done {
        match self.try_forward(route, call, caller, reply).await {
            Ok(done) => done,
            Err(e) => Done::Failed(e),
        }
    }

    /// The session a call runs on: the pooled one, or, for a call that
    /// declares `roots`, one of its own (a legacy server may ask `roots/list`
    /// on the session's GET stream, where only a lone call makes it attributable).
    async fn session_for(
        &self,
        transport: &Transport,
        key: &PoolKey,
        call: &Call,
    ) -> Result<(Arc<Session>, Option<Exclusive>), Error> {
        if call.method.allows_input() && call.meta.declares("roots") {
            let session = self.pool.open_exclusive(transport, key.clone()).await?;
            let guard = Exclusive::new(self.pool.clone(), session.clone());
            return Ok((session, Some(guard)));
        }
        Ok((self.pool.acquire(transport, key.clone()).await?, None))
    }

    async fn try_forward(
        &self,
        route: &Route,
        call: &Call,
        caller: &Caller,
        reply: &mut Reply,
    ) -> Result<Done, Error> {
        mrtr::check_responses_shape(&call.params)?;
        if let Some(blob) = call.params.get("requestState") {
            return self.resume(route, call, caller, blob, reply).await;
        }
        let transport = &self.transports[&route.path];
        let key = Self::key(route, call, caller);
        let mut params = call.params.clone();
        let pinned = cursor::open(&self.sealer, route, call, caller, &mut params)?;
        let (mut session, mut exclusive) = self.session_for(transport, &key, call).await?;
        if call.method == Method::ToolsCall {
            self.tool_headers
                .check(&session, call, caller, route.upstream.call_timeout)
                .await?;
        }
        let deadline = tokio::time::Instant::now() + route.upstream.call_timeout;
        let mut retried = false;
        loop {
            let wire = pinned.clone().unwrap_or_else(|| session.wire.clone());
            let get = match exclusive {
                Some(_) => transport.get_stream(&wire, None).await.ok().map(Box::new),
                None => None,
            };
            let upstream_id = session.mint_id();
            let token = call
                .meta
                .progress_token
                .as_ref()
                .map(|_| json!(format!("sl-{upstream_id}")));
            let request = call::upstream_request(call, &params, upstream_id, token.as_ref());
            match transport.post(&wire, &request).await {
                Ok((answer, _)) => {
                    let flight = InFlight {
                        call,
                        session: &session,
                        wire: &wire,
                        upstream_id,
                        progress_token: token.clone(),
                        keepalive: self.keepalive,
                        deadline,
                        metrics: &self.metrics,
                    };
                    let (questions, stream) =
                        match call::read_answer(&flight, answer, get, reply).await {
                            (Done::Input(questions), Some(stream)) => (questions, stream),
                            (done, _) => {
                                return Ok(self.shape(route, call, caller, &session, &wire, done))
                            }
                        };
                    let flow = ParkedFlow {
                        session: session.clone(),
                        wire,
                        stream,
                        _exclusive: exclusive,
                        upstream_id,
                        progress_token: token,
                        pending: Default::default(),
                        round: 0,
                        minted: 0,
                        deadline,
                    };
                    let done = Done::Input(questions);
                    return Ok(self
                        .conclude(route, call, caller, None, flow, done, reply)
                        .await);
                }
                Err(PostError::SessionGone) if pinned.is_some() => {
                    return Err(cursor::expired());
                }
                Err(PostError::SessionGone) if !retried => {
                    if exclusive.is_none() {
                        self.pool.invalidate(&session);
                    }
                    self.metrics
                        .sessions_reinitialized
                        .get_or_create(&Metrics::route(&route.path))
                        .inc();
                    (session, exclusive) = self.session_for(transport, &key, call).await?;
                }
                Err(PostError::NotSent) if !retried => {}
                Err(e) => return Err(map_post_error(e, true)),
            }
            retried = true;
        }
    }

    fn shape(
        &self,
        route: &Route,
        call: &Call,
        caller: &Caller,
        session: &Session,
        wire: &SessionWire,
        done: Done,
    ) -> Done {
        let Done::Result(mut result) = done else {
            return done;
        };
        if let Some(Value::String(next)) = result.get("nextCursor") {
            let sealed = cursor::seal(&self.sealer, route, call, caller, wire, next);
            result.insert("nextCursor".into(), Value::String(sealed));
        }
        if call.method == Method::ToolsList && !call.params.contains_key("cursor") {
            self.tool_headers.learn(session, caller, &result);
        }
        Done::Result(translate::result(call.method, route, &session.init, result))
    }
}

impl Legacy {
    fn rejected(&self, route: &Route, why: state::Rejected) -> Error {
        self.metrics
            .request_state_rejected
            .get_or_create(&ReasonLabels {
                route: route.path.clone(),
                reason: why.reason(),
            })
            .inc();
        why.error()
    }

    fn count_parked(&self) {
        self.metrics.parked_flows_open.set(self.parked.len() as i64);
    }

    /// A retry: finds the paused call, hands the answers to the upstream, and
    /// reads on to the result or the next round.
    async fn resume(
        &self,
        route: &Route,
        call: &Call,
        caller: &Caller,
        blob: &Value,
        reply: &mut Reply,
    ) -> Result<Done, Error> {
        let Value::String(blob) = blob else {
            return Err(self.rejected(route, state::Rejected::Invalid));
        };
        if !call.method.allows_input() {
            return Err(self.rejected(route, state::Rejected::WrongRequest));
        }
        let digest = state::params_digest(&call.params);
        let expect = state::Expect {
            route: &route.path,
            method: call.method.as_str(),
            principal: &caller.principal,
            name: call.name.as_deref(),
            params_digest: &digest,
            now_ms: state::now_ms(),
        };
        let st =
            state::open(&self.sealer, blob, &expect).map_err(|why| self.rejected(route, why))?;
        let Some(mut flow) = self.parked.take(&st.f) else {
            return Err(self.rejected(route, state::Rejected::FlowGone));
        };
        self.count_parked();
        if flow.round != st.rd {
            self.put_back(st.f, flow);
            return Err(self.rejected(route, state::Rejected::StaleRound));
        }
        let empty = serde_json::Map::new();
        let responses = call
            .params
            .get("inputResponses")
            .and_then(Value::as_object)
            .unwrap_or(&empty);
        let mut answers = Vec::new();
        for (key, question) in &flow.pending {
            let Some(answer) = responses.get(key) else {
                continue;
            };
            match mrtr::legacy_answer(key, question, answer) {
                Ok(result) => answers.push((key.clone(), result)),
                Err(e) => {
                    self.put_back(st.f, flow);
                    return Err(e);
                }
            }
        }
        for (key, result) in answers {
            let question = flow
                .pending
                .remove(&key)
                .expect("answered keys are pending");
            let response = json!({"jsonrpc": "2.0", "id": question.upstream_id, "result": result});
            if let Err(e) = flow.session.transport.post(&flow.wire, &response).await {
                tracing::warn!(?e, "could not deliver an answer upstream");
                return Err(Error::OutcomeUnknown);
            }
        }
        if !flow.pending.is_empty() {
            // Some answers are missing: ask for them again in a new round.
            return Ok(self
                .conclude(
                    route,
                    call,
                    caller,
                    Some(st.f),
                    flow,
                    Done::Input(Vec::new()),
                    reply,
                )
                .await);
        }
        let done = {
            let flight = InFlight {
                call,
                session: &flow.session,
                wire: &flow.wire,
                upstream_id: flow.upstream_id,
                progress_token: flow.progress_token.clone(),
                keepalive: self.keepalive,
                deadline: flow.deadline,
                metrics: &self.metrics,
            };
            call::read_stream(&flight, &mut flow.stream, reply).await
        };
        Ok(self
            .conclude(route, call, caller, Some(st.f), flow, done, reply)
            .await)
    }

    /// Puts a flow back after a retry that could not use it (wrong round,
    /// malformed answers): the legitimate retry may still come.
    fn put_back(&self, id: String, flow: ParkedFlow) {
        if let Err(flow) = self.parked.park(id, flow) {
            tokio::spawn(abandon(flow, self.metrics.clone()));
        }
        self.count_parked();
    }

    /// Finishes a flow's turn: parks it on a new round of questions, or shapes
    /// its final answer. When the parking lot is full, questions are declined on
    /// the client's behalf and the upstream's outcome is read instead.
    async fn conclude(
        &self,
        route: &Route,
        call: &Call,
        caller: &Caller,
        flow_id: Option<String>,
        mut flow: ParkedFlow,
        mut done: Done,
        reply: &mut Reply,
    ) -> Done {
        loop {
            let Done::Input(questions) = done else {
                return self.shape(route, call, caller, &flow.session, &flow.wire, done);
            };
            match self.park_round(route, call, caller, flow_id.clone(), flow, questions) {
                Ok(result) => return Done::Result(result),
                Err(back) => flow = back,
            }
            for question in std::mem::take(&mut flow.pending).into_values() {
                let msg = json!({"id": question.upstream_id, "method": question.method});
                let _ = flow
                    .session
                    .transport
                    .post(&flow.wire, &mrtr::decline(&msg))
                    .await;
                self.metrics
                    .upstream_requests_declined
                    .get_or_create(&MethodLabels {
                        route: route.path.clone(),
                        method: question.method.clone(),
                    })
                    .inc();
            }
            let flight = InFlight {
                call,
                session: &flow.session,
                wire: &flow.wire,
                upstream_id: flow.upstream_id,
                progress_token: flow.progress_token.clone(),
                keepalive: self.keepalive,
                deadline: flow.deadline,
                metrics: &self.metrics,
            };
            done = call::read_stream(&flight, &mut flow.stream, reply).await;
        }
    }

    /// Parks `flow` with its new `questions` and returns the `input_required`
    /// result; gives the flow back when the lot is full.
    fn park_round(
        &self,
        route: &Route,
        call: &Call,
        caller: &Caller,
        flow_id: Option<String>,
        mut flow: ParkedFlow,
        questions: Vec<Value>,
    ) -> Result<serde_json::Map<String, Value>, ParkedFlow> {
        if self.parked.is_full() {
            flow.add_questions(questions);
            return Err(flow);
        }
        flow.add_questions(questions);
        flow.round += 1;
        let id = flow_id.unwrap_or_else(random_id);
        let now = state::now_ms();
        let st = state::FlowState {
            r: route.path.clone(),
            sid: flow.wire.id.clone(),
            ver: flow.wire.version.clone(),
            own: self.instance.clone(),
            f: id.clone(),
            k: flow
                .pending
                .iter()
                .map(|(k, q)| (k.clone(), q.upstream_id.clone()))
                .collect(),
            p: caller.principal.clone(),
            m: call.method.as_str().to_string(),
            n: call.name.clone(),
            a: state::params_digest(&call.params),
            iat: now,
            exp: now + self.parked.ttl().as_millis() as u64,
            rd: flow.round,
        };
        let requests = flow.input_requests();
        let init = flow.session.init.clone();
        self.parked.park(id, flow)?;
        self.count_parked();
        self.metrics
            .mrtr_rounds
            .get_or_create(&MethodLabels {
                route: route.path.clone(),
                method: call.method.as_str().to_string(),
            })
            .inc();
        Ok(translate::input_required(
            &init,
            requests,
            state::seal(&self.sealer, &st),
        ))
    }

    /// Declines the questions of parked flows whose TTL passed, until shutdown;
    /// then declines every flow still parked.
    pub async fn run_flow_reaper(self: Arc<Self>, shutdown: tokio_util::sync::CancellationToken) {
        let period =
            (self.parked.ttl() / 10).clamp(Duration::from_millis(50), Duration::from_secs(1));
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
                self.metrics
                    .parked_flows_expired
                    .get_or_create(&Metrics::route(&flow.session.key.route))
                    .inc();
                tokio::spawn(abandon(flow, self.metrics.clone()));
            }
        }
        let left = self.parked.drain();
        self.count_parked();
        futures_util::future::join_all(left.into_iter().map(|f| abandon(f, self.metrics.clone())))
            .await;
    }
}

/// Longest time an abandoned flow's upstream stream is read after its
/// questions were declined, so the upstream can finish its call cleanly.
const ABANDON_DRAIN: Duration = Duration::from_secs(30);

/// Declines an abandoned flow's questions and reads its stream to the end,
/// declining anything else it asks, so the upstream finishes cleanly.
async fn abandon(mut flow: ParkedFlow, metrics: Metrics) {
    for question in std::mem::take(&mut flow.pending).into_values() {
        let msg = json!({"id": question.upstream_id, "method": question.method});
        let _ = flow
            .session
            .transport
            .post(&flow.wire, &mrtr::decline(&msg))
            .await;
        metrics
            .upstream_requests_declined
            .get_or_create(&MethodLabels {
                route: flow.session.key.route.clone(),
                method: question.method,
            })
            .inc();
    }
    let until = tokio::time::Instant::now() + ABANDON_DRAIN;
    let drain = async {
        while let Ok(msg) = flow.stream.next().await {
            if msg.get("method").is_none()
                && msg.get("id").and_then(Value::as_u64) == Some(flow.upstream_id)
            {
                return;
            }
            if msg.get("method").is_some() && msg.get("id").is_some() {
                call::respond_upstream(&flow.session, &flow.wire, &msg).await;
            }
        }
    };
    let _ = tokio::time::timeout_at(until.min(flow.deadline), drain).await;
}

/// 128 random bits, hex: flow ids and instance ids.
fn random_id() -> String {
    let mut b = [0u8; 16];
    rand::RngCore::fill_bytes(&mut rand::thread_rng(), &mut b);
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Builds a modern JSON-RPC error response (used by listen streams).
fn error_message(id: &Value, err: &Error) -> Value {
    error_body(Some(id), err, SUPPORTED_VERSIONS)
}
