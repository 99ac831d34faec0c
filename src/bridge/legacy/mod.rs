//! The legacy bridge: runs modern calls on pooled legacy sessions.

mod call;
mod cursor;
mod event_limit;
mod flow;
#[cfg(feature = "fuzzing")]
pub(crate) mod fuzzing;
mod h1;
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
use crate::metrics::Metrics;
use crate::park::ParkingLot;
use crate::reply::Reply;
use crate::seal::Sealer;
use call::{Done, InFlight};
use flow::Resumed;
use mrtr::ParkedFlow;
use pool::Exclusive;
pub use pool::Pool;
use session::{legacy_capabilities, PoolKey, Session};
use transport::{PostError, SessionWire, Transport};

/// One request on its way through the bridge: the resolved route, the call, the caller.
#[derive(Clone, Copy)]
struct Ctx<'a> {
    route: &'a Route,
    call: &'a Call,
    caller: &'a Caller,
}

/// Who is calling, as far as the upstream session pool is concerned.
#[derive(Debug, Clone)]
pub struct Caller {
    /// Digest of the bearer token, or "anonymous".
    pub principal: String,
    /// The request's headers. Only the MCP ones ([`Caller::is_mcp_header`])
    /// ever leave the gateway (to the replica owning a flow); none go upstream.
    pub headers: HeaderMap,
    /// The request body as received (a retry forwarded to its owner replica
    /// carries it unchanged).
    pub body: bytes::Bytes,
    /// Received from another replica (signed, and admitted as the retry of
    /// a call paused here): only ever resumes that call; never forwarded
    /// again, never run as a new call.
    pub forwarded: bool,
}

impl Caller {
    /// Headers that describe the MCP request (`MCP-Protocol-Version`,
    /// `Mcp-Method`, `Mcp-Name`, `Mcp-Param-*`), `Content-Type` and `Accept`;
    /// never credentials, never a stale `Mcp-Session-Id`.
    pub fn is_mcp_header(name: &http::HeaderName) -> bool {
        let k = name.as_str();
        (k.starts_with("mcp-") && k != "mcp-session-id") || k == "content-type" || k == "accept"
    }

