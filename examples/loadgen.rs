//! Load generator for `bench/run.sh`: one HTTP/1.1 keep-alive connection per
//! worker, closed-loop (a worker sends its next request when the previous one
//! answered), latencies recorded per request. The same code drives every
//! target: a legacy MCP server directly, nginx in front of it, and sessionless.
//!
//! ```text
//! loadgen legacy     --addr HOST:PORT [-c N] [-d SECS] [--warmup SECS]   tools/call echo on a legacy session opened first
//!                                                                       (direct, through nginx, or through the gateway's legacy relay)
//! loadgen modern     --addr HOST:PORT [-c N] [-d SECS] [--warmup SECS]   stateless 2026-07-28 tools/call echo
//!                    (`--tool NAME`: another tool with the same `text` argument, e.g. `a__echo`)
//! loadgen list       --addr HOST:PORT [-c N] [-d SECS] [--warmup SECS]   stateless 2026-07-28 tools/list
//!                                                                       (through the gateway, or direct / through nginx
//!                                                                       to a 2026 upstream; resultType complete checked)
//! loadgen mrtr       --addr HOST:PORT [-c N] [-d SECS] [--warmup SECS]   ask_user → input_required → retry; one sample = both
//! loadgen park       --addr HOST:PORT --count N [-c N]                   N ask_user calls left parked (never retried)
//! loadgen principals --addr HOST:PORT --count N [-c N] [--offset K]      N echo calls, each with its own bearer token
//! loadgen cold       --addr HOST:PORT --count N [--pause-ms MS]          N cold echo calls (each a new bearer token, so a
//!                                                                       new upstream session: on a stdio route a process
//!                                                                       spawned and initialized), one at a time, each
//!                                                                       beside a warm call (a token whose session is open);
//!                                                                       MS (100) of quiet before each call
//! loadgen streams    --addr HOST:PORT --kind get|listen --count N [-c N] [-d SECS]
//!                                                                       N streams opened (c at a time), each on its own
//!                                                                       connection, then held idle for d seconds
//!                                                                       (`get`: a legacy session's standalone GET stream;
//!                                                                       `listen`: a 2026 client's subscriptions/listen)
//!                    (modern and mrtr take `--bearer TOKEN`: every request carries it, for an authenticated route)
//! loadgen free-port                                                      prints a free 127.0.0.1 TCP port
//! loadgen report     --results FILE.jsonl [--criterion DIR]              the markdown table of a run
//! ```
//!
//! Every load mode prints one JSON line (requests, errors, rps, p50/p99 in µs)
//! with `--label` and `--rep` echoed, for `report` to aggregate. `cold`
//! prints one line of medians (cold, warm, their ratio) and every cold
//! sample. `streams` prints two: one as soon as every stream is open (or
//! failed), while they are held, and one when they are let go (how many were
//! still open).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::TcpStream;

const MODERN: &str = "2026-07-28";
const LEGACY: &str = "2025-11-25";

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Legacy,
    Modern,
    /// A stateless 2026-07-28 `tools/list`.
    List,
    Mrtr,
    Park,
    Principals,
    /// Cold calls (a new principal each) beside warm ones, one at a time.
    Cold,
    Streams,
}

/// What `streams` holds.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum StreamKind {
    /// A legacy session client's standalone GET stream (session opened first).
    Get,
    /// A 2026 client's `subscriptions/listen`.
    Listen,
}

#[derive(Clone, Debug)]
struct Opts {
    mode: Mode,
    addr: SocketAddr,
    path: String,
    concurrency: usize,
    duration: Duration,
    warmup: Duration,
    count: u64,
    offset: u64,
    threads: usize,
    label: String,
    rep: u64,
    /// Legacy mode: the session opened before the run.
    session: Option<String>,
    /// Modern and mrtr modes: the bearer token every request carries.
    bearer: Option<String>,
    /// Modern mode: the tool called (default `echo`; `a__echo` on a federated route).
    tool: String,
    /// Streams mode: what is held.
    kind: StreamKind,
    /// Cold mode: the quiet before each call.
    pause: Duration,
}

fn usage() -> ! {
    eprintln!(
        "usage: loadgen legacy|modern|list|mrtr|park|principals|cold|streams --addr HOST:PORT [--path /mcp] \
         [-c N] [-d SECS] [--warmup SECS] [--count N] [--offset K] [--threads N] \
         [--label NAME] [--rep N] [--bearer TOKEN] [--tool NAME] [--kind get|listen] [--pause-ms MS]\n       loadgen free-port\n       \
         loadgen report --results FILE.jsonl [--criterion DIR]"
    );
    std::process::exit(2)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(cmd) = args.first() else { usage() };
    match cmd.as_str() {
        "free-port" => {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
            println!("{}", l.local_addr().expect("local addr").port());
        }
        "report" => report::main(&args[1..]),
        _ => {
            let opts = parse_opts(cmd, &args[1..]);
            let rt = if opts.threads <= 1 {
                tokio::runtime::Builder::new_current_thread().enable_all().build()
            } else {
                tokio::runtime::Builder::new_multi_thread().worker_threads(opts.threads).enable_all().build()
            }
            .expect("runtime");
            if opts.mode == Mode::Streams {
                if let Err(e) = rt.block_on(streams::run(opts)) {
                    eprintln!("loadgen: {e}");
                    std::process::exit(1)
                }
                return;
            }
            let result = match opts.mode {
                Mode::Cold => rt.block_on(cold(opts)),
                _ => rt.block_on(run(opts)),
            };
            match result {
                Ok(line) => println!("{line}"),
                Err(e) => {
                    eprintln!("loadgen: {e}");
                    std::process::exit(1)
                }
            }
        }
    }
}

fn parse_opts(cmd: &str, rest: &[String]) -> Opts {
    let mode = match cmd {
        "legacy" => Mode::Legacy,
        "modern" => Mode::Modern,
        "list" => Mode::List,
        "mrtr" => Mode::Mrtr,
        "park" => Mode::Park,
        "principals" => Mode::Principals,
        "cold" => Mode::Cold,
        "streams" => Mode::Streams,
        _ => usage(),
    };
    let mut o = Opts {
        mode,
        addr: "127.0.0.1:8080".parse().unwrap(),
        path: "/mcp".into(),
        concurrency: 1,
        duration: Duration::from_secs(5),
        warmup: Duration::from_secs(1),
        count: 1000,
        offset: 0,
        threads: 1,
        label: cmd.to_string(),
        rep: 0,
        session: None,
        bearer: None,
        tool: "echo".into(),
        kind: StreamKind::Get,
        pause: Duration::from_millis(100),
    };
    let mut it = rest.iter();
    while let Some(flag) = it.next() {
        let val = it.next().unwrap_or_else(|| usage());
        let secs = |v: &str| Duration::from_secs_f64(v.parse().unwrap_or_else(|_| usage()));
        match flag.as_str() {
            "--addr" => o.addr = val.parse().unwrap_or_else(|_| usage()),
            "--path" => o.path = val.clone(),
            "-c" | "--concurrency" => o.concurrency = val.parse().unwrap_or_else(|_| usage()),
            "-d" | "--duration" => o.duration = secs(val),
            "--warmup" => o.warmup = secs(val),
            "--count" => o.count = val.parse().unwrap_or_else(|_| usage()),
            "--offset" => o.offset = val.parse().unwrap_or_else(|_| usage()),
            "--threads" => o.threads = val.parse().unwrap_or_else(|_| usage()),
            "--label" => o.label = val.clone(),
            "--rep" => o.rep = val.parse().unwrap_or_else(|_| usage()),
            "--bearer" => o.bearer = Some(val.clone()),
            "--tool" => o.tool = val.clone(),
            "--pause-ms" => o.pause = Duration::from_millis(val.parse().unwrap_or_else(|_| usage())),
            "--kind" => {
                o.kind = match val.as_str() {
                    "get" => StreamKind::Get,
                    "listen" => StreamKind::Listen,
                    _ => usage(),
                }
            }
            _ => usage(),
        }
    }
    o.concurrency = o.concurrency.max(1);
    o
}

