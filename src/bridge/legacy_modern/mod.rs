//! Legacy (2025 session) clients on 2026-07-28 upstreams: translated (DESIGN §9).
//!
//! The gateway answers `initialize` itself, from the upstream's
//! `server/discover`; the session is a sealed token ([`token`] with
//! [`Translated`]) holding the client's capabilities, `clientInfo` and the
//! negotiated version, so no replica keeps a session and the upstream sees
//! none. Each request becomes a self-contained 2026-07-28 call (`_meta` from
//! the token; `Mcp-Method`, `Mcp-Name` and the tool's `Mcp-Param-*`
//! headers), on any instance; its answer goes back as the negotiated legacy
//! version has it (no `resultType`, no 2026-only fields). An `input_required`
//! result becomes server-initiated requests pushed on the client's SSE answer
//! ([`question`]); the client's answers (on any replica, forwarded to this
//! one) go back upstream as `inputResponses` with the `requestState`, on the
//! instance that asked, and the next round or the result streams on.
//! `ping` is answered here; `DELETE` ends nothing upstream; `logging/setLevel`
//! and `resources/subscribe` have no stateless equivalent here and are
//! refused clearly (their capabilities are not advertised).

mod question;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use dashmap::DashMap;
use futures_util::StreamExt;
use http::{header, HeaderValue, Response, StatusCode};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::quota;
use super::relay::{Answering, Relay};
use super::session_token::{self as token, Claims, Rejected, Translated};
use super::tool_headers::{self, Annotations};
use super::{Caller, Services, Target};
use crate::config::{Config, LEGACY_VERSIONS};
use crate::error::{error_body, Error};
use crate::front::headers::{encode_value, param_value};
use crate::front::legacy::Peeked;
use crate::front::{MODERN_VERSION, SUPPORTED_VERSIONS};
use crate::metrics::{MethodLabels, OpenedLabels, ReasonLabels};
use crate::reply::{self, Body, Reply};
use crate::upstream::answers::{foreign_message, mint_id};
use crate::upstream::credentials::without_client_token;
use crate::upstream::{PostError, Transport, ACCEPT_BOTH};
use question::{Answer, QuestionId, Rounds};

/// Rounds of questions one call may take before it is ended.
const MAX_ROUNDS: usize = 16;
/// The largest client capabilities object kept in a session token.
const MAX_CAPABILITIES: usize = 1024;
/// The longest `clientInfo` name or version kept.
const MAX_INFO: usize = 128;
/// The tool annotations are one per route: the upstream never learns who
/// calls (no credentials go upstream), so its tool list is the same for all.
const ANY_CALLER: &str = "";

pub struct Bridge {
    services: Arc<Services>,
    session_ttl: Duration,
    /// New sessions per minute: the relay's window, shared.
    quota: Arc<quota::Creations>,
    /// Route → when fetched, the upstream's discover result.
    discover: DashMap<String, (Instant, Arc<Value>)>,
    tool_headers: tool_headers::Cache,
    rounds: Rounds,
    /// How long a round of questions waits for the client's answers.
    question_ttl: Duration,
}

/// A legacy request's envelope, read whole (it is translated).
#[derive(Deserialize)]
struct Request {
    id: Value,
    method: String,
    #[serde(default)]
    params: Option<Map<String, Value>>,
}

/// How a call ended before its result: an error for the client, or the
/// client left.
enum Stop {
    Error(Value),
    Gone,
}

impl From<Error> for Stop {
    fn from(e: Error) -> Stop {
        Stop::Error(error_object(&e))
    }
}

impl Bridge {
    pub fn new(config: &Config, services: Arc<Services>, quota: Arc<quota::Creations>) -> Bridge {
        Bridge {
            services,
            session_ttl: config.legacy.session_ttl,
            quota,
            discover: DashMap::new(),
            tool_headers: tool_headers::Cache::default(),
            rounds: Rounds::default(),
            question_ttl: config.limits.parked_flow_ttl,
        }
    }

    /// Rounds of questions waiting on this replica.
    pub fn waiting(&self) -> usize {
        self.rounds.len()
    }

