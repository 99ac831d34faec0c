//! A federated route as an upstream half (DESIGN §10, §11): one endpoint
//! for many upstreams. A call names its member by its advertised name or
//! URI ([`names`]) and reaches it with the original, through the member's
//! own upstream half (pooled legacy sessions with MRTR, or a 2026 upstream);
//! lists and `server/discover` ask every member and merge what they answer,
//! a member that is down left out. Cursors of merged lists are sealed
//! ([`cursor`]): which members continue, with which cursors of theirs.
//!
//! The halves are type parameters: this module imports no cell.

mod cursor;
pub mod names;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures_util::StreamExt;
use serde_json::{json, Map, Value};

use super::half::{Failure, Outcome, Payload, UpstreamHalf};
use super::relay::Rewrite;
use super::target::{Ask, MemberTarget};
use super::{Caller, Services, Target};
use crate::error::Error;
use crate::front::generation::Generation;
use crate::front::{Call, Method, SUBSCRIPTION_ID, SUPPORTED_VERSIONS};
use crate::metrics::MemberOutcomeLabels;
use crate::reply::{Body, Reply};
use http::Response;

/// Shortened names resolved to their originals, per member route; filled
/// from the lists that pass through. Bounded: at the cap it starts afresh.
const MAX_RESOLVED: usize = 10_000;
/// Pages of a member's list read to resolve a shortened name.
const MAX_RESOLVE_PAGES: usize = 20;
/// After a member's list was read to resolve a name, how long a name it did
/// not hold is taken as plain without reading the list again: a caller
/// cannot make every call of an unknown name cost a walk of the list.
const RESOLVE_AGAIN_AFTER: std::time::Duration = std::time::Duration::from_secs(30);

/// One endpoint for many upstreams, over the two upstream halves.
pub struct Federation<L, M> {
    /// Members that speak the 2025 session protocol.
    legacy: Arc<L>,
    /// Members that speak 2026-07-28.
    modern: Arc<M>,
    services: Arc<Services>,
    /// (member route id, advertised name) → original name.
    resolved: Mutex<HashMap<(String, String), String>>,
    /// (member route id, list method) → when its list was last read to resolve a name.
    read_for_names: Mutex<HashMap<(String, Method), std::time::Instant>>,
}

/// What a list method lists: the array's key and the field naming an item.
fn listed(method: Method) -> Option<(&'static str, Field)> {
    match method {
        Method::ToolsList => Some(("tools", Field::Name)),
        Method::PromptsList => Some(("prompts", Field::Name)),
        Method::ResourcesList => Some(("resources", Field::Uri("uri"))),
        Method::ResourcesTemplatesList => Some(("resourceTemplates", Field::Uri("uriTemplate"))),
        _ => None,
    }
}

/// How an item is named: by a name (tools, prompts) or a URI field.
#[derive(Clone, Copy)]
enum Field {
    Name,
    Uri(&'static str),
}

impl<L: UpstreamHalf, M: UpstreamHalf> Federation<L, M> {
    pub fn new(legacy: Arc<L>, modern: Arc<M>, services: Arc<Services>) -> Federation<L, M> {
        Federation {
            legacy,
            modern,
            services,
            resolved: Mutex::new(HashMap::new()),
            read_for_names: Mutex::new(HashMap::new()),
        }
    }

