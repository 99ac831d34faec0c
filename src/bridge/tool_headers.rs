//! The `x-mcp-header` annotations of each tool, learnt from the upstream's
//! tool list (cached per route and principal), to check `Mcp-Param-*` headers.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Map, Value};

use super::Caller;
use crate::error::Error;
use crate::front::{headers, Call};

const TTL: Duration = Duration::from_secs(60);
const MAX_PAGES: usize = 20;

/// Tool name → (header name, property) pairs.
pub type Annotations = Arc<HashMap<String, Vec<(String, String)>>>;

/// At most this many (route, principal) entries, and this many bytes: the
/// principal comes from the client.
const MAX_ENTRIES: usize = 4096;
const MAX_BYTES: u64 = 16 << 20;

type Key = (String, String);

pub struct Cache {
    map: quick_cache::sync::Cache<Key, (Instant, Annotations), ByBytes>,
}

impl Default for Cache {
    fn default() -> Cache {
        // A fixed, small shard count: each shard gets an equal part of the
        // byte budget, and an entry heavier than its shard is not kept.
        let options = quick_cache::OptionsBuilder::new()
            .estimated_items_capacity(MAX_ENTRIES)
            .weight_capacity(MAX_BYTES)
            .shards(4)
            .build()
            .expect("valid cache options");
        let map =
            quick_cache::sync::Cache::with_options(options, ByBytes, Default::default(), Default::default());
        Cache { map }
    }
}

/// An entry's weight: roughly the bytes it holds, and at least an even share
/// of the byte budget, so that the entry count is bounded too.
#[derive(Clone)]
struct ByBytes;

impl quick_cache::Weighter<Key, (Instant, Annotations)> for ByBytes {
    fn weight(&self, key: &Key, value: &(Instant, Annotations)) -> u64 {
        let pairs = |p: &Vec<(String, String)>| p.iter().map(|(h, n)| h.len() + n.len() + 48).sum::<usize>();
        let tools: usize = value.1.iter().map(|(name, p)| name.len() + 64 + pairs(p)).sum();
        ((key.0.len() + key.1.len() + 96 + tools) as u64).max(MAX_BYTES / MAX_ENTRIES as u64)
    }
}

/// Adds the annotated tools of one page of a tool list to `into`.
pub fn annotations(tools: &[Value], into: &mut HashMap<String, Vec<(String, String)>>) {
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
    /// The annotations known for `route` and `principal`, if fresh.
    pub fn cached(&self, route: &str, principal: &str) -> Option<Annotations> {
        let key = (route.to_string(), principal.to_string());
        self.map.get(&key).filter(|e| e.0.elapsed() < TTL).map(|e| e.1)
    }

    pub fn remember(&self, route: &str, principal: &str, tools: Annotations) {
        self.map.insert((route.to_string(), principal.to_string()), (Instant::now(), tools));
    }

    /// Remembers a complete (unpaginated) tool list of `route` seen on its
    /// way to a client.
    pub fn learn(&self, route: &str, caller: &Caller, result: &Map<String, Value>) {
        if result.contains_key("nextCursor") {
            return;
        }
        let Some(Value::Array(tools)) = result.get("tools") else {
            return;
        };
        let mut map = HashMap::new();
        annotations(tools, &mut map);
        self.remember(route, &caller.principal, Arc::new(map));
    }

    /// Checks the call's `Mcp-Param-*` headers against the tool's
    /// annotations on `route`, listing the tools (`fetch`) when they are
    /// not known yet.
    pub async fn check<Fut>(
        &self,
        route: &str,
        call: &Call,
        caller: &Caller,
        fetch: impl FnOnce() -> Fut,
    ) -> Result<(), Error>
    where
        Fut: std::future::Future<Output = Option<Annotations>>,
    {
        let tools = match self.cached(route, &caller.principal) {
            Some(t) => t,
            None => {
                let Some(t) = Box::pin(fetch()).await else {
                    crate::log_limited!(
                        tracing::Level::WARN,
                        route = %route,
                        "could not list tools to check Mcp-Param headers"
                    );
                    return Ok(());
                };
                self.remember(route, &caller.principal, t.clone());
                t
            }
        };
        let Some(ann) = call.name.as_ref().and_then(|n| tools.get(n)) else {
            return Ok(());
        };
        headers::check_param_headers(&caller.headers, ann, call.params.get("arguments"))
    }
}

/// The annotations of a whole tool list, read page by page (`page` asks for
/// the page after a cursor, `None` first; at most [`MAX_PAGES`]); `None`
/// when a page could not be read.
pub async fn gather<F, Fut>(page: F) -> Option<Annotations>
where
    F: Fn(Option<Value>) -> Fut,
    Fut: std::future::Future<Output = Option<Map<String, Value>>>,
{
    let mut map = HashMap::new();
    let mut cursor: Option<Value> = None;
    for _ in 0..MAX_PAGES {
        let result = page(cursor.take()).await?;
        annotations(result.get("tools")?.as_array()?, &mut map);
        cursor = result.get("nextCursor").filter(|c| c.is_string()).cloned();
        if cursor.is_none() {
            break;
        }
    }
    Some(Arc::new(map))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_is_bounded_in_entries_and_bytes_whatever_the_principals() {
        let cache = Cache::default();
        for i in 0..3 * MAX_ENTRIES {
            cache.map.insert(("/mcp".into(), format!("b:{i:032x}")), (Instant::now(), Arc::default()));
        }
        assert!(cache.map.len() <= MAX_ENTRIES, "{} entries", cache.map.len());
        let mut big = HashMap::new();
        big.insert("tool".to_string(), vec![("Mcp-Param-A".to_string(), "x".repeat(1 << 20))]);
        let big: Annotations = Arc::new(big);
        for i in 0..64 {
            cache.map.insert(("/mcp".into(), format!("big{i}")), (Instant::now(), big.clone()));
        }
        assert!(cache.map.weight() <= MAX_BYTES, "{} bytes", cache.map.weight());
        let key = ("/mcp".to_string(), "a large catalogue".to_string());
        cache.map.insert(key.clone(), (Instant::now(), big));
        assert!(cache.map.get(&key).is_some(), "an entry of 1 MiB is kept");
    }
}
