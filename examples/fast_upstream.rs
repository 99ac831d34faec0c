//! The benchmark's fast upstream: a minimal MCP server whose own cost per
//! request is a few µs, so that what a proxy in front of it costs is not
//! hidden behind the server's (the built-in demo server spends about 15 µs
//! per request in hyper and its JSON-RPC layer).
//!
//! ```text
//! fast_upstream [--listen 127.0.0.1:0] [--generation legacy|modern]
//! fast_upstream --stdio
//! ```
//!
//! No framework: one single-threaded tokio runtime, HTTP/1.1 keep-alive read
//! with `httparse`, the JSON-RPC envelope read borrowed, every answer written
//! with one `write_all`. It serves exactly what the benchmark sends:
//!
//! - `legacy` (2025-11-25, the default): `initialize` mints an
//!   `Mcp-Session-Id` (kept in a set; a request naming an unknown one gets
//!   404, none at all 400), notifications 202, `tools/list`, `ping`,
//!   `tools/call echo`, `DELETE` ends the session; `GET` on a session opens
//!   its standalone SSE stream, which stays open and quiet.
//! - `modern` (2026-07-28, stateless): `server/discover`, `tools/list`,
//!   `tools/call echo` with `resultType: complete`; `subscriptions/listen`
//!   answers an SSE stream that acknowledges the filter and then stays open
//!   and quiet; `initialize` is refused with -32022 (a 2026-only server).
//!
//! - `--stdio`: the `legacy` server as a program on stdin/stdout (a stdio
//!   upstream's `command`): one JSON-RPC message per line each way, the
//!   same answers as over HTTP (the same code writes them), one `write_all`
//!   per answer; no session id (the process is the session); it ends when
//!   stdin does. It logs to stderr only. `bench/run.sh` part `stdio` sets it
//!   beside the same server over HTTP, so that only the transport differs.
//!
//! A held stream (chunked `text/event-stream`) lasts until the peer closes
//! the connection: it is what `bench/run.sh` part `streams` holds by the
//! thousand through the gateway.
//!
//! Bodies are capped at 1 MiB and heads at 64 headers / 16 KiB; anything it
//! cannot parse closes the connection. It is a benchmark tool, bound to
//! loopback by `bench/run.sh`, not a server to deploy.

use std::cell::RefCell;
use std::collections::HashSet;
use std::net::SocketAddr;
use std::rc::Rc;

use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const MAX_BODY: usize = 1 << 20;
const MAX_HEAD: usize = 16 << 10;

#[derive(Clone, Copy, PartialEq)]
enum Generation {
    Legacy,
    Modern,
}

#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow, default)]
    id: Option<&'a RawValue>,
    #[serde(borrow)]
    method: &'a str,
    #[serde(borrow, default)]
    params: Option<Params<'a>>,
}

#[derive(Deserialize, Default)]
struct Params<'a> {
    #[serde(borrow, default)]
    name: Option<&'a str>,
    #[serde(borrow, default)]
    arguments: Option<Arguments<'a>>,
}

#[derive(Deserialize, Default)]
struct Arguments<'a> {
    #[serde(borrow, default)]
    text: Option<std::borrow::Cow<'a, str>>,
}

struct Server {
    generation: Generation,
    sessions: RefCell<HashSet<String>>,
    next: std::cell::Cell<u64>,
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut listen: SocketAddr = "127.0.0.1:0".parse().expect("addr");
    let mut generation = Generation::Legacy;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--stdio" if args.len() == 1 => return stdio(),
            "--listen" => listen = it.next().and_then(|v| v.parse().ok()).unwrap_or_else(|| usage()),
            "--generation" => {
                generation = match it.next().map(String::as_str) {
                    Some("legacy") => Generation::Legacy,
                    Some("modern") => Generation::Modern,
                    _ => usage(),
                }
            }
            _ => usage(),
        }
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_io().build().expect("runtime");
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        let listener = TcpListener::bind(listen).await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let name = if generation == Generation::Legacy { "legacy" } else { "modern" };
        eprintln!("fast upstream ({name}) listening on http://{addr}/mcp");
        let server = Rc::new(Server {
            generation,
            sessions: RefCell::new(HashSet::new()),
            next: std::cell::Cell::new(1),
        });
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let _ = stream.set_nodelay(true);
            tokio::task::spawn_local(connection(server.clone(), stream));
        }
    });
}