    async fn run(&self, target: &Target, call: Call, caller: &Caller, notes: &mut Reply) -> Outcome {
        if listed(call.method).is_some() {
            return self.list(target, call, caller).await;
        }
        match call.method {
            Method::Discover => self.discover(target, call, caller).await,
            Method::ToolsCall | Method::PromptsGet => {
                let Some(name) = call.name.clone() else {
                    return Error::invalid_params("params.name is required").into();
                };
                let kind = if call.method == Method::ToolsCall { "tool" } else { "prompt" };
                let list =
                    if call.method == Method::ToolsCall { Method::ToolsList } else { Method::PromptsList };
                let Some((member, original)) = self.resolve(target, &call, list, caller, &name).await else {
                    return Error::invalid_params(format!("unknown {kind} `{name}`")).into();
                };
                let mut call = call;
                call.params.insert("name".into(), Value::String(original.clone()));
                call.name = Some(original);
                let outcome = self.on_member(member, call, caller, notes).await;
                named_outcome(member, outcome)
            }
            Method::ResourcesRead => {
                let uri = call.params.get("uri").and_then(Value::as_str).unwrap_or_default().to_string();
                let Some((member, original)) =
                    names::split_uri(&uri).and_then(|(m, u)| Some((find(target, m)?, u)))
                else {
                    return Error::invalid_params(format!("unknown resource `{uri}`")).into();
                };
                let mut call = call;
                call.params.insert("uri".into(), Value::String(original.to_string()));
                call.name = Some(original.to_string());
                let outcome = self.on_member(member, call, caller, notes).await;
                named_outcome(member, outcome)
            }
            Method::CompletionComplete => {
                let Some((member, call)) = self.completion(target, call, caller).await else {
                    return Error::invalid_params("unknown completion reference").into();
                };
                let outcome = self.on_member(member, call, caller, notes).await;
                named_outcome(member, outcome)
            }
            // A listen stream comes through `subscribe` and `listen`, not as one outcome.
            _ => Error::MethodNotFound(call.method.as_str().into()).into(),
        }
    }

    /// The member and original name behind an advertised tool or prompt
    /// name, which `list` (tools or prompts) holds; `call` lends its `_meta`.
    async fn resolve<'t>(
        &self,
        target: &'t Target,
        call: &Call,
        list: Method,
        caller: &Caller,
        name: &str,
    ) -> Option<(&'t MemberTarget, String)> {
        let (prefix, rest) = names::split(name)?;
        let member = find(target, prefix)?;
        if !names::may_be_shortened(rest) {
            return Some((member, rest.to_string()));
        }
        let key = (member.target.route.id.clone(), name.to_string());
        if let Some(original) = self.resolved.lock().expect("resolved lock").get(&key) {
            return Some((member, original.clone()));
        }
        // Not seen in a list yet: read the member's list as this caller
        // would, unless it was read lately.
        {
            let mut read = self.read_for_names.lock().expect("read_for_names lock");
            let now = std::time::Instant::now();
            read.retain(|_, at| now.duration_since(*at) < RESOLVE_AGAIN_AFTER);
            if read.insert((member.target.route.id.clone(), list), now).is_some() {
                return Some((member, rest.to_string()));
            }
        }
        let mut cursor: Option<Value> = None;
        for _ in 0..MAX_RESOLVE_PAGES {
            let mut ask = list_call(call, list, cursor.take());
            ask.id = json!(0);
            let (mut quiet, _unheard) = Reply::new(false);
            let Outcome::Complete(page) = self.on_member(member, ask, caller, &mut quiet).await else {
                break;
            };
            let Ok(page) = page.into_tree() else { break };
            self.learn(member, list, &page);
            cursor = page.get("nextCursor").cloned();
            if let Some(original) = self.resolved.lock().expect("resolved lock").get(&key) {
                return Some((member, original.clone()));
            }
            if cursor.is_none() {
                break;
            }
        }
        // Only a plain name that happens to end like a shortened one is left.
        Some((member, rest.to_string()))
    }

    /// Remembers the shortened names in a member's list page.
    fn learn(&self, member: &MemberTarget, method: Method, page: &Map<String, Value>) {
        let Some((key, Field::Name)) = listed(method) else { return };
        let Some(Value::Array(items)) = page.get(key) else { return };
        let mut resolved = self.resolved.lock().expect("resolved lock");
        for original in items.iter().filter_map(|i| i.get("name")?.as_str()) {
            let advertised = names::advertised(&member.name, original);
            let plain =
                advertised.strip_prefix(member.name.as_str()).and_then(|r| r.strip_prefix(names::SEPARATOR));
            if plain != Some(original) {
                if resolved.len() >= MAX_RESOLVED {
                    resolved.clear();
                }
                resolved.insert((member.target.route.id.clone(), advertised), original.to_string());
            }
        }
    }

