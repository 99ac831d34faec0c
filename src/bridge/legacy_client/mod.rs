//! The legacy-client half (DESIGN §9, §10): legacy (2025 session) clients
//! translated, over any upstream half ([`UpstreamHalf`]).
//!
//! The gateway answers `initialize` itself, from the upstream half's
//! `server/discover`; the session is a sealed token ([`token`] with
//! [`Translated`]) holding the client's capabilities, `clientInfo` and the
//! negotiated version, so no replica keeps a client session. Each request
//! becomes a typed 2026 call (`_meta` from the token) run by the upstream
//! half: a stateless 2026 server, or the gateway's pooled legacy sessions;
//! its answer goes back as the negotiated legacy version has it (no
//! `resultType`, no 2026-only fields). An `input_required` outcome becomes
//! server-initiated requests pushed on the client's SSE answer
//! ([`question`]); the client's answers (on any replica, forwarded to this
//! one) go back to the upstream half as `inputResponses` with its
//! `requestState`, and the next round or the result streams on.
//! `ping` is answered here; `DELETE` ends nothing upstream; `logging/setLevel`
//! and `resources/subscribe` have no stateless equivalent here and are
//! refused clearly (their capabilities are not advertised).

mod question;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use dashmap::DashMap;
use http::{header, HeaderValue, Response, StatusCode};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::half::{Failure, Outcome, UpstreamHalf};
use super::quota;
use super::session_token::{self as token, Claims, Rejected, Translated};
use super::{Caller, Services, Target};
use crate::config::{Config, LEGACY_VERSIONS};
use crate::error::{error_body, Error};
use crate::front::legacy::{Kind, Peeked};
use crate::front::{Call, Meta, Method, MODERN_VERSION, SUPPORTED_VERSIONS};
use crate::metrics::{MethodLabels, OpenedLabels, ReasonLabels};
use crate::reply::{self, Body, Reply};
use crate::sealed::Purpose;
use crate::upstream::credentials::without_client_token;
use question::{Answer, QuestionId, Rounds};

/// Rounds of questions one call may take before it is ended.
const MAX_ROUNDS: usize = 16;
/// The largest client capabilities object kept in a session token.
const MAX_CAPABILITIES: usize = 1024;
/// The longest `clientInfo` name or version kept.
const MAX_INFO: usize = 128;

pub struct Bridge {
    services: Arc<Services>,
    session_ttl: Duration,
    /// New sessions per minute: the relay's window, shared.
    quota: Arc<quota::Creations>,
    /// Route → when fetched, the upstream's discover result.
    discover: DashMap<String, (Instant, Arc<Value>)>,
    rounds: Rounds,
    /// How long a round of questions waits for the client's answers.
    question_ttl: Duration,
}

/// How a call ended before its result: an error for the client, or the
/// client left.
enum Stop {
    Error(Value),
    Gone,
}

impl From<Error> for Stop {
    fn from(e: Error) -> Stop {
        match e {
            // The upstream's own error, as a legacy client reads it.
            Error::Upstream { code, message, data } => {
                let mut error = json!({"code": code, "message": message});
                if let Some(data) = data {
                    error["data"] = data;
                }
                Stop::Error(legacy_error(&error))
            }
            e => Stop::Error(error_object(&e)),
        }
    }
}

impl Bridge {
    pub fn new(config: &Config, services: Arc<Services>, quota: Arc<quota::Creations>) -> Bridge {
        Bridge {
            services,
            session_ttl: config.legacy.session_ttl,
            quota,
            discover: DashMap::new(),
            rounds: Rounds::default(),
            question_ttl: config.limits.parked_flow_ttl,
        }
    }

    /// Rounds of questions waiting on this replica.
    pub fn waiting(&self) -> usize {
        self.rounds.len()
    }