    /// The headers of `all` that describe the MCP request.
    pub fn mcp_headers(all: &HeaderMap) -> HeaderMap {
        all.iter().filter(|(k, _)| Self::is_mcp_header(k)).map(|(k, v)| (k.clone(), v.clone())).collect()
    }
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
    /// Cluster mode: how to reach the replica that owns a flow.
    cluster: Option<crate::cluster::Forwarder>,
    /// Flows taken out of the parking lot by a retry still being served.
    resuming: std::sync::atomic::AtomicUsize,
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
                config.limits.max_sessions_per_principal,
                config.pool.idle_timeout,
                metrics.clone(),
            )),
            transports,
            discover: DashMap::new(),
            tool_headers: tool_headers::Cache::default(),
            sealer,
            metrics,
            keepalive: config.keepalive_interval,
            listen_slots: Arc::new(tokio::sync::Semaphore::new(config.limits.max_listen_streams)),
            shutdown,
            parked: ParkingLot::new(
                config.limits.max_parked_flows,
                config.limits.max_parked_flows_per_principal,
                config.limits.parked_flow_ttl,
            ),
            instance: config.cluster.as_ref().map(|c| c.instance_id.clone()).unwrap_or_else(random_id),
            cluster: config.cluster.as_ref().map(|c| {
                // A forwarded retry may take as long as a direct one.
                let timeout = config.routes.iter().map(|r| r.upstream.call_timeout).max().unwrap_or_default();
                crate::cluster::Forwarder::new(c, timeout)
            }),
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
            // Rare paths are boxed: the common path's future stays small
            // (it is moved into a box for every request, and kept while parked).
            Method::Discover => Box::pin(self.discover(&route, &call, &caller)).await,
            Method::SubscriptionsListen => return Box::pin(self.listen(&route, &call, &caller, reply)).await,
            _ => self.try_forward(&route, &call, &caller, &mut reply).await.unwrap_or_else(Done::Failed),
        };
        let (status, body, outcome) = match done {
            Done::Result(result) => {
                // Built by hand: `json!` would deep-copy the result.
                let mut msg = serde_json::Map::new();
                msg.insert("jsonrpc".into(), Value::from("2.0"));
                msg.insert("id".into(), call.id.clone());
                msg.insert("result".into(), Value::Object(result));
                (StatusCode::OK, Value::Object(msg), "ok")
            }
            Done::Failed(err) => {
                (err.status(), error_body(Some(&call.id), &err, SUPPORTED_VERSIONS), err.reason())
            }
            Done::Cancelled => return "cancelled",
            Done::Relay(response) => {
                let _ = reply.relay(response);
                return "forwarded";
            }
            Done::Text(result) => {
                reply.finish_raw(StatusCode::OK, result_response(&call.id, &result)).await;
                return "ok";
            }
            // Neither reaches here: questions are parked, results are shaped.
            Done::Input(_) | Done::Raw(_) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                error_body(Some(&call.id), &Error::Internal("unfinished call".into()), SUPPORTED_VERSIONS),
                "internal",
            ),
        };
        reply.finish(status, &body).await;
        outcome
    }

    async fn discover(&self, route: &Route, call: &Call, caller: &Caller) -> Done {
        let key = Self::key(route, call, caller);
        let cache_key = (route.path.clone(), key.capabilities.clone());
        let cached =
            self.discover.get(&cache_key).filter(|e| e.0.elapsed() < route.discover_ttl).map(|e| e.1.clone());
        let init = match cached {
            Some(init) => init,
            None => match self.pool.acquire(&self.transports[&route.path], &key).await {
                Ok(session) => {
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
    async fn session_for(
        &self,
        transport: &Transport,
        key: &PoolKey,
        call: &Call,
    ) -> Result<(Arc<Session>, Option<Exclusive>), Error> {
        if call.method.allows_input() && call.meta.declares("roots") {
            let session = Box::pin(self.pool.open_exclusive(transport, key.clone())).await?;
            let guard = Exclusive::new(self.pool.clone(), session.clone());
            return Ok((session, Some(guard)));
        }
        Ok((self.pool.acquire(transport, key).await?, None))
    }

    async fn try_forward(
        &self,
        route: &Route,
        call: &Call,
        caller: &Caller,
        reply: &mut Reply,
    ) -> Result<Done, Error> {
        mrtr::check_responses_shape(&call.params)?;
        let cx = Ctx { route, call, caller };
        let mut book = None;
        if let Some(blob) = call.params.get("requestState") {
            match Box::pin(self.resume(cx, blob, reply)).await? {
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
        let transport = &self.transports[&route.path];
        let key = Self::key(route, call, caller);
        let pinned = cursor::open(&self.sealer, route, call, caller)?;
        let (mut session, mut exclusive) = self.session_for(transport, &key, call).await?;
        if call.method == Method::ToolsCall {
            self.tool_headers.check(&session, call, caller, route.upstream.response_timeout).await?;
        }
        let deadline = tokio::time::Instant::now() + route.upstream.call_timeout;
        let mut retried = false;
        loop {
            let wire = pinned.as_ref().map_or_else(|| session.wire.clone(), |(wire, _)| wire.clone());
            let get = match exclusive {
                Some(_) => Box::pin(transport.get_stream(&wire, None)).await.ok().map(Box::new),
                None => None,
            };
            let upstream_id = session.mint_id();
            let token = call.meta.progress_token.as_ref().map(|_| json!(format!("sl-{upstream_id}")));
            let request = call::UpstreamRequest {
                call,
                cursor: pinned.as_ref().map(|(_, cursor)| cursor),
                id: upstream_id,
                progress_token: token.as_ref(),
            };
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
            let posted = match call::post_call(&flight, &request, reply).await {
                Ok(posted) => posted,
                Err(done) => return Ok(done),
            };
            match posted {
                Ok((answer, _)) => {
                    let (questions, stream) = match call::read_answer(&flight, answer, get, reply).await {
                        (Done::Input(questions), Some(stream)) => (questions, stream),
                        (done, _) => {
                            return Ok(self.shape(Ctx { route, call, caller }, &session, &wire, done))
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
                    if replay {
                        return Ok(Box::pin(self.conclude_replay(cx, flow, done, &book, reply)).await);
                    }
                    return Ok(Box::pin(self.conclude(cx, None, flow, done, reply)).await);
                }
                Err(PostError::SessionGone) if pinned.is_some() => {
                    return Err(cursor::expired());
                }
                Err(PostError::SessionGone) if !retried => {
                    if exclusive.is_none() {
                        self.pool.invalidate(&session);
                    }
                    self.metrics.sessions_reinitialized.get_or_create(&Metrics::route(&route.path)).inc();
                    (session, exclusive) = self.session_for(transport, &key, call).await?;
                }
                Err(PostError::NotSent) if !retried => {}
                Err(e) => return Err(map_post_error(e, true)),
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
            let sealed = cursor::seal(&self.sealer, cx.route, cx.call, cx.caller, wire, next);
            result.insert("nextCursor".into(), Value::String(sealed));
        }
        if cx.call.method == Method::ToolsList && !cx.call.params.contains_key("cursor") {
            self.tool_headers.learn(session, cx.caller, &result);
        }
        Done::Result(translate::result(cx.call.method, cx.route, &session.init, result))
    }
}

/// `{"jsonrpc":"2.0","id":…,"result":…}` around a result already in JSON text.
fn result_response(id: &Value, result: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(result.len() + 48);
    out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
    serde_json::to_writer(&mut out, id).expect("an id serialises");
    out.extend_from_slice(b",\"result\":");
    out.extend_from_slice(result.as_bytes());
    out.push(b'}');
    out
}

/// 128 random bits, hex: flow ids and instance ids.
fn random_id() -> String {
    let mut b = [0u8; 16];
    rand::RngCore::fill_bytes(&mut rand::thread_rng(), &mut b);
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::Caller;

    #[test]
    fn only_mcp_headers_leave_the_gateway() {
        for (name, leaves) in [
            ("mcp-method", true),
            ("mcp-param-region", true),
            ("mcp-protocol-version", true),
            ("content-type", true),
            ("accept", true),
            ("mcp-session-id", false),
            ("authorization", false),
            ("cookie", false),
            ("x-api-key", false),
        ] {
            let name = http::HeaderName::from_static(name);
            assert_eq!(Caller::is_mcp_header(&name), leaves, "{name}");
        }
    }
}
