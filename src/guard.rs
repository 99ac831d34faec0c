//! The checks every request to an MCP endpoint passes before its body is read:
//! HTTP method, Host and Origin (DNS-rebinding protection), content type.
//! Each is one small function; `check` runs them in order.

use http::{header, HeaderMap, Method};
use sha2::{Digest, Sha256};

use crate::config::Config;
use crate::error::Error;

pub fn check(config: &Config, method: &Method, headers: &HeaderMap) -> Result<(), Error> {
    http_method(method)?;
    host(config, headers)?;
    origin(config, headers)?;
    content_type(headers)
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
    if authority.starts_with('[') {
        return authority.split_inclusive(']').next().unwrap_or(authority);
    }
    authority.split(':').next().unwrap_or(authority)
}

fn is_loopback_host(h: &str) -> bool {
    matches!(h, "localhost" | "127.0.0.1" | "[::1]")
}

fn host(config: &Config, headers: &HeaderMap) -> Result<(), Error> {
    let Some(allowed) = &config.allowed_hosts else {
        return Ok(());
    };
    let Some(value) = headers.get(header::HOST) else {
        return Ok(());
    };
    let h = value.to_str().map(hostname).map_err(|_| Error::HostNotAllowed)?;
    if allowed.iter().any(|a| a.eq_ignore_ascii_case(h)) {
        Ok(())
    } else {
        Err(Error::HostNotAllowed)
    }
}

/// An `Origin` that is present must be a loopback origin or listed in the config.
fn origin(config: &Config, headers: &HeaderMap) -> Result<(), Error> {
    let Some(value) = headers.get(header::ORIGIN) else {
        return Ok(());
    };
    let origin = value.to_str().map_err(|_| Error::OriginNotAllowed)?;
    if config.allowed_origins.iter().any(|o| o == origin) {
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
            let mut s = String::with_capacity(34);
            s.push_str("b:");
            for b in &digest[..16] {
                s.push_str(&format!("{b:02x}"));
            }
            s
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
    fn order_and_statuses() {
        let json = h(&[("content-type", "application/json; charset=utf-8")]);
        assert!(check(&cfg(), &Method::POST, &json).is_ok());
        assert_eq!(check(&cfg(), &Method::GET, &json).unwrap_err().status(), 405);
        assert_eq!(check(&cfg(), &Method::DELETE, &json).unwrap_err().status(), 405);
        let text = h(&[("content-type", "text/plain")]);
        assert_eq!(check(&cfg(), &Method::POST, &text).unwrap_err().status(), 415);
    }

    #[test]
    fn dns_rebinding_is_refused() {
        let evil = h(&[
            ("content-type", "application/json"),
            ("host", "evil.example.com"),
            ("origin", "http://evil.example.com"),
        ]);
        assert_eq!(check(&cfg(), &Method::POST, &evil).unwrap_err().status(), 403);
        let evil_origin = h(&[("content-type", "application/json"), ("origin", "http://evil.example.com")]);
        assert_eq!(check(&cfg(), &Method::POST, &evil_origin).unwrap_err().status(), 403);
        let local = h(&[
            ("content-type", "application/json"),
            ("host", "127.0.0.1:8080"),
            ("origin", "http://localhost:3000"),
        ]);
        assert!(check(&cfg(), &Method::POST, &local).is_ok());
        let v6 = h(&[("content-type", "application/json"), ("host", "[::1]:8080")]);
        assert!(check(&cfg(), &Method::POST, &v6).is_ok());
    }

    #[test]
    fn principals_are_digests() {
        let a = principal(&h(&[("authorization", "Bearer secret-token")]));
        assert!(a.starts_with("b:") && !a.contains("secret"));
        assert_eq!(principal(&HeaderMap::new()), "anonymous");
        assert_ne!(a, principal(&h(&[("authorization", "Bearer other")])));
    }
}
