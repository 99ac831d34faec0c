//! TLS between replicas (optional): the internal listener serves the
//! configured certificate, and a forwarding replica verifies the owner's
//! certificate against the configured CA before anything is sent.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::config;

/// Time a connection to the internal listener gets to finish its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// TLS between replicas, built from what `[cluster]` names ([`config::ClusterTls`]).
#[derive(Clone)]
pub struct ClusterTls {
    /// The internal listener's certificate and key.
    pub server: Arc<rustls::ServerConfig>,
    /// Verifies owners against the configured CA.
    pub client: Arc<rustls::ClientConfig>,
    /// The name owners' certificates must carry; `None`: the advertised host.
    pub server_name: Option<rustls::pki_types::ServerName<'static>>,
}

impl ClusterTls {
    /// The internal listener's and the forwarder's configurations (once,
    /// when the gateway starts); errors name the keys and files.
    pub fn build(tls: &config::ClusterTls) -> Result<ClusterTls, String> {
        let server = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_no_client_auth()
            .with_single_cert(tls.chain.clone(), tls.key.clone_key())
            .map_err(|e| format!("cluster TLS: tls_cert_file/tls_key_file: {e}"))?;
        let mut roots = rustls::RootCertStore::empty();
        for der in &tls.ca {
            roots
                .add(der.clone())
                .map_err(|e| format!("cluster TLS: tls_ca_file {}: {e}", tls.ca_file.display()))?;
        }
        let client = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(ClusterTls {
            server: Arc::new(server),
            client: Arc::new(client),
            server_name: tls.server_name.clone(),
        })
    }
}

pub fn acceptor(tls: &ClusterTls) -> TlsAcceptor {
    TlsAcceptor::from(tls.server.clone())
}

/// The server side of a TLS connection (the internal listener, or the
/// public one with `[server.tls]`): `None` (logged)
/// if the handshake fails or takes longer than [`HANDSHAKE_TIMEOUT`].
pub async fn accept(tls: &TlsAcceptor, tcp: TcpStream) -> Option<tokio_rustls::server::TlsStream<TcpStream>> {
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.accept(tcp)).await {
        Ok(Ok(stream)) => Some(stream),
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "TLS handshake failed");
            None
        }
        Err(_) => {
            tracing::debug!("TLS handshake timed out");
            None
        }
    }
}

/// The TLS handshake with an owner failed (wrong CA, wrong name, not TLS):
/// a misconfiguration, never a sign the owner is gone.
#[derive(Debug, thiserror::Error)]
#[error("TLS handshake with the owner replica failed: {0}")]
pub struct HandshakeFailed(io::Error);

/// Connects to owners: TCP (hyper-util's connector: resolution, timeout,
/// nodelay), then TLS when configured.
#[derive(Clone)]
pub struct Connector {
    tcp: HttpConnector,
    tls: Option<(TlsConnector, Option<ServerName<'static>>)>,
}

impl Connector {
    pub fn new(mut tcp: HttpConnector, tls: Option<&ClusterTls>) -> Connector {
        tcp.enforce_http(tls.is_none());
        Connector { tcp, tls: tls.map(|t| (TlsConnector::from(t.client.clone()), t.server_name.clone())) }
    }

    pub fn scheme(&self) -> &'static str {
        if self.tls.is_some() {
            "https"
        } else {
            "http"
        }
    }
}

type ConnectFuture = Pin<Box<dyn Future<Output = Result<TokioIo<Stream>, crate::reply::BoxError>> + Send>>;