    /// A `completion/complete`: its reference names the member.
    async fn completion<'t>(
        &self,
        target: &'t Target,
        mut call: Call,
        caller: &Caller,
    ) -> Option<(&'t MemberTarget, Call)> {
        let mut reference = call.params.get("ref")?.as_object()?.clone();
        let member = match reference.get("type").and_then(Value::as_str)? {
            "ref/prompt" => {
                let name = reference.get("name")?.as_str()?.to_string();
                let (member, original) =
                    self.resolve(target, &call, Method::PromptsList, caller, &name).await?;
                reference.insert("name".into(), Value::String(original));
                member
            }
            "ref/resource" => {
                let uri = reference.get("uri")?.as_str()?.to_string();
                let (prefix, original) = names::split_uri(&uri)?;
                let member = find(target, prefix)?;
                reference.insert("uri".into(), Value::String(original.to_string()));
                member
            }
            _ => return None,
        };
        call.params.insert("ref".into(), Value::Object(reference));
        Some((member, call))
    }

    /// Runs `call` on `member`'s own upstream half: admitted by the
    /// member's limits, counted, and its health marked.
    async fn on_member(
        &self,
        member: &MemberTarget,
        call: Call,
        caller: &Caller,
        notes: &mut Reply,
    ) -> Outcome {
        let resumes = call.params.contains_key("requestState");
        let ask = Ask { resumes, ..Ask::new(call.method.as_str(), None) };
        let outcome = match member.target.admit(&caller.principal, &[ask]) {
            Err(e) => e.into(),
            Ok(_slot) => {
                let plain = plain_caller(caller);
                match member.target.generation().await {
                    Err(e) => e.into(),
                    Ok(Generation::Legacy) => self.legacy.call(&member.target, call, &plain, notes).await,
                    Ok(Generation::Modern) => self.modern.call(&member.target, call, &plain, notes).await,
                }
            }
        };
        self.mark(member, &outcome);
        outcome
    }

    /// [`Self::on_member`] for a list or discover, within the route's
    /// `federation_list_timeout`; nothing of it reaches the client on the way.
    async fn within(
        &self,
        target: &Target,
        member: &MemberTarget,
        call: Call,
        caller: &Caller,
    ) -> Result<Outcome, tokio::time::error::Elapsed> {
        let (mut quiet, _unheard) = Reply::new(false);
        let timeout = target.route.federation_list_timeout;
        tokio::time::timeout(timeout, self.on_member(member, call, caller, &mut quiet)).await
    }

    /// Counts the outcome and marks the member down (it did not answer) or up.
    fn mark(&self, member: &MemberTarget, outcome: &Outcome) {
        let down = matches!(
            outcome,
            Outcome::Failed(Failure::Gateway(
                Error::UpstreamUnreachable
                    | Error::UpstreamTimeout
                    | Error::CircuitOpen
                    | Error::OutcomeUnknown
            ))
        );
        member.up.set(i64::from(!down));
        if crate::status::recent::upstream_failed(outcome.label()) {
            member.target.errors.add();
        }
        let labels = MemberOutcomeLabels {
            route: member.target.route.member_of.clone().unwrap_or_default(),
            member: member.name.clone(),
            outcome: outcome.label(),
        };
        self.services.metrics.federation_member_requests.get_or_create(&labels).inc();
    }

    /// A merged list: the first page holds every member's first page; a
    /// sealed cursor names the members that continue, with their cursors.
    async fn list(&self, target: &Target, call: Call, caller: &Caller) -> Outcome {
        let Some((key, field)) = listed(call.method) else {
            return Error::Internal("not a list".into()).into();
        };
        let route = &target.route;
        let (asks, cache) = match call.params.get("cursor") {
            None => (target.members.iter().map(|m| (m, None)).collect::<Vec<_>>(), None),
            Some(sealed) => match cursor::open(&self.services.sealer, target, &call, caller, sealed) {
                Err(e) => return e.into(),
                Ok(opened) => {
                    let mut asks = Vec::new();
                    for (name, cursor) in opened.next {
                        match find(target, &name) {
                            Some(m) => asks.push((m, Some(Value::String(cursor)))),
                            None => return cursor::stale().into(),
                        }
                    }
                    (asks, Some(Cache { ttl_ms: opened.ttl_ms, private: opened.private }))
                }
            },
        };
        let pages = asks.into_iter().map(|(member, cursor)| {
            let ask = list_call(&call, call.method, cursor);
            async move {
                let outcome = match self.within(target, member, ask, caller).await {
                    Ok(outcome) => outcome,
                    Err(_) => {
                        member.up.set(0);
                        Error::UpstreamTimeout.into()
                    }
                };
                (member, outcome)
            }
        });
        let pages = futures_util::future::join_all(pages).await;
        let mut items = Vec::new();
        let mut next = Vec::new();
        let first = cache.is_none();
        let mut cache = cache.unwrap_or_default();
        let mut answered = 0;
        let mut failed = None;
        for (member, outcome) in pages {
            let page = match outcome {
                Outcome::Complete(page) => page.into_tree(),
                other => {
                    crate::log_limited!(
                        tracing::Level::INFO,
                        route = %route.id,
                        member = %member.name,
                        outcome = other.label(),
                        "a federated member left out of a list"
                    );
                    if let (None, Outcome::Failed(Failure::Gateway(e))) = (&failed, other) {
                        failed = Some((member, e));
                    }
                    continue;
                }
            };
            let Ok(mut page) = page else { continue };
            answered += 1;
            self.learn(member, call.method, &page);
            if first {
                cache.take(&page);
            }
            if let Some(Value::String(c)) = page.remove("nextCursor") {
                next.push((member.name.clone(), c));
            }
            if let Some(Value::Array(list)) = page.remove(key) {
                items.extend(list.into_iter().map(|item| advertise_item(&member.name, field, item)));
            }
        }
        // Not one member answered: the list is not empty, it is unknown.
        if answered == 0 {
            return match failed {
                Some((member, e)) => member_error(member, e),
                None => Error::UpstreamInvalid("no member answered the list").into(),
            };
        }
        let mut result = Map::new();
        result.insert(key.into(), Value::Array(items));
        if !next.is_empty() {
            match cursor::seal(&self.services.sealer, target, &call, caller, next, cache) {
                Ok(c) => result.insert("nextCursor".into(), Value::String(c)),
                Err(e) => return e.into(),
            };
        }
        result.insert("resultType".into(), json!("complete"));
        cache.write(&mut result);
        if let Some(view) = &caller.access {
            view.filter(call.method.as_str(), &mut result);
        }
        Outcome::Complete(Payload::Tree(result))
    }

    /// `server/discover`: capabilities merged, instructions kept per member.
    async fn discover(&self, target: &Target, call: Call, caller: &Caller) -> Outcome {
        let asks = target.members.iter().map(|member| {
            let ask = call.clone();
            async move { (member, self.within(target, member, ask, caller).await) }
        });
        let mut capabilities = Map::new();
        let mut instructions = Vec::new();
        let mut cache = Cache::default();
        let mut answered = 0;
        for (member, found) in futures_util::future::join_all(asks).await {
            let Ok(Outcome::Complete(found)) = found else { continue };
            let Ok(found) = found.into_tree() else { continue };
            answered += 1;
            cache.take(&found);
            if let Some(Value::Object(caps)) = found.get("capabilities") {
                merge_capabilities(&mut capabilities, caps);
            }
            if let Some(text) = found.get("instructions").and_then(Value::as_str) {
                instructions.push(format!("{}: {text}", member.name));
            }
        }
        if answered == 0 {
            return Error::UpstreamUnreachable.into();
        }
        let mut result = Map::new();
        result.insert("supportedVersions".into(), json!(SUPPORTED_VERSIONS));
        result.insert("capabilities".into(), Value::Object(capabilities));
        if !instructions.is_empty() {
            result.insert("instructions".into(), json!(instructions.join("\n\n")));
        }
        result.insert("resultType".into(), json!("complete"));
        cache.write(&mut result);
        result.insert(
            "_meta".into(),
            json!({crate::front::SERVER_INFO: {"name": "sessionless", "version": env!("CARGO_PKG_VERSION")}}),
        );
        Outcome::Complete(Payload::Tree(result))
    }
}

