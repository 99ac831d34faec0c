//! CORS for browser clients (`[server.cors]`, or `[routes.cors]` for one
//! route; off by default): a preflight `OPTIONS` from an allowed origin is
//! answered 204 with the methods and the MCP headers a client sends, one
//! from any other origin 403; an actual response to an allowed origin
//! echoes it and exposes the headers a client reads (session id,
//! challenge, `Retry-After`, version). A disallowed origin gets no CORS
//! header at all. An allowed origin also passes the guard's `Origin` check
//! (`crate::guard`), so the two never disagree. The policy is plain
//! configuration ([`Cors`], validated by `crate::config`); what it does to
//! requests and answers is here.

use http::{header, HeaderMap, HeaderValue, Method, Response, StatusCode};

use crate::reply::{self, Body};

pub use crate::config::Cors;

/// The request headers a preflight always allows.
const ALLOW_HEADERS: &str = "content-type, authorization, accept, mcp-session-id, mcp-protocol-version, \
     mcp-method, mcp-name, last-event-id, traceparent, tracestate";
const ALLOW_METHODS: &str = "POST, GET, DELETE, OPTIONS";
const EXPOSE_HEADERS: &str = "mcp-session-id, mcp-protocol-version, www-authenticate, retry-after";
/// `Mcp-Param-*` names echoed from one preflight, at most.
const MAX_PARAM_HEADERS: usize = 64;

impl Cors {
    /// Whether `origin` (the header's value) may call.
    pub fn allows(&self, origin: &str) -> bool {
        match &self.origins {
            None => true,
            Some(list) => list.iter().any(|o| o.eq_ignore_ascii_case(origin)),
        }
    }

    /// The answer to a preflight: 204 with the CORS headers, or 403.
    pub fn preflight(&self, headers: &HeaderMap) -> Response<Body> {
        let Some(origin) = allowed_origin(self, headers) else {
            return reply::text(StatusCode::FORBIDDEN, "text/plain", "origin not allowed\n".into());
        };
        let mut resp = reply::empty(StatusCode::NO_CONTENT);
        let h = resp.headers_mut();
        self.common(h, origin);
        h.insert(header::ACCESS_CONTROL_ALLOW_METHODS, HeaderValue::from_static(ALLOW_METHODS));
        h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, allow_headers(headers));
        h.insert(header::ACCESS_CONTROL_MAX_AGE, HeaderValue::from(self.max_age_s));
        resp
    }

    /// Adds the CORS headers to an actual response for an allowed origin.
    pub fn decorate(&self, request: &HeaderMap, resp: &mut Response<Body>) {
        let h = resp.headers_mut();
        h.append(header::VARY, HeaderValue::from_static("origin"));
        let Some(origin) = allowed_origin(self, request) else { return };
        self.common(h, origin);
        h.insert(header::ACCESS_CONTROL_EXPOSE_HEADERS, HeaderValue::from_static(EXPOSE_HEADERS));
    }

    fn common(&self, h: &mut HeaderMap, origin: HeaderValue) {
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
        if self.allow_credentials {
            h.insert(header::ACCESS_CONTROL_ALLOW_CREDENTIALS, HeaderValue::from_static("true"));
        }
        if !h.get_all(header::VARY).iter().any(|v| v == "origin") {
            h.append(header::VARY, HeaderValue::from_static("origin"));
        }
    }
}

/// Whether a request is a CORS preflight (not just any `OPTIONS`).
pub fn is_preflight(method: &Method, headers: &HeaderMap) -> bool {
    method == Method::OPTIONS
        && headers.contains_key(header::ORIGIN)
        && headers.contains_key(header::ACCESS_CONTROL_REQUEST_METHOD)
}

/// The request's one `Origin`, if `cors` allows it.
fn allowed_origin(cors: &Cors, headers: &HeaderMap) -> Option<HeaderValue> {
    let mut values = headers.get_all(header::ORIGIN).iter();
    let (Some(origin), None) = (values.next(), values.next()) else { return None };
    cors.allows(origin.to_str().ok()?).then(|| origin.clone())
}

/// The always-allowed headers, plus the `Mcp-Param-*` ones the preflight
/// asks for (other names are left out: the browser then refuses the call).
fn allow_headers(request: &HeaderMap) -> HeaderValue {
    let mut out = ALLOW_HEADERS.to_string();
    let asked = request.get_all(header::ACCESS_CONTROL_REQUEST_HEADERS).iter();
    let names = asked.filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(','));
    for name in names.map(str::trim).filter(|n| is_param_header(n)).take(MAX_PARAM_HEADERS) {
        out.push_str(", ");
        out.push_str(&name.to_ascii_lowercase());
    }
    HeaderValue::from_str(&out).unwrap_or_else(|_| HeaderValue::from_static(ALLOW_HEADERS))
}

fn is_param_header(name: &str) -> bool {
    name.len() > 10
        && name.len() <= 128
        && name[..10].eq_ignore_ascii_case("mcp-param-")
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cors(origins: Option<&[&str]>) -> Cors {
        Cors {
            origins: origins.map(|o| o.iter().map(|s| s.to_string()).collect()),
            allow_credentials: false,
            max_age_s: 600,
        }
    }

    fn request(origin: &str, asked: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::ORIGIN, HeaderValue::from_str(origin).unwrap());
        h.insert(header::ACCESS_CONTROL_REQUEST_METHOD, HeaderValue::from_static("POST"));
        h.insert(header::ACCESS_CONTROL_REQUEST_HEADERS, HeaderValue::from_str(asked).unwrap());
        h
    }

    #[test]
    fn a_preflight_allows_only_mcp_param_headers_it_asks_for() {
        let c = cors(Some(&["https://app.example"]));
        let resp = c.preflight(&request("https://app.example", "content-type, Mcp-Param-Region, x-evil"));
        assert_eq!(resp.status(), 204);
        let allowed = resp.headers()[header::ACCESS_CONTROL_ALLOW_HEADERS].to_str().unwrap();
        assert!(allowed.contains("mcp-param-region") && allowed.contains("authorization"), "{allowed}");
        assert!(!allowed.contains("x-evil"), "{allowed}");
        assert_eq!(resp.headers()[header::ACCESS_CONTROL_ALLOW_ORIGIN], "https://app.example");
        assert_eq!(c.preflight(&request("https://evil.example", "")).status(), 403);
    }

    #[test]
    fn a_disallowed_origin_gets_no_cors_header() {
        let c = cors(Some(&["https://app.example"]));
        let mut resp = reply::empty(StatusCode::OK);
        c.decorate(&request("https://evil.example", ""), &mut resp);
        assert!(!resp.headers().contains_key(header::ACCESS_CONTROL_ALLOW_ORIGIN));
        assert_eq!(resp.headers()[header::VARY], "origin");
        let mut resp = reply::empty(StatusCode::OK);
        cors(None).decorate(&request("https://any.example", ""), &mut resp);
        assert_eq!(resp.headers()[header::ACCESS_CONTROL_ALLOW_ORIGIN], "https://any.example");
        assert_eq!(resp.headers().get_all(header::VARY).iter().count(), 1);
    }
}
