//! MCP request headers: reading them, decoding the `=?base64?…?=` form, and
//! checking `Mcp-Param-*` headers against a tool's `x-mcp-header` properties.

use std::borrow::Cow;

use base64::Engine;
use http::{HeaderMap, HeaderName};
use serde_json::Value;

use crate::error::Error;

// Names, not strings: a lookup by `&str` parses the name every time.
pub const PROTOCOL_VERSION: HeaderName = HeaderName::from_static("mcp-protocol-version");
pub const METHOD: HeaderName = HeaderName::from_static("mcp-method");
pub const NAME: HeaderName = HeaderName::from_static("mcp-name");
pub const SESSION_ID: HeaderName = HeaderName::from_static("mcp-session-id");
pub const LAST_EVENT_ID: HeaderName = HeaderName::from_static("last-event-id");
const PARAM_PREFIX: &str = "mcp-param-";

/// Headers that describe the MCP request (`MCP-Protocol-Version`,
/// `Mcp-Method`, `Mcp-Name`, `Mcp-Param-*`), `Content-Type` and `Accept`:
/// the only ones that ever leave the gateway with a request (to the replica
/// owning a paused call); never credentials, never a stale `Mcp-Session-Id`.
pub fn is_mcp(name: &HeaderName) -> bool {
    let k = name.as_str();
    (k.starts_with("mcp-") && k != "mcp-session-id") || k == "content-type" || k == "accept"
}

/// The headers of `all` that describe the MCP request ([`is_mcp`]).
pub fn mcp_only(all: &HeaderMap) -> HeaderMap {
    all.iter().filter(|(k, _)| is_mcp(k)).map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// A header's value as a string, trimmed of optional whitespace.
/// `Ok(None)` when absent; an error when present but not visible ASCII, or
/// present more than once (a proxy routing on another copy would disagree).
pub fn text<'h>(headers: &'h HeaderMap, name: &HeaderName) -> Result<Option<&'h str>, Error> {
    let mut values = headers.get_all(name).iter();
    let (first, second) = (values.next(), values.next());
    if second.is_some() {
        return Err(Error::HeaderMismatch(format!("{name} header given more than once")));
    }
    match first {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .map(|s| Some(s.trim_matches([' ', '\t'])))
            .map_err(|_| Error::HeaderMismatch(format!("{name} header has invalid characters"))),
    }
}

/// Decodes a header value that may use the `=?base64?<b64>?=` sentinel form.
/// Anything not exactly in that form (lowercase markers) is a literal value.
pub fn decode_value(raw: &str) -> Result<Cow<'_, str>, Error> {
    if let Some(inner) = raw.strip_prefix("=?base64?").and_then(|rest| rest.strip_suffix("?=")) {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(inner)
            .map_err(|_| Error::HeaderMismatch("invalid base64 in header value".into()))?;
        return String::from_utf8(bytes)
            .map(Cow::Owned)
            .map_err(|_| Error::HeaderMismatch("base64 header value is not UTF-8".into()));
    }
    Ok(Cow::Borrowed(raw))
}

/// A value as a header carries it: as it is when it is plain printable
/// ASCII without surrounding whitespace, else in the `=?base64?…?=` form
/// (so is a plain value that looks like that form).
pub fn encode_value(value: &str) -> Cow<'_, str> {
    let plain = value.bytes().all(|b| (0x20..0x7f).contains(&b))
        && value.trim() == value
        && !(value.starts_with("=?base64?") && value.ends_with("?="));
    if plain {
        return Cow::Borrowed(value);
    }
    Cow::Owned(format!("=?base64?{}?=", base64::engine::general_purpose::STANDARD.encode(value)))
}

/// The `Mcp-Param-*` value of a tool argument: strings as they are,
/// integers in decimal, booleans; `None` for anything else (or null).
pub fn param_value(value: &Value) -> Option<Cow<'_, str>> {
    match value {
        Value::String(s) => Some(encode_value(s)),
        Value::Bool(b) => Some(Cow::Borrowed(if *b { "true" } else { "false" })),
        Value::Number(n) => n.as_i64().map(|i| Cow::Owned(i.to_string())),
        _ => None,
    }
}

/// Checks one mirrored header against the body's value: missing or different → -32020.
pub fn expect_mirror(headers: &HeaderMap, name: &HeaderName, body_value: &str) -> Result<(), Error> {
    let Some(raw) = text(headers, name)? else {
        return Err(Error::HeaderMismatch(format!("missing {name} header")));
    };
    let value = decode_value(raw)?;
    if value != body_value {
        return Err(Error::HeaderMismatch(format!("{name} header does not match the body")));
    }
    Ok(())
}

/// The `x-mcp-header` annotations of a tool's input schema: (header name, property).
/// Only top-level primitive properties qualify.
pub fn param_headers(input_schema: &Value) -> Vec<(String, String)> {
    let Some(props) = input_schema.get("properties").and_then(Value::as_object) else {
        return Vec::new();
    };
    props
        .iter()
        .filter_map(|(prop, schema)| {
            let header = schema.get("x-mcp-header")?.as_str()?;
            Some((header.to_ascii_lowercase(), prop.clone()))
        })
        .collect()
}