    /// A legacy POST, its calls run on `upstream`: answered to `reply`.
    /// The metric label and outcome.
    pub async fn post<U: UpstreamHalf>(
        &self,
        upstream: &U,
        target: &Target,
        caller: &Caller,
        peek: Peeked,
        mut reply: Reply,
    ) -> (&'static str, &'static str) {
        let label = peek.label.as_str();
        // Held until the answer is complete.
        let _slot = match target.admit(&caller.principal, &super::asks(&peek)) {
            Ok(slot) => slot,
            Err(e) => return (label, fail(reply, peek.id.as_ref(), &e).await),
        };
        let outcome = match peek.label {
            Kind::Batch => {
                let e = Error::InvalidRequest("batches are not supported in front of this server".into());
                fail(reply, None, &e).await
            }
            Kind::Response => {
                // An answer to a question pushed on some replica's stream.
                match self.session(target, caller) {
                    Ok(claims) => {
                        self.answer(target, caller, &claims).await;
                        accepted(reply)
                    }
                    Err(e) => fail(reply, None, &e).await,
                }
            }
            Kind::Notification => match self.session(target, caller) {
                Ok(_) => accepted(reply),
                Err(e) => fail(reply, None, &e).await,
            },
            _ if peek.initialize => {
                match self.initialize(upstream, target, caller, &peek, &mut reply).await {
                    Ok(resp) => {
                        let _ = reply.relay(resp);
                        "ok"
                    }
                    Err(e) => fail(reply, peek.id.as_ref(), &e).await,
                }
            }
            _ => match self.session(target, caller) {
                Err(e) => fail(reply, peek.id.as_ref(), &e).await,
                Ok(claims) => self.request(upstream, target, caller, &claims, peek, reply).await,
            },
        };
        (label, outcome)
    }

    /// GET and DELETE of a translated session. GET is the session's stream
    /// of list changes, backed by the upstream half's list-change stream.
    pub async fn session_verb<U: UpstreamHalf>(
        &self,
        upstream: &U,
        target: &Target,
        caller: &Caller,
        get: bool,
        hold: Box<dyn std::any::Any + Send + Sync>,
    ) -> Result<Response<Body>, Error> {
        let claims = self.session(target, caller)?;
        if !get {
            // Nothing to end upstream: the session lives only in its token.
            return Ok(reply::empty(StatusCode::OK));
        }
        if self.services.draining.is_cancelled() {
            // This replica is leaving: the client's reconnect goes elsewhere.
            return Err(Error::Overloaded);
        }
        let discover = self.discover(upstream, target, caller).await?;
        let filter = listen_filter(&discover);
        if filter.is_empty() {
            // Nothing the upstream would announce.
            return Err(Error::MethodNotAllowed);
        }
        let place = self.services.stream_place(&target.route.id, &caller.principal)?;
        let translated = claims.translated.as_ref().expect("a translated session");
        let mut params = Map::new();
        params.insert("notifications".into(), Value::Object(filter));
        let call = Call {
            id: json!("listen"),
            method: Method::SubscriptionsListen,
            params,
            meta: meta_of(translated, Map::new()),
            name: None,
            request_state: Default::default(),
            client_headers: false,
        };
        upstream.listen(target, call, caller, Box::new(listen_event), Box::new((place, hold))).await
    }

    /// The claims of a translated session's token, or 404.
    fn session(&self, target: &Target, caller: &Caller) -> Result<Claims, Error> {
        if !caller.headers.contains_key(&crate::front::headers::SESSION_ID) {
            return Err(Error::SessionRequired);
        }
        let route = &target.route.id;
        let claims = token::of_request(&self.services.sealer, &caller.headers, route, &caller.principal)
            .and_then(|c| if c.translated.is_some() { Ok(c) } else { Err(Rejected::OtherCell) })
            .map_err(|why| why.refuse(Purpose::LegacySession, route, &self.services.metrics))?;
        Ok(claims)
    }

    /// `initialize`, answered from the upstream's discover result.
    async fn initialize<U: UpstreamHalf>(
        &self,
        upstream: &U,
        target: &Target,
        caller: &Caller,
        peek: &Peeked,
        reply: &mut Reply,
    ) -> Result<Response<Body>, Error> {
        if caller.headers.contains_key(&crate::front::headers::SESSION_ID) {
            // A session id on initialize must still be one of ours.
            self.session(target, caller)?;
        }
        let empty = Map::new();
        let params = peek.params.as_ref().unwrap_or(&empty);
        let requested = params.get("protocolVersion").and_then(Value::as_str);
        self.quota.admit_counted(&caller.principal, &target.route.id, &self.services.metrics)?;
        let discover = tokio::select! {
            discover = self.discover(upstream, target, caller) => discover?,
            _ = reply.closed() => return Err(Error::OutcomeUnknown),
        };
        let version = requested.filter(|v| LEGACY_VERSIONS.contains(v)).unwrap_or(LEGACY_VERSIONS[0]);
        let translated = Translated {
            capabilities: client_capabilities(params.get("capabilities"))?,
            client_info: client_info(params.get("clientInfo")),
            session_id: Some(super::random_id()),
        };
        let now = crate::seal::unix_now();
        let claims = Claims {
            route: target.route.id.clone(),
            // No upstream session, so no instance: each call goes to any.
            instance: String::new(),
            upstream_session: None,
            version: Some(version.to_string()),
            principal: caller.principal.clone(),
            issued: now,
            expires: now + self.session_ttl.as_secs(),
            translated: Some(translated),
        };
        let token = token::issue(&self.services.sealer, &claims).map_err(|_| {
            Error::InvalidRequest("capabilities and clientInfo too large to carry in a session id".into())
        })?;
        let token = HeaderValue::from_str(&token).expect("base64url is a valid header value");
        let result = initialize_result(&discover, version);
        let labels =
            OpenedLabels { route: target.route.id.clone(), requested: crate::versions::label(requested) };
        self.services.metrics.legacy_sessions_opened.get_or_create(&labels).inc();
        let id = peek.id.clone().unwrap_or(Value::Null);
        let mut resp =
            reply::json_response(StatusCode::OK, &json!({"jsonrpc": "2.0", "id": id, "result": result}));
        resp.headers_mut().insert(crate::front::headers::SESSION_ID, token);
        Ok(resp)
    }

