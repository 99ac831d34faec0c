//! An upstream message whose JSON would expand many times over when parsed
//! (a flat array of millions of zeros) is refused before any tree is built.
//! Its own test binary: it measures this process's resident memory.

mod support;

use serde_json::json;
use support::{Answer, FakeUpstream, Gateway};

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("Linux /proc");
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS");
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[tokio::test]
async fn an_sse_event_of_millions_of_values_is_a_502_and_costs_no_tree() {
    // 12 MiB of `0,`: 6.3 million values, under the 16 MiB event limit.
    let zeros = format!("[{}0]", "0,".repeat(6 << 20));
    let event =
        format!("data: {{\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{zeros}}}\n\n");
    drop(zeros);
    let up = FakeUpstream::new()
        .on("tools/call", Answer::Raw { status: 200, content_type: "text/event-stream".into(), body: event })
        .on("tools/list", Answer::Result(json!({"tools": []})))
        .start()
        .await;
    let gw = Gateway::start(up.url()).await;
    let warm = gw.request("tools/list").id(json!(0)).send().await;
    assert_eq!(warm.status, 200, "{}", warm.raw);
    let before = rss_kib();

    let reply =
        gw.request("tools/call").id(json!(1)).params(json!({"name": "zeros", "arguments": {}})).send().await;

    let grown_mib = rss_kib().saturating_sub(before) / 1024;
    reply.assert_error(502, -32603, &json!(1));
    assert_eq!(reply.reason(), Some("upstream_too_large"), "{}", reply.raw);
    // The event itself is read (12 MiB, plus the SSE parser's copy); parsed,
    // it would have taken over 200 MiB.
    assert!(grown_mib < 100, "resident memory grew by {grown_mib} MiB");
}