impl tower_service::Service<Uri> for Connector {
    type Response = TokioIo<Stream>;
    type Error = crate::reply::BoxError;
    type Future = ConnectFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.tcp.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let tls = self.tls.clone();
        let host = uri.host().unwrap_or_default().trim_start_matches('[').trim_end_matches(']').to_string();
        let connecting = self.tcp.call(uri);
        Box::pin(async move {
            let tcp = connecting.await?.into_inner();
            let Some((tls, name)) = tls else { return Ok(TokioIo::new(Stream::Plain(tcp))) };
            let name = match name {
                Some(name) => name,
                None => ServerName::try_from(host).map_err(|e| HandshakeFailed(io::Error::other(e)))?,
            };
            let stream = tls.connect(name, tcp).await.map_err(HandshakeFailed)?;
            Ok(TokioIo::new(Stream::Tls(Box::new(stream))))
        })
    }
}

/// A connection to an owner, plain or TLS.
pub enum Stream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl Connection for Stream {
    fn connected(&self) -> Connected {
        match self {
            Stream::Plain(s) => s.connected(),
            Stream::Tls(s) => s.get_ref().0.connected(),
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// Whether `e` (a client error) comes from a failed handshake with the owner.
pub fn handshake_failed(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(e);
    while let Some(e) = source {
        if e.is::<HandshakeFailed>() {
            return true;
        }
        source = e.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A certificate for 127.0.0.1 signed by a fresh CA, written to a directory of its own.
    fn files(tag: &str) -> (String, String, String) {
        let dir = std::env::temp_dir().join(format!("sessionless-unit-tls-{}-{tag}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = ca.self_signed(&ca_key).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])
            .unwrap()
            .signed_by(&key, &ca, &ca_key)
            .unwrap();
        let path = |name: &str, pem: String| {
            let p = dir.join(name);
            std::fs::write(&p, pem).unwrap();
            p.display().to_string()
        };
        (path("cert.pem", cert.pem()), path("key.pem", key.serialize_pem()), path("ca.pem", ca.pem()))
    }

    /// What `[cluster]` names, read, then built.
    fn load(cert: &str, key: &str, ca: &str, server_name: Option<&str>) -> Result<ClusterTls, String> {
        use std::path::Path;
        let tls = config::ClusterTls {
            chain: config::tls::certificates("tls_cert_file", Path::new(cert))?,
            key: std::sync::Arc::new(config::tls::private_key("tls_key_file", Path::new(key))?),
            ca: config::tls::certificates("tls_ca_file", Path::new(ca))?,
            cert_file: cert.into(),
            ca_file: ca.into(),
            server_name: server_name
                .map(|n| ServerName::try_from(n.to_string()).map_err(|_| format!("tls_server_name `{n}`")))
                .transpose()?,
        };
        ClusterTls::build(&tls)
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_that_never_finishes_its_handshake_is_dropped_at_the_timeout() {
        let (cert, key, ca) = files("timeout");
        let acceptor = acceptor(&load(&cert, &key, &ca, None).unwrap());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let _silent = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (tcp, _) = listener.accept().await.unwrap();
        let started = tokio::time::Instant::now();
        assert!(accept(&acceptor, tcp).await.is_none());
        assert_eq!(started.elapsed(), HANDSHAKE_TIMEOUT);
    }

    #[test]
    fn files_that_are_not_what_they_should_be_are_named() {
        let (cert, key, ca) = files("names");
        let err = |r: Result<ClusterTls, String>| r.err().expect("refused");
        assert!(err(load("/nonexistent/cert.pem", &key, &ca, None))
            .contains("tls_cert_file /nonexistent/cert.pem"));
        assert!(err(load(&cert, &cert, &ca, None)).contains("tls_key_file"));
        assert!(err(load(&cert, &key, &key, None)).contains("tls_ca_file"));
        assert!(load(&cert, &key, &ca, Some("replica.internal")).unwrap().server_name.is_some());
    }

    #[test]
    fn only_handshake_failures_are_told_apart() {
        let failed = HandshakeFailed(io::Error::other("bad certificate"));
        let wrapped: Box<dyn std::error::Error + Send + Sync> = Box::new(failed);
        assert!(handshake_failed(wrapped.as_ref()));
        assert!(!handshake_failed(&io::Error::other("connection refused")));
    }
}