    /// The upstream's discover result, cached per route for
    /// `discover_ttl_ms`: asked with no client's capabilities, and without
    /// any client's token (it is shared by every caller of the route).
    async fn discover<U: UpstreamHalf>(
        &self,
        upstream: &U,
        target: &Target,
        caller: &Caller,
    ) -> Result<Arc<Value>, Error> {
        let route = &target.route;
        if let Some(hit) = self.discover.get(&route.id).filter(|e| e.0.elapsed() < route.discover_ttl) {
            return Ok(hit.1.clone());
        }
        let meta = Meta {
            protocol_version: MODERN_VERSION.into(),
            capabilities: Map::new(),
            client_info: Some(json!({"name": "sessionless", "version": env!("CARGO_PKG_VERSION")})),
            progress_token: None,
            log_level: None,
            passthrough: Map::new(),
        };
        let (params, request_state) = (Map::new(), Default::default());
        let call = Call {
            id: json!(0),
            method: Method::Discover,
            params,
            meta,
            name: None,
            request_state,
            client_headers: false,
        };
        // Nothing of a discover is the client's to see on the way.
        let (mut notes, _quiet) = Reply::new(false);
        let asked = without_client_token(upstream.call(target, call, caller, &mut notes)).await;
        target.observed(asked.unreachable());
        let result = match asked {
            Outcome::Complete(result) => Value::Object(result.into_tree()?),
            Outcome::Failed(Failure::Gateway(e)) => return Err(e),
            _ => return Err(Error::UpstreamInvalid("discover")),
        };
        let result = Arc::new(result);
        if self.discover.len() < 1024 {
            self.discover.insert(route.id.clone(), (Instant::now(), result.clone()));
        }
        Ok(result)
    }

