//! A 2026 upstream as an upstream half ([`UpstreamHalf`]): a typed call
//! written as a self-contained 2026-07-28 request (`_meta` from the call;
//! its method, name and the tool's `Mcp-Param-*` values beside it), sent on
//! any instance's [`Channel`]; the answer read whole into an [`Outcome`],
//! notifications on the way passed to the client half. An `input_required` result's
//! `requestState` is sealed in the same [`envelope`] a 2026 client gets
//! (bound to principal, route, method, name and the instance that asked),
//! so the retry goes back to that instance with the upstream's own state.

use std::collections::HashMap;
use std::sync::Arc;

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
use crate::upstream::channel::{self, Answer, Channel, SendError, Sent, Stateless, StreamEnd};
use crate::upstream::credentials::without_client_token;
use crate::upstream::transport::stateless_headers;
use crate::upstream::Transport;
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
        let client_headers = call.client_headers;
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
                    .channel(&opened.instance)
                    .ok_or_else(|| self.rejected(target, Rejected::InstanceGone))?;
                params.insert("requestState".into(), Value::String(opened.state));
                Some(instance)
            }
            Some(_) => return Err(self.rejected(target, Rejected::Malformed).into()),
        };
        let param_headers = match (method, &name) {
            (Method::ToolsCall, Some(tool)) => {
                // A 2026 client's own Mcp-Param-* headers are checked first.
                let client = client_headers.then_some(&caller.headers);
                self.param_headers(target, tool, &params, client).await.map_err(Outcome::from)?
            }
            _ => Vec::new(),
        };
        let mut meta = meta.into_object();
        crate::observe::traceparent::into_meta(&mut meta);
        params.insert("_meta".into(), Value::Object(meta));
        let encoded = name.as_deref().map(encode_value);
        // The upstream sees an id of the gateway's own (random): the
        // client's may be predictable, and a connection is shared by callers.
        let sent = json!(mint_id());
        let body = json!({"jsonrpc": "2.0", "id": sent, "method": method.as_str(), "params": params});
        let body = serde_json::to_vec(&body).expect("serialises");
        let request = Stateless {
            method: method.as_str(),
            name: encoded.as_deref(),
            params: &param_headers,
            body: &body,
        };
        let request = &request;
        let send = |t: &'t dyn Channel| async move {
            channel::once_more(t.health(), || t.send_stateless(request)).await
        };
        let (answer, upstream) = match pinned {
            Some(upstream) => (send(upstream).await, upstream),
            None => target.on_channel(send, |e| *e == SendError::NotSent).await,
        };
        let answer = match answer {
            Err(SendError::NotSent) if pinned.is_some() => {
                return Err(self.rejected(target, Rejected::InstanceGone).into())
            }
            other => other.map_err(|e| Outcome::from(crate::upstream::map_send_error(e, true)))?,
        };
        let deadline = tokio::time::Instant::now() + target.route.upstream.call_timeout;
        let mut msg = read_message(upstream, answer, &sent, Some(notes), deadline).await?;
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
    /// `x-mcp-header` annotations (learnt from the upstream's tool list);
    /// the `client`'s own, when it sent some, checked against them first.
    async fn param_headers(
        &self,
        target: &Target,
        tool: &str,
        params: &Map<String, Value>,
        client: Option<&http::HeaderMap>,
    ) -> Result<Vec<(String, String)>, Error> {
        let route = &target.route.id;
        let tools = match self.tool_headers.cached(route, ANY_CALLER) {
            Some(tools) => tools,
            None => match self.list_tools(target).await {
                Some(tools) => {
                    self.tool_headers.remember(route, ANY_CALLER, tools.clone());
                    tools
                }
                None => return Ok(Vec::new()),
            },
        };
        let Some(annotated) = tools.get(tool) else {
            return Ok(Vec::new());
        };
        let arguments = params.get("arguments");
        if let Some(headers) = client {
            crate::front::headers::check_param_headers(headers, annotated, arguments)?;
        }
        Ok(annotated
            .iter()
            .filter_map(|(header, prop)| {
                let value = param_value(arguments?.get(prop)?)?;
                Some((format!("mcp-param-{header}"), value.into_owned()))
            })
            .collect())
    }

    /// The upstream's whole tool list, as annotations; `None` if it could
    /// not be read.
    async fn list_tools(&self, target: &Target) -> Option<Annotations> {
        let deadline = tokio::time::Instant::now() + target.route.upstream.response_timeout;
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
            let request = Stateless { method: "tools/list", name: None, params: &[], body: &body };
            let upstream: &dyn Channel = match target.stdio() {
                Some(stdio) => stdio,
                None => target.pick(),
            };
            let send = || upstream.send_stateless(&request);
            let answer = without_client_token(channel::once_more(upstream.health(), send)).await.ok()?;
            let msg = read_message(upstream, answer, &sent, None, deadline).await.ok()?;
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
        // A process's notifications name no request: no stream is carried
        // over stdio (a legacy client's GET gets what a server without one says).
        if target.stdio().is_some() {
            return Err(Error::MethodNotAllowed);
        }
        let Call { id, mut params, meta, .. } = call;
        params.insert("_meta".into(), Value::Object(meta.into_object()));
        let body = json!({"jsonrpc": "2.0", "id": id, "method": "subscriptions/listen", "params": params});
        let body = serde_json::to_vec(&body).expect("serialises");
        let request = Stateless { method: "subscriptions/listen", name: None, params: &[], body: &body };
        let headers = stateless_headers(&request);
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

/// Reads the upstream's answer to a call: its JSON-RPC message, whole or
/// from a stream (notifications on the way are relayed to `notes`).
async fn read_message(
    upstream: &dyn Channel,
    answer: Sent,
    sent: &Value,
    mut notes: Option<&mut Reply>,
    deadline: tokio::time::Instant,
) -> Result<Value, Outcome> {
    let mut stream = match answer.answer {
        Answer::Accepted => return Err(Error::UpstreamInvalid("unexpected status").into()),
        Answer::Result { id, result } => {
            return answer_to(upstream, sent, channel::result_message(id, &result));
        }
        Answer::Json(msg) if msg.get("result").is_none() && msg.get("error").is_none() => {
            return Err(Error::UpstreamInvalid("not a JSON-RPC answer").into());
        }
        Answer::Json(msg) => return answer_to(upstream, sent, msg),
        Answer::Stream(stream) => stream,
    };
    loop {
        // A client that leaves ends the upstream request (a 2026 server
        // takes the closed stream as cancellation).
        let next = tokio::time::timeout_at(deadline, stream.next());
        let msg = match &mut notes {
            Some(notes) if notes.is_streaming() => tokio::select! {
                msg = next => msg,
                _ = notes.closed() => return Err(Outcome::Gone),
            },
            _ => next.await,
        };
        let msg = match msg {
            Err(_) => return Err(Error::UpstreamTimeout.into()),
            Ok(Err(StreamEnd::Closed)) => return Err(Error::OutcomeUnknown.into()),
            Ok(Err(StreamEnd::TooLarge)) => return Err(Error::UpstreamTooLarge.into()),
            Ok(Err(StreamEnd::Invalid)) => return Err(Error::UpstreamInvalid("invalid event stream").into()),
            Ok(Ok(msg)) => msg,
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

/// `msg`, a response, if it answers the request `sent`; never delivered
/// otherwise, and the upstream's idle connections are dropped.
fn answer_to(upstream: &dyn Channel, sent: &Value, msg: Value) -> Result<Value, Outcome> {
    if foreign_message(&msg, std::slice::from_ref(sent)) {
        upstream.distrust();
        return Err(Error::UpstreamInvalid("an answer to another request").into());
    }
    Ok(msg)
}
