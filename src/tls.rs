//! TLS on the public listener (`[server.tls]`): the certified key built
//! from the chain and key the configuration read ([`crate::config::ServerTls`]),
//! served through [`Certs`], a certificate resolver whose pair can be
//! swapped while connections are accepted (a reload: [`Certs::swap`] with
//! the next generation's pair, or [`Certs::reload`], which reads the files
//! again and keeps the old pair when the new files do not load). ALPN
//! offers h2 and http/1.1; the handshake runs in the connection's task,
//! bounded like the internal listener's (`cluster::tls::accept`).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio_rustls::TlsAcceptor;

use crate::config;

/// The listener's pair, built: where it came from, and the certified key.
#[derive(Clone)]
pub struct ServerTls {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    pub certified: Arc<CertifiedKey>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("cert_file", &self.cert_file)
            .field("key_file", &self.key_file)
            .finish_non_exhaustive()
    }
}

impl ServerTls {
    /// Builds the certified key (the key must match the certificate);
    /// errors name the keys, never what the files hold.
    pub fn build(tls: &config::ServerTls) -> Result<ServerTls, String> {
        let provider = rustls::crypto::ring::default_provider();
        let certified = CertifiedKey::from_der(tls.chain.clone(), tls.key.clone_key(), &provider)
            .map_err(|e| format!("server.tls: cert_file/key_file: {e}"))?;
        Ok(ServerTls {
            cert_file: tls.cert_file.clone(),
            key_file: tls.key_file.clone(),
            certified: Arc::new(certified),
        })
    }

    /// Reads the files and builds the pair.
    pub fn load(cert_file: &std::path::Path, key_file: &std::path::Path) -> Result<ServerTls, String> {
        let read = config::ServerTls::read(cert_file, key_file).map_err(|e| format!("server.tls: {e}"))?;
        ServerTls::build(&read)
    }
}

/// The certificate the public listener serves, swappable.
#[derive(Debug)]
pub struct Certs {
    current: ArcSwap<CertifiedKey>,
    /// The files [`Certs::reload`] reads.
    files: Mutex<(PathBuf, PathBuf)>,
}

impl Certs {
    pub fn new(tls: &ServerTls) -> Arc<Certs> {
        Arc::new(Certs {
            current: ArcSwap::new(tls.certified.clone()),
            files: Mutex::new((tls.cert_file.clone(), tls.key_file.clone())),
        })
    }

    /// Serves `tls`'s pair from the next handshake on (connections already
    /// open keep theirs).
    pub fn swap(&self, tls: &ServerTls) {
        *self.files.lock().unwrap_or_else(|e| e.into_inner()) = (tls.cert_file.clone(), tls.key_file.clone());
        self.current.store(tls.certified.clone());
    }

    /// Reads the files again; on an error the pair served so far stays.
    pub fn reload(&self) -> Result<(), String> {
        let (cert, key) = self.files.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let tls = ServerTls::load(&cert, &key)?;
        self.current.store(tls.certified);
        Ok(())
    }

    /// The listener's acceptor: TLS 1.2 and 1.3, ALPN h2 then http/1.1.
    pub fn acceptor(self: &Arc<Certs>) -> TlsAcceptor {
        let mut config =
            rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .expect("ring supports the default protocol versions")
                .with_no_client_auth()
                .with_cert_resolver(self.clone());
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        TlsAcceptor::from(Arc::new(config))
    }
}

impl ResolvesServerCert for Certs {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(dir: &std::path::Path, name: &str) -> (PathBuf, PathBuf) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec![name.to_string()]).unwrap().self_signed(&key).unwrap();
        let (c, k) = (dir.join("cert.pem"), dir.join("key.pem"));
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        (c, k)
    }

    #[test]
    fn a_reload_that_fails_keeps_the_pair_served() {
        let dir = std::env::temp_dir().join(format!("sessionless-unit-server-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (c, k) = pair(&dir, "one.test");
        let tls = ServerTls::load(&c, &k).unwrap();
        assert!(!format!("{tls:?}").contains("BEGIN"), "no key material in Debug");
        let certs = Certs::new(&tls);
        let before = certs.current.load_full().cert[0].clone();
        std::fs::write(&k, "not a key").unwrap();
        let err = certs.reload().unwrap_err();
        assert!(err.contains("key_file") && !err.contains("not a key"), "{err}");
        assert_eq!(certs.current.load_full().cert[0], before);
        pair(&dir, "two.test");
        certs.reload().unwrap();
        assert_ne!(certs.current.load_full().cert[0], before);
        assert!(ServerTls::load(&c, &c).is_err(), "a certificate given as the key is refused");
        let old_key = std::fs::read(&k).unwrap();
        pair(&dir, "three.test");
        std::fs::write(&k, old_key).unwrap();
        assert!(ServerTls::load(&c, &k).unwrap_err().contains("cert_file/key_file"), "a key of another pair");
        std::fs::remove_dir_all(&dir).ok();
    }
}
