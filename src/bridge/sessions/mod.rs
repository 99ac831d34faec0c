//! The legacy-session upstream half (DESIGN §2, §10): typed calls run on
//! pooled legacy sessions, the upstream's questions turned into
//! `input_required` rounds, paused calls parked here.

mod call;
mod cursor;
mod flow;
#[cfg(feature = "fuzzing")]
pub(crate) mod fuzzing;
mod listen;
mod mrtr;
mod pool;
mod session;
mod state;
mod streams;
#[cfg(test)]
mod tests;
mod translate;

use std::sync::Arc;
use std::time::Instant;

use dashmap::DashMap;
use serde_json::{json, Value};

use super::half::{Outcome, Payload, UpstreamHalf};
use super::{Caller, Services, Target};
use crate::config::{Config, Route};
use crate::error::Error;
use crate::front::{Call, Method, SUPPORTED_VERSIONS};
use crate::metrics::Metrics;
use crate::park::ParkingLot;
use crate::reply::Reply;
use crate::upstream::{Channel, SendError, SessionWire};
use call::{Done, InFlight};
use flow::Resumed;
use mrtr::ParkedFlow;
use pool::Exclusive;
pub use pool::Pool;
use session::{legacy_capabilities, CapabilitiesText, KeyRef, Session};

/// A call's session, and the guard of one of its own.
type SessionFor = Result<(Arc<Session>, Option<Exclusive>), Error>;

/// One request on its way through the bridge: the resolved route, the call, the caller.
#[derive(Clone, Copy)]
struct Ctx<'a> {
    route: &'a Route,
    /// The route's upstream instances (a retry goes to the one its state names).
    target: &'a Target,
    call: &'a Call,
    caller: &'a Caller,
}

/// Modern (2026-07-28) clients on legacy upstreams: calls run on pooled
/// sessions, questions become `input_required` rounds, paused calls park here.
pub struct Bridge {
    services: Arc<Services>,
    pool: Arc<Pool>,
    /// (route, capabilities) → when fetched, `InitializeResult`.
    discover: DashMap<(String, String), (Instant, Arc<Value>)>,
    tool_headers: super::tool_headers::Cache,
    /// Calls paused on questions for the user, by flow id.
    parked: ParkingLot<ParkedFlow>,
    /// Flows taken out of the parking lot by a retry still being served.
    resuming: std::sync::atomic::AtomicUsize,
}

pub(crate) use crate::upstream::map_send_error;

impl Bridge {
    pub fn new(config: &Config, services: Arc<Services>) -> Bridge {
        let metrics = services.metrics.clone();
        Bridge {
            pool: Arc::new(Pool::new(
                config.pool.max_sessions,
                config.limits.max_sessions_per_principal,
                config.pool.idle_timeout,
                metrics,
            )),
            discover: DashMap::new(),
            tool_headers: super::tool_headers::Cache::default(),
            parked: ParkingLot::new(services.parking.clone(), config.limits.parked_flow_ttl),
            services,
            resuming: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// Calls paused on a question in this replica, or being resumed here
    /// (taken out of the parking lot for a retry that may park them again).
    pub fn parked_flows(&self) -> usize {
        self.parked.len() + self.resuming.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The pool key of `call` on `instance`, borrowed (`capabilities`:
    /// the call's, as [`CapabilitiesText`]).
    fn key<'k>(
        route: &'k Route,
        call: &'k Call,
        caller: &'k Caller,
        instance: &'k dyn Channel,
        capabilities: &'k CapabilitiesText,
    ) -> KeyRef<'k> {
        KeyRef {
            route: &route.id,
            instance: instance.instance(),
            principal: &caller.principal,
            capabilities: capabilities.as_str(),
            version: &call.meta.protocol_version,
        }
    }

    /// Runs one call to its outcome.
    async fn outcome(&self, target: &Target, call: &Call, caller: &Caller, notes: &mut Reply) -> Outcome {
        let done = match call.method {
            // Rare paths are boxed: the common path's future stays small
            // (it is moved into a box for every request, and kept while parked).
            Method::Discover => Box::pin(self.discover(target, call, caller)).await,
            // A stream of its own, not one outcome ([`Bridge::listen`]).
            Method::SubscriptionsListen => return Error::MethodNotFound(call.method.as_str().into()).into(),
            _ => self.try_forward(target, call, caller, notes).await.unwrap_or_else(Done::Failed),
        };
        match done {
            Done::Result(result) => Outcome::of_result(result),
            // A process that did not start: named, for the operator reading the client's error.
            Done::Failed(Error::ProcessStart { timed_out, upstream: None }) => {
                Error::ProcessStart { timed_out, upstream: Some(target.route.upstream.name.clone()) }.into()
            }
            // Shaped text is a complete result: questions come as a tree.
            Done::Text(text) => Outcome::Complete(Payload::Text(text)),
            Done::Failed(e) => e.into(),
            Done::Cancelled => Outcome::Gone,
            Done::Relay(response) => Outcome::Answered(Box::new(response)),
            // Neither reaches here: questions are parked, results are shaped.
            Done::Input(_) | Done::Raw(_) => Error::Internal("unfinished call".into()).into(),
        }
    }

    /// A 2026 client's call (the front door's): its outcome.
    pub async fn serve(&self, target: &Target, call: &Call, caller: &Caller, notes: &mut Reply) -> Outcome {
        self.outcome(target, call, caller, notes).await
    }

    async fn discover(&self, target: &Target, call: &Call, caller: &Caller) -> Done {
        let route = &*target.route;
        let cache_key = (route.id.clone(), legacy_capabilities(&call.meta.capabilities));
        let cached =
            self.discover.get(&cache_key).filter(|e| e.0.elapsed() < route.discover_ttl).map(|e| e.1.clone());
        let init = match cached {
            Some(init) => init,
            None => match self.session_anywhere(target, call, caller).await.0 {
                Ok((session, _)) => {
                    self.discover.insert(cache_key, (Instant::now(), session.init.clone()));
                    session.init.clone()
                }
                Err(e) => return Done::Failed(e),
            },
        };
        Done::Result(translate::discover(route, &init, SUPPORTED_VERSIONS))
    }

    /// The session a call runs on: the pooled one, or, for a call that
    /// declares `roots`, one of its own (a legacy server may ask `roots/list`
    /// on the session's GET stream, where only a lone call makes it attributable).
    async fn session_for(&self, channel: &dyn Channel, key: KeyRef<'_>, call: &Call) -> SessionFor {
        // (A channel that links no such message to a request gives the
        // call a process of the session to itself instead: `send_alone`.)
        if call.method.allows_input() && call.meta.declares("roots") && channel.links_all() {
            let session = Box::pin(self.pool.open_exclusive(channel, key.to_owned())).await?;
            let guard = Exclusive::new(self.pool.clone(), session.clone());
            return Ok((session, Some(guard)));
        }
        Ok((self.pool.acquire(channel, key).await?, None))
    }

    /// A call's session (as [`Self::session_for`]) on the next instance that
    /// is up, or the one after if that one cannot be reached.
    async fn session_anywhere<'t>(
        &self,
        target: &'t Target,
        call: &Call,
        caller: &Caller,
    ) -> (SessionFor, &'t dyn Channel) {
        let open = |t: &'t dyn Channel| async move {
            let capabilities = CapabilitiesText::of(&call.meta.capabilities);
            self.session_for(t, Self::key(&target.route, call, caller, t, &capabilities), call).await
        };
        target.on_channel(open, |e| matches!(e, Error::UpstreamUnreachable)).await
    }

