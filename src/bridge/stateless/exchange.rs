//! A 2026 upstream as an upstream half ([`UpstreamHalf`]): a typed call
//! written as a self-contained 2026-07-28 request (`_meta` from the call;
//! `Mcp-Method`, `Mcp-Name` and the tool's `Mcp-Param-*` headers), on any
//! instance; the answer read whole into an [`Outcome`], notifications on the
//! way passed to the client half. An `input_required` result's
//! `requestState` is sealed in the same [`envelope`] a 2026 client gets
//! (bound to principal, route, method, name and the instance that asked),
//! so the retry goes back to that instance with the upstream's own state.

use std::collections::HashMap;
use std::sync::Arc;

use futures_util::StreamExt;
use serde_json::{json, Map, Value};

use super::envelope::{self, Expect, Rejected};
use super::Bridge;
use crate::bridge::half::{Failure, Outcome, UpstreamHalf};
use crate::bridge::relay::{Answering, Relay, Rewrite};
use crate::bridge::tool_headers::{self, Annotations};
use crate::bridge::{Caller, Target};
use crate::error::Error;
use crate::front::headers::{encode_value, param_value};
use crate::front::{Call, Method, MODERN_VERSION};
use crate::reply::{Body, Reply};
use crate::upstream::answers::{foreign_message, mint_id};
use crate::upstream::credentials::without_client_token;
use crate::upstream::{SendError, Transport, ACCEPT_BOTH};
use http::Response;

/// The tool annotations are one per route: the upstream never learns who
/// calls (no client credentials go with a typed call's tool list), so its
/// tool list is the same for all.
const ANY_CALLER: &str = "";

impl UpstreamHalf for Bridge {
    async fn call(&self, target: &Target, call: Call, caller: &Caller, notes: &mut Reply) -> Outcome {
        self.exchange(target, call, caller, notes).await.unwrap_or_else(|ended| ended)
    }

    async fn listen(
        &self,
        target: &Target,
        call: Call,
        _caller: &Caller,
        rewrite: Rewrite,
        hold: Box<dyn std::any::Any + Send + Sync>,
    ) -> Result<Response<Body>, Error> {
        self.listen_stream(target, call, rewrite, hold).await
    }
}

