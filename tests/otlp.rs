//! OTLP span export (feature `otlp`): a small gRPC collector on 127.0.0.1
//! receives, at the latest when the gateway shuts down, one server span per
//! client request, in the client's trace, child of the client's span, its
//! span id the parent the upstream was sent.
#![cfg(feature = "otlp")]

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::trace::v1::Span;
use serde_json::json;
use support::{Answer, FakeUpstream, Gateway};

#[derive(Clone, Default)]
struct Collector(Arc<Mutex<Vec<Span>>>);

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let spans = request.into_inner().resource_spans.into_iter().flat_map(|r| r.scope_spans);
        self.0.lock().unwrap().extend(spans.flat_map(|s| s.spans));
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// A collector on a free loopback port; stopped when the returned guard drops.
async fn collector() -> (Collector, String, tokio_util::sync::CancellationToken) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (c, stop) = (Collector::default(), tokio_util::sync::CancellationToken::new());
    let (service, stopped) = (TraceServiceServer::new(c.clone()), stop.clone());
    // Served with hyper's h2 directly (tonic's router would bring axum).
    tokio::spawn(async move {
        loop {
            let (stream, _) = tokio::select! {
                _ = stopped.cancelled() => return,
                accepted = listener.accept() => accepted.unwrap(),
            };
            let service = hyper_util::service::TowerToHyperService::new(service.clone());
            tokio::spawn(async move {
                let io = hyper_util::rt::TokioIo::new(stream);
                let h2 = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new());
                let _ = h2.serve_connection(io, service).await;
            });
        }
    });
    (c, format!("http://{addr}"), stop)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test]
async fn each_request_is_a_span_in_the_clients_trace_flushed_at_shutdown() {
    let (collector, endpoint, stop) = collector().await;
    let _stop = stop.drop_guard();
    let up = FakeUpstream::new().on("tools/call", Answer::Result(json!({"content": []}))).start().await;
    let text = support::single_route(
        "",
        &format!("[telemetry]\notlp_endpoint = \"{endpoint}\"\nservice_name = \"obs-test\"\n"),
    );
    let gw = Gateway::from_toml(&text, up.url()).await;
    let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let call = gw
        .request("tools/call")
        .params(json!({"name": "echo", "arguments": {}}))
        .header("traceparent", parent);
    assert_eq!(call.send().await.status, 200);
    // Without a traceparent: a trace the gateway starts.
    assert_eq!(gw.request("tools/list").send().await.status, 200);
    let sent = up.calls("tools/call").pop().unwrap().header("traceparent").unwrap().to_string();
    gw.stop().await;

    let spans = collector.0.lock().unwrap().clone();
    let call = spans.iter().find(|s| s.name == "tools/call echo").unwrap_or_else(|| panic!("{spans:?}"));
    assert_eq!(hex(&call.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!(hex(&call.parent_span_id), "00f067aa0ba902b7", "child of the client's span");
    assert_eq!(
        sent,
        format!("00-4bf92f3577b34da6a3ce929d0e0e4736-{}-01", hex(&call.span_id)),
        "the hop sent upstream"
    );
    let attr = |s: &Span, k: &str| {
        s.attributes
            .iter()
            .find(|a| a.key == k)
            .and_then(|a| a.value.clone())
            .map(|v| format!("{:?}", v.value))
    };
    assert!(attr(call, "mcp.method.name").unwrap().contains("tools/call"));
    assert!(attr(call, "gen_ai.tool.name").unwrap().contains("echo"));
    assert!(attr(call, "http.response.status_code").unwrap().contains("200"));
    assert!(attr(call, "sessionless.outcome").unwrap().contains("ok"));
    let list = spans.iter().find(|s| s.name == "tools/list").expect("a span for the other request");
    assert!(list.parent_span_id.is_empty() && list.trace_id.len() == 16, "a root span");
    tokio::time::sleep(Duration::from_millis(10)).await;
}
