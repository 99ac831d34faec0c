//! The 2026 upstream half (DESIGN §9, §10): a 2026 client's call passed
//! through (below), or a typed call of another client half written as a
//! 2026 request ([`exchange`]).
//!
//! After the front door's checks the client's body goes upstream as it was
//! received, with the MCP headers mirrored (never credentials, never a
//! session id), and the answer streams back as it comes: JSON, or SSE event
//! by event. One thing is changed on the way: an upstream `requestState`
//! travels to the client inside the gateway's sealed [`envelope`], and the
//! retry's envelope is opened (bound to principal, route, method, name and
//! instance) and the upstream's state put back byte for byte. No upstream
//! session, nothing parked: any replica serves any request. A client that
//! leaves drops the upstream request, which a 2026 server takes as
//! cancellation.

mod envelope;
mod exchange;

use std::any::Any;
use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use serde_json::Value;

use super::relay::{self, Answering, Relay};
use super::{Caller, Services, Target};
use crate::error::{error_body, Error};
use crate::front::{Call, SUPPORTED_VERSIONS};
use crate::reply::{self, Body};
use crate::seal::Sealer;
use crate::upstream::answers::{judge, Verdict};
use crate::upstream::{h1, SendError, Transport, ACCEPT_BOTH};
use envelope::{Expect, Rejected};

pub struct Bridge {
    services: Arc<Services>,
    /// The tools' `x-mcp-header` annotations, for the typed calls of
    /// translated clients ([`exchange`]): a 2026 client writes its own headers.
    tool_headers: super::tool_headers::Cache,
}

/// What an upstream `requestState` is sealed with: the call's bindings and
/// the instance that answered.
struct Binding {
    sealer: Arc<Sealer>,
    principal: String,
    route: String,
    method: &'static str,
    name: Option<String>,
    instance: String,
    /// The caller's view of the route's rules: list results are filtered.
    access: Option<Arc<crate::authz::View>>,
}

impl Binding {
    fn expect(&self) -> Expect<'_> {
        Expect {
            principal: &self.principal,
            route: &self.route,
            method: self.method,
            name: self.name.as_deref(),
            now: crate::seal::unix_now(),
        }
    }

    /// The message with its `result.requestState` sealed: `Ok(None)` when it
    /// carries none (kept byte for byte), `Err` when it is not a JSON-RPC
    /// message the gateway can read (never passed on: a state it could not
    /// see would reach the client unsealed).
    /// A message as the client gets it: a list's denied items removed
    /// ([`crate::authz`]), then its `requestState` sealed.
    fn rewrite(&self, text: &str) -> Result<Option<String>, ()> {
        let filtered = match &self.access {
            Some(view) => view.filter_message(self.method, text)?,
            None => None,
        };
        match self.seal_in(filtered.as_deref().unwrap_or(text))? {
            Some(sealed) => Ok(Some(sealed)),
            None => Ok(filtered),
        }
    }

    fn seal_in(&self, text: &str) -> Result<Option<String>, ()> {
        let Some((span, state)) = state_span(text, Holder::Result)? else {
            return Ok(None);
        };
        // An envelope too large to seal is not passed on (nor is the state bare).
        let sealed = envelope::seal(&self.sealer, &self.expect(), &self.instance, &state).map_err(drop)?;
        Ok(Some(splice(text, span, &sealed)))
    }
}

/// Which member holds the `requestState`.
#[derive(Clone, Copy)]
enum Holder {
    Params,
    Result,
}

/// Where the `requestState` string of a message's params or result sits
/// (its byte range in `text`) and what it says. One typed pass over the
/// message, no tree: it also checks the whole message is JSON (an escaped
/// member name is still found; a repeated one is refused).
#[allow(clippy::type_complexity)]
fn state_span(text: &str, holder: Holder) -> Result<Option<(std::ops::Range<usize>, String)>, ()> {
    #[derive(serde::Deserialize)]
    struct Msg<'a> {
        #[serde(borrow)]
        params: Option<Members<'a>>,
        #[serde(borrow)]
        result: Option<Members<'a>>,
    }
    #[derive(serde::Deserialize)]
    struct Members<'a> {
        #[serde(rename = "requestState", borrow)]
        state: Option<&'a serde_json::value::RawValue>,
    }
    let msg: Msg<'_> = serde_json::from_str(text).map_err(|_| ())?;
    let members = match holder {
        Holder::Params => msg.params,
        Holder::Result => msg.result,
    };
    let Some(raw) = members.and_then(|m| m.state) else {
        return Ok(None);
    };
    let state: String = serde_json::from_str(raw.get()).map_err(|_| ())?;
    let start = raw.get().as_ptr() as usize - text.as_ptr() as usize;
    Ok(Some((start..start + raw.get().len(), state)))
}

