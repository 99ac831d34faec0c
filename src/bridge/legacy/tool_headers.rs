//! The `x-mcp-header` annotations of each tool, learnt from the upstream's
//! tool list (cached per route and principal), to check `Mcp-Param-*` headers.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dashmap::DashMap;
use serde_json::{json, Map, Value};

use super::call;
use super::session::Session;
use super::Caller;
use crate::error::Error;
use crate::front::{headers, Call};

const TTL: Duration = Duration::from_secs(60);
const MAX_PAGES: usize = 20;

/// Tool name → (header name, property) pairs.
type Annotations = Arc<HashMap<String, Vec<(String, String)>>>;

#[derive(Default)]
pub struct Cache {
    map: DashMap<(String, String), (Instant, Annotations)>,
}

fn annotations(tools: &[Value], into: &mut HashMap<String, Vec<(String, String)>>) {
    for tool in tools {
        let (Some(name), Some(schema)) = (tool.get("name").and_then(Value::as_str), tool.get("inputSchema"))
        else {
            continue;
        };
        let ann = headers::param_headers(schema);
        if !ann.is_empty() {
            into.insert(name.to_string(), ann);
        }
    }
}

impl Cache {
    /// Remembers a complete (unpaginated) tool list seen on its way to a client.
    pub fn learn(&self, session: &Session, caller: &Caller, result: &Map<String, Value>) {
        if result.contains_key("nextCursor") {
            return;
        }
        let Some(Value::Array(tools)) = result.get("tools") else {
            return;
        };
        let mut map = HashMap::new();
        annotations(tools, &mut map);
        let key = (session.key.route.clone(), caller.principal.clone());
        self.map.insert(key, (Instant::now(), Arc::new(map)));
    }

    /// Checks the call's `Mcp-Param-*` headers against the tool's annotations.
    pub async fn check(
        &self,
        session: &Session,
        call: &Call,
        caller: &Caller,
        timeout: Duration,
    ) -> Result<(), Error> {
        let key = (session.key.route.clone(), caller.principal.clone());
        let cached = self.map.get(&key).filter(|e| e.0.elapsed() < TTL).map(|e| e.1.clone());
        let tools = match cached {
            Some(t) => t,
            None => {
                let Some(t) = Box::pin(fetch(session, timeout)).await else {
                    tracing::warn!(route = %session.key.route, "could not list tools to check Mcp-Param headers");
                    return Ok(());
                };
                self.map.insert(key, (Instant::now(), t.clone()));
                t
            }
        };
        let Some(ann) = call.name.as_ref().and_then(|n| tools.get(n)) else {
            return Ok(());
        };
        headers::check_param_headers(&caller.headers, ann, call.params.get("arguments"))
    }
}

async fn fetch(session: &Session, timeout: Duration) -> Option<Annotations> {
    let mut map = HashMap::new();
    let mut cursor: Option<Value> = None;
    for _ in 0..MAX_PAGES {
        let params = match &cursor {
            Some(c) => json!({"cursor": c}),
            None => json!({}),
        };
        let result = call::simple_request(session, "tools/list", params, timeout).await.ok()?;
        annotations(result.get("tools")?.as_array()?, &mut map);
        cursor = result.get("nextCursor").filter(|c| c.is_string()).cloned();
        if cursor.is_none() {
            return Some(Arc::new(map));
        }
    }
    Some(Arc::new(map))
}
