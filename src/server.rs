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
use crate::cluster;
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
    /// Cluster mode: the internal listener's signature and replay checks.
    gate: Option<cluster::Gate>,
}

impl Gateway {
    pub fn new(config: Config, shutdown: CancellationToken) -> Gateway {
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        let sealer = Arc::new(Sealer::new(config.keys.clone()));
        let legacy = Arc::new(Legacy::new(&config, sealer, metrics.clone(), shutdown));
        let gate = config.cluster.as_ref().map(|c| cluster::Gate::new(c, metrics.internal_refused.clone()));
        Gateway {
            gate,
            limit: Arc::new(tokio::sync::Semaphore::new(config.limits.max_concurrent_requests)),
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

    /// Refuses new calls and waits until no paused call is left here (their
    /// retries are still served) or `deadline` passes.
    pub async fn drain(&self, deadline: std::time::Duration) {
        self.draining.store(true, Ordering::SeqCst);
        let until = tokio::time::Instant::now() + deadline;
        while self.legacy.parked_flows() > 0 && tokio::time::Instant::now() < until {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        tracing::info!(left = self.legacy.parked_flows(), "drain finished");
    }

    pub async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
        let resp = match req.uri().path() {
            "/healthz" => reply::text(StatusCode::OK, "text/plain", "ok\n".into()),
            "/readyz" if self.draining.load(Ordering::SeqCst) => {
                reply::text(StatusCode::SERVICE_UNAVAILABLE, "text/plain", "draining\n".into())
            }
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
            Ok(()) => {
                reply::text(StatusCode::OK, "application/openmetrics-text; version=1.0.0; charset=utf-8", out)
            }
            Err(_) => reply::empty(StatusCode::INTERNAL_SERVER_ERROR),
        }
    }

    fn count(&self, route: &Route, method: &'static str, outcome: &'static str, started: Instant) {
        let labels = RequestLabels { route: route.path.clone(), method, generation: "modern", outcome };
        self.metrics.requests.get_or_create(&labels).inc();
        self.metrics
            .request_duration
            .get_or_create(&MethodLabels { route: route.path.clone(), method: method.into() })
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
            let mut resp = reply::json_response(err.status(), &error_body(id, err, SUPPORTED_VERSIONS));
            resp.headers_mut().insert(http::header::ALLOW, http::HeaderValue::from_static("POST"));
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
        let caller = Caller {
            principal: crate::guard::principal(&parts.headers),
            headers: parts.headers,
            body,
            forwarded: false,
        };
        self.dispatch(route, caller, started).await
    }

    /// The internal listener (cluster mode): a retry forwarded by another
    /// replica, signed, with the caller's principal, to be answered as if
    /// received here. Only the retry of a call paused on this replica gets
    /// through; anything else is refused before any upstream work.
    pub async fn internal(self: Arc<Self>, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
        let started = Instant::now();
        let Some(gate) = &self.gate else {
            return Ok(cluster::refusal(StatusCode::NOT_FOUND));
        };
        let (parts, body) = req.into_parts();
        let head = match gate.head(&parts) {
            Ok(head) => head,
            Err(why) => return Ok(gate.refuse(why)),
        };
        let body = match read_body(body, self.config.limits.max_body_bytes).await {
            Ok(body) => body,
            Err(Error::PayloadTooLarge(_)) => return Ok(gate.refuse(cluster::Refused::TooLarge)),
            Err(_) => return Ok(gate.refuse(cluster::Refused::Unreadable)),
        };
        let headers = Caller::mcp_headers(&parts.headers);
        if let Err(why) = gate.verify(&head, &headers, &body) {
            return Ok(gate.refuse(why));
        }
        let Some(route) = self.config.route_for(&head.route).cloned() else {
            return Ok(gate.refuse(cluster::Refused::UnknownRoute));
        };
        let Ok(Message::Call(call)) = front::parse(&headers, &body) else {
            return Ok(gate.refuse(cluster::Refused::NotARetry));
        };
        if let Err(why) = self.legacy.admit_forwarded(&route, &call, &head.principal) {
            return Ok(gate.refuse(why));
        }
        let caller = Caller { principal: head.principal, headers, body, forwarded: true };
        Ok(self.run(route, *call, caller, started).await)
    }

    /// Parses the request and runs it to its answer: front → bridge → reply.
    async fn dispatch(
        self: Arc<Self>,
        route: Arc<Route>,
        caller: Caller,
        started: Instant,
    ) -> Response<Body> {
        let call = match front::parse(&caller.headers, &caller.body) {
            Ok(Message::Notification) => return reply::empty(StatusCode::ACCEPTED),
            Ok(Message::Call(call)) => *call,
            Err(rej) => return self.reject(&route, rej.id.as_ref(), &rej.error, started),
        };
        self.run(route, call, caller, started).await
    }

    /// Runs a parsed call to its answer: bridge → reply.
    async fn run(
        self: Arc<Self>,
        route: Arc<Route>,
        call: front::Call,
        caller: Caller,
        started: Instant,
    ) -> Response<Body> {
        // Draining: retries of paused calls are still served, new calls go elsewhere.
        if self.draining.load(Ordering::SeqCst) && !call.params.contains_key("requestState") {
            return self.reject(&route, Some(&call.id), &Error::Overloaded, started);
        }
        let Ok(permit) = self.limit.clone().try_acquire_owned() else {
            return self.reject(&route, Some(&call.id), &Error::Overloaded, started);
        };
        let (reply, answer) = Reply::new(crate::guard::accepts_sse(&caller.headers));
        let method = call.method.as_str();
        let gateway = self.clone();
        // Boxed: it may move to a task of its own (`Inline`).
        let work: Work = Box::pin(async move {
            let outcome = gateway.legacy.serve(route.clone(), call, caller, reply).await;
            gateway.count(&route, method, outcome, started);
            drop(permit);
        });
        let answer = Inline { work: Some(work), answer }.await;
        match answer {
            Ok(resp) => resp,
            Err(_) => reply::json_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                &error_body(None, &Error::Internal("reply dropped".into()), SUPPORTED_VERSIONS),
            ),
        }
    }

    fn count_stale_headers(&self, headers: &HeaderMap) {
        for (name, label) in
            [(front::headers::SESSION_ID, "mcp-session-id"), (front::headers::LAST_EVENT_ID, "last-event-id")]
        {
            if headers.contains_key(&name) {
                self.metrics.stale_headers_dropped.get_or_create(&HeaderLabels { header: label }).inc();
            }
        }
    }
}

async fn read_body(body: Incoming, max: usize) -> Result<Bytes, Error> {
    match Limited::new(body, max).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(Error::PayloadTooLarge(max)),
        Err(_) => Err(Error::InvalidRequest("could not read the body".into())),
    }
}

