//! One request forwarded on a legacy session: send it, then read the
//! upstream's answer (JSON, or an SSE stream carrying progress, log messages
//! and server-initiated requests before the response).

use std::time::Duration;

use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};
use tokio::time::Instant;

use super::session::Session;
use super::streams::Streams;
use crate::error::Error;
use crate::front::{Call, LogLevel};
use crate::metrics::{MethodLabels, Metrics};
use crate::reply::Reply;
use crate::upstream::channel::{self, Answer, Channel, Messages, SendError, Sent, SessionWire, StreamEnd};

/// How a forwarded call ended.
pub enum Done {
    Result(Map<String, Value>),
    Failed(Error),
    /// The client went away; the upstream was told to cancel.
    Cancelled,
    /// The upstream's result as JSON text, not yet shaped for the client.
    Raw(Box<RawValue>),
    /// The modern result as JSON text, shaped ([`super::Bridge::shape`]).
    Text(String),
    /// The upstream asked questions the client must answer (JSON-RPC requests,
    /// as the upstream sent them); the stream is paused, not finished.
    Input(Vec<Value>),
    /// The answer comes whole from the replica that owns the flow.
    Relay(http::Response<crate::reply::Body>),
}

/// Questions asked together go to the client in one round: after a question,
/// the next one joins the round if it arrives within `SIBLING_GAP`, up to
/// `SIBLING_WAIT` after the first (concurrent questions arrive back to back).
const SIBLING_GAP: Duration = Duration::from_millis(5);
const SIBLING_WAIT: Duration = Duration::from_millis(30);

/// Everything the read loop needs about the call in flight.
pub struct InFlight<'a> {
    pub call: &'a Call,
    pub session: &'a Session,
    pub wire: &'a SessionWire,
    pub upstream_id: u64,
    pub progress_token: Option<Value>,
    pub keepalive: Duration,
    pub deadline: Instant,
    pub metrics: &'a Metrics,
}

/// The legacy request for a modern call: minted id and progress token, the
/// upstream's own cursor in place of the sealed one, modern-only params and
/// `_meta` keys left out, the rest of `_meta` passed through. Serialised
/// straight from the call, without copying its params.
pub struct UpstreamRequest<'a> {
    pub call: &'a Call,
    /// The upstream's cursor, replacing the sealed `params.cursor`.
    pub cursor: Option<&'a Value>,
    pub id: u64,
    pub progress_token: Option<&'a Value>,
}

impl Serialize for UpstreamRequest<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(4))?;
        m.serialize_entry("jsonrpc", "2.0")?;
        m.serialize_entry("id", &self.id)?;
        m.serialize_entry("method", self.call.method.as_str())?;
        m.serialize_entry("params", &UpstreamParams(self))?;
        m.end()
    }
}

struct UpstreamParams<'a>(&'a UpstreamRequest<'a>);

impl Serialize for UpstreamParams<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let r = self.0;
        let mut m = s.serialize_map(None)?;
        for (k, v) in &r.call.params {
            match (k.as_str(), r.cursor) {
                ("inputResponses" | "requestState", _) => {}
                ("cursor", Some(upstream)) => m.serialize_entry(k, upstream)?,
                _ => m.serialize_entry(k, v)?,
            }
        }
        let traced = crate::observe::hop().is_some();
        if r.progress_token.is_some() || !r.call.meta.passthrough.is_empty() || traced {
            m.serialize_entry("_meta", &UpstreamMeta(r))?;
        }
        m.end()
    }
}

struct UpstreamMeta<'a>(&'a UpstreamRequest<'a>);

impl Serialize for UpstreamMeta<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        // The gateway's hop in place of the client's trace context.
        let mut trace = serde_json::Map::new();
        crate::observe::traceparent::into_meta(&mut trace);
        let ours = |k: &str| !trace.is_empty() && (k == "traceparent" || k == "tracestate");
        for (k, v) in self.0.call.meta.passthrough.iter().filter(|(k, _)| !ours(k)) {
            m.serialize_entry(k, v)?;
        }
        for (k, v) in &trace {
            m.serialize_entry(k, v)?;
        }
        if let Some(token) = self.0.progress_token {
            m.serialize_entry("progressToken", token)?;
        }
        m.end()
    }
}