    async fn try_forward(
        &self,
        target: &Target,
        call: &Call,
        caller: &Caller,
        reply: &mut Reply,
    ) -> Result<Done, Error> {
        mrtr::check_responses_shape(&call.params)?;
        let route = &*target.route;
        let cx = Ctx { route, target, call, caller };
        let mut book = None;
        if call.params.contains_key("requestState") {
            match Box::pin(self.resume(cx, reply)).await? {
                Resumed::Done(done) => return Ok(done),
                Resumed::Reissue => {}
                Resumed::Replay(answers) => book = Some(answers),
            }
        }
        if caller.forwarded {
            // Unreachable: the internal listener admits only retries of flows parked here.
            return Err(Error::Internal("a forwarded request is not a retry".into()));
        }
        let replay = route.replays(call.name.as_deref().filter(|_| call.method == Method::ToolsCall));
        let book = book.unwrap_or_default();
        let pinned = cursor::open(&self.services.sealer, route, call, caller)?;
        // The next page goes to the instance holding the cursor's session.
        let (mut channel, mut session, mut exclusive) = match &pinned {
            Some(p) => {
                let channel = target.channel(&p.instance).ok_or_else(cursor::expired)?;
                let capabilities = CapabilitiesText::of(&call.meta.capabilities);
                let key = Self::key(route, call, caller, channel, &capabilities);
                let (session, exclusive) = self.session_for(channel, key, call).await?;
                (channel, session, exclusive)
            }
            None => {
                let (opened, channel) = self.session_anywhere(target, call, caller).await;
                let (session, exclusive) = opened?;
                (channel, session, exclusive)
            }
        };
        // A new run of a tool: a 2026 client mirrors its annotated
        // arguments in headers (the tools listed on the call's session).
        if call.method == Method::ToolsCall && call.client_headers {
            let list = || list_tools(&session, route.upstream.response_timeout);
            self.tool_headers.check(&session.key.route, call, caller, list).await?;
        }
        let deadline = tokio::time::Instant::now() + route.upstream.call_timeout;
        let mut retried = false;
        loop {
            let wire = pinned.as_ref().map_or_else(|| session.wire.clone(), |p| p.wire.clone());
            let get = match exclusive {
                Some(_) => Box::pin(channel.messages(&wire, None)).await.ok(),
                None => None,
            };
            let upstream_id = session.mint_id();
            let token = call.meta.progress_token.as_ref().map(|_| json!(format!("sl-{upstream_id}")));
            let request = call::UpstreamRequest {
                call,
                cursor: pinned.as_ref().map(|p| &p.cursor),
                id: upstream_id,
                progress_token: token.as_ref(),
            };
            let flight = InFlight {
                call,
                session: &session,
                wire: &wire,
                upstream_id,
                progress_token: token.clone(),
                keepalive: self.services.keepalive,
                deadline,
                metrics: &self.services.metrics,
            };
            let posted = match call::post_call(&flight, &request, reply).await {
                Ok(posted) => posted,
                Err(done) => return Ok(done),
            };
            match posted {
                Ok(sent) => {
                    let (questions, stream) = match call::read_answer(&flight, sent.answer, get, reply).await
                    {
                        (Done::Input(questions), Some(stream)) => (questions, stream),
                        (done, _) => return Ok(self.shape(cx, &session, &wire, done)),
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
                    if replay {
                        return Ok(Box::pin(self.conclude_replay(cx, flow, done, &book, reply)).await);
                    }
                    return Ok(Box::pin(self.conclude(cx, None, flow, done, reply)).await);
                }
                Err(SendError::SessionGone) if pinned.is_some() => {
                    return Err(cursor::expired());
                }
                Err(SendError::SessionGone) if !retried => {
                    if exclusive.is_none() {
                        self.pool.invalidate(&session);
                    }
                    self.services
                        .metrics
                        .sessions_reinitialized
                        .get_or_create(&Metrics::route(&route.id))
                        .inc();
                    (session, exclusive) = self.session_for(channel, session.key.as_ref(), call).await?;
                }
                // Not sent: once more, on another instance if this one
                // could not be reached (a cursor's page has no other).
                Err(SendError::NotSent) if pinned.is_some() && !channel.health().is_up() => {
                    return Err(cursor::expired());
                }
                Err(SendError::NotSent) if !retried => {
                    if !channel.health().is_up() {
                        drop(exclusive.take());
                        let (opened, next) = self.session_anywhere(target, call, caller).await;
                        (session, exclusive) = opened?;
                        channel = next;
                    }
                }
                Err(e) => return Err(map_send_error(e, true)),
            }
            retried = true;
        }
    }

    fn shape(&self, cx: Ctx<'_>, session: &Session, wire: &SessionWire, done: Done) -> Done {
        let mut result = match done {
            Done::Result(result) => result,
            Done::Raw(raw) => {
                // Lists may need their cursor sealed and tools/list is learnt
                // from: those take the tree. Other results only gain keys.
                if !cx.call.method.paginated() {
                    if let Some(text) =
                        translate::result_text(cx.call.method, cx.route, session.server_info.as_deref(), &raw)
                    {
                        return Done::Text(text);
                    }
                }
                match serde_json::from_str::<serde_json::Map<String, Value>>(raw.get()) {
                    Ok(result) => result,
                    Err(_) => return Done::Failed(Error::UpstreamInvalid("result is not an object")),
                }
            }
            Done::Failed(Error::Upstream { code, data, .. })
                if code == crate::error::code::URL_ELICITATION_REQUIRED =>
            {
                return self.url_round(cx, &session.init, data.as_ref());
            }
            other => return other,
        };
        if let Some(Value::String(next)) = result.get("nextCursor") {
            let instance = session.channel.instance();
            let Ok(sealed) =
                cursor::seal(&self.services.sealer, cx.route, cx.call, cx.caller, instance, wire, next)
            else {
                return Done::Failed(Error::UpstreamInvalid("nextCursor too long"));
            };
            result.insert("nextCursor".into(), Value::String(sealed));
        }
        if cx.call.method == Method::ToolsList && !cx.call.params.contains_key("cursor") {
            self.tool_headers.learn(&session.key.route, cx.caller, &result);
        }
        if let Some(view) = &cx.caller.access {
            view.filter(cx.call.method.as_str(), &mut result);
        }
        Done::Result(translate::result(cx.call.method, cx.route, &session.init, result))
    }
}

/// Pooled legacy sessions as an upstream half: the call of a client half
/// that is not the 2026 front door (a translated legacy session). Its
/// questions park the call here and come back as an `input_required` result
/// whose `requestState` resumes it (on this replica: the client half's
/// retry is its own).
impl UpstreamHalf for Bridge {
    async fn call(&self, target: &Target, call: Call, caller: &Caller, notes: &mut Reply) -> Outcome {
        self.outcome(target, &call, caller, notes).await
    }

    /// A session of its own, its GET stream's list changes.
    async fn listen(
        &self,
        target: &Target,
        call: Call,
        caller: &Caller,
        rewrite: super::relay::Rewrite,
        hold: Box<dyn std::any::Any + Send + Sync>,
    ) -> Result<http::Response<crate::reply::Body>, Error> {
        self.list_changes(target, &call, caller, rewrite, hold).await
    }
}

/// The annotations of the upstream's whole tool list, asked on `session`.
async fn list_tools(
    session: &Session,
    timeout: std::time::Duration,
) -> Option<super::tool_headers::Annotations> {
    super::tool_headers::gather(|cursor| async move {
        let params = match cursor {
            Some(c) => json!({"cursor": c}),
            None => json!({}),
        };
        call::simple_request(session, "tools/list", params, timeout).await.ok()
    })
    .await
}
