//! Cluster-mode replicas for the tests. Each replica is a `sessionless::run`
//! in a Tokio runtime of its own, so that it can be *killed* (its runtime
//! dropped: no drain, nothing declined upstream, every socket closed, as with
//! `kill -9`) as well as stopped gracefully.
//!
//! ```ignore
//! let env = ClusterEnv::new("forwarded");
//! let a = Replica::start(&env.replica("gw-a", up.url())).await;
//! let b = Replica::start(&env.replica("gw-b", up.url())).await;
//! ```

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use sessionless::cluster::sign::{self, Keys, Signed, NONCE_LEN};
use sessionless::{Config, Running};

use super::client::{self, HttpClient, ModernRequest, Reply, PATIENCE};

static NEXT_ENV: AtomicUsize = AtomicUsize::new(1);

/// A sealing key shared by the replicas of one test (32 bytes, base64url).
pub const KEY: &str = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";

/// An address on 127.0.0.1 nothing listens on (bound, then released).
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().unwrap().port()
}

/// The environment variables one test's replicas read their key and secret
/// from (unique names: tests run in parallel in one process).
pub struct ClusterEnv {
    pub key_env: String,
    pub secret_env: String,
    pub secret: String,
}

impl ClusterEnv {
    pub fn new(tag: &str) -> ClusterEnv {
        let n = NEXT_ENV.fetch_add(1, Ordering::SeqCst);
        let tag = tag.to_uppercase().replace(|c: char| !c.is_ascii_alphanumeric(), "_");
        let key_env = format!("SESSIONLESS_TEST_CLUSTER_KEY_{tag}_{n}");
        let secret_env = format!("SESSIONLESS_TEST_CLUSTER_SECRET_{tag}_{n}");
        let secret = format!("cluster secret of test {tag} {n}");
        std::env::set_var(&key_env, KEY);
        std::env::set_var(&secret_env, &secret);
        ClusterEnv { key_env, secret_env, secret }
    }

    /// The same key, another secret (a misconfigured replica).
    pub fn other_secret(&self) -> ClusterEnv {
        let n = NEXT_ENV.fetch_add(1, Ordering::SeqCst);
        let secret_env = format!("{}_OTHER_{n}", self.secret_env);
        let secret = format!("another cluster secret {n}");
        std::env::set_var(&secret_env, &secret);
        ClusterEnv { key_env: self.key_env.clone(), secret_env, secret }
    }

    /// A replica's configuration with a fresh internal port (advertised as it is).
    pub fn replica(&self, instance: &str, upstream_url: &str) -> ReplicaConfig {
        let port = free_port();
        ReplicaConfig {
            instance: instance.into(),
            internal_port: port,
            advertise: format!("127.0.0.1:{port}"),
            upstream_url: upstream_url.into(),
            command: None,
            key_env: self.key_env.clone(),
            secret_env: self.secret_env.clone(),
            drain_timeout_ms: 10_000,
            route_extra: String::new(),
            upstream_extra: String::new(),
            server_extra: String::new(),
            cluster_extra: String::new(),
            extra: String::new(),
        }
    }
}

/// One replica's routing file, written out by [`ReplicaConfig::toml`].
#[derive(Clone, Debug)]
pub struct ReplicaConfig {
    pub instance: String,
    pub internal_port: u16,
    /// `host:port` sealed into the states this replica issues.
    pub advertise: String,
    pub upstream_url: String,
    /// A stdio upstream's argv, written as `command` instead of `url`.
    pub command: Option<Vec<String>>,
    pub key_env: String,
    pub secret_env: String,
    pub drain_timeout_ms: u64,
    /// Lines added to the `[[routes]]` table (e.g. `continuity = "replay"`).
    pub route_extra: String,
    /// Lines added to the `[[upstreams]]` table.
    pub upstream_extra: String,
    /// Lines added to the `[server]` table.
    pub server_extra: String,
    /// Lines added to the `[cluster]` table.
    pub cluster_extra: String,
    /// Tables appended at the end (`[limits]`, …).
    pub extra: String,
}