/// One keep-alive HTTP/1.1 connection, reopened after an error.
struct Conn {
    addr: SocketAddr,
    sender: Option<SendRequest<Full<Bytes>>>,
}

struct Answer {
    status: StatusCode,
    session_id: Option<String>,
    sse: bool,
    body: Bytes,
}

impl Conn {
    fn new(addr: SocketAddr) -> Conn {
        Conn { addr, sender: None }
    }

    async fn connect(&mut self) -> Result<&mut SendRequest<Full<Bytes>>, String> {
        if self.sender.as_ref().is_some_and(|s| s.is_closed()) {
            self.sender = None;
        }
        if self.sender.is_none() {
            let stream = TcpStream::connect(self.addr).await.map_err(|e| format!("connect: {e}"))?;
            let _ = stream.set_nodelay(true);
            let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .map_err(|e| format!("handshake: {e}"))?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            self.sender = Some(sender);
        }
        Ok(self.sender.as_mut().expect("just set"))
    }

    async fn send(&mut self, req: Request<Full<Bytes>>) -> Result<Answer, String> {
        let result = async {
            let sender = self.connect().await?;
            sender.ready().await.map_err(|e| format!("ready: {e}"))?;
            let resp = sender.send_request(req).await.map_err(|e| format!("send: {e}"))?;
            let status = resp.status();
            let session_id =
                resp.headers().get("mcp-session-id").and_then(|v| v.to_str().ok()).map(str::to_string);
            let sse = resp
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.starts_with("text/event-stream"));
            let body = resp.into_body().collect().await.map_err(|e| format!("body: {e}"))?.to_bytes();
            Ok(Answer { status, session_id, sse, body })
        }
        .await;
        if result.is_err() {
            self.sender = None;
        }
        result
    }
}

fn request(o: &Opts) -> http::request::Builder {
    Request::builder()
        .method("POST")
        .uri(o.path.as_str())
        .header("host", o.addr.to_string())
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
}

fn modern_body(id: u64, tool: &str, args: Value, caps: Value, extra: Option<(Value, Value)>) -> Vec<u8> {
    let mut params = json!({
        "name": tool,
        "arguments": args,
        "_meta": {
            "io.modelcontextprotocol/protocolVersion": MODERN,
            "io.modelcontextprotocol/clientCapabilities": caps,
        }
    });
    if let Some((responses, state)) = extra {
        params["inputResponses"] = responses;
        params["requestState"] = state;
    }
    serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}))
        .expect("json")
}

fn modern_request(o: &Opts, tool: &str, body: Vec<u8>, bearer: Option<String>) -> Request<Full<Bytes>> {
    let mut b = request(o)
        .header("mcp-protocol-version", MODERN)
        .header("mcp-method", "tools/call")
        .header("mcp-name", tool);
    if let Some(t) = bearer {
        b = b.header("authorization", format!("Bearer {t}"));
    }
    b.body(Full::new(Bytes::from(body))).expect("request")
}

/// The JSON-RPC message of an answer: the body, or the last SSE `data:` line.
fn message(a: &Answer) -> Option<Value> {
    if !a.sse {
        return serde_json::from_slice(&a.body).ok();
    }
    let text = std::str::from_utf8(&a.body).ok()?;
    text.lines()
        .rev()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
        .find(|v| v.get("result").is_some() || v.get("error").is_some())
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// A cheap success check for echo answers: 200, a result, not a tool error.
fn echo_ok(a: &Answer) -> Result<(), String> {
    if a.status != StatusCode::OK {
        return Err(format!("status {}", a.status));
    }
    if !contains(&a.body, b"\"result\"") || contains(&a.body, b"\"isError\":true") {
        return Err(format!("bad body: {}", String::from_utf8_lossy(&a.body)));
    }
    Ok(())
}

/// The same for a 2026-07-28 answer, which must also say `resultType: complete`.
fn modern_echo_ok(a: &Answer) -> Result<(), String> {
    echo_ok(a)?;
    if !contains(&a.body, b"\"resultType\":\"complete\"") {
        return Err(format!("no resultType complete: {}", String::from_utf8_lossy(&a.body)));
    }
    Ok(())
}

/// Opens a legacy session: initialize, then notifications/initialized.
async fn open_session(o: &Opts, capabilities: Value) -> Result<String, String> {
    let mut conn = Conn::new(o.addr);
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": LEGACY, "capabilities": capabilities,
        "clientInfo": {"name": "loadgen", "version": "1"}}});
    let req = request(o).body(Full::new(Bytes::from(serde_json::to_vec(&init).unwrap()))).unwrap();
    let a = conn.send(req).await?;
    if a.status != StatusCode::OK {
        return Err(format!("initialize: status {}", a.status));
    }
    let sid = a.session_id.ok_or("initialize: no Mcp-Session-Id")?;
    let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let req = request(o)
        .header("mcp-session-id", sid.as_str())
        .header("mcp-protocol-version", LEGACY)
        .body(Full::new(Bytes::from(serde_json::to_vec(&note).unwrap())))
        .unwrap();
    let a = conn.send(req).await?;
    if a.status != StatusCode::ACCEPTED {
        return Err(format!("initialized: status {}", a.status));
    }
    Ok(sid)
}

/// One sample: total latency, and for MRTR the two legs.
struct Sample {
    total: Duration,
    legs: Option<(Duration, Duration)>,
}

/// Runs one iteration of the mode; `n` is a run-wide sequence number.
async fn once(o: &Opts, conn: &mut Conn, n: u64) -> Result<Sample, String> {
    let start = Instant::now();
    match o.mode {
        Mode::Legacy => {
            let body = serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": n + 1,
                "method": "tools/call", "params": {"name": "echo", "arguments": {"text": "hi"}}}))
            .unwrap();
            let req = request(o)
                .header("mcp-session-id", o.session.as_deref().unwrap_or(""))
                .header("mcp-protocol-version", LEGACY)
                .body(Full::new(Bytes::from(body)))
                .unwrap();
            echo_ok(&conn.send(req).await?)?;
        }
        Mode::Modern | Mode::Principals => {
            let body = modern_body(n + 1, &o.tool, json!({"text": "hi"}), json!({}), None);
            let bearer = match o.mode {
                Mode::Principals => Some(format!("tok-{}", o.offset + n)),
                _ => o.bearer.clone(),
            };
            modern_echo_ok(&conn.send(modern_request(o, &o.tool, body, bearer)).await?)?;
        }
        Mode::List => {
            let body = serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": n + 1, "method": "tools/list",
                "params": {"_meta": {"io.modelcontextprotocol/protocolVersion": MODERN,
                    "io.modelcontextprotocol/clientCapabilities": {}}}}))
            .expect("json");
            let req = request(o)
                .header("mcp-protocol-version", MODERN)
                .header("mcp-method", "tools/list")
                .body(Full::new(Bytes::from(body)))
                .expect("request");
            let a = conn.send(req).await?;
            if a.status != StatusCode::OK || !contains(&a.body, b"\"tools\":[") {
                return Err(format!("bad list: {} {}", a.status, String::from_utf8_lossy(&a.body)));
            }
        }
        Mode::Streams => unreachable!("streams::run"),
        Mode::Cold => unreachable!("cold"),
        Mode::Mrtr | Mode::Park => {
            let caps = json!({"elicitation": {}});
            let args = json!({"question": "bench?"});
            let body = modern_body(2 * n + 1, "ask_user", args.clone(), caps.clone(), None);
            let a = conn.send(modern_request(o, "ask_user", body, o.bearer.clone())).await?;
            let msg = message(&a).ok_or_else(|| format!("status {}: unparsable answer", a.status))?;
            let result = msg.get("result").ok_or_else(|| format!("no result: {msg}"))?;
            if result.get("resultType").and_then(Value::as_str) != Some("input_required")
                || result.pointer("/inputRequests/elicitation_1").is_none()
            {
                return Err(format!("not input_required: {msg}"));
            }
            let state = result.get("requestState").cloned().ok_or("no requestState")?;
            let first = start.elapsed();
            if o.mode == Mode::Park {
                return Ok(Sample { total: first, legs: None });
            }
            let responses = json!({"elicitation_1": {"action": "accept", "content": {"answer": "x"}}});
            let body = modern_body(2 * n + 2, "ask_user", args, caps, Some((responses, state)));
            let a = conn.send(modern_request(o, "ask_user", body, o.bearer.clone())).await?;
            let msg = message(&a).ok_or_else(|| format!("status {}: unparsable retry answer", a.status))?;
            let text = msg.pointer("/result/content/0/text").and_then(Value::as_str);
            if text != Some("you answered: x") {
                return Err(format!("retry: {msg}"));
            }
            let total = start.elapsed();
            return Ok(Sample { total, legs: Some((first, total - first)) });
        }
    }
    Ok(Sample { total: start.elapsed(), legs: None })
}