    /// A legacy POST: answered to `reply`. The metric label and outcome.
    pub async fn post(
        &self,
        target: &Target,
        caller: &Caller,
        peek: Peeked,
        reply: Reply,
    ) -> (&'static str, &'static str) {
        let label = peek.label.as_str();
        // Held until the answer is complete.
        let _slot = match target.admit(&caller.principal, &super::asks(&peek)) {
            Ok(slot) => slot,
            Err(e) => return (label, fail(reply, peek.id.as_ref(), &e).await),
        };
        let outcome = match label {
            "batch" => {
                let e = Error::InvalidRequest("batches are not supported in front of this server".into());
                fail(reply, None, &e).await
            }
            "response" => {
                // An answer to a question pushed on some replica's stream.
                match self.session(target, caller) {
                    Ok(claims) => {
                        self.answer(target, caller, &claims).await;
                        accepted(reply)
                    }
                    Err(e) => fail(reply, None, &e).await,
                }
            }
            "notification" => match self.session(target, caller) {
                Ok(_) => accepted(reply),
                Err(e) => fail(reply, None, &e).await,
            },
            _ if peek.initialize => match self.initialize(target, caller).await {
                Ok(resp) => {
                    let _ = reply.relay(resp);
                    "ok"
                }
                Err(e) => fail(reply, peek.id.as_ref(), &e).await,
            },
            _ => match self.session(target, caller) {
                Err(e) => fail(reply, peek.id.as_ref(), &e).await,
                Ok(claims) => match serde_json::from_slice::<Request>(&caller.body) {
                    Err(_) => {
                        fail(reply, peek.id.as_ref(), &Error::InvalidRequest("bad request".into())).await
                    }
                    Ok(req) => self.request(target, caller, &claims, req, reply).await,
                },
            },
        };
        (label, outcome)
    }