/// Sends the call upstream, minding the client meanwhile: keep-alives if the
/// upstream is slow to start answering, and a cancellation upstream if the
/// client leaves or the upstream times out after the call went out.
/// `Err`: the call is over (cancelled); `Ok`: what the channel brought back.
pub async fn post_call(
    flight: &InFlight<'_>,
    request: &UpstreamRequest<'_>,
    reply: &mut Reply,
) -> Result<Result<Sent, SendError>, Done> {
    let channel = &*flight.session.channel;
    let post = async {
        let bytes = serde_json::to_vec(request).map_err(|_| SendError::Invalid("encode"))?;
        match !channel.links_all() && alone(flight.call) {
            true => channel.send_alone(flight.wire, &bytes).await,
            false => channel.send(flight.wire, &bytes).await,
        }
    };
    tokio::pin!(post);
    let mut keepalive = tokio::time::interval_at(Instant::now() + flight.keepalive, flight.keepalive);
    loop {
        tokio::select! {
            posted = &mut post => {
                if matches!(posted, Err(SendError::Timeout | SendError::Broken)) {
                    cancel(flight, "gateway gave up waiting for the answer");
                }
                return Ok(posted);
            }
            _ = reply.closed() => return Err(cancel(flight, "client closed the stream")),
            _ = keepalive.tick() => {
                if reply.keepalive().await.is_err() {
                    return Err(cancel(flight, "client closed the stream"));
                }
            }
        }
    }
}

/// Whether `call` must get what the server links to no request (its
/// questions and log lines): a call that may ask on a session that
/// declared elicitation, sampling or roots, or one that asks for log lines.
fn alone(call: &Call) -> bool {
    let asks = || ["elicitation", "sampling", "roots"].iter().any(|c| call.meta.declares(c));
    call.meta.log_level.is_some() || (call.method.allows_input() && asks())
}

/// Reads the upstream's answer to `flight` and streams what the client asked
/// for. The stream comes back with [`Done::Input`], to be parked.
pub async fn read_answer(
    flight: &InFlight<'_>,
    answer: Answer,
    get: Option<Box<dyn Messages>>,
    reply: &mut Reply,
) -> (Done, Option<Streams>) {
    let msg = match answer {
        Answer::Result { id, result } if id == flight.upstream_id => return (Done::Raw(result), None),
        Answer::Result { .. } => return (foreign(&*flight.session.channel), None),
        Answer::Json(msg) => msg,
        Answer::Accepted => return (Done::Failed(Error::UpstreamInvalid("202 to a request")), None),
        Answer::Stream(post) => {
            let mut streams = Streams { post, get };
            let done = Box::pin(read_stream(flight, &mut streams, reply)).await;
            return (done, Some(streams));
        }
    };
    let done = json_answer(msg, flight.upstream_id).unwrap_or_else(|| foreign(&*flight.session.channel));
    (done, None)
}

/// A whole answer that holds no response to the request sent: never
/// delivered, and the connection that carried it is not used again.
fn foreign(channel: &dyn Channel) -> Done {
    channel.distrust();
    Done::Failed(Error::UpstreamInvalid("an answer to another request"))
}

/// A whole-JSON answer: one message, or a 2025-03-26 batch holding the response.
fn json_answer(msg: Value, id: u64) -> Option<Done> {
    match msg {
        Value::Array(batch) => batch.iter().find_map(|m| response_of(m, id)),
        // The common case: our result, moved out rather than copied.
        Value::Object(mut m)
            if m.get("id").and_then(Value::as_u64) == Some(id) && !m.contains_key("error") =>
        {
            match m.remove("result") {
                Some(Value::Object(r)) => Some(Done::Result(r)),
                _ => Some(Done::Failed(Error::UpstreamInvalid("response without result"))),
            }
        }
        m => response_of(&m, id),
    }
}