fn usage() -> ! {
    eprintln!("usage: fast_upstream [--listen 127.0.0.1:0] [--generation legacy|modern]\n       fast_upstream --stdio");
    std::process::exit(2)
}

/// `--stdio`: the legacy server on stdin/stdout, one message per line.
/// Blocking and single-threaded, like the HTTP server's one thread: a line
/// is read, answered with one `write_all` (and flush), and the next read.
fn stdio() {
    use std::io::{BufRead, Write};
    eprintln!("fast upstream (legacy) on stdin/stdout");
    let mut input = std::io::stdin().lock();
    let mut output = std::io::stdout().lock();
    let mut line: Vec<u8> = Vec::with_capacity(8192);
    let mut out: Vec<u8> = Vec::with_capacity(1024);
    loop {
        line.clear();
        match input.read_until(b'\n', &mut line) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) => {
                eprintln!("fast upstream: stdin: {e}");
                return;
            }
        }
        let body = line.trim_ascii();
        if body.is_empty() {
            continue;
        }
        if body.len() > MAX_BODY {
            eprintln!("fast upstream: a line of {} bytes, over {MAX_BODY}: ignored", body.len());
            continue;
        }
        out.clear();
        match serde_json::from_slice::<Envelope>(body) {
            Err(_) => out.extend_from_slice(PARSE_ERROR),
            // A notification (or a response to a server request): nothing to answer.
            Ok(Envelope { id: None, .. }) => continue,
            Ok(Envelope { id: Some(id), method, params }) => {
                out.extend_from_slice(legacy_answer(method, id, params.unwrap_or_default()).as_bytes())
            }
        }
        out.push(b'\n');
        if output.write_all(&out).and_then(|()| output.flush()).is_err() {
            return;
        }
    }
}

/// One keep-alive connection: requests read one after another until the
/// peer closes or sends something this server does not parse.
async fn connection(server: Rc<Server>, mut stream: TcpStream) {
    let mut buf: Vec<u8> = Vec::with_capacity(8192);
    let mut out: Vec<u8> = Vec::with_capacity(1024);
    loop {
        // The head: read until it parses.
        let (head_len, method, session, content_length) = loop {
            let mut headers = [httparse::EMPTY_HEADER; 64];
            let mut req = httparse::Request::new(&mut headers);
            match req.parse(&buf) {
                Ok(httparse::Status::Complete(n)) => {
                    let mut length = 0usize;
                    let mut session = None;
                    for h in req.headers.iter() {
                        if h.name.eq_ignore_ascii_case("content-length") {
                            match std::str::from_utf8(h.value).ok().and_then(|v| v.trim().parse().ok()) {
                                Some(l) if l <= MAX_BODY => length = l,
                                _ => return,
                            }
                        } else if h.name.eq_ignore_ascii_case("mcp-session-id") {
                            session = Some(String::from_utf8_lossy(h.value).into_owned());
                        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                            return; // not what the benchmark sends
                        }
                    }
                    break (n, req.method.unwrap_or("").to_string(), session, length);
                }
                Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD => {
                    if !read_more(&mut stream, &mut buf).await {
                        return;
                    }
                }
                _ => return,
            }
        };
        while buf.len() < head_len + content_length {
            if !read_more(&mut stream, &mut buf).await {
                return;
            }
        }
        out.clear();
        let body = &buf[head_len..head_len + content_length];
        let held = server.answer(&method, session.as_deref(), body, &mut out);
        buf.drain(..head_len + content_length);
        if stream.write_all(&out).await.is_err() {
            return;
        }
        if held == Held::Stream {
            return hold(stream).await;
        }
    }
}

