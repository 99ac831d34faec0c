//! The benchmark's fast upstream: a minimal MCP server whose own cost per
//! request is a few µs, so that what a proxy in front of it costs is not
//! hidden behind the server's (the built-in demo server spends about 15 µs
//! per request in hyper and its JSON-RPC layer).
//!
//! ```text
//! fast_upstream [--listen 127.0.0.1:0] [--generation legacy|modern]
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
    eprintln!("usage: fast_upstream [--listen 127.0.0.1:0] [--generation legacy|modern]");
    std::process::exit(2)
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
        if method == "initialize" {
            let n = self.next.get();
            self.next.set(n + 1);
            let sid = format!("fast-{n:016x}");
            self.sessions.borrow_mut().insert(sid.clone());
            let result = r#"{"protocolVersion":"2025-11-25","capabilities":{"tools":{}},"serverInfo":{"name":"fast-upstream","version":"1"}}"#;
            return result_of(out, id, result, Some(&sid));
        }
        match session {
            None => return respond(out, "400 Bad Request", None, Some("application/json"), NO_SESSION),
            Some(s) if !self.sessions.borrow().contains(s) => {
                return respond(out, "404 Not Found", None, Some("application/json"), UNKNOWN_SESSION)
            }
            Some(_) => {}
        }
        match method {
            "tools/call" => tool_call(out, id, params, ""),
            "tools/list" => result_of(out, id, TOOLS, None),
            "ping" => result_of(out, id, "{}", None),
            _ => error_of(out, id, -32601, "Method not found"),
        }
    }
}

fn modern(method: &str, id: &RawValue, params: Params, out: &mut Vec<u8>) {
    match method {
        "server/discover" => result_of(
            out,
            id,
            r#"{"resultType":"complete","supportedVersions":["2026-07-28"],"capabilities":{"tools":{}},"_meta":{"io.modelcontextprotocol/serverInfo":{"name":"fast-upstream","version":"1"}}}"#,
            None,
        ),
        "tools/call" => tool_call(out, id, params, r#","resultType":"complete""#),
        "tools/list" => {
            let result = format!(r#"{}{}"#, &TOOLS[..TOOLS.len() - 1], r#","resultType":"complete"}"#);
            result_of(out, id, &result, None)
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

fn tool_call(out: &mut Vec<u8>, id: &RawValue, params: Params, extra: &str) {
    if params.name != Some("echo") {
        return error_of(out, id, -32602, "Unknown tool");
    }
    let text = params.arguments.and_then(|a| a.text).unwrap_or_default();
    let text = serde_json::to_string(&*text).unwrap_or_else(|_| "\"\"".into());
    let result = format!(r#"{{"content":[{{"type":"text","text":{text}}}]{extra}}}"#);
    result_of(out, id, &result, None)
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

fn result_of(out: &mut Vec<u8>, id: &RawValue, result: &str, session: Option<&str>) {
    let body = format!(r#"{{"jsonrpc":"2.0","id":{},"result":{result}}}"#, id.get());
    respond(out, "200 OK", session, Some("application/json"), body.as_bytes());
}

fn error_of(out: &mut Vec<u8>, id: &RawValue, code: i32, message: &str) {
    let body =
        format!(r#"{{"jsonrpc":"2.0","id":{},"error":{{"code":{code},"message":"{message}"}}}}"#, id.get());
    respond(out, "200 OK", None, Some("application/json"), body.as_bytes());
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