impl<L: UpstreamHalf, M: UpstreamHalf> Federation<L, M> {
    /// A 2026 client's `subscriptions/listen`: one acknowledgement (the
    /// filter as asked), then every member's change notifications, URIs
    /// advertised and tagged with the client's subscription id, and the
    /// final result once every member's stream has ended. Each member is
    /// asked for its own part of the filter (its resources, by their own URIs).
    pub async fn subscribe(
        &self,
        target: &Target,
        call: Call,
        caller: &Caller,
        hold: Box<dyn std::any::Any + Send + Sync>,
    ) -> Result<Response<Body>, Error> {
        let Some(Value::Object(filter)) = call.params.get("notifications").cloned() else {
            return Err(Error::invalid_params("subscriptions/listen needs a notifications filter"));
        };
        let place = self.services.stream_place(&target.route.id, &caller.principal)?;
        let id = call.id.clone();
        let tag: Rewrite = {
            let id = id.clone();
            Box::new(move |text: &str| tagged_notification(text, &id))
        };
        let mut members = Vec::new();
        for member in &target.members {
            let mut own = call.clone();
            own.params.insert("notifications".into(), Value::Object(member_filter(&member.name, &filter)));
            members.push((member, own));
        }
        let merged = self.merged_changes(members, caller, Arc::new(tag)).await?;
        let event = |msg: &Value| {
            Ok::<_, crate::reply::BoxError>(hyper::body::Frame::data(crate::reply::sse_event(msg)))
        };
        let ack = json!({"jsonrpc": "2.0", "method": "notifications/subscriptions/acknowledged",
            "params": {"notifications": filter, "_meta": {SUBSCRIPTION_ID: id}}});
        let end = json!({"jsonrpc": "2.0", "id": id,
            "result": {"resultType": "complete", "_meta": {SUBSCRIPTION_ID: id}}});
        let stream = futures_util::stream::iter([event(&ack)])
            .chain(merged)
            .chain(futures_util::stream::once(async move { event(&end) }))
            .map(move |frame| {
                let _held = (&place, &hold);
                frame
            });
        Ok(crate::reply::sse_response(http_body_util::BodyExt::boxed(http_body_util::StreamBody::new(
            stream,
        ))))
    }