/// The outcome if `msg` is the response to request `id`. Some servers answer
/// a request they could not read with an error of no id (null, or the Python
/// SDK's "server-error"): taken as this request's. An error with another id
/// answers another request: never this one's.
fn response_of(msg: &Value, id: u64) -> Option<Done> {
    let is_ours = msg.get("id").and_then(Value::as_u64) == Some(id);
    if let Some(err) = msg.get("error") {
        let about_this = is_ours || crate::upstream::answers::unaddressed(msg.get("id"));
        return (about_this && msg.get("method").is_none())
            .then(|| Done::Failed(super::translate::error(err)));
    }
    if !is_ours {
        return None;
    }
    match msg.get("result") {
        Some(Value::Object(r)) => Some(Done::Result(r.clone())),
        _ => Some(Done::Failed(Error::UpstreamInvalid("response without result"))),
    }
}

/// What one message from the upstream's stream means for the call in flight.
enum Incoming {
    /// The response to the call (result or error).
    Response(Done),
    /// A question for the user that may become an `input_required` round.
    Question(Value),
    /// A question needing a capability the request did not declare.
    Undeclared(Value, Value),
    /// Another server request (`ping`, or a question outside MRTR methods).
    Request(Value),
    Notification(Value),
    /// Anything else: a response to something else, noise.
    Ignored,
}

fn classify(flight: &InFlight<'_>, msg: Value) -> Incoming {
    let method = msg.get("method").and_then(Value::as_str);
    let Some(method) = method else {
        return match response_of(&msg, flight.upstream_id) {
            Some(done) => Incoming::Response(done),
            None => Incoming::Ignored,
        };
    };
    if msg.get("id").is_none() {
        return Incoming::Notification(msg);
    }
    if let Some(required) = undeclared_capability(flight.call, &msg) {
        return Incoming::Undeclared(msg, required);
    }
    if flight.call.method.allows_input() && super::mrtr::is_question(method) {
        return Incoming::Question(msg);
    }
    Incoming::Request(msg)
}

/// Refuses the call because the upstream needs a capability the request did
/// not declare: declines the pending questions and cancels the upstream call.
async fn refuse_undeclared(flight: &InFlight<'_>, questions: &[Value], required: Value) -> Done {
    for q in questions {
        respond_upstream(flight.session, flight.wire, q).await;
    }
    cancel(flight, "the client did not declare a capability this call needs");
    Done::Failed(Error::MissingCapability(required))
}

/// Reads the stream until the response, a round of questions, or the end.
pub async fn read_stream(flight: &InFlight<'_>, stream: &mut Streams, reply: &mut Reply) -> Done {
    let mut keepalive = tokio::time::interval_at(Instant::now() + flight.keepalive, flight.keepalive);
    loop {
        let msg = tokio::select! {
            msg = stream.next() => msg,
            _ = reply.closed() => return cancel(flight, "client closed the stream"),
            _ = keepalive.tick() => {
                if reply.keepalive().await.is_err() {
                    return cancel(flight, "client closed the stream");
                }
                continue;
            }
            _ = tokio::time::sleep_until(flight.deadline) => {
                cancel(flight, "gateway call timeout");
                return Done::Failed(Error::OutcomeUnknown);
            }
        };
        let msg = match msg {
            Ok(m) => m,
            Err(StreamEnd::TooLarge) => return Done::Failed(Error::UpstreamTooLarge),
            Err(StreamEnd::Invalid) => return Done::Failed(Error::UpstreamInvalid("bad SSE event")),
            Err(StreamEnd::Closed) => return Done::Failed(Error::OutcomeUnknown),
        };
        match classify(flight, msg) {
            Incoming::Response(done) => return done,
            Incoming::Question(q) => return gather_siblings(flight, stream, reply, q).await,
            Incoming::Undeclared(q, required) => return refuse_undeclared(flight, &[q], required).await,
            Incoming::Request(r) => answer_server_request(flight, &r).await,
            Incoming::Notification(n) => {
                if let Some(note) = forwardable(flight, n) {
                    if reply.event(&note).await.is_err() {
                        return cancel(flight, "client closed the stream");
                    }
                }
            }
            Incoming::Ignored => {}
        }
    }
}