/// Whether the answer just written is a stream that stays open.
#[derive(PartialEq)]
enum Held {
    No,
    Stream,
}

/// Keeps a streamed answer open, sending nothing more, until the peer
/// closes the connection (or sends anything: nothing is pipelined on it).
async fn hold(mut stream: TcpStream) {
    let mut byte = [0u8; 1];
    let _ = stream.read(&mut byte).await;
}

async fn read_more(stream: &mut TcpStream, buf: &mut Vec<u8>) -> bool {
    if buf.capacity() - buf.len() < 4096 {
        buf.reserve(8192);
    }
    matches!(stream.read_buf(buf).await, Ok(n) if n > 0)
}

impl Server {
    fn answer(&self, method: &str, session: Option<&str>, body: &[u8], out: &mut Vec<u8>) -> Held {
        let known = |s: Option<&str>| s.is_some_and(|s| self.sessions.borrow().contains(s));
        match method {
            "POST" => {}
            "DELETE" if self.generation == Generation::Legacy => {
                let known = session.is_some_and(|s| self.sessions.borrow_mut().remove(s));
                respond(out, if known { "200 OK" } else { "404 Not Found" }, None, None, b"");
                return Held::No;
            }
            "GET" if self.generation == Generation::Legacy && known(session) => {
                stream_head(out);
                return Held::Stream;
            }
            "GET" if self.generation == Generation::Legacy => {
                respond(out, "404 Not Found", None, Some("application/json"), UNKNOWN_SESSION);
                return Held::No;
            }
            _ => {
                respond(out, "405 Method Not Allowed", None, None, b"");
                return Held::No;
            }
        }
        let Ok(msg) = serde_json::from_slice::<Envelope>(body) else {
            respond(out, "400 Bad Request", None, Some("application/json"), PARSE_ERROR);
            return Held::No;
        };
        let Some(id) = msg.id else {
            // A notification (or a response to a server request): accepted.
            respond(out, "202 Accepted", None, None, b"");
            return Held::No;
        };
        let params = msg.params.unwrap_or_default();
        match self.generation {
            Generation::Legacy => self.legacy(msg.method, id, params, session, out),
            Generation::Modern if msg.method == "subscriptions/listen" => {
                listen(out, id);
                return Held::Stream;
            }
            Generation::Modern => modern(msg.method, id, params, out),
        }
        Held::No
    }

    fn legacy(&self, method: &str, id: &RawValue, params: Params, session: Option<&str>, out: &mut Vec<u8>) {
        let mut minted = None;
        if method == "initialize" {
            let n = self.next.get();
            self.next.set(n + 1);
            let sid = format!("fast-{n:016x}");
            self.sessions.borrow_mut().insert(sid.clone());
            minted = Some(sid);
        } else {
            match session {
                None => return respond(out, "400 Bad Request", None, Some("application/json"), NO_SESSION),
                Some(s) if !self.sessions.borrow().contains(s) => {
                    return respond(out, "404 Not Found", None, Some("application/json"), UNKNOWN_SESSION)
                }
                Some(_) => {}
            }
        }
        let body = legacy_answer(method, id, params);
        respond(out, "200 OK", minted.as_deref(), Some("application/json"), body.as_bytes());
    }
}

/// A legacy (2025-11-25) request's answer, the JSON-RPC message alone: the
/// same over HTTP (once the session is checked) and over stdio.
fn legacy_answer(method: &str, id: &RawValue, params: Params) -> String {
    match method {
        "initialize" => result_body(
            id,
            r#"{"protocolVersion":"2025-11-25","capabilities":{"tools":{}},"serverInfo":{"name":"fast-upstream","version":"1"}}"#,
        ),
        "tools/call" => tool_call(id, params, ""),
        "tools/list" => result_body(id, TOOLS),
        "ping" => result_body(id, "{}"),
        _ => error_body(id, -32601, "Method not found"),
    }
}

