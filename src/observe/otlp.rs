//! Spans exported over OTLP/gRPC (feature `otlp`): one server span per
//! client request, its id the one sent upstream as the parent, child of the
//! client's `traceparent`. Finished spans wait in a bounded queue (full:
//! dropped, and said at most once per 10 s); a task sends them in batches
//! and, at shutdown, sends what is left within a bounded time.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{span, status, ResourceSpans, ScopeSpans, Span, Status};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{Counted, Hop};
use crate::config::telemetry::Otlp;
use crate::ratelog::RateLimitedLog;

/// Spans sent in one export request at most.
const BATCH: usize = 512;
/// How long an export may take (a collector that hangs drops its batch).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long shutdown waits for the last spans to go.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);
/// A batch is sent when full or after this long.
const BATCH_DELAY: Duration = Duration::from_secs(1);

/// A finished request, as the record saw it.
pub struct Finished<'a> {
    pub hop: &'a Hop,
    pub counted: &'a Counted,
    pub status: u16,
    pub tool: Option<&'a str>,
    pub start: SystemTime,
    pub micros: u64,
}

#[derive(Clone)]
pub struct Exporter {
    queue: mpsc::Sender<Span>,
    full: std::sync::Arc<RateLimitedLog>,
    flush: CancellationToken,
    task: std::sync::Arc<std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>>,
}

impl Exporter {
    /// Starts the export task (in the current runtime). The connection to
    /// the collector is made lazily and again after a failure.
    pub fn start(config: &Otlp) -> Result<Exporter, String> {
        let channel = tonic::transport::Endpoint::from_shared(config.endpoint.clone())
            .map_err(|e| format!("otlp_endpoint: {e}"))?
            .connect_timeout(Duration::from_secs(5))
            .timeout(EXPORT_TIMEOUT)
            .connect_lazy();
        let (queue, rx) = mpsc::channel(config.max_queue);
        let flush = CancellationToken::new();
        let resource = Resource {
            attributes: vec![
                text("service.name", &config.service_name),
                text("service.version", env!("CARGO_PKG_VERSION")),
            ],
            ..Default::default()
        };
        let task = tokio::spawn(send(TraceServiceClient::new(channel), rx, resource, flush.clone()));
        Ok(Exporter {
            queue,
            full: std::sync::Arc::new(RateLimitedLog::new(Duration::from_secs(10))),
            flush,
            task: std::sync::Arc::new(std::sync::Mutex::new(Some(task))),
        })
    }

    /// Queues the span of a finished request (sampled ones only).
    pub fn finished(&self, f: Finished<'_>) {
        if f.hop.flags & 0x01 == 0 {
            return;
        }
        if self.queue.try_send(span_of(f)).is_err() {
            if let Some(suppressed) = self.full.allow() {
                tracing::warn!(suppressed, "OTLP export queue full: span dropped");
            }
        }
    }

    /// Sends what is queued and stops, within a bounded time.
    pub async fn flush(&self) {
        self.flush.cancel();
        let task = self.task.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(task) = task {
            if tokio::time::timeout(FLUSH_TIMEOUT, task).await.is_err() {
                tracing::warn!("OTLP export still running at exit: spans left unsent");
            }
        }
    }
}

async fn send(
    mut client: TraceServiceClient<tonic::transport::Channel>,
    mut rx: mpsc::Receiver<Span>,
    resource: Resource,
    flush: CancellationToken,
) {
    let failed = RateLimitedLog::new(Duration::from_secs(10));
    let mut batch = Vec::with_capacity(BATCH);
    loop {
        let stopping = tokio::select! {
            n = rx.recv_many(&mut batch, BATCH) => n == 0,
            _ = flush.cancelled() => true,
        };
        if stopping {
            rx.close();
            while rx.recv_many(&mut batch, BATCH).await > 0 {
                if batch.len() >= BATCH {
                    export(&mut client, &resource, &mut batch, &failed).await;
                }
            }
            export(&mut client, &resource, &mut batch, &failed).await;
            return;
        }
        if batch.len() < BATCH {
            // Wait a little for more, so that a batch is not one span.
            let _ = tokio::time::timeout(BATCH_DELAY, async {
                while batch.len() < BATCH {
                    let room = BATCH - batch.len();
                    if rx.recv_many(&mut batch, room).await == 0 {
                        break;
                    }
                }
            })
            .await;
        }
        export(&mut client, &resource, &mut batch, &failed).await;
    }
}

async fn export(
    client: &mut TraceServiceClient<tonic::transport::Channel>,
    resource: &Resource,
    batch: &mut Vec<Span>,
    failed: &RateLimitedLog,
) {
    if batch.is_empty() {
        return;
    }
    let request = ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(resource.clone()),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: "sessionless".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                    ..Default::default()
                }),
                spans: std::mem::take(batch),
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
    };
    if let Err(e) = client.export(request).await {
        if let Some(suppressed) = failed.allow() {
            tracing::warn!(code = %e.code(), suppressed, "OTLP export failed: spans dropped");
        }
    }
}

fn span_of(f: Finished<'_>) -> Span {
    let c = f.counted;
    let start = f.start.duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos() as u64;
    let mut attributes = vec![
        text("mcp.method.name", c.method),
        text("http.route", &c.route),
        int("http.response.status_code", i64::from(f.status)),
        text("sessionless.outcome", c.outcome),
        text("sessionless.generation", c.generation),
        text("sessionless.upstream", c.upstream),
    ];
    if let Some(tool) = f.tool {
        attributes.push(text("gen_ai.tool.name", tool));
    }
    let name = match f.tool {
        Some(tool) => format!("{} {tool}", c.method),
        None => c.method.to_string(),
    };
    let failed = f.status >= 500;
    Span {
        trace_id: f.hop.trace_id.to_vec(),
        span_id: f.hop.span.to_vec(),
        parent_span_id: f.hop.parent.map(|p| p.to_vec()).unwrap_or_default(),
        trace_state: f.hop.state.as_deref().unwrap_or("").to_string(),
        flags: u32::from(f.hop.flags),
        name,
        kind: span::SpanKind::Server as i32,
        start_time_unix_nano: start,
        end_time_unix_nano: start + f.micros * 1000,
        attributes,
        status: Some(Status {
            code: if failed { status::StatusCode::Error } else { status::StatusCode::Unset } as i32,
            message: if failed { c.outcome.to_string() } else { String::new() },
        }),
        ..Default::default()
    }
}

fn text(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(any_value::Value::StringValue(value.into())) }),
        ..Default::default()
    }
}

fn int(key: &str, value: i64) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(any_value::Value::IntValue(value)) }),
        ..Default::default()
    }
}
