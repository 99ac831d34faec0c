//! `subscriptions/listen`: an upstream session of its own, its standalone GET
//! stream, and `resources/subscribe` for the URIs the filter names. Only the
//! notification types the client asked for (and the upstream supports) are
//! passed on, each tagged with the subscription id.

use std::sync::Arc;

use http::StatusCode;
use serde_json::{json, Map, Value};
use tokio::time::Instant;

use super::call::{respond_upstream, simple_request};
use super::session::Session;
use super::{Bridge, Caller, Target};
use crate::bridge::relay::Rewrite;
use crate::config::Route;
use crate::error::error_body;
use crate::error::Error;
use crate::front::Call;
use crate::front::{tag_subscription, SUBSCRIPTION_ID, SUPPORTED_VERSIONS};
use crate::metrics::Metrics;
use crate::reply::{Body, Reply};
use crate::upstream::channel::Messages;
use http::Response;

const MAX_SUBSCRIBED_URIS: usize = 256;

/// What the client asked for, cut down to what the upstream can deliver.
#[derive(Debug, Default, Clone)]
struct Filter {
    tools: bool,
    prompts: bool,
    resources: bool,
    uris: Vec<String>,
}

impl Filter {
    fn parse(params: &Map<String, Value>) -> Result<Filter, Error> {
        let Some(Value::Object(n)) = params.get("notifications") else {
            return Err(Error::invalid_params("subscriptions/listen needs a notifications filter"));
        };
        let flag = |k: &str| n.get(k).and_then(Value::as_bool).unwrap_or(false);
        let uris = match n.get("resourceSubscriptions") {
            None => Vec::new(),
            Some(Value::Array(a)) if a.len() <= MAX_SUBSCRIBED_URIS => a
                .iter()
                .map(|u| u.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| Error::invalid_params("resourceSubscriptions must be strings"))?,
            Some(_) => {
                return Err(Error::invalid_params("resourceSubscriptions must be a bounded list of URIs"))
            }
        };
        Ok(Filter {
            tools: flag("toolsListChanged"),
            prompts: flag("promptsListChanged"),
            resources: flag("resourcesListChanged"),
            uris,
        })
    }

    /// Keeps what the upstream's capabilities support.
    fn honoured(mut self, init: &Value) -> Filter {
        let cap = |path: &str| init.pointer(path).and_then(Value::as_bool).unwrap_or(false);
        self.tools &= cap("/capabilities/tools/listChanged");
        self.prompts &= cap("/capabilities/prompts/listChanged");
        self.resources &= cap("/capabilities/resources/listChanged");
        if !cap("/capabilities/resources/subscribe") {
            self.uris.clear();
        }
        self
    }

    fn to_json(&self) -> Value {
        let mut out = Map::new();
        for (k, on) in [
            ("toolsListChanged", self.tools),
            ("promptsListChanged", self.prompts),
            ("resourcesListChanged", self.resources),
        ] {
            if on {
                out.insert(k.into(), json!(true));
            }
        }
        if !self.uris.is_empty() {
            out.insert("resourceSubscriptions".into(), json!(self.uris));
        }
        Value::Object(out)
    }

    fn wants(&self, msg: &Value) -> bool {
        match msg.get("method").and_then(Value::as_str) {
            Some("notifications/tools/list_changed") => self.tools,
            Some("notifications/prompts/list_changed") => self.prompts,
            Some("notifications/resources/list_changed") => self.resources,
            Some("notifications/resources/updated") => msg
                .pointer("/params/uri")
                .and_then(Value::as_str)
                .is_some_and(|u| self.uris.iter().any(|x| x == u)),
            _ => false,
        }
    }
}

fn tagged(mut msg: Value, id: &Value) -> Value {
    if let Some(obj) = msg.as_object_mut() {
        obj.remove("id");
    }
    tag_subscription(&mut msg, id);
    msg
}

/// Subscribes upstream, on `session`, to each of `uris`; a refusal is logged.
async fn subscribe_uris(session: &Session, uris: &[String], timeout: std::time::Duration) {
    for uri in uris {
        if let Err(e) = simple_request(session, "resources/subscribe", json!({"uri": uri}), timeout).await {
            crate::log_limited!(tracing::Level::WARN, error = %e, "resources/subscribe failed upstream");
        }
    }
}