    /// GET and DELETE of a translated session. GET is the session's stream
    /// of list changes, backed by the upstream's `subscriptions/listen`.
    pub async fn session_verb<'t>(
        &self,
        target: &'t Target,
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
        let discover = self.discover(target).await?;
        let filter = listen_filter(&discover);
        if filter.is_empty() {
            // Nothing the upstream would announce.
            return Err(Error::MethodNotAllowed);
        }
        let place = self.services.stream_place(&target.route.id, &caller.principal)?;
        let translated = claims.t.as_ref().expect("a translated session");
        let params = json!({"_meta": {
            "io.modelcontextprotocol/protocolVersion": MODERN_VERSION,
            "io.modelcontextprotocol/clientCapabilities": translated.c,
            "io.modelcontextprotocol/clientInfo": translated.ci},
            "notifications": Value::Object(filter)});
        let body =
            json!({"jsonrpc": "2.0", "id": "listen", "method": "subscriptions/listen", "params": params});
        let body = serde_json::to_vec(&body).expect("serialises");
        let headers = call_headers("subscriptions/listen", None, &[]);
        let (headers, body) = (&headers, &body);
        let send = |t: &'t Transport| t.send_headers_again("POST", headers, body);
        let (resp, upstream) = target.on_instance(send, |e| *e == PostError::NotSent).await;
        let resp = resp.map_err(|e| crate::upstream::map_post_error(e, false))?;
        if !(resp.is_sse() && (200..300).contains(&resp.status)) {
            let _ = upstream.read_body(resp.body).await;
            return Err(Error::UpstreamInvalid("subscriptions/listen did not stream"));
        }
        let mut relay = Relay::new(
            resp.body,
            upstream.max_response(),
            self.services.keepalive,
            self.services.draining.clone(),
            Box::new((place, hold)),
        );
        relay.rewrite = Some(Box::new(listen_event));
        relay.answering = Some(Answering { ids: vec![json!("listen")], upstream: upstream.clone() });
        Ok(relay.response(None))
    }

    /// The claims of a translated session's token, or 404.
    fn session(&self, target: &Target, caller: &Caller) -> Result<Claims, Error> {
        if !caller.headers.contains_key(&crate::front::headers::SESSION_ID) {
            return Err(Error::SessionRequired);
        }
        let route = &target.route.id;
        let claims = token::of_request(&self.services.sealer, &caller.headers, route, &caller.principal)
            .and_then(|c| if c.t.is_some() { Ok(c) } else { Err(Rejected::OtherCell) })
            .map_err(|why| {
                let labels = ReasonLabels { route: route.clone(), reason: why.reason() };
                self.services.metrics.session_tokens_rejected.get_or_create(&labels).inc();
                Error::SessionNotFound
            })?;
        Ok(claims)
    }

    /// `initialize`, answered from the upstream's discover result.
    async fn initialize(&self, target: &Target, caller: &Caller) -> Result<Response<Body>, Error> {
        if caller.headers.contains_key(&crate::front::headers::SESSION_ID) {
            // A session id on initialize must still be one of ours.
            self.session(target, caller)?;
        }
        let msg: Value = serde_json::from_slice(&caller.body).map_err(|_| Error::Parse)?;
        let params = msg.get("params").and_then(Value::as_object).cloned().unwrap_or_default();
        let requested = params.get("protocolVersion").and_then(Value::as_str);
        self.quota.admit_counted(&caller.principal, &target.route.id, &self.services.metrics)?;
        let discover = self.discover(target).await?;
        let version = requested.filter(|v| LEGACY_VERSIONS.contains(v)).unwrap_or(LEGACY_VERSIONS[0]);
        let translated = Translated {
            c: client_capabilities(params.get("capabilities"))?,
            ci: client_info(params.get("clientInfo")),
            s: Some(super::random_id()),
        };
        let now = crate::seal::unix_now();
        let claims = Claims {
            r: target.route.id.clone(),
            // No upstream session, so no instance: each call goes to any.
            i: String::new(),
            u: None,
            v: Some(version.to_string()),
            p: caller.principal.clone(),
            iat: now,
            exp: now + self.session_ttl.as_secs(),
            t: Some(translated),
        };
        let token = token::issue(&self.services.sealer, &claims);
        let token = HeaderValue::from_str(&token).expect("base64url is a valid header value");
        let result = initialize_result(&discover, version);
        let labels =
            OpenedLabels { route: target.route.id.clone(), requested: crate::versions::label(requested) };
        self.services.metrics.legacy_sessions_opened.get_or_create(&labels).inc();
        let id = msg.get("id").cloned().unwrap_or(Value::Null);
        let mut resp =
            reply::json_response(StatusCode::OK, &json!({"jsonrpc": "2.0", "id": id, "result": result}));
        resp.headers_mut().insert(crate::front::headers::SESSION_ID, token);
        Ok(resp)
    }

    /// The upstream's discover result, cached per route for `discover_ttl_ms`.
    async fn discover<'t>(&self, target: &'t Target) -> Result<Arc<Value>, Error> {
        let route = &target.route;
        if let Some(hit) = self.discover.get(&route.id).filter(|e| e.0.elapsed() < route.discover_ttl) {
            return Ok(hit.1.clone());
        }
        let meta = json!({
            "io.modelcontextprotocol/protocolVersion": MODERN_VERSION,
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "sessionless", "version": env!("CARGO_PKG_VERSION")},
        });
        let sent = json!(mint_id());
        let body =
            json!({"jsonrpc": "2.0", "id": sent, "method": "server/discover", "params": {"_meta": meta}});
        let body = serde_json::to_vec(&body).expect("serialises");
        let headers = call_headers("server/discover", None, &[]);
        let (headers, body) = (&headers, &body);
        // Shared by every caller of the route: fetched without any client's token.
        let send = |t: &'t Transport| without_client_token(t.send_headers_again("POST", headers, body));
        let (resp, upstream) = target.on_instance(send, |e| *e == PostError::NotSent).await;
        let resp = resp.map_err(|e| crate::upstream::map_post_error(e, false))?;
        let deadline = tokio::time::Instant::now() + route.upstream.response_timeout;
        let msg = read_message(upstream, resp, &sent, None, deadline).await.map_err(|stop| match stop {
            Stop::Error(_) | Stop::Gone => Error::UpstreamInvalid("discover"),
        })?;
        let result = msg.get("result").filter(|r| r.is_object()).ok_or(Error::UpstreamInvalid("discover"))?;
        let result = Arc::new(result.clone());
        if self.discover.len() < 1024 {
            self.discover.insert(route.id.clone(), (Instant::now(), result.clone()));
        }
        Ok(result)
    }

    /// A request on a translated session.
    async fn request(
        &self,
        target: &Target,
        caller: &Caller,
        claims: &Claims,
        req: Request,
        reply: Reply,
    ) -> &'static str {
        let refused = match req.method.as_str() {
            "ping" => return finish_result(reply, &req.id, json!({})).await,
            // The 2026 level rides on each request; the token holding it
            // cannot change under the client (see README).
            "logging/setLevel" => "logging/setLevel is not available: no log messages are sent",
            "resources/subscribe" | "resources/unsubscribe" => "resource subscriptions are not available",
            _ => return self.call(target, caller, claims, req, reply).await,
        };
        // A JSON-RPC error inside a live session: HTTP 200 (a 404 would tell
        // a 2025 client its session is gone).
        let error =
            rpc_error(crate::error::code::METHOD_NOT_FOUND, &format!("{refused} through this gateway"));
        reply.finish(StatusCode::OK, &json!({"jsonrpc": "2.0", "id": req.id, "error": error})).await;
        "method_not_found"
    }

    /// A request as a stateless 2026 call, its rounds of questions asked of
    /// the client, its result translated back.
    async fn call(
        &self,
        target: &Target,
        caller: &Caller,
        claims: &Claims,
        req: Request,
        mut reply: Reply,
    ) -> &'static str {
        let id = req.id.clone();
        match self.run(target, caller, claims, req, &mut reply).await {
            Ok(result) => finish_result(reply, &id, result).await,
            Err(Stop::Gone) => "cancelled",
            Err(Stop::Error(error)) => {
                let reason = error_reason(&error);
                reply.finish(StatusCode::OK, &json!({"jsonrpc": "2.0", "id": id, "error": error})).await;
                reason
            }
        }
    }

    async fn run<'t>(
        &self,
        target: &'t Target,
        caller: &Caller,
        claims: &Claims,
        req: Request,
        reply: &mut Reply,
    ) -> Result<Value, Stop> {
        let translated = claims.t.as_ref().expect("a translated session");
        let method = req.method.as_str();
        let mut params = req.params.unwrap_or_default();
        // Only the gateway speaks MRTR upstream.
        params.remove("inputResponses");
        params.remove("requestState");
        let mut meta = match params.remove("_meta") {
            Some(Value::Object(m)) => m,
            _ => Map::new(),
        };
        meta.insert("io.modelcontextprotocol/protocolVersion".into(), json!(MODERN_VERSION));
        meta.insert("io.modelcontextprotocol/clientCapabilities".into(), translated.c.clone());
        meta.insert("io.modelcontextprotocol/clientInfo".into(), translated.ci.clone());
        crate::observe::traceparent::into_meta(&mut meta);
        params.insert("_meta".into(), Value::Object(meta));
        let name = match method {
            "tools/call" | "prompts/get" => params.get("name").and_then(Value::as_str).map(str::to_string),
            "resources/read" => params.get("uri").and_then(Value::as_str).map(str::to_string),
            _ => None,
        };
        let param_headers = match (method, &name) {
            ("tools/call", Some(tool)) => self.param_headers(target, tool, &params).await,
            _ => Vec::new(),
        };
        let encoded = name.as_deref().map(encode_value);
        let headers = call_headers(method, encoded.as_deref(), &param_headers);
        let route = &target.route;
        let deadline = tokio::time::Instant::now() + route.upstream.call_timeout;
        let mut pinned: Option<&Transport> = None;
        for _ in 0..MAX_ROUNDS {
            // The upstream sees an id of the gateway's own (random): the
            // client's is predictable, and a connection is shared by callers.
            let sent = json!(mint_id());
            let body = json!({"jsonrpc": "2.0", "id": sent, "method": method, "params": params});
            let body = serde_json::to_vec(&body).expect("serialises");
            let (resp, upstream) = match pinned {
                // A retry goes to the instance that asked.
                Some(upstream) => match upstream.send_headers_again("POST", &headers, &body).await {
                    Err(PostError::NotSent) => {
                        return Err(Stop::Error(rpc_error(
                            -32603,
                            "the server instance that asked the question cannot be reached; call again",
                        )))
                    }
                    other => (other, upstream),
                },
                None => {
                    let (headers, body) = (&headers, &body);
                    let send = |t: &'t Transport| t.send_headers_again("POST", headers, body);
                    target.on_instance(send, |e| *e == PostError::NotSent).await
                }
            };
            let resp = resp.map_err(|e| crate::upstream::map_post_error(e, true))?;
            let msg = read_message(upstream, resp, &sent, Some(reply), deadline).await?;
            if let Some(error) = msg.get("error") {
                return Err(Stop::Error(legacy_error(error)));
            }
            let Some(Value::Object(mut result)) = msg.get("result").cloned() else {
                return Err(Error::UpstreamInvalid("no result").into());
            };
            if result.get("resultType").and_then(Value::as_str) != Some("input_required") {
                if method == "tools/list"
                    && !result.contains_key("nextCursor")
                    && !params.contains_key("cursor")
                {
                    let mut map = HashMap::new();
                    if let Some(Value::Array(tools)) = result.get("tools") {
                        tool_headers::annotations(tools, &mut map);
                    }
                    self.tool_headers.remember(&route.id, ANY_CALLER, Arc::new(map));
                }
                if let Some(view) = &caller.access {
                    view.filter(method, &mut result);
                }
                strip_modern(&mut result);
                return Ok(Value::Object(result));
            }
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
                params.remove("inputResponses");
            } else {
                params.insert("inputResponses".into(), Value::Object(answers));
            }
            match state {
                Some(state) => params.insert("requestState".into(), state),
                None => params.remove("requestState"),
            };
            pinned = Some(upstream);
        }
        Err(Error::UpstreamInvalid("too many rounds of questions").into())
    }

    /// The `Mcp-Param-*` headers of a tool call, from the tool's
    /// `x-mcp-header` annotations (learnt from the upstream's tool list).
    async fn param_headers(
        &self,
        target: &Target,
        tool: &str,
        params: &Map<String, Value>,
    ) -> Vec<(String, String)> {
        let route = &target.route.id;
        let tools = match self.tool_headers.cached(route, ANY_CALLER) {
            Some(tools) => tools,
            None => match self.list_tools(target).await {
                Some(tools) => {
                    self.tool_headers.remember(route, ANY_CALLER, tools.clone());
                    tools
                }
                None => return Vec::new(),
            },
        };
        let Some(annotated) = tools.get(tool) else {
            return Vec::new();
        };
        let arguments = params.get("arguments");
        annotated
            .iter()
            .filter_map(|(header, prop)| {
                let value = param_value(arguments?.get(prop)?)?;
                Some((format!("mcp-param-{header}"), value.into_owned()))
            })
            .collect()
    }

    /// The upstream's whole tool list, as annotations; `None` if it could
    /// not be read.
    async fn list_tools(&self, target: &Target) -> Option<Annotations> {
        let deadline = tokio::time::Instant::now() + target.route.upstream.response_timeout;
        let headers = call_headers("tools/list", None, &[]);
        let headers = &headers;
        tool_headers::gather(|cursor| async move {
            let mut params = json!({"_meta": {
                "io.modelcontextprotocol/protocolVersion": MODERN_VERSION,
                "io.modelcontextprotocol/clientCapabilities": {}}});
            if let Some(c) = cursor {
                params["cursor"] = c;
            }
            let sent = json!(mint_id());
            let body = json!({"jsonrpc": "2.0", "id": sent, "method": "tools/list", "params": params});
            let body = serde_json::to_vec(&body).expect("serialises");
            let upstream = target.pick();
            let resp =
                without_client_token(upstream.send_headers_again("POST", headers, &body)).await.ok()?;
            let msg = read_message(upstream, resp, &sent, None, deadline).await.ok()?;
            match msg.get("result") {
                Some(Value::Object(result)) => Some(result.clone()),
                _ => None,
            }
        })
        .await
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
        let translated = claims.t.as_ref().expect("a translated session");
        let session = session_of(claims, caller);
        let version = claims.v.as_deref().unwrap_or(LEGACY_VERSIONS[0]);
        for request in requests.values() {
            if let Some(missing) = missing_capability(&translated.c, request) {
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
                    o: self.services.instance.clone(),
                    oa: self.services.cluster.as_ref().map(|c| c.advertise().to_string()),
                    f: round.clone(),
                    k: key.clone(),
                    r: route.clone(),
                    p: caller.principal.clone(),
                    s: Some(session.clone()),
                    exp,
                },
            );
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
        if q.o == self.services.instance {
            self.delivered(target, &q, answer, "here");
            return;
        }
        let (Some(cluster), Some(owner)) = (&self.services.cluster, &q.oa) else {
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
        if q.o == self.services.instance {
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
        let q = question::open(&self.services.sealer, &resp.id, &target.route.id, principal)?;
        let outcome = match (resp.result, resp.error) {
            (Some(result), None) => Ok(result),
            (None, Some(error)) => Err(error),
            _ => return None,
        };
        let answer = Answer { key: q.k.clone(), outcome };
        Some((q, answer))
    }

    fn delivered(&self, target: &Target, q: &QuestionId, answer: Answer, how: &'static str) {
        let outcome = if self.rounds.deliver(&q.f, answer) { how } else { "no_round" };
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
    claims.t.as_ref().expect("a translated session").session(token.unwrap_or_default())
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
            meta.remove("io.modelcontextprotocol/subscriptionId");
            if meta.is_empty() {
                params.remove("_meta");
            }
        }
    }
    Ok(Some(msg.to_string()))
}