impl ReplicaConfig {
    pub fn toml(&self) -> String {
        format!(
            r#"
[server]
listen = "127.0.0.1:0"
drain_timeout_ms = {drain}
{server_extra}

[[upstreams]]
name = "up"
{upstream}
{upstream_extra}

[[routes]]
path = "/mcp"
upstream = "up"
{route_extra}

[[keys]]
id = "k1"
env = "{key_env}"

[cluster]
instance_id = "{instance}"
internal_listen = "127.0.0.1:{port}"
advertise = "{advertise}"
secret_env = "{secret_env}"
{cluster_extra}
{extra}
"#,
            drain = self.drain_timeout_ms,
            server_extra = self.server_extra,
            upstream = match &self.command {
                Some(argv) => format!("command = {}", serde_json::to_string(argv).unwrap()),
                None => format!("url = \"{}\"", self.upstream_url),
            },
            upstream_extra = self.upstream_extra,
            route_extra = self.route_extra,
            key_env = self.key_env,
            instance = self.instance,
            port = self.internal_port,
            advertise = self.advertise,
            secret_env = self.secret_env,
            cluster_extra = self.cluster_extra,
            extra = self.extra,
        )
    }

    pub fn route(mut self, lines: &str) -> Self {
        self.route_extra.push_str(lines);
        self.route_extra.push('\n');
        self
    }

    pub fn upstream(mut self, lines: &str) -> Self {
        self.upstream_extra.push_str(lines);
        self.upstream_extra.push('\n');
        self
    }

    pub fn server(mut self, lines: &str) -> Self {
        self.server_extra.push_str(lines);
        self.server_extra.push('\n');
        self
    }

    pub fn cluster(mut self, lines: &str) -> Self {
        self.cluster_extra.push_str(lines);
        self.cluster_extra.push('\n');
        self
    }

    /// TLS on the internal link: this replica's certificate from `cert`,
    /// owners verified against `ca`'s CA.
    pub fn tls(self, cert: &TlsFiles, ca: &TlsFiles) -> Self {
        self.cluster(&format!(
            "tls_cert_file = \"{}\"\ntls_key_file = \"{}\"\ntls_ca_file = \"{}\"",
            cert.cert.display(),
            cert.key.display(),
            ca.ca.display()
        ))
    }

    /// A stdio upstream running `argv` instead of the HTTP one.
    pub fn command(mut self, argv: Vec<String>) -> Self {
        self.command = Some(argv);
        self
    }

    pub fn drain_ms(mut self, ms: u64) -> Self {
        self.drain_timeout_ms = ms;
        self
    }

    pub fn advertise(mut self, addr: &str) -> Self {
        self.advertise = addr.into();
        self
    }

    pub fn secret_from(mut self, env: &ClusterEnv) -> Self {
        self.secret_env = env.secret_env.clone();
        self
    }
}

/// A replica running in its own runtime; killed when dropped.
pub struct Replica {
    pub instance: String,
    /// The address sealed into its states (what signatures to it name).
    pub advertise: String,
    /// The internal listener's address (what the others forward to).
    pub internal: SocketAddr,
    addr: SocketAddr,
    running: Option<Running>,
    runtime: Option<tokio::runtime::Runtime>,
    client: HttpClient,
}