impl Bridge {
    async fn exchange<'t>(
        &self,
        target: &'t Target,
        call: Call,
        caller: &Caller,
        notes: &mut Reply,
    ) -> Result<Outcome, Outcome> {
        let Call { method, mut params, meta, name, .. } = call;
        let expect = |now| Expect {
            principal: &caller.principal,
            route: &target.route.id,
            method: method.as_str(),
            name: name.as_deref(),
            now,
        };
        // A retry goes back to the instance that asked, with its own state.
        let pinned = match params.remove("requestState") {
            None => None,
            Some(Value::String(blob)) => {
                let opened = envelope::open(&self.services.sealer, &blob, &expect(crate::seal::unix_now()))
                    .map_err(|why| self.rejected(target, why))?;
                let instance = target
                    .instance(&opened.instance)
                    .ok_or_else(|| self.rejected(target, Rejected::InstanceGone))?;
                params.insert("requestState".into(), Value::String(opened.state));
                Some(instance)
            }
            Some(_) => return Err(self.rejected(target, Rejected::Malformed).into()),
        };
        let param_headers = match (method, &name) {
            (Method::ToolsCall, Some(tool)) => self.param_headers(target, tool, &params).await,
            _ => Vec::new(),
        };
        let mut meta = meta.into_object();
        crate::observe::traceparent::into_meta(&mut meta);
        params.insert("_meta".into(), Value::Object(meta));
        let encoded = name.as_deref().map(encode_value);
        let headers = call_headers(method.as_str(), encoded.as_deref(), &param_headers);
        // The upstream sees an id of the gateway's own (random): the
        // client's may be predictable, and a connection is shared by callers.
        let sent = json!(mint_id());
        let body = json!({"jsonrpc": "2.0", "id": sent, "method": method.as_str(), "params": params});
        let body = serde_json::to_vec(&body).expect("serialises");
        let (headers, body) = (&headers, &body);
        let send = |t: &'t Transport| t.send_headers_again("POST", headers, body);
        let (resp, upstream) = match pinned {
            Some(upstream) => (send(upstream).await, upstream),
            None => target.on_instance(send, |e| *e == SendError::NotSent).await,
        };
        let resp = match resp {
            Err(SendError::NotSent) if pinned.is_some() => {
                return Err(self.rejected(target, Rejected::InstanceGone).into())
            }
            other => other.map_err(|e| Outcome::from(crate::upstream::map_send_error(e, true)))?,
        };
        let deadline = tokio::time::Instant::now() + target.route.upstream.call_timeout;
        let mut msg = read_message(upstream, resp, &sent, Some(notes), deadline).await?;
        if let Some(error) = msg.get_mut("error") {
            return Ok(Outcome::Failed(Failure::Upstream(error.take())));
        }
        let Some(Value::Object(mut result)) = msg.get_mut("result").map(Value::take) else {
            return Err(Error::UpstreamInvalid("no result").into());
        };
        if let Some(Value::String(state)) = result.get("requestState") {
            let now = crate::seal::unix_now();
            let sealed = envelope::seal(&self.services.sealer, &expect(now), upstream.instance(), state)
                .map_err(|_| Outcome::from(Error::UpstreamInvalid("requestState too large to seal")))?;
            result.insert("requestState".into(), Value::String(sealed));
        }
        if method == Method::ToolsList && !result.contains_key("nextCursor") && !params.contains_key("cursor")
        {
            let mut map = HashMap::new();
            if let Some(Value::Array(tools)) = result.get("tools") {
                tool_headers::annotations(tools, &mut map);
            }
            self.tool_headers.remember(&target.route.id, ANY_CALLER, Arc::new(map));
        }
        if let Some(view) = &caller.access {
            view.filter(method.as_str(), &mut result);
        }
        Ok(Outcome::of_result(result))
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

    /// A `subscriptions/listen` stream of the upstream's, on any instance.
    async fn listen_stream<'t>(
        &self,
        target: &'t Target,
        call: Call,
        rewrite: Rewrite,
        hold: Box<dyn std::any::Any + Send + Sync>,
    ) -> Result<Response<Body>, Error> {
        let Call { id, mut params, meta, .. } = call;
        params.insert("_meta".into(), Value::Object(meta.into_object()));
        let body = json!({"jsonrpc": "2.0", "id": id, "method": "subscriptions/listen", "params": params});
        let body = serde_json::to_vec(&body).expect("serialises");
        let headers = call_headers("subscriptions/listen", None, &[]);
        let (headers, body) = (&headers, &body);
        let send = |t: &'t Transport| t.send_headers_again("POST", headers, body);
        let (resp, upstream) = target.on_instance(send, |e| *e == SendError::NotSent).await;
        let resp = resp.map_err(|e| crate::upstream::map_send_error(e, false))?;
        if !(resp.is_sse() && (200..300).contains(&resp.status)) {
            let _ = upstream.read_body(resp.body).await;
            return Err(Error::UpstreamInvalid("subscriptions/listen did not stream"));
        }
        let (keepalive, stop) = (self.services.keepalive, self.services.draining.clone());
        let mut relay = Relay::new(resp.body, upstream.max_response(), keepalive, stop, hold);
        relay.rewrite = Some(rewrite);
        relay.answering = Some(Answering { ids: vec![id], upstream: upstream.clone() });
        Ok(relay.response(None))
    }
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
/// from SSE (notifications on the way are relayed to `notes`).
async fn read_message(
    upstream: &Transport,
    resp: crate::upstream::h1::Response,
    sent: &Value,
    mut notes: Option<&mut Reply>,
    deadline: tokio::time::Instant,
) -> Result<Value, Outcome> {
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
            let event = match &mut notes {
                Some(notes) if notes.is_streaming() => tokio::select! {
                    event = next => event,
                    _ = notes.closed() => return Err(Outcome::Gone),
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
                if let Some(notes) = notes.as_deref_mut() {
                    notes.event(&msg).await.map_err(|_| Outcome::Gone)?;
                }
            }
        }
    }
    let json = resp.is_json();
    let read = tokio::time::timeout_at(deadline, upstream.read_body(resp.body));
    let read = match notes {
        Some(notes) if notes.is_streaming() => tokio::select! {
            read = read => read,
            _ = notes.closed() => return Err(Outcome::Gone),
        },
        _ => read.await,
    };
    let body = match read {
        Err(_) => return Err(Error::UpstreamTimeout.into()),
        Ok(r) => r.map_err(|e| Outcome::from(crate::upstream::map_send_error(e, true)))?,
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
fn answer_to(upstream: &Transport, sent: &Value, msg: Value) -> Result<Value, Outcome> {
    if foreign_message(&msg, std::slice::from_ref(sent)) {
        upstream.distrust();
        return Err(Error::UpstreamInvalid("an answer to another request").into());
    }
    Ok(msg)
}