/// A 2026 call's headers: version, method, name (already encoded), and
/// `extra` (`Mcp-Param-*`).
fn call_headers<'a>(
    method: &'a str,
    name: Option<&'a str>,
    extra: &'a [(String, String)],
) -> Vec<(&'a str, &'a str)> {
    let mut headers = vec![
        ("mcp-protocol-version", MODERN_VERSION),
        ("mcp-method", method),
        ("accept", ACCEPT_BOTH),
        ("content-type", "application/json"),
    ];
    if let Some(name) = name {
        headers.push(("mcp-name", name));
    }
    headers.extend(extra.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    headers
}

/// Reads the upstream's answer to a call: its JSON-RPC message, from JSON or
/// from SSE (notifications on the way are relayed to `reply`).
async fn read_message(
    upstream: &Transport,
    resp: crate::upstream::h1::Response,
    sent: &Value,
    mut reply: Option<&mut Reply>,
    deadline: tokio::time::Instant,
) -> Result<Value, Stop> {
    let status = resp.status;
    if matches!(status, 202 | 401 | 403 | 407) {
        return Err(Error::UpstreamInvalid("unexpected status").into());
    }
    if resp.is_sse() && (200..300).contains(&status) {
        let mut events = Relay::events(resp.body, upstream.max_response());
        loop {
            // A client that leaves ends the upstream request (a 2026
            // server takes the closed stream as cancellation).
            let next = tokio::time::timeout_at(deadline, events.next());
            let event = match &mut reply {
                Some(reply) if reply.is_streaming() => tokio::select! {
                    event = next => event,
                    _ = reply.closed() => return Err(Stop::Gone),
                },
                _ => next.await,
            };
            let event = match event {
                Err(_) => return Err(Error::UpstreamTimeout.into()),
                Ok(None) => return Err(Error::OutcomeUnknown.into()),
                Ok(Some(Err(_))) => return Err(Error::UpstreamInvalid("invalid event stream").into()),
                Ok(Some(Ok(event))) => event,
            };
            let Some(data) = event.data.as_deref().filter(|d| !d.trim().is_empty()) else { continue };
            if crate::upstream::event_limit::too_many_values(data.as_bytes(), upstream.max_response()) {
                return Err(Error::UpstreamTooLarge.into());
            }
            let Ok(msg) = serde_json::from_str::<Value>(data) else {
                return Err(Error::UpstreamInvalid("event is not JSON").into());
            };
            let is_answer =
                msg.get("id").is_some() && (msg.get("result").is_some() || msg.get("error").is_some());
            if is_answer {
                return answer_to(upstream, sent, msg);
            }
            // Notifications (progress, log messages) go on to the client.
            if msg.get("method").is_some() && msg.get("id").is_none() {
                if let Some(reply) = reply.as_deref_mut() {
                    reply.event(&msg).await.map_err(|_| Stop::Gone)?;
                }
            }
        }
    }
    let json = resp.is_json();
    let read = tokio::time::timeout_at(deadline, upstream.read_body(resp.body));
    let read = match reply {
        Some(reply) if reply.is_streaming() => tokio::select! {
            read = read => read,
            _ = reply.closed() => return Err(Stop::Gone),
        },
        _ => read.await,
    };
    let body = match read {
        Err(_) => return Err(Error::UpstreamTimeout.into()),
        Ok(r) => r.map_err(|e| crate::upstream::map_post_error(e, true))?,
    };
    if crate::upstream::event_limit::too_many_values(&body, upstream.max_response()) {
        return Err(Error::UpstreamTooLarge.into());
    }
    let msg: Value = match serde_json::from_slice(&body) {
        Ok(v) if json => v,
        _ => {
            let why = if (200..300).contains(&status) { "content type" } else { "error status" };
            return Err(Error::UpstreamInvalid(why).into());
        }
    };
    if msg.get("result").is_none() && msg.get("error").is_none() {
        return Err(Error::UpstreamInvalid("not a JSON-RPC answer").into());
    }
    answer_to(upstream, sent, msg)
}

/// `msg`, a response, if it answers the request `sent`; never delivered
/// otherwise, and the upstream's idle connections are dropped.
fn answer_to(upstream: &Transport, sent: &Value, msg: Value) -> Result<Value, Stop> {
    if foreign_message(&msg, std::slice::from_ref(sent)) {
        upstream.distrust();
        return Err(Error::UpstreamInvalid("an answer to another request").into());
    }
    Ok(msg)
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