    /// A request on a translated session.
    async fn request<U: UpstreamHalf>(
        &self,
        upstream: &U,
        target: &Target,
        caller: &Caller,
        claims: &Claims,
        peek: Peeked,
        reply: Reply,
    ) -> &'static str {
        let id = peek.id.clone().unwrap_or(Value::Null);
        let refused = match peek.method.as_deref().unwrap_or_default() {
            "ping" => return finish_result(reply, &id, json!({})).await,
            // The 2026 level rides on each request; the token holding it
            // cannot change under the client (see docs/protocol.md).
            "logging/setLevel" => "logging/setLevel is not available: no log messages are sent",
            "resources/subscribe" | "resources/unsubscribe" => "resource subscriptions are not available",
            method => match Method::parse(method).filter(|m| *m != Method::SubscriptionsListen) {
                Some(method) => {
                    return self.call(upstream, target, caller, claims, method, peek, reply).await
                }
                None => "this method is not known",
            },
        };
        // A JSON-RPC error inside a live session: HTTP 200 (a 404 would tell
        // a 2025 client its session is gone).
        let error =
            rpc_error(crate::error::code::METHOD_NOT_FOUND, &format!("{refused} through this gateway"));
        reply.finish(StatusCode::OK, &json!({"jsonrpc": "2.0", "id": id, "error": error})).await;
        "method_not_found"
    }

    /// A request as a typed 2026 call, its rounds of questions asked of
    /// the client, its result translated back.
    #[allow(clippy::too_many_arguments)]
    async fn call<U: UpstreamHalf>(
        &self,
        upstream: &U,
        target: &Target,
        caller: &Caller,
        claims: &Claims,
        method: Method,
        peek: Peeked,
        mut reply: Reply,
    ) -> &'static str {
        let id = peek.id.clone().unwrap_or(Value::Null);
        let call = match typed_call(claims, method, id.clone(), peek.params) {
            Ok(call) => call,
            Err(e) => return fail_in_session(reply, &id, Stop::from(e)).await,
        };
        match self.run(upstream, target, caller, claims, call, &mut reply).await {
            Ok(result) => finish_result(reply, &id, result).await,
            Err(stop) => fail_in_session(reply, &id, stop).await,
        }
    }

    /// Runs the call on `upstream` round after round: each round of
    /// questions is asked of the client and the call retried with its
    /// answers and the state the upstream half gave.
    async fn run<U: UpstreamHalf>(
        &self,
        upstream: &U,
        target: &Target,
        caller: &Caller,
        claims: &Claims,
        mut call: Call,
        reply: &mut Reply,
    ) -> Result<Value, Stop> {
        for _ in 0..MAX_ROUNDS {
            let outcome = upstream.call(target, call.clone(), caller, reply).await;
            target.observed(outcome.unreachable());
            let mut result = match outcome {
                Outcome::Complete(result) => {
                    let mut result = result.into_tree()?;
                    strip_modern(&mut result);
                    return Ok(Value::Object(result));
                }
                Outcome::InputRequired(result) => result,
                Outcome::Failed(Failure::Upstream(error)) => return Err(Stop::Error(legacy_error(&error))),
                Outcome::Failed(Failure::Gateway(e)) => return Err(e.into()),
                Outcome::Gone => return Err(Stop::Gone),
                // Its retries are its own, on this replica.
                Outcome::Answered(_) => {
                    return Err(Error::Internal("a retry answered elsewhere".into()).into())
                }
            };
            let state = result.remove("requestState");
            let requests = match result.remove("inputRequests") {
                Some(Value::Object(r)) if !r.is_empty() => r,
                // A continuation hint: retry at once with the state.
                _ if state.is_some() => Map::new(),
                _ => return Err(Error::UpstreamInvalid("input_required without questions").into()),
            };
            let answers = if requests.is_empty() {
                Map::new()
            } else {
                self.ask(target, caller, claims, &requests, reply).await?
            };
            if answers.is_empty() {
                call.params.remove("inputResponses");
            } else {
                call.params.insert("inputResponses".into(), Value::Object(answers));
            }
            match state {
                Some(state) => call.params.insert("requestState".into(), state),
                None => call.params.remove("requestState"),
            };
        }
        Err(Error::UpstreamInvalid("too many rounds of questions").into())
    }

    /// Pushes one round of questions on the client's stream and waits for
    /// every answer; the `inputResponses`.
    async fn ask(
        &self,
        target: &Target,
        caller: &Caller,
        claims: &Claims,
        requests: &Map<String, Value>,
        reply: &mut Reply,
    ) -> Result<Map<String, Value>, Stop> {
        let route = &target.route.id;
        let translated = claims.translated.as_ref().expect("a translated session");
        let session = session_of(claims, caller);
        let version = claims.version.as_deref().unwrap_or(LEGACY_VERSIONS[0]);
        for request in requests.values() {
            if let Some(missing) = missing_capability(&translated.capabilities, request) {
                return Err(Stop::Error(json!({"code": -32600,
                    "message": format!("the server asks for a client capability this session did not declare: {}",
                        missing.as_object().and_then(|m| m.keys().next().cloned()).unwrap_or_default()),
                    "data": {"requiredCapabilities": missing}})));
            }
        }
        if !crate::guard::accepts_sse(&caller.headers) {
            return Err(Error::InvalidRequest(
                "this call asks the user a question: accept text/event-stream to answer it".into(),
            )
            .into());
        }
        // A place like a parked flow's (global and per-principal caps).
        let _place = self.services.parking.hold(&caller.principal).map_err(|why| {
            let quota = match why {
                crate::park::Refused::PrincipalFull => "parked_flows_per_principal",
                _ => "parked_flows",
            };
            let labels = crate::metrics::QuotaLabels { route: route.clone(), quota };
            self.services.metrics.quota_exceeded.get_or_create(&labels).inc();
            Stop::from(Error::Overloaded)
        })?;
        let round = super::random_id();
        let mut waiting = self.rounds.wait(round.clone(), requests.len());
        let expires = tokio::time::Instant::now() + self.question_ttl;
        let exp = crate::seal::unix_now() + self.question_ttl.as_secs() + 1;
        let mut ids = HashMap::new();
        for (key, request) in requests {
            let qid = question::mint(
                &self.services.sealer,
                &QuestionId {
                    owner: self.services.instance.clone(),
                    owner_address: self.services.cluster.as_ref().map(|c| c.advertise().to_string()),
                    round: round.clone(),
                    key: key.clone(),
                    route: route.clone(),
                    principal: caller.principal.clone(),
                    session: Some(session.clone()),
                    expires: exp,
                },
            )
            .map_err(|_| Stop::from(Error::UpstreamInvalid("input key too long")))?;
            let method = request.get("method").and_then(Value::as_str).unwrap_or_default();
            let params = legacy_question_params(method, request.get("params"), version);
            let mut msg = json!({"jsonrpc": "2.0", "id": qid, "method": method});
            if let Some(params) = params {
                msg["params"] = params;
            }
            reply.event(&msg).await.map_err(|_| Stop::Gone)?;
            ids.insert(key.clone(), (qid, method.to_string()));
            let labels = MethodLabels { route: route.clone(), method: method_label(method).into() };
            self.services.metrics.questions_pushed.get_or_create(&labels).inc();
        }
        let mut answers = Map::new();
        while answers.len() < requests.len() {
            tokio::select! {
                answer = waiting.answers.recv() => {
                    let Some(Answer { key, outcome }) = answer else { break };
                    let Some((_, method)) = ids.get(&key) else { continue };
                    match outcome {
                        Ok(result) => {
                            answers.insert(key, result);
                        }
                        // Declining an elicitation has its own shape; a
                        // refused sampling or roots request ends the call.
                        Err(_) if method == "elicitation/create" => {
                            answers.insert(key, json!({"action": "decline"}));
                        }
                        Err(error) => {
                            let message = error.get("message").and_then(Value::as_str).unwrap_or("refused");
                            return Err(Stop::Error(rpc_error(-32603,
                                &format!("the client refused the server's {method} request: {message}"))));
                        }
                    }
                }
                _ = tokio::time::sleep(self.services.keepalive) => {
                    reply.keepalive().await.map_err(|_| Stop::Gone)?;
                }
                _ = reply.closed() => return Err(Stop::Gone),
                _ = tokio::time::sleep_until(expires) => {
                    // Unanswered: the client is told its questions are void;
                    // an elicitation counts as cancelled, anything else ends the call.
                    for (key, (qid, method)) in &ids {
                        if answers.contains_key(key) {
                            continue;
                        }
                        let note = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                            "params": {"requestId": qid, "reason": "no answer in time"}});
                        let _ = reply.event(&note).await;
                        if method != "elicitation/create" {
                            return Err(Stop::Error(rpc_error(-32603,
                                &format!("no answer to the server's {method} request in time"))));
                        }
                    }
                    for (key, (_, _)) in &ids {
                        answers.entry(key.clone()).or_insert_with(|| json!({"action": "cancel"}));
                    }
                }
            }
        }
        Ok(answers)
    }

    /// A client's answer to a pushed question, on the session it was pushed
    /// on: delivered to the round waiting here, or forwarded (with the
    /// session) to the replica holding it.
    async fn answer(&self, target: &Target, caller: &Caller, claims: &Claims) {
        let Some((q, answer)) = self.open_answer(target, &caller.principal, &caller.body) else {
            return;
        };
        let session = session_of(claims, caller);
        if !q.asked_on(Some(&session)) {
            self.other_session(target);
            return;
        }
        if q.owner == self.services.instance {
            self.delivered(target, &q, answer, "here");
            return;
        }
        let (Some(cluster), Some(owner)) = (&self.services.cluster, &q.owner_address) else {
            self.count_forwarded(target, "no_owner");
            return;
        };
        let forwarded = cluster
            .forward(
                owner,
                &target.route.id,
                &caller.principal,
                Some(&session),
                &caller.headers,
                caller.body.clone(),
            )
            .await;
        self.count_forwarded(target, if forwarded.is_ok() { "forwarded" } else { "owner_gone" });
    }

    /// An answer forwarded by another replica (signed, principal checked;
    /// `session`, signed too, the one it was posted on): whether it was one
    /// for a round of this cell (then it is taken, or refused when it was
    /// not posted on the session the question was pushed on).
    pub fn take_forwarded(
        &self,
        target: &Target,
        principal: &str,
        session: Option<&str>,
        body: &Bytes,
    ) -> bool {
        let Some((q, answer)) = self.open_answer(target, principal, body) else {
            return false;
        };
        if !q.asked_on(session) {
            self.other_session(target);
            return true;
        }
        if q.owner == self.services.instance {
            self.delivered(target, &q, answer, "received");
        }
        true
    }

    fn open_answer(&self, target: &Target, principal: &str, body: &[u8]) -> Option<(QuestionId, Answer)> {
        #[derive(Deserialize)]
        struct Response {
            id: String,
            result: Option<Value>,
            error: Option<Value>,
        }
        let resp: Response = serde_json::from_slice(body).ok()?;
        let q = question::open(&self.services.sealer, &resp.id, &target.route.id, principal).ok()?;
        let outcome = match (resp.result, resp.error) {
            (Some(result), None) => Ok(result),
            (None, Some(error)) => Err(error),
            _ => return None,
        };
        let answer = Answer { key: q.key.clone(), outcome };
        Some((q, answer))
    }

    fn delivered(&self, target: &Target, q: &QuestionId, answer: Answer, how: &'static str) {
        let outcome = if self.rounds.deliver(&q.round, answer) { how } else { "no_round" };
        self.count_forwarded(target, outcome);
    }

    /// An answer to a question pushed on another session (of the same
    /// principal: another's does not open), or forwarded without its session:
    /// refused, counted and logged.
    fn other_session(&self, target: &Target) {
        self.count_forwarded(target, "other_session");
        crate::log_limited!(
            tracing::Level::WARN,
            route = %target.route.id,
            "refused an answer to a question pushed on another session"
        );
    }

    fn count_forwarded(&self, target: &Target, outcome: &'static str) {
        let labels = ReasonLabels { route: target.route.id.clone(), reason: outcome };
        self.services.metrics.answers_routed.get_or_create(&labels).inc();
    }
}

