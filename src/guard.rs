//! The checks every request to an MCP endpoint passes before its body is read:
//! HTTP method, Host and Origin (DNS-rebinding protection), content type.
//! Each is one small function; `check` runs them in order.

use http::uri::Authority;
use http::{header, HeaderMap, Method};
use sha2::{Digest, Sha256};

use crate::config::Config;
use crate::cors::Cors;
use crate::error::Error;

/// `authority` is the request URI's (h2 `:authority`, or an absolute-form
/// HTTP/1.1 target); `Host` is the header. `cors`: the route's, whose
/// origins are allowed here too.
pub fn check(
    config: &Config,
    cors: Option<&Cors>,
    method: &Method,
    authority: Option<&Authority>,
    headers: &HeaderMap,
) -> Result<(), Error> {
    http_method(method)?;
    check_origin(config, cors, authority, headers)?;
    content_type(headers)
}

/// Host and Origin only: for a legacy session's GET and DELETE, which have no body.
pub fn check_origin(
    config: &Config,
    cors: Option<&Cors>,
    authority: Option<&Authority>,
    headers: &HeaderMap,
) -> Result<(), Error> {
    host(config, authority, headers)?;
    origin(config, cors, headers)
}

fn http_method(method: &Method) -> Result<(), Error> {
    if method == Method::POST {
        Ok(())
    } else {
        Err(Error::MethodNotAllowed)
    }
}

/// The host part of `host[:port]` or `[v6]:port`.
fn hostname(authority: &str) -> &str {
    let bytes = authority.as_bytes();
    match bytes.first() {
        Some(b'[') => bytes.iter().position(|&b| b == b']').map_or(authority, |end| &authority[..=end]),
        _ => bytes.iter().position(|&b| b == b':').map_or(authority, |end| &authority[..end]),
    }
}

fn is_loopback_host(h: &str) -> bool {
    matches!(h, "localhost" | "127.0.0.1" | "[::1]")
}

/// With allowed hosts configured (by default on a loopback listener), the
/// request must name its host, by `Host` or `:authority`, and every name it
/// gives must be allowed: a request that names none is refused too.
fn host(config: &Config, authority: Option<&Authority>, headers: &HeaderMap) -> Result<(), Error> {
    let Some(allowed) = &config.allowed_hosts else {
        return Ok(());
    };
    let is_allowed = |authority: &str| {
        let host = hostname(authority);
        allowed.iter().any(|a| a.eq_ignore_ascii_case(host))
    };
    let mut named = false;
    if let Some(authority) = authority {
        named = true;
        if !allowed.iter().any(|a| a.eq_ignore_ascii_case(authority.host())) {
            return Err(Error::HostNotAllowed);
        }
    }
    for value in headers.get_all(header::HOST) {
        named = true;
        if !value.to_str().is_ok_and(is_allowed) {
            return Err(Error::HostNotAllowed);
        }
    }
    if named {
        Ok(())
    } else {
        Err(Error::HostNotAllowed)
    }
}

/// An `Origin` that is present must be a loopback origin, listed in the
/// config, or one the route's CORS allows (the Host check still applies).
fn origin(config: &Config, cors: Option<&Cors>, headers: &HeaderMap) -> Result<(), Error> {
    let Some(value) = headers.get(header::ORIGIN) else {
        return Ok(());
    };
    let origin = value.to_str().map_err(|_| Error::OriginNotAllowed)?;
    if config.allowed_origins.iter().any(|o| o == origin) || cors.is_some_and(|c| c.allows(origin)) {
        return Ok(());
    }
    let authority = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
        .ok_or(Error::OriginNotAllowed)?;
    if is_loopback_host(hostname(authority)) {
        Ok(())
    } else {
        Err(Error::OriginNotAllowed)
    }
}

fn content_type(headers: &HeaderMap) -> Result<(), Error> {
    let ct = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let essence = ct.split(';').next().unwrap_or("").trim();
    if essence.eq_ignore_ascii_case("application/json") {
        Ok(())
    } else {
        Err(Error::UnsupportedMediaType)
    }
}

/// Whether the client listed `text/event-stream` in `Accept`.
pub fn accepts_sse(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("text/event-stream") || v.contains("*/*"))
}

