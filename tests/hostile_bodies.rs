//! Bodies that JSON parsers read differently (issue 22): an out-of-range
//! number, a lone surrogate in a string or a member name, arrays nested 200
//! deep, a repeated member name. Each is refused by the one strict reader
//! (400 and -32700, or -32600 for a repeated name) on every path — the
//! legacy relay, the 2026 client on a legacy and on a 2026 upstream, and a
//! legacy client translated onto a 2026 upstream — inside `params`, outside
//! it, and in batch items; and the upstream runs nothing. Before, the relay
//! and the translated path let a denied tool run with such a body.
//!
//! Every case is also sent without its hostile part, to show that the
//! upstream's log sees what gets through (so "nothing ran" can fail).

mod support;

use http::Method;
use serde_json::json;
use support::legacy::{Legacy, LEGACY};
use support::modern::ModernUpstream;
use support::{Answer, FakeUpstream, Gateway, Reply, VERSION};

/// Where the hostile member goes.
const SLOT: &str = r#""slot":0"#;

/// A hostile member (or members) put where [`SLOT`] stands, and the code refusing it.
const HOSTILE: &[(&str, &str, i64)] = &[
    ("a number past a double's range", r#""pad":1e400"#, -32700),
    ("the same in full digits", "\"pad\":1000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000", -32700),
    ("a lone surrogate in a string", r#""note":"\ud800""#, -32700),
    ("a lone surrogate in a name", r#""\ud800":1"#, -32700),
    ("arrays nested 200 deep", "DEEP", -32700),
    ("a repeated name", "REPEAT", -32600),
    ("a name repeated in another case (a case-insensitive decoder's last match)", "REPEAT_CASE", -32600),
];

/// The rules every route here has: deny tools delete_*, prompts secret_*,
/// resources under file:///secret/.
const RULES: &str = r#"
[[routes.rules]]
effect = "deny"
tools = ["delete_*"]
prompts = ["secret_*"]
resources = ["file:///secret/*"]
"#;

/// A call of `method` on `target` with [`SLOT`] at `place` ("arguments",
/// "params", "top"); `meta` adds the 2026 `_meta`.
fn call(id: i64, method: &str, target: &str, place: &str, meta: bool) -> String {
    let key = if method == "resources/read" { "uri" } else { "name" };
    let mut params = json!({key: target, "arguments": {"x": 1}});
    if meta {
        params["_meta"] = json!({"io.modelcontextprotocol/protocolVersion": VERSION,
            "io.modelcontextprotocol/clientCapabilities": {}});
    }
    let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string();
    match place {
        "arguments" => body.replacen(r#""x":1"#, &format!(r#""x":1,{SLOT}"#), 1),
        "params" => body.replacen(r#""arguments""#, &format!(r#"{SLOT},"arguments""#), 1),
        _ => body.replacen(r#""jsonrpc""#, &format!(r#"{SLOT},"jsonrpc""#), 1),
    }
}

/// A call with nothing hostile in it.
fn plain(id: i64, method: &str, target: &str, place: &str, meta: bool) -> String {
    call(id, method, target, place, meta).replacen(SLOT, r#""y":0"#, 1)
}

/// `body` with its slot filled by `hostile`; the repeat is of the call's own
/// target key where that sits in `params`.
fn fill(body: &str, hostile: &str, allowed: &str) -> String {
    let member = match hostile {
        "DEEP" => format!(r#""deep":{}{}"#, "[".repeat(200), "]".repeat(200)),
        "REPEAT" if body.contains(r#""uri""#) => format!(r#""uri":"{allowed}""#),
        "REPEAT" => format!(r#""name":"{allowed}""#),
        "REPEAT_CASE" if body.contains(r#""uri""#) => format!(r#""URI":"{allowed}""#),
        "REPEAT_CASE" => format!(r#""Name":"{allowed}""#),
        other => other.to_string(),
    };
    body.replacen(SLOT, &member, 1)
}

/// The three call methods, each with a denied target and an allowed one.
const CALLS: &[(&str, &str, &str)] = &[
    ("tools/call", "delete_user", "echo"),
    ("prompts/get", "secret_plan", "greeting"),
    ("resources/read", "file:///secret/keys", "file:///public/readme"),
];

/// Places of the slot; a repeated name only counts inside the objects the
/// gateway reads, and "top" repeats nothing of the call's.
fn places(hostile: &str) -> &'static [&'static str] {
    if hostile.starts_with("REPEAT") {
        &["params"]
    } else {
        &["arguments", "params", "top"]
    }
}

/// One hostile call: what it is, the method and denied target it names, its body, the code refusing it.
struct Case {
    what: String,
    method: &'static str,
    target: &'static str,
    body: String,
    code: i64,
}

/// Every hostile member in every place, on every call method; `meta` for a 2026 client.
fn cases(meta: bool) -> Vec<Case> {
    let mut all = Vec::new();
    for (what, hostile, code) in HOSTILE {
        for (method, denied, allowed) in CALLS {
            for place in places(hostile) {
                let id = all.len() as i64 + 10;
                let body = fill(&call(id, method, denied, place, meta), hostile, allowed);
                let what = format!("{what} in {place} of {method}");
                all.push(Case { what, method, target: denied, body, code: *code });
            }
        }
    }
    all
}

fn assert_refused(reply: &Reply, code: i64, what: &str) {
    assert_eq!(reply.status, 400, "{what}: {}", reply.raw);
    assert_eq!(reply.error_code(), Some(code), "{what}: {}", reply.raw);
    assert!(!reply.raw.contains("serde") && !reply.raw.contains("line 1"), "{what}: {}", reply.raw);
}

/// The gateway's own requests: the handshake, and the tool list it reads
/// for `Mcp-Param-*` annotations.
fn own(method: Option<&str>) -> bool {
    matches!(method, Some("initialize" | "notifications/initialized" | "tools/list"))
}

/// What a legacy fake upstream ran: every POST but the gateway's own (a
/// body the fake cannot parse counts).
fn legacy_ran(up: &support::Upstream) -> usize {
    up.seen().iter().filter(|s| s.method == Method::POST && !own(s.rpc_method())).count()
}

/// What a 2026 fake upstream ran, probes and the gateway's own aside.
fn modern_ran(up: &ModernUpstream) -> usize {
    up.calls().iter().filter(|r| !own(r.body["method"].as_str())).count()
}

fn legacy_fake() -> FakeUpstream {
    let done = Answer::Result(json!({"content": [{"type": "text", "text": "done"}]}));
    FakeUpstream::new()
        .on("tools/call", done)
        .on("prompts/get", Answer::Result(json!({"messages": []})))
        .on("resources/read", Answer::Result(json!({"contents": []})))
}

fn config(generation: &str, extra: &str) -> String {
    format!(
        "[[upstreams]]\nname = \"up\"\nurl = \"{{upstream}}\"\ngeneration = \"{generation}\"\n{extra}\n\n\
         [[routes]]\npath = \"/mcp\"\nupstream = \"up\"\n{RULES}"
    )
}

async fn gateway(upstream: &str, generation: &str, extra: &str) -> Gateway {
    let text = config(generation, extra).replace("{upstream}", upstream);
    Gateway::with_config(sessionless::Config::from_toml(&text).expect("valid config")).await
}

#[tokio::test]
async fn the_relay_runs_nothing_a_hostile_body_carries() {
    let up = legacy_fake().start().await;
    let gw = gateway(up.url(), "legacy", "").await;
    let client = Legacy::new(&gw);
    let session = client.open().await;
    for case in cases(false) {
        assert_refused(&client.post(Some(&session), case.body).await, case.code, &case.what);
        assert_eq!(legacy_ran(&up), 0, "{}: {}", case.what, up.dump());
    }
    // The same hostile members in a batch item: refused whole.
    for (what, hostile, code) in HOSTILE {
        let place = places(hostile)[0];
        let item = fill(&call(90, "tools/call", "delete_user", place, false), hostile, "echo");
        let ping = json!({"jsonrpc": "2.0", "id": 91, "method": "ping"});
        let reply = client.post(Some(&session), format!("[{ping},{item}]")).await;
        assert_refused(&reply, *code, &format!("{what} in a batch item"));
    }
    assert_eq!(legacy_ran(&up), 0, "{}", up.dump());
    // Without the hostile part: an allowed call runs, a denied one is refused as denied.
    for (method, denied, allowed) in CALLS {
        let ok = client.post(Some(&session), plain(1, method, allowed, "arguments", false)).await;
        assert_eq!(ok.status, 200, "{method}: {}", ok.raw);
        let no = client.post(Some(&session), plain(2, method, denied, "arguments", false)).await;
        no.assert_error(200, -31003, &json!(2));
    }
    assert_eq!(legacy_ran(&up), 3, "only the allowed calls ran: {}", up.dump());
    let (_, metrics) = gw.get("/metrics").await;
    assert!(metrics.contains(r#"generation="legacy",upstream="legacy",outcome="invalid"#), "{metrics}");
}

#[tokio::test]
async fn modern_clients_on_a_legacy_upstream_run_nothing_a_hostile_body_carries() {
    let up = legacy_fake().start().await;
    let gw = gateway(up.url(), "legacy", "").await;
    modern_cases(&gw).await;
    assert_eq!(legacy_ran(&up), 0, "{}", up.dump());
    for (method, _, allowed) in CALLS {
        let ok = modern_post(&gw, method, allowed, plain(1, method, allowed, "params", true)).await;
        assert_eq!(ok.status, 200, "{method}: {}", ok.raw);
    }
    assert_eq!(legacy_ran(&up), 3, "{}", up.dump());
}

#[tokio::test]
async fn the_pass_through_runs_nothing_a_hostile_body_carries() {
    let up = ModernUpstream::start().await;
    let gw = gateway(&up.url, "modern", "").await;
    modern_cases(&gw).await;
    assert_eq!(modern_ran(&up), 0, "{:?}", up.calls());
    let _ = modern_post(&gw, "tools/call", "echo", plain(1, "tools/call", "echo", "params", true)).await;
    assert_eq!(modern_ran(&up), 1, "the log sees what gets through");
}

async fn modern_post(gw: &Gateway, method: &str, target: &str, body: String) -> Reply {
    let headers = [
        ("content-type", "application/json"),
        ("accept", "application/json, text/event-stream"),
        ("mcp-protocol-version", VERSION),
        ("mcp-method", method),
        ("mcp-name", target),
    ];
    gw.post_raw(&headers, body).await
}

/// Every hostile body as a 2026 client sends it: refused before anything.
async fn modern_cases(gw: &Gateway) {
    for case in cases(true) {
        let reply = modern_post(gw, case.method, case.target, case.body).await;
        assert_refused(&reply, case.code, &case.what);
    }
}

#[tokio::test]
async fn a_legacy_client_translated_onto_a_2026_upstream_runs_nothing_a_hostile_body_carries() {
    let up = ModernUpstream::start().await;
    let gw = gateway(&up.url, "modern", "legacy_clients = \"translate\"").await;
    let client = Legacy::new(&gw);
    let init = client.post(None, support::legacy::init_body(json!(1))).await;
    assert_eq!(init.result()["protocolVersion"], LEGACY, "{}", init.raw);
    let session = init.header("mcp-session-id").unwrap().to_string();
    for case in cases(false) {
        assert_refused(&client.post(Some(&session), case.body).await, case.code, &case.what);
    }
    assert_eq!(modern_ran(&up), 0, "{:?}", up.calls());
    let _ = client.post(Some(&session), plain(1, "tools/call", "echo", "params", false)).await;
    assert_eq!(modern_ran(&up), 1, "the log sees what gets through");
}

#[tokio::test]
async fn per_tool_limits_count_what_the_upstream_runs() {
    let up = legacy_fake().start().await;
    let limits = "[[routes]]\npath = \"/limited\"\nupstream = \"up\"\n\
                  tool_rate_limits = { echo = { per_minute = 1, burst = 1 } }\n";
    let text =
        format!("[[upstreams]]\nname = \"up\"\nurl = \"{}\"\ngeneration = \"legacy\"\n\n{limits}", up.url());
    let gw = Gateway::with_config(sessionless::Config::from_toml(&text).unwrap()).await;
    let client = Legacy::at(gw.url("/limited"));
    let session = client.open().await;
    // A hostile body naming the limited tool is refused, and spends nothing.
    let hostile = fill(&call(1, "tools/call", "echo", "arguments", false), r#""pad":1e400"#, "echo");
    assert_refused(&client.post(Some(&session), hostile).await, -32700, "padding");
    let item = |id: i64| plain(id, "tools/call", "echo", "arguments", false);
    let one = client.post(Some(&session), item(4)).await;
    assert_eq!(one.status, 200, "the refused body spent none of the limit: {}", one.raw);
    // The limit spent: a batch of calls of the tool is refused, each item counted.
    let ping = json!({"jsonrpc": "2.0", "id": 2, "method": "ping"});
    let batch = client.post(Some(&session), format!("[{ping},{}]", item(3))).await;
    assert_eq!(batch.status, 429, "{}", batch.raw);
    assert_eq!(legacy_ran(&up), 1, "{}", up.dump());
}
