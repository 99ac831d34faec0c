//! What the gateway adds to every request it sends one upstream: the
//! upstream's own headers (an API key, read from the environment or a file
//! when the gateway starts, never from the routing file), and, for an
//! upstream that is itself the resource server a client's token was issued
//! for, that client's `Authorization` (opt-in, per request: the request's
//! task carries it in [`CLIENT_TOKEN`], so nothing pooled or background
//! ever holds it).
//!
//! Values are [`Secret`]s: redacted in `Debug`, marked sensitive, and never
//! named in an error (only the header's name and where the value was to
//! come from).

use std::sync::Arc;

use http::HeaderName;

use crate::config::Upstream;

pub use crate::config::secret::{refused_name, Secret};

/// An upstream's added headers, their values read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Credentials {
    headers: Arc<[(HeaderName, Secret)]>,
    /// Whether the client's verified token goes to this upstream.
    forward: bool,
}

impl Credentials {
    /// Reads every configured value of `upstream` (when the gateway starts):
    /// errors name the upstream, the header and the variable or file, never a value.
    pub fn load(upstream: &Upstream) -> Result<Credentials, String> {
        let headers = upstream
            .headers
            .iter()
            .map(|h| {
                let err = |why: String| format!("upstream `{}`: header {}: {why}", upstream.name, h.name);
                let raw = h.source.read(crate::config::file::Kind::Secret).map_err(err)?;
                let value = Secret::new(&raw).map_err(|why| err(format!("the value {why}")))?;
                Ok((h.name.clone(), value))
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(Credentials { headers: headers.into(), forward: upstream.forward_authorization.is_some() })
    }

    /// `headers` followed by the added ones, as the h1 client writes them.
    /// Without added headers or a token to send, `headers` as they are
    /// (no copy on the request path).
    pub fn add<'a>(
        &'a self,
        headers: &'a [(&'a str, &'a str)],
        token: Option<&'a Secret>,
    ) -> std::borrow::Cow<'a, [(&'a str, &'a str)]> {
        let token = token.filter(|_| self.forward);
        if self.headers.is_empty() && token.is_none() {
            return std::borrow::Cow::Borrowed(headers);
        }
        let mut all = Vec::with_capacity(headers.len() + self.headers.len() + 1);
        all.extend_from_slice(headers);
        all.extend(self.headers.iter().map(|(n, v)| (n.as_str(), v.as_str())));
        if let Some(token) = token {
            all.push(("authorization", token.as_str()));
        }
        std::borrow::Cow::Owned(all)
    }

    pub fn forwards(&self) -> bool {
        self.forward
    }
}

/// A client request's token, forwarded, and whether an upstream refused it.
#[derive(Debug)]
pub struct Forwarded {
    pub token: Secret,
    refused: std::sync::atomic::AtomicBool,
}

impl Forwarded {
    pub fn new(token: Secret) -> Arc<Forwarded> {
        Arc::new(Forwarded { token, refused: Default::default() })
    }

    /// An upstream answered 401 or 403 to it.
    pub fn refuse(&self) {
        self.refused.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn refused(&self) -> bool {
        self.refused.load(std::sync::atomic::Ordering::Relaxed)
    }
}

tokio::task_local! {
    /// The `Authorization` of the client request this task serves, set only
    /// on a route whose upstream takes it (see [`crate::server`]).
    pub static CLIENT_TOKEN: Option<Arc<Forwarded>>;
}

/// Runs `work` without the client's token: for what is fetched once and
/// shared by every caller of a route (probes, a discover result, tool annotations).
pub async fn without_client_token<F: std::future::Future>(work: F) -> F::Output {
    CLIENT_TOKEN.scope(None, work).await
}

/// The client's token for the request this task serves, if it is forwarded.
pub fn client_token() -> Option<Arc<Forwarded>> {
    CLIENT_TOKEN.try_with(Clone::clone).ok().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_checked_and_never_shown() {
        let s = Secret::new(" Bearer abc.def \n").unwrap();
        assert_eq!(s.as_str(), "Bearer abc.def");
        assert_eq!(format!("{s:?}"), "Secret(<redacted>)");
        assert!(Secret::new("a\r\nx: y").is_err());
        assert!(Secret::new("").is_err());
        assert!(Secret::new("caf\u{e9}").is_err());
    }

    #[test]
    fn framing_hop_by_hop_and_mcp_headers_are_refused() {
        for n in ["host", "content-length", "connection", "transfer-encoding", "mcp-session-id", "mcp-method"]
        {
            assert!(refused_name(&HeaderName::from_static(n)), "{n}");
        }
        for n in ["x-api-key", "authorization", "cookie"] {
            assert!(!refused_name(&HeaderName::from_static(n)), "{n}");
        }
    }
}
