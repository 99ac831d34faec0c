//! The listener and the request pipeline: guard → read body → front → route →
//! bridge → respond. Also `/metrics`, `/healthz` and `/readyz`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::bridge::legacy::{Caller, Legacy};
use crate::config::{Config, Route};
use crate::error::{error_body, Error};
use crate::front::{self, Message, SUPPORTED_VERSIONS};
use crate::metrics::{HeaderLabels, MethodLabels, Metrics, RequestLabels};
use crate::reply::{self, Body, Reply};
use crate::seal::Sealer;

pub struct Gateway {
    config: Arc<Config>,
    legacy: Arc<Legacy>,
    metrics: Metrics,
    registry: Registry,
    draining: AtomicBool,
    limit: Arc<tokio::sync::Semaphore>,
}

impl Gateway {
    pub fn new(config: Config, shutdown: CancellationToken) -> Gateway {
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        let sealer = Arc::new(Sealer::new(config.keys.clone()));
        let legacy = Arc::new(Legacy::new(&config, sealer, metrics.clone(), shutdown));
        Gateway {
            limit: Arc::new(tokio::sync::Semaphore::new(
                config.limits.max_concurrent_requests,
            )),
            config: Arc::new(config),
            legacy,
            metrics,
            registry,
            draining: AtomicBool::new(false),
        }
    }

    pub fn legacy(&self) -> &Arc<Legacy> {
        &self.legacy
    }

    pub fn set_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    pub async fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
    ) -> Result<Response<Body>, Infallible> {
        let resp = match req.uri().path() {
            "/healthz" => reply::text(StatusCode::OK, "text/plain", "ok\n".into()),
            "/readyz" if self.draining.load(Ordering::SeqCst) => reply::text(
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain",
                "draining\n".into(),
            ),
            "/readyz" => reply::text(StatusCode::OK, "text/plain", "ready\n".into()),
            "/metrics" => self.metrics_text(),
            path => match self.config.route_for(path).cloned() {
                Some(route) => self.mcp(route, req).await,
                None => reply::text(StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
            },
        };
        Ok(resp)
    }

    fn metrics_text(&self) -> Response<Body> {
        let mut out = String::new();
        match prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            Ok(()) => reply::text(
                StatusCode::OK,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                out,
            ),
            Err(_) => reply::empty(StatusCode::INTERNAL_SERVER_ERROR),
        }
    }

    fn count(&self, route: &Route, method: &str, outcome: &'static str, started: Instant) {
        let labels = RequestLabels {
            route: route.path.clone(),
            method: method.to_string(),
            generation: "modern",
            outcome,
        };
        self.metrics.requests.get_or_create(&labels).inc();
        self.metrics
            .request_duration
            .get_or_create(&MethodLabels {
                route: route.path.clone(),
                method: method.to_string(),
            })
            .observe(started.elapsed().as_secs_f64());
        tracing::debug!(
            target: "sessionless::access",
            route = %route.path,
            method,
            outcome,
            micros = started.elapsed().as_micros() as u64,
            "request"
        );
    }

    fn reject(
        &self,
        route: &Route,
        id: Option<&serde_json::Value>,
        err: &Error,
        started: Instant,
    ) -> Response<Body> {
        self.count(route, "invalid", err.reason(), started);
        if err.status() == StatusCode::METHOD_NOT_ALLOWED {
            let mut resp =
                reply::json_response(err.status(), &error_body(id, err, SUPPORTED_VERSIONS));
            resp.headers_mut()
                .insert(http::header::ALLOW, http::HeaderValue::from_static("POST"));
            return resp;
        }
        reply::json_response(err.status(), &error_body(id, err, SUPPORTED_VERSIONS))
    }

    async fn mcp(self: Arc<Self>, route: Arc<Route>, req: Request<Incoming>) -> Response<Body> {
        let started = Instant::now();
        let (parts, body) = req.into_parts();
        if let Err(e) = crate::guard::check(&self.config, &parts.method, &parts.headers) {
            return self.reject(&route, None, &e, started);
        }
        let body = match read_body(body, self.config.limits.max_body_bytes).await {
            Ok(b) => b,
            Err(e) => return self.reject(&route, None, &e, started),
        };
        self.count_stale_headers(&parts.headers);
        let call = match front::parse(&parts.headers, &body) {
            Ok(Message::Notification) => return reply::empty(StatusCode::ACCEPTED),
            Ok(Message::Call(call)) => *call,
            Err(rej) => return self.reject(&route, rej.id.as_ref(), &rej.error, started),
        };
        let Ok(permit) = self.limit.clone().try_acquire_owned() else {
            return self.reject(&route, Some(&call.id), &Error::Overloaded, started);
        };
        let caller = Caller {
            principal: crate::guard::principal(&parts.headers),
            param_headers: param_headers(&parts.headers),
        };
        let (reply, answer) = Reply::new(crate::guard::accepts_sse(&parts.headers));
        let method = call.method.as_str();
        let gateway = self.clone();
        // The call runs in its own task so that a client going away is noticed
        // (and the upstream told to cancel) instead of the work being dropped.
        tokio::spawn(async move {
            let outcome = gateway
                .legacy
                .serve(route.clone(), call, caller, reply)
                .await;
            gateway.count(&route, method, outcome, started);
            drop(permit);
        });
        match answer.await {
            Ok(resp) => resp,
            Err(_) => reply::json_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                &error_body(
                    None,
                    &Error::Internal("reply dropped".into()),
                    SUPPORTED_VERSIONS,
                ),
            ),
        }
    }

    fn count_stale_headers(&self, headers: &HeaderMap) {
        for (name, label) in [
            (front::headers::SESSION_ID, "mcp-session-id"),
            (front::headers::LAST_EVENT_ID, "last-event-id"),
        ] {
            if headers.contains_key(name) {
                self.metrics
                    .stale_headers_dropped
                    .get_or_create(&HeaderLabels { header: label })
                    .inc();
            }
        }
    }
}

fn param_headers(headers: &HeaderMap) -> HeaderMap {
    headers
        .iter()
        .filter(|(k, _)| k.as_str().starts_with("mcp-param-"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

async fn read_body(body: Incoming, max: usize) -> Result<Bytes, Error> {
    match Limited::new(body, max).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(Error::PayloadTooLarge(max)),
        Err(_) => Err(Error::InvalidRequest("could not read the body".into())),
    }
}

/// Accepts connections until `shutdown` fires, then drains them.
pub async fn serve(gateway: Arc<Gateway>, listener: TcpListener, shutdown: CancellationToken) {
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let builder = auto::Builder::new(TokioExecutor::new());
    loop {
        let (stream, _peer): (_, SocketAddr) = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let gw = gateway.clone();
        let service = hyper::service::service_fn(move |req| gw.clone().handle(req));
        let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
        let conn = graceful.watch(conn.into_owned());
        tokio::spawn(async move {
            let _ = conn.await;
        });
    }
    gateway.set_draining();
    drop(listener);
    let drain = gateway.config.drain_timeout;
    if tokio::time::timeout(drain, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("drain deadline passed with connections still open");
    }
    gateway.legacy.pool().close_all().await;
}