    /// The members' change streams (each `(member, its call)`), merged,
    /// each event through the member's URI advertising and `rewrite`.
    async fn merged_changes(
        &self,
        members: Vec<(&MemberTarget, Call)>,
        caller: &Caller,
        rewrite: Arc<Rewrite>,
    ) -> Result<
        impl futures_util::Stream<Item = Result<hyper::body::Frame<bytes::Bytes>, crate::reply::BoxError>>
            + Send
            + Sync
            + 'static,
        Error,
    > {
        let opened = members.into_iter().map(|(member, call)| {
            let rewrite = member_rewrite(&member.name, rewrite.clone());
            async move {
                let plain = plain_caller(caller);
                // The client's stream place and permits are held once, by the merged stream.
                let none = Box::new(());
                let opened = match member.target.generation().await {
                    Err(e) => Err(e),
                    Ok(Generation::Legacy) => {
                        self.legacy.listen(&member.target, call, &plain, rewrite, none).await
                    }
                    Ok(Generation::Modern) => {
                        self.modern.listen(&member.target, call, &plain, rewrite, none).await
                    }
                };
                match opened {
                    Ok(resp) if resp.status() == http::StatusCode::OK => Some(resp.into_body()),
                    _ => None,
                }
            }
        });
        let bodies: Vec<Body> = futures_util::future::join_all(opened).await.into_iter().flatten().collect();
        if bodies.is_empty() {
            return Err(Error::MethodNotAllowed);
        }
        Ok(futures_util::stream::select_all(bodies.into_iter().map(http_body_util::BodyStream::new)))
    }
}

impl<L: UpstreamHalf, M: UpstreamHalf> UpstreamHalf for Federation<L, M> {
    async fn call(&self, target: &Target, call: Call, caller: &Caller, notes: &mut Reply) -> Outcome {
        self.run(target, call, caller, notes).await
    }