/// What tells the request's translated session from every other
/// ([`Translated::session`]): its questions are bound to it.
fn session_of(claims: &Claims, caller: &Caller) -> String {
    let token = caller.headers.get(&crate::front::headers::SESSION_ID).and_then(|v| v.to_str().ok());
    claims.translated.as_ref().expect("a translated session").session(token.unwrap_or_default())
}

/// The listen filter for what the upstream announces (its discover
/// capabilities with `listChanged`).
fn listen_filter(discover: &Value) -> Map<String, Value> {
    let mut filter = Map::new();
    for (cap, flag) in [
        ("tools", "toolsListChanged"),
        ("prompts", "promptsListChanged"),
        ("resources", "resourcesListChanged"),
    ] {
        if discover.pointer(&format!("/capabilities/{cap}/listChanged")).and_then(Value::as_bool)
            == Some(true)
        {
            filter.insert(flag.into(), json!(true));
        }
    }
    filter
}

/// One event of the upstream's listen stream as the legacy GET stream
/// carries it: list changes without the subscription's `_meta`; the
/// acknowledgement and the closing result are dropped (empty data).
fn listen_event(data: &str) -> Result<Option<String>, ()> {
    let mut msg: Value = serde_json::from_str(data).map_err(|_| ())?;
    let method = msg.get("method").and_then(Value::as_str).unwrap_or_default();
    if !method.starts_with("notifications/") || method == "notifications/subscriptions/acknowledged" {
        return Ok(Some(String::new()));
    }
    if let Some(Value::Object(params)) = msg.get_mut("params") {
        if let Some(Value::Object(meta)) = params.get_mut("_meta") {
            meta.remove(crate::front::SUBSCRIPTION_ID);
            if meta.is_empty() {
                params.remove("_meta");
            }
        }
    }
    Ok(Some(msg.to_string()))
}