#[derive(Default)]
struct WorkerOut {
    lat: Vec<u32>,
    legs: Vec<(u32, u32)>,
    ok: u64,
    /// Successful requests including the warm-up (for CPU per request).
    all: u64,
    errors: u64,
    first_error: Option<String>,
}

fn micros(d: Duration) -> u32 {
    d.as_micros().min(u32::MAX as u128) as u32
}

async fn run(mut o: Opts) -> Result<Value, String> {
    if o.mode == Mode::Legacy {
        o.session = Some(open_session(&o, json!({})).await?);
    }
    let counted = matches!(o.mode, Mode::Park | Mode::Principals);
    let o = Arc::new(o);
    let seq = Arc::new(AtomicU64::new(0));
    let begin = Instant::now();
    let measure_from = if counted { begin } else { begin + o.warmup };
    let until = if counted {
        // A bound, not a target: counted modes stop when the count is done.
        begin + Duration::from_secs(600)
    } else {
        measure_from + o.duration
    };
    let mut workers = Vec::new();
    for _ in 0..o.concurrency {
        let (o, seq) = (o.clone(), seq.clone());
        workers.push(tokio::spawn(async move {
            let mut out = WorkerOut::default();
            let mut conn = Conn::new(o.addr);
            loop {
                let now = Instant::now();
                if now >= until {
                    break;
                }
                let n = seq.fetch_add(1, Ordering::Relaxed);
                if counted && n >= o.count {
                    break;
                }
                let started = Instant::now();
                let r = once(&o, &mut conn, n).await;
                let measured = counted || (started >= measure_from && Instant::now() <= until);
                if r.is_ok() {
                    out.all += 1;
                }
                match r {
                    Ok(s) if measured => {
                        out.ok += 1;
                        out.lat.push(micros(s.total));
                        if let Some((a, b)) = s.legs {
                            out.legs.push((micros(a), micros(b)));
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        out.errors += 1;
                        out.first_error.get_or_insert(e);
                        // Do not spin on a dead target.
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
            out
        }));
    }
    let mut all = WorkerOut::default();
    for w in workers {
        let w = w.await.map_err(|e| format!("worker: {e}"))?;
        all.lat.extend(w.lat);
        all.legs.extend(w.legs);
        all.ok += w.ok;
        all.all += w.all;
        all.errors += w.errors;
        if all.first_error.is_none() {
            all.first_error = w.first_error;
        }
    }
    let elapsed = if counted { begin.elapsed() } else { until.saturating_duration_since(measure_from) };
    all.lat.sort_unstable();
    let pct = |v: &[u32], p: f64| -> Value {
        if v.is_empty() {
            Value::Null
        } else {
            json!(v[((v.len() - 1) as f64 * p).round() as usize])
        }
    };
    let mean = if all.lat.is_empty() {
        0.0
    } else {
        all.lat.iter().map(|&x| x as f64).sum::<f64>() / all.lat.len() as f64
    };
    let mode = format!("{:?}", o.mode).to_lowercase();
    let mut line = json!({
        "kind": "load",
        "label": o.label,
        "rep": o.rep,
        "mode": mode,
        "concurrency": o.concurrency,
        "seconds": elapsed.as_secs_f64(),
        "requests": all.ok,
        "all_requests": all.all,
        "errors": all.errors,
        "rps": all.ok as f64 / elapsed.as_secs_f64().max(1e-9),
        "p50_us": pct(&all.lat, 0.50),
        "p99_us": pct(&all.lat, 0.99),
        "mean_us": mean.round(),
        "max_us": all.lat.last().copied(),
    });
    if !all.legs.is_empty() {
        let mut q: Vec<u32> = all.legs.iter().map(|l| l.0).collect();
        let mut r: Vec<u32> = all.legs.iter().map(|l| l.1).collect();
        q.sort_unstable();
        r.sort_unstable();
        line["question_p50_us"] = pct(&q, 0.5);
        line["retry_p50_us"] = pct(&r, 0.5);
    }
    if let Some(e) = all.first_error {
        line["first_error"] = json!(e.chars().take(300).collect::<String>());
    }
    Ok(line)
}

/// One 2026 `tools/call` carrying `token`, timed and checked.
async fn timed_call(o: &Opts, conn: &mut Conn, n: u64, token: &str) -> Result<Duration, String> {
    let body = modern_body(n, &o.tool, json!({"text": "hi"}), json!({}), None);
    let req = modern_request(o, &o.tool, body, Some(token.to_string()));
    let start = Instant::now();
    let answer = conn.send(req).await?;
    let took = start.elapsed();
    modern_echo_ok(&answer)?;
    Ok(took)
}

/// `loadgen cold`: what a call on a new session costs (on a stdio route, a
/// process spawned and initialized first) beside a call on an open one.
/// One connection (kept alive), one call at a time: a warm call (one
/// principal, its session opened before the first sample), then a cold one
/// (a principal of its own), each after `--pause-ms` of quiet, `--count`
/// times. The tokens carry a nonce of the run, so no two runs share one.
async fn cold(o: Opts) -> Result<Value, String> {
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
        ^ u64::from(std::process::id());
    let mut conn = Conn::new(o.addr);
    let warm_token = format!("warm-{nonce:x}");
    // The warm principal's session opened (twice: the first call opens it).
    for n in 0..2 {
        timed_call(&o, &mut conn, n + 1, &warm_token).await.map_err(|e| format!("warm-up: {e}"))?;
    }
    let (mut cold, mut warm) = (Vec::new(), Vec::new());
    let (mut errors, mut first_error) = (0u64, None);
    for n in 0..o.count {
        for is_cold in [false, true] {
            tokio::time::sleep(o.pause).await;
            let token = if is_cold { format!("cold-{nonce:x}-{n}") } else { warm_token.clone() };
            match timed_call(&o, &mut conn, 2 * n + 3 + u64::from(is_cold), &token).await {
                Ok(took) if is_cold => cold.push(micros(took)),
                Ok(took) => warm.push(micros(took)),
                Err(e) => {
                    errors += 1;
                    first_error.get_or_insert(format!("{} call: {e}", if is_cold { "cold" } else { "warm" }));
                }
            }
        }
    }
    let samples = cold.clone();
    cold.sort_unstable();
    warm.sort_unstable();
    // As the load modes take their p50.
    let p50 =
        |v: &[u32]| if v.is_empty() { None } else { Some(v[((v.len() - 1) as f64 * 0.5).round() as usize]) };
    let ratio = match (p50(&cold), p50(&warm)) {
        (Some(c), Some(w)) if w > 0 => json!(f64::from(c) / f64::from(w)),
        _ => Value::Null,
    };
    let mut line = json!({
        "kind": "cold", "label": o.label, "rep": o.rep, "path": o.path, "count": o.count,
        "pause_ms": o.pause.as_millis() as u64,
        "cold_calls": cold.len(), "warm_calls": warm.len(), "errors": errors,
        "cold_p50_us": p50(&cold), "cold_min_us": cold.first(), "cold_max_us": cold.last(),
        "warm_p50_us": p50(&warm), "warm_min_us": warm.first(), "warm_max_us": warm.last(),
        "cold_over_warm": ratio, "cold_us": samples,
    });
    if let Some(e) = first_error {
        line["first_error"] = json!(e.chars().take(300).collect::<String>());
    }
    Ok(line)
}

/// `loadgen streams`: long-lived streams opened by the thousand and held
/// idle, for the gateway's memory per held stream (`bench/run.sh` part
/// `streams`). Each stream has its own connection; its events (keep-alive
/// comments) are read as they come, so that the gateway never waits on it.
mod streams {
    use super::*;
    use hyper::body::Incoming;
    use tokio::sync::{mpsc, Semaphore};
    use tokio_util::sync::CancellationToken;

    /// The opening phase's bound: a stream not open by then counts as failed.
    const OPEN_BOUND: Duration = Duration::from_secs(300);
    /// The bytes read while waiting for a listen stream's acknowledgement.
    const ACK_BOUND: usize = 64 << 10;

    pub async fn run(o: Opts) -> Result<(), String> {
        let o = Arc::new(o);
        let begin = Instant::now();
        let gate = Arc::new(Semaphore::new(o.concurrency));
        let release = CancellationToken::new();
        let (opened_tx, mut opened_rx) = mpsc::unbounded_channel::<Result<(), String>>();
        let mut holders = Vec::with_capacity(o.count as usize);
        for n in 0..o.count {
            let (o, gate, release, opened) = (o.clone(), gate.clone(), release.clone(), opened_tx.clone());
            holders.push(tokio::spawn(async move {
                let permit = gate.acquire_owned().await.expect("never closed");
                let open = tokio::time::timeout(OPEN_BOUND, open(&o, n)).await;
                drop(permit);
                let (sender, body) = match open {
                    Ok(Ok(held)) => held,
                    Ok(Err(e)) => return drop(opened.send(Err(e))),
                    Err(_) => return drop(opened.send(Err("not open in time".into()))),
                };
                let _ = opened.send(Ok(()));
                if hold(body, &release).await {
                    STILL_OPEN.fetch_add(1, Ordering::Relaxed);
                }
                drop(sender);
            }));
        }
        drop(opened_tx);
        let (mut opened, mut errors, mut first_error) = (0u64, 0u64, None);
        while let Some(r) = opened_rx.recv().await {
            match r {
                Ok(()) => opened += 1,
                Err(e) => {
                    errors += 1;
                    first_error.get_or_insert(e);
                }
            }
            if opened + errors == o.count {
                break;
            }
        }
        let kind = format!("{:?}", o.kind).to_lowercase();
        let mut line = json!({
            "kind": "streams", "label": o.label, "rep": o.rep, "stream": kind,
            "count": o.count, "opened": opened, "errors": errors,
            "open_seconds": begin.elapsed().as_secs_f64(), "hold_seconds": o.duration.as_secs_f64(),
        });
        if let Some(e) = first_error {
            line["first_error"] = json!(e.chars().take(300).collect::<String>());
        }
        println!("{line}");
        tokio::time::sleep(o.duration).await;
        release.cancel();
        for h in holders {
            let _ = h.await;
        }
        let still = STILL_OPEN.load(Ordering::Relaxed);
        println!(
            "{}",
            json!({"kind": "streams_end", "label": o.label, "rep": o.rep, "stream": kind,
                "opened": opened, "still_open": still, "ended_early": opened - still})
        );
        Ok(())
    }

    static STILL_OPEN: AtomicU64 = AtomicU64::new(0);

    type Sender = SendRequest<Full<Bytes>>;

    /// Reads a held stream until it is let go (true) or ends first (false).
    async fn hold(mut body: Incoming, release: &CancellationToken) -> bool {
        loop {
            tokio::select! {
                _ = release.cancelled() => return true,
                frame = body.frame() => match frame {
                    Some(Ok(_)) => {}
                    _ => return false,
                },
            }
        }
    }

    /// One connection and one stream on it, open and acknowledged.
    async fn open(o: &Opts, n: u64) -> Result<(Sender, Incoming), String> {
        let stream = TcpStream::connect(o.addr).await.map_err(|e| format!("connect: {e}"))?;
        let _ = stream.set_nodelay(true);
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("handshake: {e}"))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let resp = match o.kind {
            StreamKind::Get => {
                let session = session(o, &mut sender).await?;
                let req = Request::builder()
                    .method("GET")
                    .uri(o.path.as_str())
                    .header("host", o.addr.to_string())
                    .header("accept", "text/event-stream")
                    .header("mcp-session-id", session)
                    .header("mcp-protocol-version", LEGACY)
                    .body(Full::new(Bytes::new()))
                    .expect("request");
                send(&mut sender, req).await?
            }
            StreamKind::Listen => {
                let body = json!({"jsonrpc": "2.0", "id": n + 1, "method": "subscriptions/listen", "params": {
                    "notifications": {"toolsListChanged": true},
                    "_meta": {"io.modelcontextprotocol/protocolVersion": MODERN,
                              "io.modelcontextprotocol/clientCapabilities": {}}}});
                let mut b = request(o)
                    .header("mcp-protocol-version", MODERN)
                    .header("mcp-method", "subscriptions/listen");
                if let Some(t) = &o.bearer {
                    b = b.header("authorization", format!("Bearer {t}"));
                }
                let req = b.body(Full::new(Bytes::from(body.to_string()))).expect("request");
                send(&mut sender, req).await?
            }
        };
        let sse = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        if resp.status() != StatusCode::OK || !sse {
            let status = resp.status();
            let body = resp.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
            return Err(format!("status {status}: {}", String::from_utf8_lossy(&body)));
        }
        let mut body = resp.into_body();
        if o.kind == StreamKind::Listen {
            acknowledged(&mut body).await?;
        }
        Ok((sender, body))
    }

    async fn send(
        sender: &mut Sender,
        req: Request<Full<Bytes>>,
    ) -> Result<hyper::Response<Incoming>, String> {
        sender.ready().await.map_err(|e| format!("ready: {e}"))?;
        sender.send_request(req).await.map_err(|e| format!("send: {e}"))
    }

    /// A legacy session opened on this connection: initialize, then
    /// notifications/initialized.
    async fn session(o: &Opts, sender: &mut Sender) -> Result<String, String> {
        let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": LEGACY, "capabilities": {},
            "clientInfo": {"name": "loadgen", "version": "1"}}});
        let req = request(o).body(Full::new(Bytes::from(init.to_string()))).expect("request");
        let resp = send(sender, req).await?;
        let status = resp.status();
        let sid = resp.headers().get("mcp-session-id").and_then(|v| v.to_str().ok()).map(str::to_string);
        let body = resp.into_body().collect().await.map_err(|e| format!("body: {e}"))?.to_bytes();
        let sid = match (status, sid) {
            (StatusCode::OK, Some(sid)) => sid,
            _ => return Err(format!("initialize: status {status}: {}", String::from_utf8_lossy(&body))),
        };
        let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        let req = request(o)
            .header("mcp-session-id", sid.as_str())
            .header("mcp-protocol-version", LEGACY)
            .body(Full::new(Bytes::from(note.to_string())))
            .expect("request");
        let resp = send(sender, req).await?;
        let status = resp.status();
        let _ = resp.into_body().collect().await;
        if status != StatusCode::ACCEPTED {
            return Err(format!("initialized: status {status}"));
        }
        Ok(sid)
    }

    /// Reads a listen stream up to its acknowledgement.
    async fn acknowledged(body: &mut Incoming) -> Result<(), String> {
        let mut seen = Vec::new();
        while seen.len() < ACK_BOUND {
            match body.frame().await {
                Some(Ok(frame)) => {
                    if let Some(data) = frame.data_ref() {
                        seen.extend_from_slice(data);
                    }
                    if contains(&seen, b"notifications/subscriptions/acknowledged") {
                        return Ok(());
                    }
                }
                Some(Err(e)) => return Err(format!("stream: {e}")),
                None => {
                    return Err(format!(
                        "ended before its acknowledgement: {}",
                        String::from_utf8_lossy(&seen)
                    ))
                }
            }
        }
        Err("no acknowledgement".into())
    }
}