/// `text` with the bytes of `span` replaced by `value` as a JSON string.
fn splice(text: &str, span: std::ops::Range<usize>, value: &str) -> String {
    let quoted = Value::String(value.to_string()).to_string();
    let mut out = String::with_capacity(text.len() + quoted.len());
    out.push_str(&text[..span.start]);
    out.push_str(&quoted);
    out.push_str(&text[span.end..]);
    out
}

impl Bridge {
    pub fn new(services: Arc<Services>) -> Bridge {
        Bridge { services, tool_headers: super::tool_headers::Cache::default() }
    }

    /// Passes `call` (whose body is the caller's, as received) to the
    /// upstream; the answer, and the outcome label for metrics. `hold` lives
    /// as long as the answer.
    pub async fn serve(
        &self,
        target: &Target,
        call: &Call,
        caller: Caller,
        hold: Box<dyn Any + Send + Sync>,
    ) -> (Response<Body>, &'static str) {
        let Caller { principal, headers, body, access, .. } = caller;
        let binding = Binding {
            sealer: self.services.sealer.clone(),
            principal,
            route: target.route.id.clone(),
            method: call.method.as_str(),
            name: call.name.clone(),
            instance: String::new(),
            access,
        };
        match self.pass(target, call, &headers, body, binding, hold).await {
            Ok(resp) => (resp, "forwarded"),
            Err(e) => {
                target.observed(matches!(e, Error::UpstreamUnreachable));
                let resp =
                    reply::json_response(e.status(), &error_body(Some(&call.id), &e, SUPPORTED_VERSIONS));
                (resp, e.reason())
            }
        }
    }