/// A legacy request as a typed 2026 call: `_meta` from the session token
/// (capabilities, clientInfo) and the client's own (its progress token and
/// other keys); `inputResponses` and `requestState` are the gateway's alone.
fn typed_call(
    claims: &Claims,
    method: Method,
    id: Value,
    params: Option<Map<String, Value>>,
) -> Result<Call, Error> {
    let translated = claims.translated.as_ref().expect("a translated session");
    let mut params = params.unwrap_or_default();
    params.remove("inputResponses");
    params.remove("requestState");
    let own = match params.remove("_meta") {
        Some(Value::Object(m)) => m,
        _ => Map::new(),
    };
    let name = match method.name_key() {
        None => None,
        Some(key) => match params.get(key) {
            Some(Value::String(name)) => Some(name.clone()),
            _ => return Err(Error::invalid_params(format!("missing params.{key}"))),
        },
    };
    let meta = meta_of(translated, own);
    Ok(Call { id, method, params, meta, name, request_state: Default::default(), client_headers: false })
}

/// The typed call a translated session sends upstream for a request of
/// `method` with `params`, as [`typed_call`] makes it (the fuzz targets in
/// `fuzz/`: what is forwarded names what the rules saw).
#[cfg(feature = "fuzzing")]
pub fn translated_call(method: Method, params: Option<Map<String, Value>>) -> Result<Call, Error> {
    let translated = Translated { capabilities: json!({}), client_info: json!({}), session_id: None };
    let claims = Claims {
        route: String::new(),
        instance: String::new(),
        upstream_session: None,
        version: None,
        principal: String::new(),
        issued: 0,
        expires: 0,
        translated: Some(translated),
    };
    typed_call(&claims, method, Value::Null, params)
}