/// The caller's identity for pooling: a digest of the bearer token, or "anonymous".
/// The token itself is never forwarded upstream.
pub fn principal(headers: &HeaderMap) -> String {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")));
    match token {
        None => "anonymous".into(),
        Some(t) => {
            let digest = Sha256::digest(t.trim().as_bytes());
            format!("b:{}", crate::seal::hex(&digest[..16]))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> Config {
        Config::single("http://127.0.0.1:1/mcp", "127.0.0.1:8080".parse().unwrap()).unwrap()
    }

    fn h(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.insert(*k, v.parse().unwrap());
        }
        m
    }

    #[test]
    fn the_hostname_of_an_authority() {
        for (authority, host) in [
            ("a:1", "a"),
            ("host", "host"),
            (":80", ""),
            ("", ""),
            ("[::1]:80", "[::1]"),
            ("[::1]", "[::1]"),
            ("[::1", "[::1"),
            ("[a]b]", "[a]"),
        ] {
            assert_eq!(hostname(authority), host, "{authority}");
        }
    }

    #[test]
    fn order_and_statuses() {
        let json = h(&[("content-type", "application/json; charset=utf-8"), ("host", "127.0.0.1:8080")]);
        assert!(check(&cfg(), None, &Method::POST, None, &json).is_ok());
        assert_eq!(check(&cfg(), None, &Method::GET, None, &json).unwrap_err().status(), 405);
        assert_eq!(check(&cfg(), None, &Method::DELETE, None, &json).unwrap_err().status(), 405);
        let text = h(&[("content-type", "text/plain"), ("host", "localhost")]);
        assert_eq!(check(&cfg(), None, &Method::POST, None, &text).unwrap_err().status(), 415);
    }

    #[test]
    fn dns_rebinding_is_refused() {
        let evil = h(&[
            ("content-type", "application/json"),
            ("host", "evil.example.com"),
            ("origin", "http://evil.example.com"),
        ]);
        assert_eq!(check(&cfg(), None, &Method::POST, None, &evil).unwrap_err().status(), 403);
        let evil_origin = h(&[
            ("content-type", "application/json"),
            ("host", "localhost"),
            ("origin", "http://evil.example.com"),
        ]);
        assert_eq!(check(&cfg(), None, &Method::POST, None, &evil_origin).unwrap_err().status(), 403);
        let local = h(&[
            ("content-type", "application/json"),
            ("host", "127.0.0.1:8080"),
            ("origin", "http://localhost:3000"),
        ]);
        assert!(check(&cfg(), None, &Method::POST, None, &local).is_ok());
        let v6 = h(&[("content-type", "application/json"), ("host", "[::1]:8080")]);
        assert!(check(&cfg(), None, &Method::POST, None, &v6).is_ok());
    }

    #[test]
    fn a_request_that_names_no_host_or_a_foreign_authority_is_refused() {
        let json = h(&[("content-type", "application/json")]);
        assert_eq!(
            check(&cfg(), None, &Method::POST, None, &json).unwrap_err().status(),
            403,
            "no Host at all"
        );
        let local: Authority = "127.0.0.1:8080".parse().unwrap();
        assert!(check(&cfg(), None, &Method::POST, Some(&local), &json).is_ok(), "h2 :authority");
        let evil: Authority = "evil.example.com".parse().unwrap();
        assert_eq!(check(&cfg(), None, &Method::POST, Some(&evil), &json).unwrap_err().status(), 403);
        let with_host = h(&[("content-type", "application/json"), ("host", "localhost")]);
        assert_eq!(
            check(&cfg(), None, &Method::POST, Some(&evil), &with_host).unwrap_err().status(),
            403,
            "an allowed Host does not excuse a foreign :authority"
        );
        let v6: Authority = "[::1]:8080".parse().unwrap();
        assert!(check(&cfg(), None, &Method::POST, Some(&v6), &json).is_ok());
        let mut open = cfg();
        open.allowed_hosts = None;
        assert!(check(&open, None, &Method::POST, None, &json).is_ok(), "a public listener checks no host");
    }

    #[test]
    fn principals_are_digests() {
        let a = principal(&h(&[("authorization", "Bearer secret-token")]));
        assert!(a.starts_with("b:") && !a.contains("secret"));
        assert_eq!(principal(&HeaderMap::new()), "anonymous");
        assert_ne!(a, principal(&h(&[("authorization", "Bearer other")])));
    }
}
