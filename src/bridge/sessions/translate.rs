//! Legacy → modern shapes: results gain `resultType`, `serverInfo` and cache
//! fields; legacy error codes are mapped; capabilities lose legacy-only parts.

use serde::de::IgnoredAny;
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

use crate::config::Route;
use crate::error::{code, Error};
use crate::front::Method;

pub use crate::front::SERVER_INFO;

/// Shapes a legacy result for a modern client.
pub fn result(
    method: Method,
    route: &Route,
    init: &Value,
    mut result: Map<String, Value>,
) -> Map<String, Value> {
    result.insert("resultType".into(), json!("complete"));
    let meta = result.entry("_meta").or_insert_with(|| json!({}));
    if let (Value::Object(meta), Some(info)) = (meta, init.get("serverInfo")) {
        meta.insert(SERVER_INFO.into(), info.clone());
    }
    if method.cacheable() {
        result.entry("ttlMs").or_insert_with(|| json!(route.ttl_ms));
        result.entry("cacheScope").or_insert_with(|| json!(route.cache_scope.as_str()));
    }
    result
}

/// [`result`] for a result kept as JSON text: the keys are added in front of
/// the upstream's own, without building a tree. `None` when the result must
/// take the tree path: it is not an object, it has a `_meta` or `resultType`
/// of its own, or it repeats a key the gateway may set. Other keys pass as
/// the upstream wrote them.
/// `server_info` is the upstream's `serverInfo` as JSON text.
pub fn result_text(
    method: Method,
    route: &Route,
    server_info: Option<&str>,
    raw: &RawValue,
) -> Option<String> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Keys {
        #[serde(rename = "_meta")]
        meta: Option<IgnoredAny>,
        result_type: Option<IgnoredAny>,
        ttl_ms: Option<IgnoredAny>,
        cache_scope: Option<IgnoredAny>,
    }
    let text = raw.get();
    let rest = text.strip_prefix('{')?.trim_start();
    // Most results name none of these keys anywhere (and escape nothing that
    // could spell one): then there is no need to read the keys.
    let might_have = ["\"_meta\"", "\"resultType\"", "\"ttlMs\"", "\"cacheScope\"", "\\u"];
    let keys: Keys = if might_have.iter().any(|k| text.contains(k)) {
        serde_json::from_str(text).ok()?
    } else {
        Keys { meta: None, result_type: None, ttl_ms: None, cache_scope: None }
    };
    if keys.meta.is_some() || keys.result_type.is_some() {
        return None;
    }
    let mut out = String::with_capacity(text.len() + 160);
    out.push_str(r#"{"resultType":"complete""#);
    if let Some(info) = server_info {
        for part in [r#","_meta":{""#, SERVER_INFO, r#"":"#, info, "}"] {
            out.push_str(part);
        }
    }
    if method.cacheable() {
        use std::fmt::Write;
        if keys.ttl_ms.is_none() {
            let _ = write!(out, r#","ttlMs":{}"#, route.ttl_ms);
        }
        if keys.cache_scope.is_none() {
            let _ = write!(out, r#","cacheScope":"{}""#, route.cache_scope.as_str());
        }
    }
    if !rest.starts_with('}') {
        out.push(',');
    }
    out.push_str(rest);
    Some(out)
}

/// An `input_required` result: no cache fields, `serverInfo` as on every result.
pub fn input_required(init: &Value, input_requests: Value, request_state: String) -> Map<String, Value> {
    let mut out = Map::new();
    out.insert("resultType".into(), json!("input_required"));
    out.insert("inputRequests".into(), input_requests);
    out.insert("requestState".into(), Value::String(request_state));
    if let Some(info) = init.get("serverInfo") {
        out.insert("_meta".into(), json!({SERVER_INFO: info}));
    }
    out
}

/// A legacy JSON-RPC error object as a gateway error (codes mapped).
pub fn error(err: &Value) -> Error {
    let upstream_code = err.get("code").and_then(Value::as_i64).unwrap_or(code::INTERNAL_ERROR);
    let data = err.get("data");
    let code = match upstream_code {
        code::LEGACY_RESOURCE_NOT_FOUND => code::INVALID_PARAMS,
        // -32042 stays visible to the bridge, which turns it into a URL round.
        code::URL_ELICITATION_REQUIRED => code::URL_ELICITATION_REQUIRED,
        // The client's capabilities reach the upstream's session as declared,
        // so a 2026-07-28 -32021 in its shape is the client's to act on: kept
        // (its status is 400, `Error::status`). -32020 and -32022 describe
        // the headers and version of the gateway's own legacy request, not
        // the client's (checked at the front door): a client told so would
        // renegotiate for nothing.
        c @ code::MISSING_CAPABILITY if crate::error::spec_error_status(c, data).is_some() => c,
        // The spec reserves -32020..-32099; never pass an undefined one through.
        c if (-32099..=-32020).contains(&c) => code::INTERNAL_ERROR,
        c => c,
    };
    let message =
        err.get("message").and_then(Value::as_str).unwrap_or("Upstream error").chars().take(1024).collect();
    Error::Upstream { code, message, data: data.cloned() }
}

/// Server capabilities for `server/discover`: legacy-only entries removed.
pub fn capabilities(init: &Value) -> Value {
    let mut caps = init.get("capabilities").and_then(Value::as_object).cloned().unwrap_or_default();
    caps.remove("tasks");
    if let Some(Value::Object(exp)) = caps.get_mut("experimental") {
        exp.remove("tasks");
        if exp.is_empty() {
            caps.remove("experimental");
        }
    }
    Value::Object(caps)
}

/// The `server/discover` result built from a cached `InitializeResult`.
pub fn discover(route: &Route, init: &Value, supported: &[&str]) -> Map<String, Value> {
    let mut out = Map::new();
    out.insert("supportedVersions".into(), json!(supported));
    out.insert("capabilities".into(), capabilities(init));
    if let Some(i) = init.get("instructions").filter(|i| i.is_string()) {
        out.insert("instructions".into(), i.clone());
    }
    result(Method::Discover, route, init, out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{CacheScope, Config};

    fn route() -> Route {
        let c = Config::single("http://127.0.0.1:1/mcp", "127.0.0.1:0".parse().unwrap()).unwrap();
        let mut r = (*c.routes[0]).clone();
        r.cache_scope = CacheScope::Private;
        r
    }

    #[test]
    fn results_gain_modern_fields() {
        let init = json!({"serverInfo": {"name": "up", "version": "1"}});
        let r =
            result(Method::ToolsList, &route(), &init, serde_json::from_value(json!({"tools": []})).unwrap());
        assert_eq!(r["resultType"], "complete");
        assert_eq!(r["ttlMs"], 0);
        assert_eq!(r["cacheScope"], "private");
        assert_eq!(r["_meta"][SERVER_INFO]["name"], "up");
        let r = result(Method::ToolsCall, &route(), &init, Map::new());
        assert!(!r.contains_key("ttlMs"));
    }

    #[test]
    fn text_results_match_tree_results() {
        let init = json!({"serverInfo": {"name": "up\"q", "version": "1"}});
        for (method, result) in [
            (Method::ToolsCall, r#"{"content":[{"type":"text","text":"hi"}],"isError":false}"#),
            (Method::ToolsCall, "{}"),
            (Method::ToolsCall, " { } "),
            (Method::ResourcesRead, r#"{"contents":[]}"#),
            (Method::ResourcesRead, r#"{"contents":[],"ttlMs":5}"#),
        ] {
            let raw = RawValue::from_string(result.trim().to_string()).unwrap();
            let info = init["serverInfo"].to_string();
            let text = result_text(method, &route(), Some(&info), &raw).expect(result);
            let tree = super::result(method, &route(), &init, serde_json::from_str(result).unwrap());
            assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), Value::Object(tree), "{result}");
        }
        let empty = RawValue::from_string("{}".into()).unwrap();
        let no_info = result_text(Method::ToolsCall, &route(), None, &empty);
        assert_eq!(no_info.as_deref(), Some(r#"{"resultType":"complete"}"#));
        for tree_only in [
            r#"{"_meta":{"a":1}}"#,
            r#"{"resultType":"x"}"#,
            r#"{"ttlMs":1,"ttlMs":2}"#,
            r#"{"\u005fmeta":{}}"#,
            "[1]",
        ] {
            let raw = RawValue::from_string(tree_only.to_string()).unwrap();
            assert!(result_text(Method::ToolsCall, &route(), Some("{}"), &raw).is_none(), "{tree_only}");
        }
    }

    #[test]
    fn legacy_codes_are_mapped() {
        let e = error(&json!({"code": -32002, "message": "Resource not found"}));
        assert_eq!(e.rpc_error(&[])["code"], -32602);
        let e = error(&json!({"code": -32601, "message": "nope"}));
        assert_eq!(e.status(), 404);
        let e = error(&json!({"code": -32043, "message": "reserved"}));
        assert_eq!(e.rpc_error(&[])["code"], -32603);
    }

    #[test]
    fn a_missing_capability_in_its_shape_keeps_its_code_and_status() {
        let data = json!({"requiredCapabilities": {"sampling": {}}});
        let e = error(&json!({"code": -32021, "message": "needs sampling", "data": data}));
        let body = e.rpc_error(&[]);
        assert_eq!(body, json!({"code": -32021, "message": "needs sampling", "data": data}));
        assert_eq!(e.status(), 400);
        // Not in its shape: mapped as any reserved code, data kept.
        for data in [json!({"requiredCapabilities": ["sampling"]}), json!("sampling"), Value::Null] {
            let e = error(&json!({"code": -32021, "message": "m", "data": data}));
            assert_eq!(e.rpc_error(&[])["code"], -32603, "{data}");
            assert_eq!(e.status(), 200, "{data}");
        }
        let e = error(&json!({"code": -32021, "message": "m"}));
        assert_eq!((e.rpc_error(&[])["code"].as_i64(), e.status().as_u16()), (Some(-32603), 200));
        // The gateway's own hop: not the client's header or version trouble.
        let e = error(&json!({"code": -32020, "message": "Header mismatch"}));
        assert_eq!((e.rpc_error(&[])["code"].as_i64(), e.status().as_u16()), (Some(-32603), 200));
        let e = error(&json!({"code": -32022, "message": "Unsupported protocol version",
            "data": {"supported": ["2025-06-18"], "requested": "2025-11-25"}}));
        assert_eq!((e.rpc_error(&[])["code"].as_i64(), e.status().as_u16()), (Some(-32603), 200));
    }

    #[test]
    fn discover_drops_legacy_only_capabilities() {
        let init = json!({"capabilities": {"tools": {}, "tasks": {}, "experimental": {"tasks": {}}},
            "instructions": "hi", "serverInfo": {"name": "up", "version": "1"}});
        let d = discover(&route(), &init, &["2026-07-28"]);
        assert_eq!(d["capabilities"], json!({"tools": {}}));
        assert_eq!(d["instructions"], "hi");
        assert_eq!(d["supportedVersions"][0], "2026-07-28");
    }
}