/// Which listener a connection came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    /// Clients, `/metrics`, health.
    Public,
    /// Retries forwarded by other replicas (cluster mode).
    Internal,
}

/// Open requests get this long to finish once the listeners close.
const GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// Accepts connections until `stop` fires, then gives open ones a short grace.
/// With `tls`, each connection's handshake runs in its own task first.
pub async fn serve(
    gateway: Arc<Gateway>,
    listener: TcpListener,
    stop: CancellationToken,
    kind: Listener,
    tls: Option<tokio_rustls::TlsAcceptor>,
) {
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let builder = auto::Builder::new(TokioExecutor::new());
    loop {
        let (stream, _peer): (_, SocketAddr) = tokio::select! {
            _ = stop.cancelled() => break,
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
        let service = hyper::service::service_fn(move |req| {
            let gw = gw.clone();
            async move {
                match kind {
                    Listener::Public => gw.handle(req).await,
                    Listener::Internal => gw.internal(req).await,
                }
            }
        });
        if let Some(tls) = tls.clone() {
            let (builder, watcher) = (builder.clone(), graceful.watcher());
            tokio::spawn(async move {
                if let Some(stream) = cluster::tls::accept(&tls, stream).await {
                    let _ = watcher
                        .watch(builder.serve_connection(TokioIo::new(stream), service).into_owned())
                        .await;
                }
            });
            continue;
        }
        let conn = builder.serve_connection(TokioIo::new(stream), service);
        let conn = graceful.watch(conn.into_owned());
        tokio::spawn(async move {
            let _ = conn.await;
        });
    }
    drop(listener);
    if tokio::time::timeout(GRACE, graceful.shutdown()).await.is_err() {
        tracing::warn!(?kind, "connections still open after the grace period");
    }
}

type Work = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// Runs a call in the handler's own task until its answer is ready: a call
/// answered with one JSON body costs no task of its own. Once the answer is an
/// SSE stream (the call goes on writing it), or if the handler is dropped
/// because the client left, the call moves to a task of its own, where it
/// notices the client is gone and cancels upstream rather than being dropped
/// mid-flight.
struct Inline {
    work: Option<Work>,
    answer: tokio::sync::oneshot::Receiver<Response<Body>>,
}

impl std::future::Future for Inline {
    type Output = Result<Response<Body>, tokio::sync::oneshot::error::RecvError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        if let Some(work) = self.work.as_mut() {
            if work.as_mut().poll(cx).is_ready() {
                self.work = None;
            }
        }
        let answer = std::pin::Pin::new(&mut self.answer).poll(cx);
        if answer.is_ready() {
            if let Some(work) = self.work.take() {
                tokio::spawn(work);
            }
        }
        answer
    }
}

impl Drop for Inline {
    fn drop(&mut self) {
        if let Some(work) = self.work.take() {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(work);
            }
        }
    }
}