    /// Every member's change stream, merged: each member's own (through
    /// its half), its URIs advertised, then `rewrite`. A member without
    /// one is left out; with none at all, 405.
    async fn listen(
        &self,
        target: &Target,
        call: Call,
        caller: &Caller,
        rewrite: Rewrite,
        hold: Box<dyn std::any::Any + Send + Sync>,
    ) -> Result<Response<Body>, Error> {
        let members = target.members.iter().map(|m| (m, call.clone())).collect();
        let merged = self.merged_changes(members, caller, Arc::new(rewrite)).await?;
        let merged = merged.map(move |frame| {
            let _hold = &hold;
            frame
        });
        Ok(crate::reply::sse_response(http_body_util::BodyExt::boxed(http_body_util::StreamBody::new(
            merged,
        ))))
    }
}

/// A merged result's cache fields: the smallest `ttlMs` of the members',
/// `private` if any member's is (or none said).
#[derive(Debug, Clone, Copy, Default)]
pub struct Cache {
    pub ttl_ms: Option<u64>,
    pub private: bool,
}

impl Cache {
    /// Takes in one member's result.
    fn take(&mut self, result: &Map<String, Value>) {
        if let Some(ttl) = result.get("ttlMs").and_then(Value::as_u64) {
            self.ttl_ms = Some(self.ttl_ms.map_or(ttl, |t| t.min(ttl)));
        }
        self.private |= result.get("cacheScope").and_then(Value::as_str) != Some("public");
    }

    fn write(self, result: &mut Map<String, Value>) {
        result.insert("ttlMs".into(), json!(self.ttl_ms.unwrap_or(0)));
        let scope = if self.private || self.ttl_ms.is_none() { "private" } else { "public" };
        result.insert("cacheScope".into(), json!(scope));
    }
}

/// A member's listen event for the client's stream: its change
/// notifications tagged with the client's subscription `id`; its own
/// acknowledgement and final result dropped (the merged stream has its own).
fn tagged_notification(text: &str, id: &Value) -> Result<Option<String>, ()> {
    let mut msg: Value = serde_json::from_str(text).map_err(|_| ())?;
    let method = msg.get("method").and_then(Value::as_str).unwrap_or_default();
    if !method.starts_with("notifications/") || method == "notifications/subscriptions/acknowledged" {
        return Ok(Some(String::new()));
    }
    if !crate::front::tag_subscription(&mut msg, id) {
        return Err(());
    }
    Ok(Some(msg.to_string()))
}

/// A listen filter for one member: the list changes asked, and of the
/// resources to watch only the member's, by their own URIs.
fn member_filter(member: &str, filter: &Map<String, Value>) -> Map<String, Value> {
    let mut own = filter.clone();
    if let Some(Value::Array(uris)) = filter.get("resourceSubscriptions") {
        let mine: Vec<Value> = uris
            .iter()
            .filter_map(|u| names::split_uri(u.as_str()?))
            .filter(|(m, _)| *m == member)
            .map(|(_, uri)| Value::String(uri.to_string()))
            .collect();
        own.insert("resourceSubscriptions".into(), Value::Array(mine));
    }
    own
}

/// The caller as a member sees it: the route's rules name advertised
/// names, so a member filters nothing.
fn plain_caller(caller: &Caller) -> Caller {
    Caller {
        principal: caller.principal.clone(),
        headers: caller.headers.clone(),
        body: caller.body.clone(),
        forwarded: caller.forwarded,
        access: None,
    }
}

/// A member's change-stream rewrite: `resources/updated` URIs advertised,
/// then the client's own `rewrite`.
fn member_rewrite(member: &str, rewrite: Arc<Rewrite>) -> Rewrite {
    let member = member.to_string();
    Box::new(move |text: &str| {
        let advertised = advertise_notification(&member, text)?;
        match (rewrite(advertised.as_deref().unwrap_or(text))?, advertised) {
            (Some(new), _) => Ok(Some(new)),
            (None, advertised) => Ok(advertised),
        }
    })
}

/// A `notifications/resources/updated` with its URI advertised; `None`
/// for anything else (kept as it is).
fn advertise_notification(member: &str, text: &str) -> Result<Option<String>, ()> {
    if !text.contains("notifications/resources/updated") {
        return Ok(None);
    }
    let mut msg: Value = serde_json::from_str(text).map_err(|_| ())?;
    if msg.get("method").and_then(Value::as_str) != Some("notifications/resources/updated") {
        return Ok(None);
    }
    let Some(Value::String(uri)) = msg.pointer("/params/uri") else { return Ok(None) };
    let advertised = names::advertised_uri(member, uri);
    msg["params"]["uri"] = Value::String(advertised);
    Ok(Some(msg.to_string()))
}

