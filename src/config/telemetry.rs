//! Observability settings: `/readyz`'s policy (`server.readiness`), the
//! `[telemetry]` table (OTLP export, the per-tool latency allowlist).

use serde::Deserialize;

use super::{at, ConfigError};

/// At most this many tools on the latency allowlist (each a label value).
pub const MAX_LATENCY_TOOLS: usize = 64;
/// Longest tool name on the allowlist.
const MAX_TOOL_NAME: usize = 128;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTelemetry {
    /// OTLP/gRPC collector, e.g. "http://127.0.0.1:4317"; no export when absent.
    pub otlp_endpoint: Option<String>,
    /// `service.name` of the exported spans (default "sessionless").
    pub service_name: Option<String>,
    /// Spans waiting for export at most (default 2048); more are dropped.
    pub otlp_max_queue: Option<usize>,
    /// Tools whose `tools/call` latency is a histogram of its own, labelled
    /// by tool name (the allowlist bounds the label's values).
    pub latency_tools: Option<Vec<String>>,
}

/// When `/readyz` answers 200 (besides draining, always 503).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Readiness {
    /// Whatever the upstreams do (the replica itself is up).
    #[default]
    Always,
    /// At least one instance of at least one route's upstream is up.
    AnyUpstream,
    /// Every route's upstream has at least one instance up.
    AllUpstreams,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Telemetry {
    pub otlp: Option<Otlp>,
    /// Sorted, for a binary search per call.
    pub latency_tools: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Otlp {
    pub endpoint: String,
    pub service_name: String,
    pub max_queue: usize,
}

impl Telemetry {
    /// Whether `tool` gets a label of its own in the per-tool histogram.
    pub fn labels_tool(&self, tool: &str) -> bool {
        self.latency_tools.binary_search_by(|t| t.as_str().cmp(tool)).is_ok()
    }
}

pub fn readiness(raw: Option<&str>, text: &str) -> Result<Readiness, ConfigError> {
    match raw {
        None | Some("always") => Ok(Readiness::Always),
        Some("any_upstream") => Ok(Readiness::AnyUpstream),
        Some("all_upstreams") => Ok(Readiness::AllUpstreams),
        Some(other) => Err(ConfigError(format!(
            "{}readiness `{other}`: expected \"always\", \"any_upstream\" or \"all_upstreams\"",
            at(text, "readiness")
        ))),
    }
}

pub fn telemetry(raw: &RawTelemetry, text: &str) -> Result<Telemetry, ConfigError> {
    let otlp = match &raw.otlp_endpoint {
        None => None,
        Some(endpoint) => {
            let uri: http::Uri = endpoint.parse().map_err(|_| bad(text, "otlp_endpoint", "not a URL"))?;
            if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
                return Err(bad(text, "otlp_endpoint", "expected http://host:port or https://host:port"));
            }
            if !cfg!(feature = "otlp") {
                return Err(bad(text, "otlp_endpoint", "this binary was built without the `otlp` feature"));
            }
            Some(Otlp {
                endpoint: endpoint.clone(),
                service_name: raw.service_name.clone().unwrap_or_else(|| "sessionless".into()),
                max_queue: raw.otlp_max_queue.unwrap_or(2048).clamp(1, 65_536),
            })
        }
    };
    let mut latency_tools = raw.latency_tools.clone().unwrap_or_default();
    if latency_tools.len() > MAX_LATENCY_TOOLS {
        return Err(bad(text, "latency_tools", &format!("at most {MAX_LATENCY_TOOLS} tools")));
    }
    if let Some(t) = latency_tools.iter().find(|t| t.is_empty() || t.len() > MAX_TOOL_NAME || t.contains('*'))
    {
        return Err(bad(text, "latency_tools", &format!("`{t}`: a tool name (no patterns, 1 to 128 bytes)")));
    }
    latency_tools.sort();
    latency_tools.dedup();
    Ok(Telemetry { otlp, latency_tools })
}

fn bad(text: &str, key: &str, why: &str) -> ConfigError {
    ConfigError(format!("{}{key}: {why}", at(text, key)))
}
