//! Test support: the gateway booted in-process on 127.0.0.1:0, a modern
//! client, and a fake legacy upstream (see `upstream`).
#![allow(dead_code)]

pub mod client;
pub mod cluster;
pub mod jwt;
pub mod legacy;
pub mod modern;
pub mod upstream;

use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use sessionless::{Config, Running};

#[allow(unused_imports)]
pub use client::{Events, ModernRequest, Reply, PATIENCE, VERSION};
#[allow(unused_imports)]
pub use upstream::{Answer, FakeUpstream, Seen, Step, Upstream};

/// Every upstream configured as legacy rather than probed: the fakes are
/// legacy servers, and a probe would be one more request they see.
pub fn legacy_upstreams(mut config: Config) -> Config {
    for route in &mut config.routes {
        std::sync::Arc::make_mut(route).upstream.generation = sessionless::config::UpstreamGeneration::Legacy;
    }
    config
}

/// A gateway running in this test's runtime; stopped when dropped.
pub struct Gateway {
    running: Option<Running>,
    client: client::HttpClient,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if let Some(r) = &self.running {
            r.shutdown_token().cancel();
        }
    }
}

impl Gateway {
    /// `sessionless --upstream URL` for a legacy upstream (the fake), its
    /// generation configured rather than probed (so the upstream sees only
    /// what the test's requests cause); listening on 127.0.0.1:0.
    pub async fn start(upstream_url: &str) -> Gateway {
        let config =
            Config::single(upstream_url, "127.0.0.1:0".parse().unwrap()).expect("single-upstream config");
        Gateway::with_config(legacy_upstreams(config)).await
    }

    /// `sessionless --upstream URL` exactly: the upstream's generation probed.
    pub async fn start_auto(upstream_url: &str) -> Gateway {
        let config =
            Config::single(upstream_url, "127.0.0.1:0".parse().unwrap()).expect("single-upstream config");
        Gateway::with_config(config).await
    }

    /// A routing file; `{upstream}` is replaced by `upstream_url`. The
    /// listener is always 127.0.0.1:0; upstreams are taken as legacy (the
    /// fake), not probed.
    pub async fn from_toml(toml: &str, upstream_url: &str) -> Gateway {
        let text = toml.replace("{upstream}", upstream_url);
        let config = Config::from_toml(&text).expect("test config is valid");
        Gateway::with_config(legacy_upstreams(config)).await
    }

    pub async fn with_config(mut config: Config) -> Gateway {
        config.listen = "127.0.0.1:0".parse().unwrap();
        let running = sessionless::run(config).await.expect("gateway starts");
        Gateway { running: Some(running), client: client::http_client() }
    }

    /// Started from a routing file (listening on 127.0.0.1:0 whatever it
    /// says), reloaded when asked ([`Gateway::reload`]) and, with `watch`,
    /// when it changes; upstream generations are as the file says.
    pub async fn from_file(path: &std::path::Path, watch: bool) -> Gateway {
        let listen = Some("127.0.0.1:0".parse().unwrap());
        let source = sessionless::reload::Source { path: path.to_path_buf(), listen, watch };
        let running = sessionless::run_from(source).await.expect("gateway starts");
        Gateway { running: Some(running), client: client::http_client() }
    }

    /// Reads its routing file again (as `SIGHUP` does).
    pub async fn reload(&self) -> Result<sessionless::live::Reloaded, String> {
        self.running.as_ref().unwrap().reload().await
    }

    /// A modern request to `path`.
    pub fn request_to(&self, path: &str, method: &str) -> ModernRequest {
        ModernRequest::new(self.client.clone(), self.url(path), method)
    }

    pub fn url(&self, path: &str) -> String {
        self.running.as_ref().unwrap().url(path)
    }

    /// A modern request to `/mcp`.
    pub fn request(&self, method: &str) -> ModernRequest {
        ModernRequest::new(self.client.clone(), self.url("/mcp"), method)
    }