/// Collects the questions the upstream asks together with `first`.
async fn gather_siblings(
    flight: &InFlight<'_>,
    stream: &mut Streams,
    reply: &mut Reply,
    first: Value,
) -> Done {
    let mut questions = vec![first];
    let cap = Instant::now() + SIBLING_WAIT;
    let mut until = (Instant::now() + SIBLING_GAP).min(cap);
    loop {
        let msg = tokio::select! {
            msg = stream.next() => msg,
            _ = tokio::time::sleep_until(until) => return Done::Input(questions),
        };
        until = (Instant::now() + SIBLING_GAP).min(cap);
        let msg = match msg {
            Ok(msg) => msg,
            // The call is gone with its stream: nothing to park, no answer to deliver.
            Err(StreamEnd::TooLarge) => return Done::Failed(Error::UpstreamTooLarge),
            Err(StreamEnd::Invalid) => return Done::Failed(Error::UpstreamInvalid("bad SSE event")),
            Err(StreamEnd::Closed) => return Done::Failed(Error::OutcomeUnknown),
        };
        match classify(flight, msg) {
            Incoming::Response(done) => return done,
            Incoming::Question(q) => questions.push(q),
            Incoming::Undeclared(q, required) => {
                questions.push(q);
                return refuse_undeclared(flight, &questions, required).await;
            }
            Incoming::Request(r) => answer_server_request(flight, &r).await,
            Incoming::Notification(n) => {
                if let Some(note) = forwardable(flight, n) {
                    let _ = reply.event(&note).await;
                }
            }
            Incoming::Ignored => {}
        }
    }
}

/// The client capability an upstream request needs, if this call's request
/// did not declare it (as a `ClientCapabilities` object for -32021).
fn undeclared_capability(call: &Call, msg: &Value) -> Option<Value> {
    let method = msg.get("method").and_then(Value::as_str)?;
    let (capability, mode) = match method {
        "elicitation/create" => {
            let mode = msg.pointer("/params/mode").and_then(Value::as_str).unwrap_or("form");
            ("elicitation", Some(mode))
        }
        "sampling/createMessage" => {
            // Tool-enabled sampling needs `sampling.tools`.
            let wants_tools = msg.pointer("/params/tools").is_some();
            let declared = call.meta.capabilities.get("sampling").filter(|v| v.is_object());
            return match declared {
                None if wants_tools => Some(json!({"sampling": {"tools": {}}})),
                None => Some(json!({"sampling": {}})),
                Some(d) if wants_tools && d.get("tools").is_none() => {
                    Some(json!({"sampling": {"tools": {}}}))
                }
                Some(_) => None,
            };
        }
        "roots/list" => ("roots", None),
        _ => return None,
    };
    let declared = call.meta.capabilities.get(capability).filter(|v| v.is_object());
    match (declared, mode) {
        (None, Some("url")) => Some(json!({capability: {"url": {}}})),
        (None, _) => Some(json!({capability: {}})),
        // `elicitation: {}` means form only; URL mode must be declared.
        (Some(decl), Some("url")) if decl.get("url").is_none() => Some(json!({capability: {"url": {}}})),
        _ => None,
    }
}