/// A translated session's `_meta` for one call: the token's capabilities
/// and clientInfo, the client's progress token and its keys of no one's
/// reserved prefix.
fn meta_of(translated: &Translated, mut own: Map<String, Value>) -> Meta {
    let progress_token = own.remove("progressToken").filter(|t| t.is_string() || t.is_number());
    own.retain(|k, _| !k.starts_with("io.modelcontextprotocol/"));
    Meta {
        protocol_version: MODERN_VERSION.into(),
        capabilities: translated.capabilities.as_object().cloned().unwrap_or_default(),
        client_info: Some(translated.client_info.clone()),
        progress_token,
        log_level: None,
        passthrough: own,
    }
}

/// A call that ended without a result, answered inside the session (HTTP
/// 200); the metric outcome.
async fn fail_in_session(reply: Reply, id: &Value, stop: Stop) -> &'static str {
    match stop {
        Stop::Gone => "cancelled",
        Stop::Error(error) => {
            let reason = error_reason(&error);
            reply.finish(StatusCode::OK, &json!({"jsonrpc": "2.0", "id": id, "error": error})).await;
            reason
        }
    }
}

/// The InitializeResult for `version`, from a discover result.
fn initialize_result(discover: &Value, version: &str) -> Value {
    let mut capabilities = Map::new();
    if let Some(Value::Object(caps)) = discover.get("capabilities") {
        for key in ["tools", "prompts", "resources", "completions"] {
            let Some(Value::Object(c)) = caps.get(key) else { continue };
            // List changes come on the GET stream (from the upstream's
            // listen stream); resource subscriptions are not offered.
            let mut c = c.clone();
            c.remove("subscribe");
            capabilities.insert(key.into(), Value::Object(c));
        }
    }
    let server_info = discover
        .pointer("/_meta/io.modelcontextprotocol~1serverInfo")
        .or_else(|| discover.get("serverInfo"))
        .cloned()
        .unwrap_or_else(|| json!({"name": "unknown", "version": "0"}));
    let mut result =
        json!({"protocolVersion": version, "capabilities": capabilities, "serverInfo": server_info});
    if let Some(instructions) = discover.get("instructions").filter(|i| i.is_string()) {
        result["instructions"] = instructions.clone();
    }
    result
}

/// The client's capabilities as 2026 `clientCapabilities`: the questions it
/// can answer, bounded in size (they ride in the session token).
fn client_capabilities(declared: Option<&Value>) -> Result<Value, Error> {
    let mut caps = Map::new();
    if let Some(Value::Object(declared)) = declared {
        for key in ["elicitation", "sampling", "roots"] {
            if let Some(Value::Object(c)) = declared.get(key) {
                caps.insert(key.into(), Value::Object(c.clone()));
            }
        }
    }
    let caps = Value::Object(caps);
    if caps.to_string().len() > MAX_CAPABILITIES {
        return Err(Error::invalid_params("client capabilities too large"));
    }
    Ok(caps)
}

/// The client's `clientInfo`, name and version only, bounded.
fn client_info(declared: Option<&Value>) -> Value {
    let field = |k: &str| {
        let s = declared.and_then(|d| d.get(k)).and_then(Value::as_str).unwrap_or("unknown");
        s.chars().take(MAX_INFO).collect::<String>()
    };
    json!({"name": field("name"), "version": field("version")})
}

