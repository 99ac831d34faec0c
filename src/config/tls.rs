//! TLS material the routing file names (`[server.tls]`, `[cluster]`'s
//! `tls_*` keys), validated into plain values: the files' paths and what
//! they hold decoded from PEM to DER (certificates, a private key), and the
//! name owners' certificates must carry. Nothing here is a rustls object:
//! `crate::tls` builds the listener's certified key from a [`ServerTls`],
//! `crate::cluster::tls` the internal listener's and the forwarder's
//! configurations from a [`ClusterTls`].

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use super::file::{self, Kind};
use super::raw;
use super::{at, ConfigError, Outside};

/// `[server.tls]`: the listener's certificate chain and key.
#[derive(Clone)]
pub struct ServerTls {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// Leaf first; at least one.
    pub chain: Vec<CertificateDer<'static>>,
    pub key: Arc<PrivateKeyDer<'static>>,
}

impl ServerTls {
    /// Reads and decodes the pair's files (what a reload of the pair alone
    /// reads too); errors name the key and the file, never what it holds.
    pub fn read(cert_file: &Path, key_file: &Path) -> Result<ServerTls, String> {
        Ok(ServerTls {
            chain: certificates("cert_file", cert_file)?,
            key: Arc::new(private_key("key_file", key_file)?),
            cert_file: cert_file.into(),
            key_file: key_file.into(),
        })
    }
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("cert_file", &self.cert_file)
            .field("key_file", &self.key_file)
            .finish_non_exhaustive()
    }
}

/// `[cluster]` TLS: this replica's chain and key, and the CA that other
/// replicas' certificates are verified against.
#[derive(Clone)]
pub struct ClusterTls {
    pub cert_file: PathBuf,
    pub ca_file: PathBuf,
    pub chain: Vec<CertificateDer<'static>>,
    pub key: Arc<PrivateKeyDer<'static>>,
    /// At least one.
    pub ca: Vec<CertificateDer<'static>>,
    /// The name owners' certificates must carry; `None`: the advertised host.
    pub server_name: Option<ServerName<'static>>,
}

impl std::fmt::Debug for ClusterTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterTls")
            .field("cert_file", &self.cert_file)
            .field("ca_file", &self.ca_file)
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

/// The certificates of a PEM file (at least one); `key` names it in errors.
pub fn certificates(key: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let pem = file::read(path, Kind::Tls).map_err(|e| format!("{key} {e}"))?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{key} {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{key} {}: no certificate", path.display()));
    }
    Ok(certs)
}

/// The private key of a PEM file; `key` names it in errors.
pub fn private_key(key: &str, path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    let pem = file::read(path, Kind::Tls).map_err(|e| format!("{key} {e}"))?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| format!("{key} {}: no private key ({e})", path.display()))
}

/// `[server.tls]`: `None` when a file is missing and `outside` does not
/// require it (`check-config`).
pub(super) fn server(
    t: &raw::RawServerTls,
    text: &str,
    outside: &Outside,
) -> Result<Option<ServerTls>, ConfigError> {
    let err = |e: String| ConfigError(format!("{}server.tls: {e}", at(text, "cert_file")));
    let cert = outside.file("listener TLS certificate (server.tls.cert_file)", &t.cert_file);
    let cert = cert.map_err(|e| err(format!("cert_file {e}")))?;
    let key = outside.file("listener TLS key (server.tls.key_file)", &t.key_file);
    let key = key.map_err(|e| err(format!("key_file {e}")))?;
    if !(cert && key) {
        return Ok(None);
    }
    ServerTls::read(Path::new(&t.cert_file), Path::new(&t.key_file)).map(Some).map_err(err)
}

/// `[cluster]` TLS: all three files or none; `tls_server_name` only with them.
pub(super) fn cluster(
    c: &raw::RawCluster,
    text: &str,
    outside: &Outside,
) -> Result<Option<ClusterTls>, ConfigError> {
    let err = |e: String| ConfigError(format!("{}cluster TLS: {e}", at(text, "tls_")));
    let files = [
        ("tls_cert_file", &c.tls_cert_file),
        ("tls_key_file", &c.tls_key_file),
        ("tls_ca_file", &c.tls_ca_file),
    ];
    let missing: Vec<&str> = files.iter().filter(|(_, v)| v.is_none()).map(|(k, _)| *k).collect();
    let (Some(cert), Some(key), Some(ca)) = (&c.tls_cert_file, &c.tls_key_file, &c.tls_ca_file) else {
        if missing.len() == files.len() && c.tls_server_name.is_none() {
            return Ok(None);
        }
        return Err(ConfigError(format!(
            "{}cluster TLS needs tls_cert_file, tls_key_file and tls_ca_file together; missing: {}",
            at(text, "tls_"),
            missing.join(", ")
        )));
    };
    let server_name = c
        .tls_server_name
        .as_deref()
        .map(|n| {
            ServerName::try_from(n.to_string())
                .map_err(|_| err(format!("tls_server_name `{n}` is not a DNS name or IP address")))
        })
        .transpose()?;
    let mut all_there = true;
    let files =
        [("tls_cert_file", "certificate", cert), ("tls_key_file", "key", key), ("tls_ca_file", "CA", ca)];
    for (name, what, path) in files {
        let what = format!("cluster TLS {what} ({name})");
        all_there &= outside.file(&what, path).map_err(|e| err(format!("{name} {e}")))?;
    }
    if !all_there {
        return Ok(None);
    }
    Ok(Some(ClusterTls {
        chain: certificates("tls_cert_file", Path::new(cert)).map_err(err)?,
        key: Arc::new(private_key("tls_key_file", Path::new(key)).map_err(err)?),
        ca: certificates("tls_ca_file", Path::new(ca)).map_err(err)?,
        cert_file: cert.into(),
        ca_file: ca.into(),
        server_name,
    }))
}