/// A notification the client asked for, rewritten for it; `None` otherwise.
fn forwardable(flight: &InFlight<'_>, mut msg: Value) -> Option<Value> {
    match msg.get("method").and_then(Value::as_str)? {
        "notifications/progress" => {
            let ours = flight.progress_token.as_ref()?;
            let params = msg.get_mut("params")?.as_object_mut()?;
            if params.get("progressToken") != Some(ours) {
                return None;
            }
            let client_token = flight.call.meta.progress_token.clone()?;
            params.insert("progressToken".into(), client_token);
            Some(msg)
        }
        "notifications/message" => {
            let wanted = flight.call.meta.log_level?;
            let level = msg.pointer("/params/level").and_then(Value::as_str).and_then(LogLevel::parse)?;
            (level >= wanted).then_some(msg)
        }
        _ => None,
    }
}

/// Answers a server-initiated request: `ping` is answered by the gateway;
/// questions for the user are declined on the client's behalf (elicitation
/// `cancel`, others an error) so the upstream is never left waiting.
async fn answer_server_request(flight: &InFlight<'_>, msg: &Value) {
    let method = respond_upstream(flight.session, flight.wire, msg).await;
    if method != "ping" {
        let label = match method {
            "elicitation/create" => "elicitation/create",
            "sampling/createMessage" => "sampling/createMessage",
            "roots/list" => "roots/list",
            _ => "other",
        };
        flight
            .metrics
            .upstream_requests_declined
            .get_or_create(&MethodLabels { route: flight.session.key.route.clone(), method: label.into() })
            .inc();
    }
}

/// Posts the gateway's answer to an upstream request; returns its method.
pub async fn respond_upstream<'m>(session: &Session, wire: &SessionWire, msg: &'m Value) -> &'m str {
    let method = msg.get("method").and_then(Value::as_str).unwrap_or("");
    let _ = channel::post(&*session.channel, wire, &super::mrtr::decline(msg)).await;
    method
}

/// A request the gateway itself sends on a session (not a client's call):
/// waits for its result, answering anything the upstream asks meanwhile.
pub async fn simple_request(
    session: &Session,
    method: &str,
    params: Value,
    timeout: Duration,
) -> Result<Map<String, Value>, Error> {
    let id = session.mint_id();
    let request = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    let exchange = async {
        let sent = channel::post(&*session.channel, &session.wire, &request)
            .await
            .map_err(|e| super::map_send_error(e, true))?;
        let done = match sent.answer {
            Answer::Json(msg) => Some(json_answer(msg, id).unwrap_or_else(|| foreign(&*session.channel))),
            Answer::Result { id: got, result } if got == id => {
                json_answer(channel::result_message(got, &result), id)
            }
            Answer::Result { .. } => Some(foreign(&*session.channel)),
            Answer::Accepted => None,
            Answer::Stream(mut stream) => loop {
                let msg = stream.next().await.map_err(|_| Error::OutcomeUnknown)?;
                if msg.get("method").is_some() {
                    if msg.get("id").is_some() {
                        respond_upstream(session, &session.wire, &msg).await;
                    }
                    continue;
                }
                if let Some(done) = response_of(&msg, id) {
                    break Some(done);
                }
            },
        };
        match done {
            Some(Done::Result(r)) => Ok(r),
            Some(Done::Failed(e)) => Err(e),
            _ => Err(Error::UpstreamInvalid("no response")),
        }
    };
    tokio::time::timeout(timeout, exchange).await.unwrap_or(Err(Error::UpstreamTimeout))
}

/// Tells the upstream to stop working on the request (a legacy disconnect is not a cancel).
/// Sent in the background: a slow or dead upstream must not delay the client's answer.
pub fn cancel(flight: &InFlight<'_>, reason: &str) -> Done {
    let note = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": flight.upstream_id, "reason": reason}});
    let (link, wire) = (flight.session.channel.clone(), flight.wire.clone());
    tokio::spawn(crate::observe::with_hop(async move {
        let _ = channel::post(&*link, &wire, &note).await;
    }));
    flight.metrics.upstream_cancellations.get_or_create(&Metrics::route(&flight.session.key.route)).inc();
    Done::Cancelled
}