    async fn pass<'t>(
        &self,
        target: &'t Target,
        call: &Call,
        headers: &http::HeaderMap,
        body: Bytes,
        mut binding: Binding,
        hold: Box<dyn Any + Send + Sync>,
    ) -> Result<Response<Body>, Error> {
        // A retry goes back to the instance that issued its state; a new
        // call to the next instance that is up.
        let (body, pinned) = match call.params.get("requestState") {
            None => (body, None),
            Some(Value::String(blob)) => {
                let opened = envelope::open(&self.services.sealer, blob, &binding.expect())
                    .map_err(|why| self.rejected(target, why))?;
                let instance = target
                    .instance(&opened.instance)
                    .ok_or_else(|| self.rejected(target, Rejected::InstanceGone))?;
                (with_state(&body, &opened.state)?, Some(instance))
            }
            Some(_) => return Err(self.rejected(target, Rejected::Malformed)),
        };
        // The gateway's hop in place of the client's `_meta.traceparent`.
        let client_trace = call.meta.passthrough.get("traceparent").and_then(Value::as_str);
        let body = match (client_trace, crate::observe::hop()) {
            (Some(client), Some(hop)) if crate::observe::traceparent::parse(client).is_some() => {
                crate::observe::traceparent::swap_in_body(&body, client, &hop).unwrap_or(body)
            }
            _ => body,
        };
        let mut out: Vec<(&str, &str)> = headers
            .iter()
            .filter(|(k, _)| crate::front::headers::is_mcp(k))
            .filter_map(|(k, v)| Some((k.as_str(), v.to_str().ok()?)))
            .collect();
        if !headers.contains_key(header::ACCEPT) {
            out.push(("accept", ACCEPT_BOTH));
        }
        // A listen stream is long-lived: it takes a stream place (global and
        // per principal) and has no deadline; it ends when this replica drains.
        let listen = call.method == crate::front::Method::SubscriptionsListen;
        let place = match listen {
            true => Some(self.services.stream_place(&target.route.id, &binding.principal)?),
            false => None,
        };
        // Not sent: safe to send once more (to the next instance if this
        // one could not be reached and the call is not pinned to it).
        let (out, body) = (&out, &body);
        let send = |upstream: &'t Transport| upstream.send_headers_again("POST", out, body);
        let (resp, upstream) = match pinned {
            Some(upstream) => (send(upstream).await, upstream),
            None => target.on_instance(send, |e| *e == SendError::NotSent).await,
        };
        let resp = match resp {
            Err(SendError::NotSent) if pinned.is_some() => {
                return Err(self.rejected(target, Rejected::InstanceGone))
            }
            other => other.map_err(|e| crate::upstream::map_send_error(e, true))?,
        };
        binding.instance = upstream.instance().to_string();
        let sse = resp.is_sse();
        if sse && (200..300).contains(&resp.status) {
            let stop = if listen { &self.services.draining } else { &self.services.shutdown };
            let mut relay = Relay::new(
                resp.body,
                upstream.max_response(),
                self.services.keepalive,
                stop.clone(),
                Box::new((hold, place)),
            );
            if !listen {
                relay.deadline = Some(tokio::time::Instant::now() + target.route.upstream.call_timeout);
            }
            relay.id = Some(call.id.clone());
            relay.answering = Some(Answering { ids: vec![call.id.clone()], upstream: upstream.clone() });
            relay.rewrite = Some(Box::new(move |data: &str| binding.rewrite(data)));
            return Ok(relay.response(None));
        }
        self.json_answer(upstream, resp, &call.id, &binding).await
    }

    /// A JSON answer: passed as it is when it is a JSON-RPC message (any
    /// status), its `requestState` sealed; anything else is a gateway error.
    async fn json_answer(
        &self,
        upstream: &Transport,
        resp: h1::Response,
        sent: &Value,
        binding: &Binding,
    ) -> Result<Response<Body>, Error> {
        let status = StatusCode::from_u16(resp.status).unwrap_or(StatusCode::BAD_GATEWAY);
        let json = resp.is_json();
        let retry_after = resp.header("retry-after").and_then(|v| HeaderValue::from_str(v).ok());
        // The upstream's own authentication is not the client's business:
        // its challenge would send the client to authorize at the gateway.
        if matches!(resp.status, 202 | 401 | 403 | 407) {
            return Err(Error::UpstreamInvalid("unexpected status"));
        }
        let body =
            upstream.read_body(resp.body).await.map_err(|e| crate::upstream::map_send_error(e, true))?;
        let invalid =
            || Error::UpstreamInvalid(if status.is_success() { "content type" } else { "error status" });
        let text = std::str::from_utf8(&body).map_err(|_| invalid())?;
        match if json { judge(&body, std::slice::from_ref(sent)) } else { Verdict::NotJson } {
            Verdict::Fine => {}
            Verdict::NotJson => return Err(invalid()),
            Verdict::Foreign => {
                upstream.distrust();
                return Err(Error::UpstreamInvalid("an answer to another request"));
            }
        }
        let body = match binding.rewrite(text).map_err(|()| invalid())? {
            Some(sealed) => Bytes::from(sealed),
            None => body,
        };
        let mut out = relay::answer(status, body, false, None);
        if let Some(retry_after) = retry_after {
            out.headers_mut().insert(header::RETRY_AFTER, retry_after);
        }
        Ok(out)
    }

    fn rejected(&self, target: &Target, why: Rejected) -> Error {
        why.refuse(crate::sealed::Purpose::UpstreamState, &target.route.id, &self.services.metrics)
    }
}

/// The retry's body with the upstream's own `requestState` put back in the
/// place of the envelope; every other byte as the client sent it.
fn with_state(body: &[u8], state: &str) -> Result<Bytes, Error> {
    let text = std::str::from_utf8(body).map_err(|_| Error::Parse)?;
    match state_span(text, Holder::Params) {
        Ok(Some((span, _))) => Ok(Bytes::from(splice(text, span, state))),
        _ => Err(Error::InvalidRequest("the requestState could not be read".into())),
    }
}
