//! Cluster mode: a retry whose flow is parked on another replica is forwarded
//! to that replica's internal listener, authenticated with a shared secret
//! (separate from the sealing keys), and its answer relayed back unchanged.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use subtle::ConstantTimeEq;

use crate::config::Cluster;
use crate::reply::{Body, BoxError};

/// The internal listener's one endpoint.
pub const RETRY_PATH: &str = "/internal/v1/retry";
pub const SECRET_HEADER: &str = "x-sessionless-secret";
pub const ROUTE_HEADER: &str = "x-sessionless-route";
pub const PRINCIPAL_HEADER: &str = "x-sessionless-principal";
/// Set on the internal listener's own refusals, so that the forwarding
/// replica can tell them from the owner's answer to the client.
pub const REFUSED_HEADER: &str = "x-sessionless-refused";

/// Why a retry could not be handed to its owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForwardError {
    /// Nothing answers at the owner's address (gone, restarted elsewhere).
    OwnerGone,
    /// The owner's internal listener refused the request (wrong secret, unknown route).
    Refused,
    /// The owner accepted the retry but its answer broke off.
    Broken,
}

pub struct Forwarder {
    http: Client<HttpConnector, Full<Bytes>>,
    /// This replica's own internal address, sealed into the states it issues.
    advertise: String,
    secret: HeaderValue,
    /// Time allowed for the owner's answer to start.
    timeout: Duration,
}

impl Forwarder {
    pub fn new(cluster: &Cluster, timeout: Duration) -> Forwarder {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(cluster.connect_timeout));
        connector.set_nodelay(true);
        let http =
            Client::builder(TokioExecutor::new()).pool_idle_timeout(Duration::from_secs(30)).build(connector);
        let mut secret = HeaderValue::from_bytes(&hex(&cluster.secret)).expect("hex is a valid header value");
        secret.set_sensitive(true);
        Forwarder { http, advertise: cluster.advertise.clone(), secret, timeout }
    }

    pub fn advertise(&self) -> &str {
        &self.advertise
    }

    /// Sends the retry (`headers`, `body`) to the replica at `owner` and
    /// returns its answer, to be relayed to the client as it is.
    pub async fn forward(
        &self,
        owner: &str,
        route: &str,
        principal: &str,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Result<Response<Body>, ForwardError> {
        let uri = format!("http://{owner}{RETRY_PATH}");
        let mut req = Request::post(uri).body(Full::new(body)).map_err(|_| ForwardError::Refused)?;
        let h = req.headers_mut();
        let mcp = headers.iter().filter(|(k, _)| crate::bridge::legacy::Caller::is_mcp_header(k));
        h.extend(mcp.map(|(k, v)| (k.clone(), v.clone())));
        h.insert(SECRET_HEADER, self.secret.clone());
        h.insert(ROUTE_HEADER, HeaderValue::from_str(route).map_err(|_| ForwardError::Refused)?);
        h.insert(PRINCIPAL_HEADER, HeaderValue::from_str(principal).map_err(|_| ForwardError::Refused)?);
        let resp = match tokio::time::timeout(self.timeout, self.http.request(req)).await {
            Err(_) => return Err(ForwardError::Broken),
            Ok(Err(e)) if e.is_connect() => return Err(ForwardError::OwnerGone),
            Ok(Err(_)) => return Err(ForwardError::Broken),
            Ok(Ok(resp)) => resp,
        };
        if resp.headers().contains_key(REFUSED_HEADER) {
            return Err(ForwardError::Refused);
        }
        let (parts, body) = resp.into_parts();
        let mut out = Response::new(body.map_err(|e| Box::new(e) as BoxError).boxed());
        *out.status_mut() = parts.status;
        for name in ["content-type", "cache-control", "x-accel-buffering", "retry-after"] {
            if let Some(v) = parts.headers.get(name) {
                out.headers_mut().insert(name, v.clone());
            }
        }
        Ok(out)
    }
}

/// Whether a request to the internal listener carries the cluster secret.
pub fn authorized(headers: &HeaderMap, secret: &[u8]) -> bool {
    let expected = hex(secret);
    headers.get(SECRET_HEADER).is_some_and(|v| v.as_bytes().ct_eq(&expected).into())
}

/// The internal listener's refusal: plain status, marked so it is never relayed.
pub fn refusal(status: StatusCode) -> Response<Body> {
    let mut resp = crate::reply::empty(status);
    resp.headers_mut().insert(REFUSED_HEADER, HeaderValue::from_static("1"));
    resp
}

fn hex(bytes: &[u8]) -> Vec<u8> {
    bytes.iter().flat_map(|b| format!("{b:02x}").into_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_secret_is_checked() {
        let mut h = HeaderMap::new();
        assert!(!authorized(&h, b"0123456789abcdef"));
        h.insert(SECRET_HEADER, HeaderValue::from_bytes(&hex(b"0123456789abcdef")).unwrap());
        assert!(authorized(&h, b"0123456789abcdef"));
        assert!(!authorized(&h, b"0123456789abcdeF"));
    }
}