/// `loadgen report`: medians over repetitions, ratios per repetition, targets.
mod report {
    use super::*;
    use std::fmt::Write as _;

    fn median(mut v: Vec<f64>) -> Option<f64> {
        v.retain(|x| x.is_finite());
        if v.is_empty() {
            return None;
        }
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let n = v.len();
        Some(if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 })
    }

    fn f(v: Option<f64>, digits: usize) -> String {
        match v {
            Some(x) => format!("{x:.digits$}"),
            None => "n/a".into(),
        }
    }

    fn verdict(ok: Option<bool>) -> &'static str {
        match ok {
            Some(true) => "PASS",
            Some(false) => "FAIL",
            None => "n/a",
        }
    }

    /// Criterion medians (ns) by benchmark id, from `DIR/*/new/`.
    fn criterion(dir: &str) -> BTreeMap<String, f64> {
        let mut out = BTreeMap::new();
        let Ok(entries) = std::fs::read_dir(dir) else {
            return out;
        };
        for e in entries.flatten() {
            let new = e.path().join("new");
            let (Ok(b), Ok(est)) = (
                std::fs::read_to_string(new.join("benchmark.json")),
                std::fs::read_to_string(new.join("estimates.json")),
            ) else {
                continue;
            };
            let (Ok(b), Ok(est)) = (serde_json::from_str::<Value>(&b), serde_json::from_str::<Value>(&est))
            else {
                continue;
            };
            if let (Some(id), Some(m)) = (
                b.get("full_id").and_then(Value::as_str),
                est.pointer("/median/point_estimate").and_then(Value::as_f64),
            ) {
                out.insert(id.to_string(), m);
            }
        }
        out
    }

    pub fn main(args: &[String]) {
        let mut results = None;
        let mut crit = None;
        let mut it = args.iter();
        while let Some(flag) = it.next() {
            match (flag.as_str(), it.next()) {
                ("--results", Some(v)) => results = Some(v.clone()),
                ("--criterion", Some(v)) => crit = Some(v.clone()),
                _ => usage(),
            }
        }
        let Some(results) = results else { usage() };
        let text = std::fs::read_to_string(&results).expect("read results");
        let lines: Vec<Value> = text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
        print!("{}", render(&lines, crit.as_deref().map(criterion).unwrap_or_default()));
    }

    fn load<'a>(lines: &'a [Value], label: &'a str, c: u64) -> impl Iterator<Item = &'a Value> + 'a {
        lines.iter().filter(move |l| {
            l["kind"] == "load" && l["label"] == label && l["concurrency"].as_u64() == Some(c)
        })
    }

    fn num(l: &Value, k: &str) -> f64 {
        l[k].as_f64().unwrap_or(f64::NAN)
    }

    fn by_rep<'a>(lines: &'a [Value], label: &'a str, c: u64) -> BTreeMap<u64, &'a Value> {
        load(lines, label, c).map(|l| (l["rep"].as_u64().unwrap_or(0), l)).collect()
    }

    /// The medians of one cell at one concurrency, per repetition ratios.
    struct Ratios {
        tput: Option<f64>,
        added: Option<f64>,
        gateway_errors: u64,
    }

    /// One group of load cells: direct, nginx and the gateway, each at
    /// concurrency 1, 8 and 32. `prefix` is the group's label prefix ("" for
    /// the stateless echo cells, "legacy-" for the legacy relay cells). Writes
    /// the medians table and the ratios table; returns the ratios by concurrency.
    fn group(s: &mut String, lines: &[Value], prefix: &str, title: &str, reps: usize) -> Vec<(u64, Ratios)> {
        let labels = ["direct", "nginx", "sessionless"].map(|t| format!("{prefix}{t}"));
        group_of(s, lines, &labels, title, reps)
    }

    /// [`group`] with the three cells' labels given: direct, nginx, the gateway.
    fn group_of(
        s: &mut String,
        lines: &[Value],
        labels: &[String; 3],
        title: &str,
        reps: usize,
    ) -> Vec<(u64, Ratios)> {
        let targets = ["direct", "nginx", "sessionless"];
        let label = |t: &str| labels[targets.iter().position(|x| *x == t).expect("a target")].clone();
        let _ = writeln!(s, "### {title}, closed loop, medians over {reps} repetitions\n");
        let _ = writeln!(
            s,
            "| concurrency | target | req/s | p50 µs | p99 µs | errors | proxy CPU µs/req | of which user + sys | upstream CPU µs/req |"
        );
        let _ = writeln!(s, "|---:|---|---:|---:|---:|---:|---:|---:|---:|");
        let mut ratio_rows = Vec::new();
        let mut out = Vec::new();
        for c in [1u64, 8, 32] {
            for t in targets {
                let l = label(t);
                let ls: Vec<&Value> = load(lines, &l, c).collect();
                if ls.is_empty() {
                    continue;
                }
                let med = |k: &str| median(ls.iter().map(|l| num(l, k)).collect());
                let errors: u64 = ls.iter().filter_map(|l| l["errors"].as_u64()).sum();
                let _ = writeln!(
                    s,
                    "| {c} | {t} | {} | {} | {} | {errors} | {} | {} | {} |",
                    f(med("rps"), 0),
                    f(med("p50_us"), 0),
                    f(med("p99_us"), 0),
                    if t == "direct" { "—".into() } else { f(med("proxy_cpu_us"), 1) },
                    match (t, med("proxy_user_us"), med("proxy_sys_us")) {
                        ("direct", ..) | (_, None, _) | (_, _, None) => "—".into(),
                        (_, u, sys) => format!("{} + {}", f(u, 1), f(sys, 1)),
                    },
                    f(med("upstream_cpu_us"), 1)
                );
            }
            // Ratios are taken within each repetition (same minute, same load), then the median.
            let (dl, nl, gl) = (label("direct"), label("nginx"), label("sessionless"));
            let (d, n, g) = (by_rep(lines, &dl, c), by_rep(lines, &nl, c), by_rep(lines, &gl, c));
            let mut cpu = Vec::new();
            let mut tput = Vec::new();
            let mut added = Vec::new();
            let mut sl_added = Vec::new();
            let mut ng_added = Vec::new();
            for (rep, gl) in &g {
                if let Some(nl) = n.get(rep) {
                    tput.push(num(gl, "rps") / num(nl, "rps"));
                    cpu.push(num(gl, "proxy_cpu_us") / num(nl, "proxy_cpu_us"));
                    if let Some(dl) = d.get(rep) {
                        let a_sl = num(gl, "p50_us") - num(dl, "p50_us");
                        let a_ng = num(nl, "p50_us") - num(dl, "p50_us");
                        sl_added.push(a_sl);
                        ng_added.push(a_ng);
                        added.push(if a_ng > 0.0 { a_sl / a_ng } else { f64::NAN });
                    }
                }
            }
            let gateway_errors: u64 = load(lines, &gl, c).filter_map(|l| l["errors"].as_u64()).sum();
            let tput_m = median(tput);
            let added_m = median(added);
            ratio_rows.push(format!(
                "| {c} | {} | {} | {} | {} | {} |",
                f(tput_m, 2),
                f(median(cpu), 2),
                f(median(sl_added), 0),
                f(median(ng_added), 0),
                f(added_m, 2)
            ));
            out.push((c, Ratios { tput: tput_m, added: added_m, gateway_errors }));
        }
        let _ = writeln!(s, "\n### Ratios (per repetition, then median)\n");
        let _ = writeln!(
            s,
            "| concurrency | req/s sessionless ÷ nginx | proxy CPU/req sessionless ÷ nginx | sessionless added p50 µs | nginx added p50 µs | added ÷ added |"
        );
        let _ = writeln!(s, "|---:|---:|---:|---:|---:|---:|");
        for r in &ratio_rows {
            let _ = writeln!(s, "{r}");
        }
        out
    }

    /// The gateway's two paths for the same 2026 request, side by side: the
    /// pass-through (2026 upstream) and the translating path (legacy
    /// upstream, one pooled session). Ratios per repetition, then the median.
    fn pass_through_vs_translating(s: &mut String, lines: &[Value]) {
        let _ = writeln!(s, "\n### The gateway's pass-through beside its translating path (same request)\n");
        let _ = writeln!(
            s,
            "| concurrency | pass-through req/s | translating req/s | req/s ÷ | pass-through p50 µs | translating p50 µs | p50 ÷ | pass-through CPU µs/req | translating CPU µs/req | CPU ÷ | errors |"
        );
        let _ = writeln!(s, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        for c in [1u64, 8, 32] {
            let (p, t) = (by_rep(lines, "modern-sessionless", c), by_rep(lines, "sessionless", c));
            let med = |m: &BTreeMap<u64, &Value>, k: &str| median(m.values().map(|l| num(l, k)).collect());
            let ratio = |k: &str| {
                median(p.iter().filter_map(|(rep, a)| t.get(rep).map(|b| num(a, k) / num(b, k))).collect())
            };
            let errors: u64 = p.values().chain(t.values()).filter_map(|l| l["errors"].as_u64()).sum();
            let _ = writeln!(
                s,
                "| {c} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {errors} |",
                f(med(&p, "rps"), 0),
                f(med(&t, "rps"), 0),
                f(ratio("rps"), 2),
                f(med(&p, "p50_us"), 0),
                f(med(&t, "p50_us"), 0),
                f(ratio("p50_us"), 2),
                f(med(&p, "proxy_cpu_us"), 1),
                f(med(&t, "proxy_cpu_us"), 1),
                f(ratio("proxy_cpu_us"), 2),
            );
        }
    }

    /// The same 2026 echo on one gateway through an open route, an API-key
    /// route and a JWT route (HS256, the verified token cached): what
    /// authentication adds per request. Ratios per repetition, then the median.
    fn auth_paths(s: &mut String, lines: &[Value]) {
        let _ = writeln!(
            s,
            "\n### Authentication: the same call on an open route, an API-key route and a JWT route\n"
        );
        let _ = writeln!(
            s,
            "| concurrency | route | req/s | req/s ÷ open | p50 µs | added p50 µs over open | proxy CPU µs/req | added CPU µs/req | errors |"
        );
        let _ = writeln!(s, "|---:|---|---:|---:|---:|---:|---:|---:|---:|");
        for c in [1u64, 8, 32] {
            let open = by_rep(lines, "auth-open", c);
            for route in ["open", "api_key", "jwt"] {
                let label = format!("auth-{route}");
                let m = by_rep(lines, &label, c);
                if m.is_empty() {
                    continue;
                }
                let med = |k: &str| median(m.values().map(|l| num(l, k)).collect());
                let per_rep = |k: &str, op: fn(f64, f64) -> f64| {
                    median(
                        m.iter()
                            .filter_map(|(rep, a)| open.get(rep).map(|b| op(num(a, k), num(b, k))))
                            .collect(),
                    )
                };
                let errors: u64 = m.values().filter_map(|l| l["errors"].as_u64()).sum();
                let _ = writeln!(
                    s,
                    "| {c} | {route} | {} | {} | {} | {} | {} | {} | {errors} |",
                    f(med("rps"), 0),
                    f(per_rep("rps", |a, b| a / b), 3),
                    f(med("p50_us"), 0),
                    f(per_rep("p50_us", |a, b| a - b), 0),
                    f(med("proxy_cpu_us"), 1),
                    f(per_rep("proxy_cpu_us", |a, b| a - b), 1),
                );
            }
        }
    }

    /// System calls per request (`strace -c -f` on one run at c=32), by proxy.
    fn syscalls(s: &mut String, lines: &[Value]) {
        let rows: Vec<&Value> = lines.iter().filter(|l| l["kind"] == "syscalls").collect();
        if rows.is_empty() {
            return;
        }
        let _ = writeln!(s, "### System calls per request (strace -c -f, one run at concurrency 32)\n");
        let _ = writeln!(s, "| process | requests | calls/req | of which failed | per call (/req) |");
        let _ = writeln!(s, "|---|---:|---:|---:|---|");
        for r in rows {
            let n = num(r, "requests");
            let mut calls: Vec<(String, f64, f64)> = r["calls"]
                .as_object()
                .map(|m| {
                    let per_req = |v: &Value| v.as_f64().unwrap_or(0.0) / n;
                    m.iter().map(|(k, v)| (k.clone(), per_req(&v[0]), per_req(&v[1]))).collect()
                })
                .unwrap_or_default();
            calls.sort_by(|a, b| b.1.partial_cmp(&a.1).unwrap_or(std::cmp::Ordering::Equal));
            let each: Vec<String> =
                calls
                    .iter()
                    .filter(|c| c.1 >= 0.01)
                    .map(|(k, c, e)| {
                        if *e >= 0.01 {
                            format!("{k} {c:.2} ({e:.2} failed)")
                        } else {
                            format!("{k} {c:.2}")
                        }
                    })
                    .collect();
            let _ = writeln!(
                s,
                "| {} | {n} | {} | {} | {} |",
                r["label"].as_str().unwrap_or("?"),
                f(Some(num(r, "total") / n), 2),
                f(Some(num(r, "errors") / n), 2),
                each.join(", ")
            );
        }
        s.push('\n');
    }

    /// A federated route of three members beside a route of one upstream
    /// (the same fast server): medians per concurrency, and their ratios.
    fn federation(s: &mut String, lines: &[Value]) {
        let _ = writeln!(s, "\n### A federated route (three members) beside a single upstream\n");
        let _ = writeln!(
            s,
            "| c | call: single req/s | call: federated req/s | ÷ | list: single req/s | list: federated (3 members) req/s | ÷ | proxy CPU µs/req, call single / federated / list single / federated | errors |"
        );
        let _ = writeln!(s, "|---:|---:|---:|---:|---:|---:|---:|---|---:|");
        let cs: std::collections::BTreeSet<u64> = lines
            .iter()
            .filter(|l| l["label"].as_str().is_some_and(|t| t.starts_with("fed-")))
            .filter_map(|l| l["concurrency"].as_u64())
            .collect();
        for c in cs {
            let of = |label: &str| -> Vec<&Value> {
                lines.iter().filter(|l| l["label"] == label && l["concurrency"].as_u64() == Some(c)).collect()
            };
            let m = |label: &str, k: &str| median(of(label).iter().map(|l| num(l, k)).collect());
            let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
                (Some(a), Some(b)) if b > 0.0 => Some(a / b),
                _ => None,
            };
            let errors: u64 =
                ["fed-call-single", "fed-call-federated", "fed-list-single", "fed-list-federated"]
                    .iter()
                    .flat_map(|l| of(l))
                    .filter_map(|l| l["errors"].as_u64())
                    .sum();
            let (cs1, cf, ls, lf) = (
                m("fed-call-single", "rps"),
                m("fed-call-federated", "rps"),
                m("fed-list-single", "rps"),
                m("fed-list-federated", "rps"),
            );
            let cpu = ["fed-call-single", "fed-call-federated", "fed-list-single", "fed-list-federated"]
                .map(|l| f(m(l, "proxy_cpu_us"), 1))
                .join(" / ");
            let _ = writeln!(
                s,
                "| {c} | {} | {} | {} | {} | {} | {} | {cpu} | {errors} |",
                f(cs1, 0),
                f(cf, 0),
                f(ratio(cf, cs1), 2),
                f(ls, 0),
                f(lf, 0),
                f(ratio(lf, ls), 2)
            );
        }
    }

    /// Part `stdio`: the same echo through the gateway to the fast server
    /// as a stdio upstream and over HTTP (ratios per repetition, then the
    /// median), and the cold calls (a new session each: on stdio, a process
    /// spawned and initialized) beside warm ones.
    fn stdio(s: &mut String, lines: &[Value]) {
        let cells = ["stdio-http", "stdio-stdio"];
        if lines.iter().any(|l| l["kind"] == "load" && l["label"] == cells[1]) {
            let _ = writeln!(
                s,
                "\n### A stdio upstream beside the same server over HTTP (examples/fast_upstream.rs, `--stdio`; ratios per repetition, then the median)\n"
            );
            let _ = writeln!(
                s,
                "| c | HTTP req/s | stdio req/s | stdio ÷ HTTP | HTTP p50 µs | stdio p50 µs | stdio ÷ HTTP | gateway CPU µs/req HTTP / stdio | upstream CPU µs/req HTTP / stdio | errors |"
            );
            let _ = writeln!(s, "|---:|---:|---:|---:|---:|---:|---:|---|---|---:|");
            for c in [1u64, 8, 32] {
                let (h, t) = (by_rep(lines, cells[0], c), by_rep(lines, cells[1], c));
                if t.is_empty() {
                    continue;
                }
                let med =
                    |m: &BTreeMap<u64, &Value>, k: &str| median(m.values().map(|l| num(l, k)).collect());
                let ratio = |k: &str| {
                    median(
                        t.iter().filter_map(|(rep, a)| h.get(rep).map(|b| num(a, k) / num(b, k))).collect(),
                    )
                };
                let errors: u64 = h.values().chain(t.values()).filter_map(|l| l["errors"].as_u64()).sum();
                let _ = writeln!(
                    s,
                    "| {c} | {} | {} | {} | {} | {} | {} | {} / {} | {} / {} | {errors} |",
                    f(med(&h, "rps"), 0),
                    f(med(&t, "rps"), 0),
                    f(ratio("rps"), 2),
                    f(med(&h, "p50_us"), 0),
                    f(med(&t, "p50_us"), 0),
                    f(ratio("p50_us"), 2),
                    f(med(&h, "proxy_cpu_us"), 1),
                    f(med(&t, "proxy_cpu_us"), 1),
                    f(med(&h, "upstream_cpu_us"), 1),
                    f(med(&t, "upstream_cpu_us"), 1),
                );
            }
        }
        let cold: Vec<&Value> = lines.iter().filter(|l| l["kind"] == "cold").collect();
        if cold.is_empty() {
            return;
        }
        let of = |label: &str| -> BTreeMap<u64, &Value> {
            cold.iter()
                .filter(|l| l["label"] == label)
                .map(|l| (l["rep"].as_u64().unwrap_or(0), *l))
                .collect()
        };
        let calls = cold.iter().filter_map(|l| l["count"].as_u64()).max().unwrap_or(0);
        let reps =
            cold.iter().filter_map(|l| l["rep"].as_u64()).collect::<std::collections::BTreeSet<_>>().len();
        let _ = writeln!(
            s,
            "\n### A call on a new session (a new principal) beside a warm call, concurrency 1: the median of {calls} cold and {calls} warm calls per repetition, then the median over {reps} repetitions\n"
        );
        let _ = writeln!(
            s,
            "| route | cold p50 µs | warm p50 µs | cold ÷ warm | cold − warm µs | cold ÷ stdio cold (no spare) | cold calls | errors |"
        );
        let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|");
        let base = of("stdio-cold");
        let rows = [
            ("stdio-cold-http", "HTTP upstream (a new session: `initialize` over HTTP, no spawn)"),
            ("stdio-cold", "stdio upstream, `spare_processes = 0` (a process spawned, then `initialize`)"),
            (
                "stdio-cold-spare",
                "stdio upstream, `spare_processes = 1` (a spare claimed, then `initialize`)",
            ),
        ];
        for (label, what) in rows {
            let m = of(label);
            if m.is_empty() {
                continue;
            }
            let med = |k: &str| median(m.values().map(|l| num(l, k)).collect());
            let per_rep = |op: fn(&Value, &Value) -> f64, other: &BTreeMap<u64, &Value>| {
                median(m.iter().filter_map(|(rep, a)| other.get(rep).map(|b| op(a, b))).collect())
            };
            let cold_over_warm = median(m.values().map(|l| num(l, "cold_over_warm")).collect());
            let added = median(m.values().map(|l| num(l, "cold_p50_us") - num(l, "warm_p50_us")).collect());
            let over_base = per_rep(|a, b| num(a, "cold_p50_us") / num(b, "cold_p50_us"), &base);
            let n: u64 = m.values().filter_map(|l| l["cold_calls"].as_u64()).sum();
            let errors: u64 = m.values().filter_map(|l| l["errors"].as_u64()).sum();
            let _ = writeln!(
                s,
                "| {what} | {} | {} | {} | {} | {} | {n} | {errors} |",
                f(med("cold_p50_us"), 0),
                f(med("warm_p50_us"), 0),
                f(cold_over_warm, 1),
                f(added, 0),
                f(over_base, 2),
            );
        }
    }

    fn render(lines: &[Value], crit: BTreeMap<String, f64>) -> String {
        let mut s = String::new();
        let reps = lines
            .iter()
            .filter(|l| l["kind"] == "load")
            .filter_map(|l| l["rep"].as_u64())
            .collect::<std::collections::BTreeSet<_>>()
            .len();
        let has = |label: &str| lines.iter().any(|l| l["kind"] == "load" && l["label"] == label);
        let mut verdicts = Vec::new();
        let targets = |verdicts: &mut Vec<String>, what: &str, ratios: Vec<(u64, Ratios)>| {
            for (c, r) in ratios {
                if c == 32 {
                    verdicts.push(format!(
                        "| throughput sessionless / nginx at c=32, no errors{what} | ≥ 0.90 | {} ({} errors) | {} |",
                        f(r.tput, 2),
                        r.gateway_errors,
                        verdict(r.tput.map(|t| t >= 0.9 && r.gateway_errors == 0))
                    ));
                }
                verdicts.push(format!(
                    "| added p50 over direct, sessionless / nginx, c={c}{what} | ≤ 1.5 | {} | {} |",
                    f(r.added, 2),
                    verdict(r.added.map(|a| a <= 1.5))
                ));
            }
        };
        // The fast upstream (the headline): every path, each beside nginx.
        if has("fast-sessionless") || has("fast-nginx") {
            let _ = writeln!(s, "## In front of the fast upstream (examples/fast_upstream.rs)\n");
            let fast = |t: &str| format!("fast-{t}");
            let groups: [(&str, [String; 3], &str); 6] = [
                ("2026 client, tools/call echo translated onto a legacy session; load generator single-threaded", ["direct", "nginx", "sessionless"].map(fast), ""),
                ("the same, load generator multi-threaded", ["direct", "nginx", "sessionless"].map(|t| format!("fastmt-{t}")), " (load generator multi-threaded)"),
                ("legacy client, tools/call echo on a session (the legacy relay)", ["legacy-direct", "legacy-nginx", "legacy-sessionless"].map(fast), " (legacy relay)"),
                ("2026 client on a 2026 upstream (the pass-through)", ["modern-direct", "modern-nginx", "modern-sessionless"].map(fast), " (pass-through)"),
                ("2026 client behind an API key (beside the echo cells' direct and nginx)", ["direct", "nginx", "apikey-sessionless"].map(fast), " (API key)"),
                ("2026 client behind a JWT (HS256, verification cached)", ["direct", "nginx", "jwt-sessionless"].map(fast), " (JWT)"),
            ];
            for (title, labels, what) in groups {
                if !has(&labels[2]) {
                    continue;
                }
                let ratios = group_of(&mut s, lines, &labels, title, reps);
                targets(&mut verdicts, &format!(", fast upstream{what}"), ratios);
                s.push('\n');
            }
        }
        syscalls(&mut s, lines);
        if has("sessionless") || has("nginx") || has("direct") {
            if !s.is_empty() {
                let _ = writeln!(s, "## In front of the demo server (sessionless demo-upstream)\n");
            }
            let ratios = group(&mut s, lines, "", "tools/call echo", reps);
            targets(&mut verdicts, "", ratios);
        }
        // A 2026 client on a 2026 upstream (`demo-upstream --generation
        // modern`): direct, through nginx, through the gateway's pass-through.
        if has("modern-sessionless") || has("modern-nginx") || has("modern-direct") {
            if !s.is_empty() {
                s.push('\n');
            }
            let title = "2026 client, tools/call echo on a 2026 upstream (pass-through)";
            let ratios = group(&mut s, lines, "modern-", title, reps);
            targets(&mut verdicts, " (pass-through)", ratios);
        }
        if has("modern-sessionless") && has("sessionless") {
            pass_through_vs_translating(&mut s, lines);
        }
        // The legacy relay (a 2025 session client through the gateway's
        // legacy cell): informative, no targets of its own.
        if has("legacy-sessionless") || has("legacy-nginx") || has("legacy-direct") {
            if !s.is_empty() {
                s.push('\n');
            }
            let title = "legacy client, tools/call echo on a session (relay)";
            group(&mut s, lines, "legacy-", title, reps);
        }

        if has("auth-open") {
            auth_paths(&mut s, lines);
        }
        if has("fed-call-federated") || has("fed-list-federated") {
            federation(&mut s, lines);
        }
        if has("stdio-stdio") || lines.iter().any(|l| l["kind"] == "cold") {
            stdio(&mut s, lines);
        }

        // MRTR
        let echo1: Vec<&Value> = lines.iter().filter(|l| l["label"] == "mrtr-echo").collect();
        let mrtr: Vec<&Value> = lines.iter().filter(|l| l["label"] == "mrtr").collect();
        if !mrtr.is_empty() {
            let m = |ls: &[&Value], k: &str| median(ls.iter().map(|l| num(l, k)).collect());
            let errs: u64 = mrtr.iter().chain(echo1.iter()).filter_map(|l| l["errors"].as_u64()).sum();
            let _ = writeln!(s, "\n### MRTR through sessionless, concurrency 1\n");
            let _ = writeln!(s, "| what | p50 µs | p99 µs |");
            let _ = writeln!(s, "|---|---:|---:|");
            let _ = writeln!(
                s,
                "| `echo` (one request, no question) | {} | {} |",
                f(m(&echo1, "p50_us"), 0),
                f(m(&echo1, "p99_us"), 0)
            );
            let _ = writeln!(
                s,
                "| `ask_user` round trip (question + retry) | {} | {} |",
                f(m(&mrtr, "p50_us"), 0),
                f(m(&mrtr, "p99_us"), 0)
            );
            let _ = writeln!(
                s,
                "| — leg 1: question → `input_required` | {} | |",
                f(m(&mrtr, "question_p50_us"), 0)
            );
            let _ = writeln!(s, "| — leg 2: retry → result | {} | |", f(m(&mrtr, "retry_p50_us"), 0));
            let ratio = match (m(&mrtr, "p50_us"), m(&echo1, "p50_us")) {
                (Some(a), Some(b)) if b > 0.0 => Some(a / b),
                _ => None,
            };
            let _ = writeln!(s, "\nround trip ÷ echo (p50): {} ; errors: {errs}", f(ratio, 1));
        }

        // Memory
        let mems: Vec<&Value> = lines.iter().filter(|l| l["kind"] == "mem").collect();
        if !mems.is_empty() {
            let _ = writeln!(s, "\n### Gateway memory (VmRSS)\n");
            let _ = writeln!(s, "| what | count | RSS before KiB | RSS after KiB | KiB each |");
            let _ = writeln!(s, "|---|---:|---:|---:|---:|");
            for m in &mems {
                let (b, a, n) = (num(m, "before_kb"), num(m, "after_kb"), num(m, "count"));
                let each = (a - b) / n;
                let _ = writeln!(
                    s,
                    "| {} | {} | {b:.0} | {a:.0} | {each:.2} |",
                    m["what"].as_str().unwrap_or("?"),
                    n
                );
                if m["held_stream"] == true {
                    verdicts.push(format!(
                        "| memory per held stream: {} | ≤ 16 KiB | {each:.2} KiB ({n} held) | {} |",
                        m["what"].as_str().unwrap_or("?"),
                        verdict(Some(each <= 16.0 && n > 0.0))
                    ));
                }
                if m["what"] == "parked flows" {
                    verdicts.push(format!(
                        "| memory per parked flow | ≤ 16 KiB | {each:.2} KiB ({n} parked) | {} |",
                        verdict(Some(each <= 16.0 && n > 0.0))
                    ));
                }
            }
        }

        // Criterion
        if !crit.is_empty() {
            let _ = writeln!(s, "\n### Criterion microbenchmarks (median)\n");
            let _ = writeln!(s, "| benchmark | median |");
            let _ = writeln!(s, "|---|---:|");
            for (id, ns) in &crit {
                let _ = writeln!(
                    s,
                    "| {id} | {} |",
                    if *ns >= 1000.0 { format!("{:.2} µs", ns / 1000.0) } else { format!("{ns:.0} ns") }
                );
            }
            if let Some(ns) = crit.get("seal+open") {
                verdicts.push(format!(
                    "| seal+open | < 5 µs | {:.2} µs | {} |",
                    ns / 1000.0,
                    verdict(Some(*ns < 5000.0))
                ));
            }
        }

        if !verdicts.is_empty() {
            let _ = writeln!(s, "\n### Targets\n");
            let _ = writeln!(s, "| target | goal | measured | verdict |");
            let _ = writeln!(s, "|---|---|---|---|");
            for v in verdicts {
                let _ = writeln!(s, "{v}");
            }
        }
        s
    }
}