/// The capability a question needs that `caps` lacks, as a ClientCapabilities object.
fn missing_capability(caps: &Value, request: &Value) -> Option<Value> {
    let method = request.get("method").and_then(Value::as_str).unwrap_or_default();
    let params = request.get("params");
    match method {
        "elicitation/create" => {
            let Some(elicitation) = caps.get("elicitation") else {
                return Some(json!({"elicitation": {}}));
            };
            let url = params.and_then(|p| p.get("mode")).and_then(Value::as_str) == Some("url");
            (url && elicitation.get("url").is_none()).then(|| json!({"elicitation": {"url": {}}}))
        }
        "sampling/createMessage" => {
            let Some(sampling) = caps.get("sampling") else {
                return Some(json!({"sampling": {}}));
            };
            let tools = params.and_then(|p| p.get("tools")).is_some();
            (tools && sampling.get("tools").is_none()).then(|| json!({"sampling": {"tools": {}}}))
        }
        "roots/list" => caps.get("roots").is_none().then(|| json!({"roots": {}})),
        _ => Some(json!({})),
    }
}

/// A 2026 input request's params as the negotiated legacy version has
/// them: URL elicitation gains the `elicitationId` 2025-11-25 requires,
/// and `mode` goes for 2025-06-18, which has none.
fn legacy_question_params(method: &str, params: Option<&Value>, version: &str) -> Option<Value> {
    let mut params = params.cloned()?;
    if method == "elicitation/create" {
        if let Value::Object(p) = &mut params {
            if p.get("mode").and_then(Value::as_str) == Some("url") {
                p.insert("elicitationId".into(), json!(super::random_id()));
            } else if version != "2025-11-25" {
                p.remove("mode");
            }
        }
    }
    Some(params)
}

/// A result as a legacy client reads it: no `resultType`, no caching
/// hints, no 2026 `_meta` entries.
fn strip_modern(result: &mut Map<String, Value>) {
    result.remove("resultType");
    result.remove("ttlMs");
    result.remove("cacheScope");
    if let Some(Value::Object(meta)) = result.get_mut("_meta") {
        meta.retain(|k, _| !k.starts_with("io.modelcontextprotocol/"));
        if meta.is_empty() {
            result.remove("_meta");
        }
    }
}

/// An upstream JSON-RPC error as a legacy client reads it: the 2026-only
/// codes become the closest legacy ones, data kept. A 2025 client knows no
/// code of the spec's reserved -32020..-32099 but -32042, which 2026-07-28
/// forbids (a 2025-11-25 client would take it for a URL elicitation it was
/// never asked): the rest of the range is an internal error, as on the
/// modern path.
fn legacy_error(error: &Value) -> Value {
    let mut error = error.clone();
    let code = error.get("code").and_then(Value::as_i64).unwrap_or(-32603);
    let mapped = match code {
        // Missing client capability: the request cannot be served as sent.
        -32021 => -32600,
        // Header or version trouble is the gateway's, not the client's;
        // anything else of the range is undefined.
        -32099..=-32020 => -32603,
        c => c,
    };
    error["code"] = json!(mapped);
    error
}

fn rpc_error(code: i64, message: &str) -> Value {
    json!({"code": code, "message": message})
}

/// The JSON-RPC error object of a gateway error.
fn error_object(e: &Error) -> Value {
    error_body(None, e, SUPPORTED_VERSIONS)
        .get("error")
        .cloned()
        .unwrap_or_else(|| rpc_error(-32603, "error"))
}

fn error_reason(error: &Value) -> &'static str {
    match error.get("code").and_then(Value::as_i64) {
        Some(-32600) => "invalid_request",
        Some(-32601) => "method_not_found",
        Some(-32602) => "invalid_params",
        _ => "upstream_error",
    }
}

fn method_label(method: &str) -> &'static str {
    match method {
        "elicitation/create" => "elicitation/create",
        "sampling/createMessage" => "sampling/createMessage",
        "roots/list" => "roots/list",
        _ => "other",
    }
}

fn accepted(reply: Reply) -> &'static str {
    let _ = reply.relay(reply::empty(StatusCode::ACCEPTED));
    "accepted"
}

async fn finish_result(reply: Reply, id: &Value, result: Value) -> &'static str {
    reply.finish(StatusCode::OK, &json!({"jsonrpc": "2.0", "id": id, "result": result})).await;
    "ok"
}

async fn fail(reply: Reply, id: Option<&Value>, e: &Error) -> &'static str {
    let mut resp = reply::error(id, e);
    if e.status() == StatusCode::METHOD_NOT_ALLOWED {
        resp.headers_mut().insert(header::ALLOW, HeaderValue::from_static("POST, DELETE"));
    }
    let _ = reply.relay(resp);
    e.reason()
}

#[cfg(test)]
mod tests;