fn modern(method: &str, id: &RawValue, params: Params, out: &mut Vec<u8>) {
    match method {
        "server/discover" => result_of(
            out,
            id,
            r#"{"resultType":"complete","supportedVersions":["2026-07-28"],"capabilities":{"tools":{}},"_meta":{"io.modelcontextprotocol/serverInfo":{"name":"fast-upstream","version":"1"}}}"#,
        ),
        "tools/call" => json_of(out, &tool_call(id, params, r#","resultType":"complete""#)),
        "tools/list" => {
            let result = format!(r#"{}{}"#, &TOOLS[..TOOLS.len() - 1], r#","resultType":"complete"}"#);
            result_of(out, id, &result)
        }
        "initialize" => error_of(out, id, -32022, "Unsupported protocol version"),
        _ => error_of(out, id, -32601, "Method not found"),
    }
}

const TOOLS: &str = r#"{"tools":[{"name":"echo","description":"Echoes its text","inputSchema":{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}}]}"#;
const PARSE_ERROR: &[u8] = br#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error"}}"#;
const NO_SESSION: &[u8] =
    br#"{"jsonrpc":"2.0","id":null,"error":{"code":-32000,"message":"Bad Request: Mcp-Session-Id required"}}"#;
const UNKNOWN_SESSION: &[u8] =
    br#"{"jsonrpc":"2.0","id":null,"error":{"code":-32001,"message":"Session not found"}}"#;

/// `tools/call`'s answer (`echo` only), the JSON-RPC message.
fn tool_call(id: &RawValue, params: Params, extra: &str) -> String {
    if params.name != Some("echo") {
        return error_body(id, -32602, "Unknown tool");
    }
    let text = params.arguments.and_then(|a| a.text).unwrap_or_default();
    let text = serde_json::to_string(&*text).unwrap_or_else(|_| "\"\"".into());
    let result = format!(r#"{{"content":[{{"type":"text","text":{text}}}]{extra}}}"#);
    result_body(id, &result)
}

/// The head of a held SSE answer (chunked: it has no length).
fn stream_head(out: &mut Vec<u8>) {
    out.extend_from_slice(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n\
          transfer-encoding: chunked\r\n\r\n",
    );
}

/// `subscriptions/listen`: the stream's head and its acknowledgement (every
/// filter taken as asked: the server sends nothing more).
fn listen(out: &mut Vec<u8>, id: &RawValue) {
    use std::io::Write;
    stream_head(out);
    let event = format!(
        "event: message\ndata: {{\"jsonrpc\":\"2.0\",\"method\":\"notifications/subscriptions/acknowledged\",\
         \"params\":{{\"_meta\":{{\"io.modelcontextprotocol/subscriptionId\":{}}}}}}}\n\n",
        id.get()
    );
    let _ = write!(out, "{:x}\r\n{event}\r\n", event.len());
}

fn result_body(id: &RawValue, result: &str) -> String {
    format!(r#"{{"jsonrpc":"2.0","id":{},"result":{result}}}"#, id.get())
}

fn error_body(id: &RawValue, code: i32, message: &str) -> String {
    format!(r#"{{"jsonrpc":"2.0","id":{},"error":{{"code":{code},"message":"{message}"}}}}"#, id.get())
}

/// A JSON-RPC message as a 200 answer.
fn json_of(out: &mut Vec<u8>, body: &str) {
    respond(out, "200 OK", None, Some("application/json"), body.as_bytes());
}

fn result_of(out: &mut Vec<u8>, id: &RawValue, result: &str) {
    json_of(out, &result_body(id, result));
}

fn error_of(out: &mut Vec<u8>, id: &RawValue, code: i32, message: &str) {
    json_of(out, &error_body(id, code, message));
}

fn respond(out: &mut Vec<u8>, status: &str, session: Option<&str>, content_type: Option<&str>, body: &[u8]) {
    use std::io::Write;
    let _ = write!(out, "HTTP/1.1 {status}\r\ncontent-length: {}\r\n", body.len());
    if let Some(t) = content_type {
        let _ = write!(out, "content-type: {t}\r\n");
    }
    if let Some(s) = session {
        let _ = write!(out, "mcp-session-id: {s}\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
}