impl Bridge {
    /// Serves a `subscriptions/listen` call until the client, the upstream
    /// or shutdown ends it. A listen stream may last hours, so what it holds
    /// while it waits is kept small: of the call only its id, of the caller
    /// nothing (its headers keep the request's read buffer alive), and every
    /// step but the wait boxed (their futures would otherwise size the
    /// wait's). The call and the caller come boxed for the same reason: an
    /// async fn keeps room for its arguments as long as it runs.
    pub async fn listen(
        &self,
        target: &Target,
        call: Box<Call>,
        caller: Box<Caller>,
        mut reply: Reply,
    ) -> &'static str {
        let route = &*target.route;
        let filter = match Filter::parse(&call.params) {
            Ok(f) => f,
            Err(e) => return fail(target, reply, &call.id, e).await,
        };
        let _place = match self.services.stream_place(&route.id, &caller.principal) {
            Ok(place) => place,
            Err(e) => return fail(target, reply, &call.id, e).await,
        };
        let session = match Box::pin(self.session_of_its_own(target, &call, &caller)).await {
            Ok(s) => s,
            Err(e) => return fail(target, reply, &call.id, e).await,
        };
        let id = only_id(call);
        drop(caller);
        let gauge =
            self.services.metrics.listen_streams_open.get_or_create(&Metrics::route(&route.id)).clone();
        gauge.inc();
        let ended = match Box::pin(self.subscribe(route, &id, &session, filter, &mut reply)).await {
            Some((filter, stream)) => self.run_listen(&id, &session, &filter, stream, &mut reply).await,
            None => Ended::Cancelled,
        };
        gauge.dec();
        Box::pin(self.pool.close(&session, "exclusive")).await;
        if ended == Ended::Complete {
            let end = json!({"jsonrpc": "2.0", "id": id,
                "result": {"resultType": "complete", "_meta": {SUBSCRIPTION_ID: id}}});
            reply.finish(StatusCode::OK, &end).await;
        }
        ended.outcome()
    }

    /// Subscribes upstream to the filter's URIs, opens the session's GET
    /// stream (if the upstream has one) and acknowledges the filter to the
    /// client; `None` when the client has gone.
    async fn subscribe(
        &self,
        route: &Route,
        id: &Value,
        session: &Session,
        filter: Filter,
        reply: &mut Reply,
    ) -> Option<(Filter, Option<Box<dyn Messages>>)> {
        let filter = filter.honoured(&session.init);
        subscribe_uris(session, &filter.uris, route.upstream.response_timeout).await;
        let stream = match session.channel.messages(&session.wire, None).await {
            Ok(s) => Some(s),
            Err(e) => {
                crate::log_limited!(
                    tracing::Level::INFO,
                    outcome = e.as_str(),
                    "upstream has no standalone GET stream; listen carries keep-alives only"
                );
                None
            }
        };
        let ack = json!({"jsonrpc": "2.0", "method": "notifications/subscriptions/acknowledged",
            "params": {"notifications": filter.to_json(), "_meta": {SUBSCRIPTION_ID: id}}});
        reply.event(&ack).await.ok()?;
        Some((filter, stream))
    }

    /// The wait: the upstream's notifications the filter wants, tagged,
    /// and keep-alives, until one side ends.
    async fn run_listen(
        &self,
        id: &Value,
        session: &Session,
        filter: &Filter,
        mut stream: Option<Box<dyn Messages>>,
        reply: &mut Reply,
    ) -> Ended {
        let mut keepalive =
            tokio::time::interval_at(Instant::now() + self.services.keepalive, self.services.keepalive);
        loop {
            let next = async {
                match stream.as_mut() {
                    Some(s) => s.next().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = self.services.shutdown.cancelled() => return Ended::Complete,
                _ = reply.closed() => return Ended::Cancelled,
                _ = keepalive.tick() => {
                    if reply.keepalive().await.is_err() { return Ended::Cancelled; }
                }
                msg = next => match msg {
                    Err(_) => return Ended::Complete,
                    Ok(msg) if msg.get("id").is_some() && msg.get("method").is_some() => {
                        Box::pin(respond_upstream(session, &session.wire, &msg)).await;
                    }
                    Ok(msg) if filter.wants(&msg) => {
                        if reply.event(&tagged(msg, id)).await.is_err() { return Ended::Cancelled; }
                    }
                    Ok(_) => {}
                },
            }
        }
    }
}

impl Bridge {
    /// A session of the stream's own (not pooled; closed by its owner with
    /// [`super::Pool::close`]), on the next instance that is up.
    async fn session_of_its_own(
        &self,
        target: &Target,
        call: &Call,
        caller: &Caller,
    ) -> Result<Arc<Session>, Error> {
        let capabilities = super::session::CapabilitiesText::of(&call.meta.capabilities);
        let route = &*target.route;
        let open =
            |t| self.pool.open_exclusive(t, Self::key(route, call, caller, t, &capabilities).to_owned());
        target.on_channel(open, |e| matches!(e, Error::UpstreamUnreachable)).await.0
    }