impl Drop for Replica {
    fn drop(&mut self) {
        if let Some(r) = &self.running {
            r.shutdown_token().cancel();
        }
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

impl Replica {
    pub async fn start(config: &ReplicaConfig) -> Replica {
        let text = config.toml();
        let parsed = Config::from_toml(&text).unwrap_or_else(|e| panic!("replica config: {e:?}\n{text}"));
        // The fakes are legacy servers: configured so, not probed, unless
        // the test names the generation itself.
        let parsed = if config.upstream_extra.contains("generation") {
            parsed
        } else {
            super::legacy_upstreams(parsed)
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name(format!("replica-{}", config.instance))
            .enable_all()
            .build()
            .expect("replica runtime");
        let running = runtime
            .spawn(sessionless::run(parsed))
            .await
            .expect("replica start task")
            .unwrap_or_else(|e| panic!("replica {} starts: {e}", config.instance));
        let internal = running.internal_addr.expect("cluster mode has an internal listener");
        assert_eq!(internal.port(), config.internal_port, "internal listener on the configured port");
        Replica {
            instance: config.instance.clone(),
            advertise: config.advertise.clone(),
            internal,
            addr: running.addr,
            running: Some(running),
            runtime: Some(runtime),
            client: client::http_client(),
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// A modern request to this replica's `/mcp`.
    pub fn request(&self, method: &str) -> ModernRequest {
        self.request_to("/mcp", method)
    }

    /// A modern request to this replica's `path`.
    pub fn request_to(&self, path: &str, method: &str) -> ModernRequest {
        ModernRequest::new(self.client.clone(), self.url(path), method)
    }

    /// Sends a hand-made request and reads the whole answer.
    pub async fn raw(&self, req: Request<Full<Bytes>>) -> Reply {
        Reply::read(client::send(&self.client, req).await).await
    }

    /// GET `path`: status and body text.
    pub async fn get(&self, path: &str) -> (StatusCode, String) {
        let req = Request::get(self.url(path)).body(Full::new(Bytes::new())).unwrap();
        let resp = client::send(&self.client, req).await;
        let status = resp.status();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    /// The sum of every sample of the metric `name`.
    pub async fn metric(&self, name: &str) -> f64 {
        let (status, text) = self.get("/metrics").await;
        assert_eq!(status, StatusCode::OK);
        super::metric_sum(&text, name)
    }

    /// The sum of the samples of `name` whose label set contains `label`.
    pub async fn metric_where(&self, name: &str, label: &str) -> f64 {
        let (_, text) = self.get("/metrics").await;
        text.lines()
            .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(label))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// Starts draining (as SIGTERM does) without waiting.
    pub fn begin_shutdown(&self) {
        if let Some(r) = &self.running {
            r.shutdown_token().cancel();
        }
    }

    /// Drains and stops gracefully; returns how long that took.
    pub async fn stop(mut self) -> Duration {
        let started = Instant::now();
        if let Some(r) = self.running.take() {
            tokio::time::timeout(PATIENCE * 3, r.shutdown()).await.expect("the replica stops in time");
        }
        started.elapsed()
    }

    /// Waits until the replica has stopped on its own (after
    /// [`Replica::begin_shutdown`]); returns how long that took, `None` if it
    /// was still running after `within`.
    pub async fn stopped_within(&mut self, within: Duration) -> Option<Duration> {
        let started = Instant::now();
        let running = self.running.take()?;
        let token = running.shutdown_token();
        let mut wait = Box::pin(running.wait());
        match tokio::time::timeout(within, &mut wait).await {
            Ok(()) => Some(started.elapsed()),
            Err(_) => {
                // Still running: make sure it does stop (the test fails anyway).
                token.cancel();
                None
            }
        }
    }

    /// Kills the replica: no drain, nothing declined upstream; its sockets close.
    pub async fn kill(mut self) {
        if let Some(rt) = self.runtime.take() {
            // Wait until the replica's tasks (and so its listeners) are gone,
            // as after a `kill -9`: nothing answers at its addresses any more.
            tokio::task::spawn_blocking(move || rt.shutdown_timeout(std::time::Duration::from_secs(2)))
                .await
                .expect("runtime shut down");
        }
        self.running.take();
    }
}

/// A request to a replica's internal listener, signed the way a forwarding
/// replica signs it (the gateway's own `cluster::sign`), for tests to alter.
#[derive(Clone)]
pub struct Internal {
    /// The internal listener it is sent to.
    pub to: SocketAddr,
    /// The advertised address the signature names.
    pub audience: String,
    pub route: String,
    pub principal: String,
    /// The MCP headers (forwarded and signed).
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub timestamp_ms: u64,
    pub nonce: [u8; NONCE_LEN],
    /// The translated legacy session an answer came on (signed, sent in
    /// `x-sessionless-session`).
    pub session: Option<String>,
}

impl Internal {
    /// `req` forwarded to `owner` for an anonymous caller, stamped now with a fresh nonce.
    pub fn of(owner: &Replica, req: &ModernRequest) -> Internal {
        let nonce: [u8; NONCE_LEN] = rand::random();
        Internal {
            to: owner.internal,
            audience: owner.advertise.clone(),
            route: "/mcp".into(),
            principal: "anonymous".into(),
            headers: req.headers(),
            body: req.body().to_string().into_bytes(),
            timestamp_ms: sign::now_ms(),
            nonce,
            session: None,
        }
    }

    /// A legacy client's `answer` to a question pushed on `owner`, as another
    /// replica forwards it for an anonymous caller (no session yet).
    pub fn answer(owner: &Replica, answer: &serde_json::Value) -> Internal {
        Internal {
            to: owner.internal,
            audience: owner.advertise.clone(),
            route: "/mcp".into(),
            principal: "anonymous".into(),
            headers: vec![("content-type".into(), "application/json".into())],
            body: answer.to_string().into_bytes(),
            timestamp_ms: sign::now_ms(),
            nonce: rand::random(),
            session: None,
        }
    }

    fn header_map(&self) -> HeaderMap {
        self.headers
            .iter()
            .map(|(k, v)| (HeaderName::from_bytes(k.as_bytes()).unwrap(), HeaderValue::from_str(v).unwrap()))
            .collect()
    }

    /// Its signature (base64url) under `secret`.
    pub fn signature(&self, secret: &str) -> String {
        use base64::Engine;
        let headers = self.header_map();
        let tag = Keys::derive(&[secret.as_bytes().to_vec()]).sign(&Signed {
            audience: &self.audience,
            route: &self.route,
            principal: &self.principal,
            headers: &headers,
            body_digest: &sign::body_digest(&self.body),
            timestamp_ms: self.timestamp_ms,
            nonce: &self.nonce,
            session: self.session.as_deref(),
        });
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(tag)
    }

    /// The HTTP request as it stands, with `signature` if any.
    pub fn request(&self, signature: Option<&str>) -> Request<Full<Bytes>> {
        use base64::Engine;
        let mut b = Request::post(format!("http://{}/internal/v1/retry", self.to));
        for (k, v) in &self.headers {
            b = b.header(k, v);
        }
        b = b
            .header("x-sessionless-route", &self.route)
            .header("x-sessionless-principal", &self.principal)
            .header("x-sessionless-timestamp", self.timestamp_ms.to_string())
            .header(
                "x-sessionless-nonce",
                base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(self.nonce),
            )
            .header(
                "x-sessionless-body-sha256",
                base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(sign::body_digest(&self.body)),
            );
        if let Some(s) = signature {
            b = b.header("x-sessionless-signature", s);
        }
        if let Some(s) = &self.session {
            b = b.header("x-sessionless-session", s);
        }
        b.body(Full::new(Bytes::from(self.body.clone()))).unwrap()
    }
}

/// PEM files for the internal link's TLS, in a directory of their own.
pub struct TlsFiles {
    pub ca: std::path::PathBuf,
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
}

impl TlsFiles {
    /// A fresh self-signed CA and, signed by it, a certificate for 127.0.0.1 and localhost.
    pub fn generate(tag: &str) -> TlsFiles {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
        let n = NEXT_ENV.fetch_add(1, Ordering::SeqCst);
        let dir = std::env::temp_dir().join(format!("sessionless-tls-{}-{tag}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let key = KeyPair::generate().unwrap();
        let params = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
        let cert = params.signed_by(&key, &ca, &ca_key).unwrap();
        let files = TlsFiles { ca: dir.join("ca.pem"), cert: dir.join("cert.pem"), key: dir.join("key.pem") };
        std::fs::write(&files.ca, ca.pem()).unwrap();
        std::fs::write(&files.cert, cert.pem()).unwrap();
        std::fs::write(&files.key, key.serialize_pem()).unwrap();
        files
    }
}