    /// Sends a hand-made request and reads the whole answer.
    pub async fn raw(&self, req: Request<Full<Bytes>>) -> Reply {
        Reply::read(client::send(&self.client, req).await).await
    }

    /// A POST to `/mcp` with the given headers and body, nothing added.
    pub async fn post_raw(&self, headers: &[(&str, &str)], body: impl Into<Bytes>) -> Reply {
        let mut b = Request::post(self.url("/mcp"));
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        self.raw(b.body(Full::new(body.into())).unwrap()).await
    }

    /// Writes `req` on a raw connection, waits `after`, then closes the
    /// connection without reading anything: a client that gave up before
    /// the answer started.
    pub async fn hang_up_after(&self, req: ModernRequest, after: Duration) {
        use tokio::io::AsyncWriteExt;
        let body = req.body().to_string();
        let mut head =
            format!("POST /mcp HTTP/1.1\r\nhost: {}\r\ncontent-length: {}\r\n", self.addr(), body.len());
        for (k, v) in req.headers() {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        let mut stream = tokio::net::TcpStream::connect(self.addr()).await.unwrap();
        stream.write_all(head.as_bytes()).await.unwrap();
        stream.write_all(body.as_bytes()).await.unwrap();
        tokio::time::sleep(after).await;
        drop(stream);
    }

    pub fn addr(&self) -> std::net::SocketAddr {
        self.running.as_ref().unwrap().addr
    }

    /// GET `path`: status and body text.
    pub async fn get(&self, path: &str) -> (StatusCode, String) {
        let req = Request::get(self.url(path)).body(Full::new(Bytes::new())).unwrap();
        let resp = client::send(&self.client, req).await;
        let status = resp.status();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    pub async fn assert_healthy(&self) {
        let (status, body) = self.get("/healthz").await;
        assert_eq!(status, StatusCode::OK, "/healthz: {body}");
    }

    /// The sum of every sample of the metric `name` (all label sets).
    pub async fn metric(&self, name: &str) -> f64 {
        let (status, text) = self.get("/metrics").await;
        assert_eq!(status, StatusCode::OK);
        metric_sum(&text, name)
    }

    /// Waits (up to a few seconds) for `name` to reach at least `at_least`.
    pub async fn wait_metric(&self, name: &str, at_least: f64) -> f64 {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
        loop {
            let v = self.metric(name).await;
            if v >= at_least || tokio::time::Instant::now() > deadline {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits (up to a few seconds) for `name` to equal `expected`; returns
    /// the last value read, for the caller's assertion.
    pub async fn settled_metric(&self, name: &str, expected: f64) -> f64 {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
        loop {
            let v = self.metric(name).await;
            if v == expected || tokio::time::Instant::now() > deadline {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Starts a graceful shutdown without waiting for it (see [`Gateway::stop`]).
    pub fn begin_shutdown(&self) {
        if let Some(r) = &self.running {
            r.shutdown_token().cancel();
        }
    }

    /// Shuts down gracefully and waits for the drain to finish.
    pub async fn stop(mut self) {
        if let Some(r) = self.running.take() {
            let _ = tokio::time::timeout(PATIENCE, r.shutdown()).await;
        }
    }
}

/// Sums the samples of `name` in Prometheus/OpenMetrics text.
pub fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.strip_prefix(name).is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' ')))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// An address on which nothing listens (bound, then released).
pub async fn closed_port_url() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    format!("http://{addr}/mcp")
}

/// A routing file with one upstream (`{upstream}`, replaced by
/// `Gateway::from_toml`) served at `/mcp`: `upstream_keys` go into its
/// `[[upstreams]]` table, `tables` (e.g. `[limits] …`) after it.
pub fn single_route(upstream_keys: &str, tables: &str) -> String {
    format!(
        "[[upstreams]]\nname = \"up\"\nurl = \"{{upstream}}\"\n{upstream_keys}\n\n[[routes]]\npath = \"/mcp\"\nupstream = \"up\"\n\n{tables}\n"
    )
}
