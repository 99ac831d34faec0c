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

/// The Host rule of the gateway's own pages (`/status`, `/metrics`), on
/// any listener: every name the request gives (and it gives one) is in
/// `allowed_hosts` when the file sets it, else a loopback name (`localhost`,
/// `127.x.y.z`, `[::1]`); either way the address the connection came in on
/// (`local`: the listen address, or a wildcard listener's interface) is
/// accepted too. An IP literal cannot be rebound, so a browser sends it only
/// to pages of that very origin; a name (`evil.example` resolving to this
/// host) is what DNS rebinding uses, and is refused.
pub fn ops_host(
    config: &Config,
    authority: Option<&Authority>,
    headers: &HeaderMap,
    local: std::net::IpAddr,
) -> Result<(), Error> {
    let allowed = |authority: &str| {
        let host = hostname(authority);
        let literal = host.trim_start_matches('[').trim_end_matches(']');
        let is_local =
            literal.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.to_canonical() == local.to_canonical());
        is_local
            || match &config.ops_hosts {
                Some(list) => list.iter().any(|a| a.eq_ignore_ascii_case(host)),
                None => {
                    host.eq_ignore_ascii_case("localhost")
                        || literal.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
                }
            }
    };
    let mut named = false;
    if let Some(authority) = authority {
        named = true;
        if !allowed(authority.as_str()) {
            return Err(Error::HostNotAllowed);
        }
    }
    for value in headers.get_all(header::HOST) {
        named = true;
        if !value.to_str().is_ok_and(allowed) {
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
    fn the_gateway_pages_host_rule() {
        let loopback: std::net::IpAddr = "127.0.0.1".parse().unwrap();
        let host = |v: &str| h(&[("host", v)]);
        let mut wildcard = cfg();
        wildcard.listen = "0.0.0.0:8080".parse().unwrap();
        wildcard.allowed_hosts = None;
        for c in [cfg(), wildcard] {
            for ok in ["localhost", "LOCALHOST:8080", "127.0.0.1:8080", "127.0.0.2", "[::1]:8080"] {
                assert!(ops_host(&c, None, &host(ok), loopback).is_ok(), "{ok}");
            }
            for refused in ["evil.example", "evil.example:8080", "10.0.0.5:8080", "localhost.evil.example"] {
                assert!(ops_host(&c, None, &host(refused), loopback).is_err(), "{refused}");
            }
            assert!(ops_host(&c, None, &HeaderMap::new(), loopback).is_err(), "no host named");
            // A wildcard listener reached on an interface address: that address, as a literal.
            let pod: std::net::IpAddr = "10.0.0.5".parse().unwrap();
            assert!(ops_host(&c, None, &host("10.0.0.5:8080"), pod).is_ok());
            assert!(ops_host(&c, None, &host("10.0.0.6:8080"), pod).is_err());
            let v4_mapped: std::net::IpAddr = "::ffff:10.0.0.5".parse().unwrap();
            assert!(ops_host(&c, None, &host("10.0.0.5"), v4_mapped).is_ok());
            let evil: Authority = "evil.example".parse().unwrap();
            assert!(
                ops_host(&c, Some(&evil), &host("localhost"), loopback).is_err(),
                ":authority checked too"
            );
        }
        let mut listed = cfg();
        listed.ops_hosts = Some(vec!["gw.example".into()]);
        assert!(ops_host(&listed, None, &host("gw.example:443"), loopback).is_ok());
        assert!(
            ops_host(&listed, None, &host("localhost"), loopback).is_err(),
            "the list replaces loopback names"
        );
        assert!(
            ops_host(&listed, None, &host("127.0.0.1"), loopback).is_ok(),
            "the connection's own address"
        );
    }

    #[test]
    fn principals_are_digests() {
        let a = principal(&h(&[("authorization", "Bearer secret-token")]));
        assert!(a.starts_with("b:") && !a.contains("secret"));
        assert_eq!(principal(&HeaderMap::new()), "anonymous");
        assert_ne!(a, principal(&h(&[("authorization", "Bearer other")])));
    }
}