/// Validates `Mcp-Param-*` headers for a `tools/call` against the tool's annotated
/// properties: a present, non-null argument needs its header with the same value.
pub fn check_param_headers(
    headers: &HeaderMap,
    annotated: &[(String, String)],
    arguments: Option<&Value>,
) -> Result<(), Error> {
    for (header, prop) in annotated {
        let name = format!("{PARAM_PREFIX}{header}");
        let arg = arguments.and_then(|a| a.get(prop)).filter(|v| !v.is_null());
        // A name that cannot be a header is a header that is not there.
        let raw = match HeaderName::try_from(name) {
            Ok(name) => text(headers, &name)?,
            Err(_) => None,
        };
        match (arg, raw) {
            (None, _) => continue,
            (Some(_), None) => {
                return Err(Error::HeaderMismatch(format!("missing Mcp-Param-{header} header")))
            }
            (Some(value), Some(raw)) => {
                if !param_matches(value, &decode_value(raw)?) {
                    return Err(Error::HeaderMismatch(format!(
                        "Mcp-Param-{header} header does not match the body"
                    )));
                }
            }
        }
    }
    Ok(())
}

fn param_matches(value: &Value, header: &str) -> bool {
    match value {
        Value::String(s) => s == header,
        Value::Bool(b) => header == if *b { "true" } else { "false" },
        Value::Number(n) => match (n.as_i64(), header.parse::<i64>()) {
            (Some(a), Ok(b)) => a == b,
            _ => n.to_string() == header,
        },
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_mcp_headers_leave_the_gateway() {
        for (name, leaves) in [
            ("mcp-method", true),
            ("mcp-param-region", true),
            ("mcp-protocol-version", true),
            ("content-type", true),
            ("accept", true),
            ("mcp-session-id", false),
            ("authorization", false),
            ("cookie", false),
            ("x-api-key", false),
        ] {
            let name = HeaderName::from_static(name);
            assert_eq!(is_mcp(&name), leaves, "{name}");
        }
    }

    fn map(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn values_are_encoded_when_not_plain_and_decode_back() {
        for plain in ["tools/call", "a b", "=?base64?x"] {
            assert_eq!(encode_value(plain), plain);
        }
        for odd in [" lead", "trail ", "ünï", "line\nbreak", "=?base64?aGk=?="] {
            let encoded = encode_value(odd);
            assert!(encoded.starts_with("=?base64?"), "{odd:?} → {encoded}");
            assert_eq!(decode_value(&encoded).unwrap(), odd);
        }
        assert_eq!(param_value(&json!(42)).unwrap(), "42");
        assert_eq!(param_value(&json!(true)).unwrap(), "true");
        assert_eq!(param_value(&json!(1.5)), None);
        assert_eq!(param_value(&json!(null)), None);
    }

    #[test]
    fn base64_sentinel_is_decoded_and_lookalikes_are_literal() {
        assert_eq!(decode_value("=?base64?5pel5pys?=").unwrap(), "日本");
        assert_eq!(decode_value("=?BASE64?abc?=").unwrap(), "=?BASE64?abc?=");
        assert_eq!(decode_value("plain").unwrap(), "plain");
        assert!(decode_value("=?base64?!!!?=").is_err());
    }

    #[test]
    fn mirrors_are_trimmed_and_case_sensitive() {
        let h = map(&[("mcp-name", "  get_weather ")]);
        assert!(expect_mirror(&h, &NAME, "get_weather").is_ok());
        let h = map(&[("mcp-method", "TOOLS/CALL")]);
        assert!(expect_mirror(&h, &METHOD, "tools/call").is_err());
        assert!(expect_mirror(&HeaderMap::new(), &METHOD, "tools/call").is_err());
    }

    #[test]
    fn repeated_mirrors_are_refused() {
        let mut h = map(&[("mcp-name", "echo")]);
        h.append("mcp-name", "delete_everything".parse().unwrap());
        assert!(expect_mirror(&h, &NAME, "echo").is_err());
    }

    #[test]
    fn param_headers_follow_the_tool_schema() {
        let schema = json!({"properties": {
            "region": {"type": "string", "x-mcp-header": "Region"},
            "count": {"type": "integer", "x-mcp-header": "Count"},
            "plain": {"type": "string"}}});
        let ann = param_headers(&schema);
        assert_eq!(ann.len(), 2);
        let args = json!({"region": "eu", "count": 3});
        let ok = map(&[("mcp-param-region", "eu"), ("mcp-param-count", "3")]);
        assert!(check_param_headers(&ok, &ann, Some(&args)).is_ok());
        let missing = map(&[("mcp-param-region", "eu")]);
        assert!(check_param_headers(&missing, &ann, Some(&args)).is_err());
        let wrong = map(&[("mcp-param-region", "us"), ("mcp-param-count", "3")]);
        assert!(check_param_headers(&wrong, &ann, Some(&args)).is_err());
        let absent = json!({"region": null});
        assert!(check_param_headers(&HeaderMap::new(), &ann, Some(&absent)).is_ok());
    }
}