    /// The list changes a session of its own hears, for a client half that
    /// writes a stream of its own (a translated legacy session's GET
    /// stream): an SSE answer, each notification the filter wants as
    /// `rewrite` has it (dropped when it says so). Its task ends when the
    /// client leaves, the upstream's stream ends, or this replica drains or
    /// stops; then the session is closed. `hold` lives as long as it.
    pub(super) async fn list_changes(
        &self,
        target: &Target,
        call: &Call,
        caller: &Caller,
        rewrite: Rewrite,
        hold: Box<dyn std::any::Any + Send + Sync>,
    ) -> Result<Response<Body>, Error> {
        let route = &*target.route;
        let filter = Filter::parse(&call.params)?;
        let session = self.session_of_its_own(target, call, caller).await?;
        let filter = filter.honoured(&session.init);
        // The resources asked for by URI (a federated route's 2026 client
        // asks a member here), subscribed on the stream's session.
        subscribe_uris(&session, &filter.uris, route.upstream.response_timeout).await;
        let wants_any = filter.tools || filter.prompts || filter.resources || !filter.uris.is_empty();
        let stream = match session.channel.messages(&session.wire, None).await {
            Ok(stream) if wants_any => stream,
            // Nothing the upstream would announce, or no stream to hear it on.
            _ => {
                self.pool.close(&session, "exclusive").await;
                return Err(Error::MethodNotAllowed);
            }
        };
        let (mut reply, answer) = Reply::new(true);
        // Starts the SSE answer: it is handed over below, before any event.
        reply.keepalive().await.map_err(|_| Error::Internal("listen stream".into()))?;
        let gauge =
            self.services.metrics.listen_streams_open.get_or_create(&Metrics::route(&route.id)).clone();
        gauge.inc();
        let (pool, services) = (self.pool.clone(), self.services.clone());
        tokio::spawn(async move {
            let _hold = hold;
            let mut stream = stream;
            relay_changes(&services, &session, &filter, &rewrite, &mut stream, &mut reply).await;
            gauge.dec();
            pool.close(&session, "exclusive").await;
        });
        answer.await.map_err(|_| Error::Internal("listen stream".into()))
    }
}

/// Passes the notifications `filter` wants from a session's GET stream on
/// to `reply`, answering the upstream's own requests there, until one end goes.
async fn relay_changes(
    services: &crate::bridge::Services,
    session: &Session,
    filter: &Filter,
    rewrite: &Rewrite,
    stream: &mut Box<dyn Messages>,
    reply: &mut Reply,
) {
    let mut keepalive = tokio::time::interval_at(Instant::now() + services.keepalive, services.keepalive);
    loop {
        tokio::select! {
            _ = services.draining.cancelled() => return,
            _ = services.shutdown.cancelled() => return,
            _ = reply.closed() => return,
            _ = keepalive.tick() => {
                if reply.keepalive().await.is_err() { return; }
            }
            msg = stream.next() => match msg {
                Err(_) => return,
                Ok(msg) if msg.get("id").is_some() && msg.get("method").is_some() => {
                    respond_upstream(session, &session.wire, &msg).await;
                }
                Ok(msg) if filter.wants(&msg) => {
                    let text = msg.to_string();
                    let event = match rewrite(&text) {
                        Ok(None) => msg,
                        Ok(Some(text)) if text.is_empty() => continue,
                        Ok(Some(text)) => match serde_json::from_str(&text) {
                            Ok(event) => event,
                            Err(_) => continue,
                        },
                        Err(()) => continue,
                    };
                    if reply.event(&event).await.is_err() { return; }
                }
                Ok(_) => {}
            },
        }
    }
}

/// How a listen stream ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    /// The upstream's stream ended, or the gateway is shutting down: the
    /// client is told the subscription is complete.
    Complete,
    /// The client went away.
    Cancelled,
}

impl Ended {
    /// The request's outcome label.
    fn outcome(self) -> &'static str {
        match self {
            Ended::Complete => "ok",
            Ended::Cancelled => "cancelled",
        }
    }
}

async fn fail(target: &Target, reply: Reply, id: &Value, e: Error) -> &'static str {
    target.observed(matches!(e, Error::UpstreamUnreachable));
    reply.finish(e.status(), &error_body(Some(id), &e, SUPPORTED_VERSIONS)).await;
    e.reason()
}

/// The call's id; the rest (params, `_meta`) is dropped here.
fn only_id(call: Box<Call>) -> Value {
    call.id
}