/// The member named `prefix`.
fn find<'t>(target: &'t Target, prefix: &str) -> Option<&'t MemberTarget> {
    target.members.iter().find(|m| m.name == prefix)
}

/// A list call for one member: `call`'s `_meta`, the member's own cursor.
fn list_call(call: &Call, method: Method, cursor: Option<Value>) -> Call {
    let mut params = Map::new();
    if let Some(c) = cursor {
        params.insert("cursor".into(), c);
    }
    Call {
        id: call.id.clone(),
        method,
        params,
        meta: call.meta.clone(),
        name: None,
        request_state: Default::default(),
        client_headers: false,
    }
}

/// A listed item under its advertised name or URI.
fn advertise_item(member: &str, field: Field, mut item: Value) -> Value {
    let Some(obj) = item.as_object_mut() else { return item };
    match field {
        Field::Name => {
            if let Some(Value::String(name)) = obj.get("name") {
                let advertised = names::advertised(member, name);
                obj.insert("name".into(), Value::String(advertised));
            }
        }
        Field::Uri(key) => {
            if let Some(Value::String(uri)) = obj.get(key) {
                let advertised = names::advertised_uri(member, uri);
                obj.insert(key.into(), Value::String(advertised));
            }
        }
    }
    item
}

/// A member's outcome for the client: URIs in its result (resource links,
/// embedded resources, read contents) advertised; its errors naming it.
fn named_outcome(member: &MemberTarget, outcome: Outcome) -> Outcome {
    match outcome {
        Outcome::Complete(payload) => match payload.into_tree() {
            Ok(mut result) => {
                advertise_uris(&member.name, &mut result);
                Outcome::Complete(Payload::Tree(result))
            }
            Err(e) => member_error(member, e),
        },
        Outcome::Failed(Failure::Gateway(e)) => member_error(member, e),
        other => other,
    }
}

fn member_error(member: &MemberTarget, error: Error) -> Outcome {
    Error::Member { member: member.name.clone(), error: Box::new(error) }.into()
}

/// Rewrites the URIs a result holds: `content[]` resource links and
/// embedded resources (tool results, prompt messages), `contents[]` of a read.
fn advertise_uris(member: &str, result: &mut Map<String, Value>) {
    let prefix = |v: &mut Value| {
        if let Some(Value::String(uri)) = v.get("uri") {
            let advertised = names::advertised_uri(member, uri);
            v["uri"] = Value::String(advertised);
        }
    };
    let mut content = |item: &mut Value| match item.get("type").and_then(Value::as_str) {
        Some("resource_link") => prefix(item),
        Some("resource") => {
            if let Some(resource) = item.get_mut("resource") {
                prefix(resource)
            }
        }
        _ => {}
    };
    if let Some(Value::Array(items)) = result.get_mut("content") {
        items.iter_mut().for_each(&mut content);
    }
    if let Some(Value::Array(messages)) = result.get_mut("messages") {
        for m in messages {
            if let Some(c) = m.get_mut("content") {
                content(c);
            }
        }
    }
    if let Some(Value::Array(contents)) = result.get_mut("contents") {
        contents.iter_mut().for_each(prefix);
    }
}

/// Adds `more`'s capabilities to `into`: a capability is advertised if a
/// member has it; its flags are merged one level down.
fn merge_capabilities(into: &mut Map<String, Value>, more: &Map<String, Value>) {
    for (name, value) in more {
        match (into.get_mut(name), value) {
            (Some(Value::Object(have)), Value::Object(add)) => {
                for (k, v) in add {
                    let keep = have.get(k).is_some_and(|h| h == &Value::Bool(true));
                    if !keep {
                        have.insert(k.clone(), v.clone());
                    }
                }
            }
            (None, v) => {
                into.insert(name.clone(), v.clone());
            }
            _ => {}
        }
    }
}
