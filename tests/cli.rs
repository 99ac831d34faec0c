//! The binary as a newcomer meets it: errors in words that say what to do
//! (a port in use, a URL without scheme, an upstream at a wrong path or a
//! closed port), never a backtrace, and a shutdown that says what it waits
//! for and stops at once on a second signal. Every process is started on
//! 127.0.0.1 and killed when its handle drops, also when a test fails.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_sessionless");

/// How long a process may take to print what a test waits for.
const PATIENCE: Duration = Duration::from_secs(20);

/// A running `sessionless`: its stderr (and stdout) lines as they come.
struct Proc {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Proc {
    /// `sessionless ARGS`, with `RUST_BACKTRACE=1` as many users have it.
    fn start(args: &[&str]) -> Proc {
        Proc::spawn(BIN, args)
    }

    fn spawn(program: &str, args: &[&str]) -> Proc {
        let mut child = Command::new(program)
            .args(args)
            .env("RUST_BACKTRACE", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the binary runs");
        let (tx, lines) = mpsc::channel();
        let out: Box<dyn Read + Send> = Box::new(child.stdout.take().unwrap());
        let err: Box<dyn Read + Send> = Box::new(child.stderr.take().unwrap());
        for stream in [out, err] {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
        }
        Proc { child, lines, seen: Vec::new() }
    }

    /// The first line (from now on, or already seen) containing `text`.
    fn wait_for(&mut self, text: &str) -> String {
        if let Some(line) = self.seen.iter().find(|l| l.contains(text)) {
            return line.clone();
        }
        let deadline = Instant::now() + PATIENCE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.contains(text) {
                        return line;
                    }
                }
                Err(_) => panic!("no line with {text:?} within {PATIENCE:?}; saw:\n{}", self.seen.join("\n")),
            }
        }
    }

    /// The address in the first line containing `text` followed by `http://`.
    fn address(&mut self, text: &str) -> SocketAddr {
        let line = self.wait_for(text);
        let at = line.find("http://").unwrap_or_else(|| panic!("no URL in {line:?}")) + "http://".len();
        let addr: String =
            line[at..].chars().take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ':').collect();
        addr.parse().unwrap_or_else(|e| panic!("{addr:?} in {line:?}: {e}"))
    }

    fn signal(&self, name: &str) {
        let status = Command::new("kill").arg(format!("-{name}")).arg(self.child.id().to_string()).status();
        assert!(status.unwrap().success(), "kill -{name}");
    }

    /// Waits for the exit; its status and how long it took.
    fn exit(&mut self, within: Duration) -> (std::process::ExitStatus, Duration) {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                // What it printed on the way out.
                while let Ok(line) = self.lines.recv_timeout(Duration::from_millis(200)) {
                    self.seen.push(line);
                }
                return (status, started.elapsed());
            }
            assert!(
                started.elapsed() < within,
                "still running after {within:?}; saw:\n{}",
                self.seen.join("\n")
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A routing file in a directory of its own, removed on drop.
struct ConfigFile {
    dir: std::path::PathBuf,
    path: String,
}

impl ConfigFile {
    fn new(tag: &str, toml: &str) -> ConfigFile {
        let dir = std::env::temp_dir().join(format!("sessionless-cli-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("gateway.toml");
        std::fs::write(&file, toml).unwrap();
        ConfigFile { path: file.display().to_string(), dir }
    }
}

impl Drop for ConfigFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A built-in legacy server: `sessionless demo-upstream` on a free port.
fn demo_upstream() -> (Proc, SocketAddr) {
    let mut p = Proc::start(&["demo-upstream", "--listen", "127.0.0.1:0"]);
    let addr = p.address("demo upstream");
    (p, addr)
}

/// A port on 127.0.0.1 nothing listens on (bound, then closed).
fn closed_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

/// A one-shot command's output, `RUST_BACKTRACE=1` set as many users have it.
fn run(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .env("RUST_LIB_BACKTRACE", "1")
        .stdin(Stdio::null())
        .output()
        .expect("the binary runs")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A user's error: a failure exit, no backtrace, and after any log lines
/// one line of words, the last (returned).
fn assert_user_error(out: &Output) -> String {
    let err = stderr(out);
    assert!(!out.status.success(), "{err}");
    assert!(!err.to_lowercase().contains("backtrace"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    // Log lines start with their time; the error is the one line that does not.
    let words: Vec<&str> = err.lines().filter(|l| !l.starts_with("20")).collect();
    assert_eq!(words.len(), 1, "one line of words:\n{err}");
    assert!(words[0].starts_with("sessionless: "), "{err}");
    assert!(err.trim_end().ends_with(words[0]), "{err}");
    words[0].to_string()
}

/// A plain HTTP/1.1 exchange: status and body.
fn http(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    s.write_all(req.as_bytes()).unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    let status = answer.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = answer.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (status, body)
}

/// A 2026-07-28 `tools/call` of `name`, elicitation declared.
fn call(addr: SocketAddr, name: &str) -> (u16, String) {
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{"name":"{name}","arguments":{{}},"_meta":{{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{{"elicitation":{{}}}}}}}}}}"#
    );
    let headers = [
        ("Content-Type", "application/json"),
        ("Accept", "application/json, text/event-stream"),
        ("MCP-Protocol-Version", "2026-07-28"),
        ("Mcp-Method", "tools/call"),
        ("Mcp-Name", name),
    ];
    http(addr, "POST", "/mcp", &headers, &body)
}

#[test]
fn a_port_in_use_names_the_address_and_the_flag() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = run(&["--upstream", "http://127.0.0.1:9/mcp", "--listen", &addr]);
    let err = assert_user_error(&out);
    assert!(err.contains(&format!("cannot listen on {addr}")), "{err}");
    assert!(err.contains("in use") && err.contains("--listen"), "{err}");
    assert!(!err.contains("os error"), "{err}");
}

#[test]
fn a_url_without_scheme_says_what_it_needs() {
    let out = run(&["--upstream", "127.0.0.1:3101/mcp"]);
    let err = assert_user_error(&out);
    assert!(err.contains("127.0.0.1:3101/mcp") && err.contains("http:// or https://"), "{err}");
}

#[test]
fn localhost_is_accepted_for_listen() {
    let (_up, up) = demo_upstream();
    let mut gw = Proc::start(&["--upstream", &format!("http://{up}/mcp"), "--listen", "localhost:0"]);
    let addr = gw.address("listening on");
    assert!(addr.ip().is_loopback(), "{addr}");
    assert_eq!(http(addr, "GET", "/healthz", &[], "").0, 200);
}

#[test]
fn a_probe_says_what_each_upstream_answered_and_fails_when_one_is_unusable() {
    let (_up, up) = demo_upstream();
    let closed = closed_port();
    let dir = std::env::temp_dir().join(format!("sessionless-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = |name: &str, url: String| {
        let path = dir.join(name);
        let toml = format!(
            "[[upstreams]]\nname = \"u\"\nurl = \"{url}\"\n\n[[routes]]\npath = \"/mcp\"\nupstream = \"u\"\n"
        );
        std::fs::write(&path, toml).unwrap();
        path.display().to_string()
    };
    let good = run(&["check-config", "--probe", &file("good.toml", format!("http://{up}/mcp"))]);
    let said = String::from_utf8_lossy(&good.stdout);
    assert!(good.status.success(), "{said}{}", stderr(&good));
    assert!(said.contains(&format!("/mcp -> u (http://{up}/mcp): legacy")), "{said}");

    for (name, url, why) in [
        ("path.toml", format!("http://{up}/wrong"), "404 Not Found"),
        ("closed.toml", format!("http://{closed}/mcp"), "connection refused"),
    ] {
        let out = run(&["check-config", "--probe", &file(name, url.clone())]);
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(!out.status.success(), "{url}: {said}");
        assert!(said.contains(&format!("(http://{}", url.trim_start_matches("http://"))), "{said}");
        assert!(said.contains("unusable") && said.contains(why), "{url}: {said}");
        let err = assert_user_error(&out);
        assert!(err.contains("1 upstream(s) cannot be used"), "{err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_upstream_at_a_wrong_path_is_named_in_the_answer_the_log_and_readyz() {
    let (_up, up) = demo_upstream();
    let url = format!("http://{up}/wrong");
    let mut gw = Proc::start(&["--upstream", &url, "--listen", "127.0.0.1:0"]);
    let addr = gw.address("listening on");
    let (status, body) = call(addr, "echo");
    assert_eq!(status, 502, "{body}");
    assert!(body.contains("404 Not Found at the upstream's URL: is its path right?"), "{body}");
    assert!(body.contains(r#""id":7"#), "{body}");
    let line = gw.wait_for("could not find out what the upstream speaks");
    assert!(line.contains("upstream=default") && line.contains(&format!("url={url}")), "{line}");
    assert!(line.contains("404"), "{line}");
    assert!(line.contains("is the path of the URL right?"), "{line}");
    assert!(!line.contains("Status(") && !line.contains("Some("), "no Rust in the log: {line}");
    let (_, ready) = http(addr, "GET", "/readyz", &[], "");
    assert!(ready.contains("unusable") && ready.contains("404"), "{ready}");
}

#[test]
fn a_closed_upstream_port_is_named_in_the_log_and_readyz() {
    let url = format!("http://{}/mcp", closed_port());
    let mut gw = Proc::start(&["--upstream", &url, "--listen", "127.0.0.1:0"]);
    let addr = gw.address("listening on");
    let (status, body) = call(addr, "echo");
    assert!(status == 502 || status == 503, "{status} {body}");
    assert!(body.contains(r#""id":7"#), "{body}");
    let line = gw.wait_for("connection refused");
    assert!(line.contains("upstream=default") && line.contains(&url), "{line}");
    assert!(!line.contains("NotSent") && !line.contains(" e="), "no Rust in the log: {line}");
    let (_, ready) = http(addr, "GET", "/readyz", &[], "");
    assert!(ready.contains("connection refused"), "{ready}");
}

#[test]
fn shutdown_says_what_it_drains_and_a_second_signal_stops_at_once() {
    let (_up, up) = demo_upstream();
    let file = ConfigFile::new(
        "drain",
        &format!(
            "[server]\nlisten = \"127.0.0.1:0\"\ndrain_timeout_ms = 60000\n\n\
             [[upstreams]]\nname = \"demo\"\nurl = \"http://{up}/mcp\"\n\n[[routes]]\npath = \"/mcp\"\nupstream = \"demo\"\n"
        ),
    );
    for (first, second) in [("TERM", "INT"), ("INT", "TERM")] {
        let mut gw = Proc::start(&["--config", &file.path]);
        let addr = gw.address("listening on");
        // A paused call: the gateway holds the upstream's question.
        let (status, body) = call(addr, "ask_user");
        assert_eq!(status, 200, "{body}");
        assert!(body.contains("input_required"), "{body}");
        gw.signal(first);
        let said = gw.wait_for("draining:");
        assert!(said.contains("1 paused call, up to 60 s") && said.contains("again"), "{said}");
        // Still draining: it waits for the paused call's retry.
        std::thread::sleep(Duration::from_millis(500));
        assert!(gw.child.try_wait().unwrap().is_none(), "stopped before the deadline");
        gw.signal(second);
        // Far below the 60 s deadline; every step after the drain gets a second.
        let (status, took) = gw.exit(Duration::from_secs(20));
        assert!(status.success(), "{status}");
        assert!(took < Duration::from_secs(10), "took {took:?}");
        gw.wait_for("stopping now; left undrained: 1 paused call");
        gw.wait_for("sessionless: stopped");
    }
}

#[test]
fn a_gateway_with_nothing_to_drain_says_so_and_stops() {
    let (_up, up) = demo_upstream();
    let mut gw = Proc::start(&["--upstream", &format!("http://{up}/mcp"), "--listen", "127.0.0.1:0"]);
    gw.address("listening on");
    gw.signal("INT");
    gw.wait_for("nothing to drain; stopping");
    let (status, took) = gw.exit(Duration::from_secs(20));
    assert!(status.success() && took < Duration::from_secs(10), "{status} {took:?}");
}

#[test]
fn the_demo_drains_briefly_after_its_question() {
    let mut demo = Proc::start(&["demo", "--listen", "127.0.0.1:0"]);
    let addr = demo.address("sessionless demo: gateway on");
    let (status, body) = call(addr, "ask_user");
    assert!(status == 200 && body.contains("input_required"), "{status} {body}");
    demo.signal("INT");
    demo.wait_for("draining: 1 paused call, up to 2 s");
    // The default drain (10 s) would take longer than this.
    let (status, took) = demo.exit(Duration::from_secs(20));
    assert!(status.success(), "{status}");
    assert!(took < Duration::from_secs(10), "took {took:?}");
}

#[test]
fn a_reader_that_stops_early_ends_check_config_as_a_filter_does() {
    // `sessionless check-config FILE | head -0`: stdout is a socket whose
    // other end is closed before the process starts, so its first write fails
    // with EPIPE. It ends quietly with a SIGPIPE death's status (141, which a
    // shell's `pipefail` sees), not with a panic or a success.
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/single.toml");
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    drop(ours);
    let out = Command::new(BIN)
        .arg("check-config")
        .arg(&file)
        .stdout(Stdio::from(std::os::fd::OwnedFd::from(theirs)))
        .stderr(Stdio::piped())
        .output()
        .expect("the binary runs");
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(141), "{err}");
    assert!(!err.contains("panicked") && !err.contains("Broken pipe"), "{err}");
}

#[test]
fn a_signal_right_after_listening_drains_and_stops_cleanly() {
    // The handlers are installed before the gateway starts: a signal sent as
    // soon as it says it listens is a drain, never a death by signal.
    let closed = format!("http://{}/mcp", closed_port());
    for round in 0..10 {
        let mut gw = Proc::start(&["--upstream", &closed, "--listen", "127.0.0.1:0"]);
        gw.wait_for("listening on");
        gw.signal(if round % 2 == 0 { "INT" } else { "TERM" });
        let (status, _) = gw.exit(Duration::from_secs(20));
        assert_eq!(status.code(), Some(0), "round {round}: {status}; saw:\n{}", gw.seen.join("\n"));
        gw.wait_for("sessionless: stopped");
    }
}

/// A gateway with one call paused on tests/support/hung_upstream.py (which
/// never answers the decline, nor `DELETE`), draining for up to 60 s.
fn paused_on_a_hung_upstream(tag: &str) -> (Proc, Proc, ConfigFile) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/hung_upstream.py");
    let mut up = Proc::spawn("python3", &[script, "0"]);
    let up_addr = up.address("listening on");
    let file = ConfigFile::new(
        tag,
        &format!(
            "[server]\nlisten = \"127.0.0.1:0\"\ndrain_timeout_ms = 60000\n\n\
             [[upstreams]]\nname = \"hung\"\nurl = \"http://{up_addr}/mcp\"\ngeneration = \"legacy\"\n\n\
             [[routes]]\npath = \"/mcp\"\nupstream = \"hung\"\n"
        ),
    );
    let mut gw = Proc::start(&["--config", &file.path]);
    let addr = gw.address("listening on");
    let (status, body) = call(addr, "ask");
    assert!(status == 200 && body.contains("input_required"), "{status} {body}");
    gw.signal("TERM");
    gw.wait_for("draining: 1 paused call, up to 60 s");
    (gw, up, file)
}

#[test]
fn a_hung_upstream_does_not_hold_a_second_signal() {
    let (mut gw, _up, _file) = paused_on_a_hung_upstream("hung");
    gw.signal("INT");
    // The decline and the DELETE get a second each, not their 5 s (or the
    // upstream's 30 s response timeout).
    let (status, took) = gw.exit(Duration::from_secs(30));
    assert!(status.success(), "{status}");
    assert!(took < Duration::from_secs(8), "took {took:?}; saw:\n{}", gw.seen.join("\n"));
    gw.wait_for("stopping now; left undrained: 1 paused call");
    gw.wait_for("sessionless: stopped");
}

#[test]
fn a_third_signal_exits_at_once() {
    let (mut gw, _up, _file) = paused_on_a_hung_upstream("third");
    gw.signal("INT");
    gw.wait_for("stopping now");
    // The hung decline holds the stop for up to a second: a third signal
    // does not wait for it.
    gw.signal("INT");
    let (status, _) = gw.exit(Duration::from_secs(10));
    assert_eq!(status.code(), Some(130), "{status}; saw:\n{}", gw.seen.join("\n"));
    gw.wait_for("exiting at once (third signal)");
}

#[test]
fn an_upstream_at_a_wrong_path_takes_a_replica_out_of_service_when_readiness_asks() {
    let (_up, up) = demo_upstream();
    let file = ConfigFile::new(
        "ready",
        &format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nreadiness = \"all_upstreams\"\n\n\
             [[upstreams]]\nname = \"right\"\nurl = \"http://{up}/mcp\"\n\n\
             [[upstreams]]\nname = \"wrong\"\nurl = \"http://{up}/wrong\"\n\n\
             [[routes]]\npath = \"/mcp\"\nupstream = \"right\"\n\n[[routes]]\npath = \"/wrong\"\nupstream = \"wrong\"\n"
        ),
    );
    let mut gw = Proc::start(&["--config", &file.path]);
    let addr = gw.address("listening on");
    // The start-up probe of each `auto` upstream has run once the log says so.
    gw.wait_for("could not find out what the upstream speaks");
    gw.wait_for("upstream probed route=/mcp");
    let (status, body) = http(addr, "GET", "/readyz", &[], "");
    assert_eq!(status, 503, "{body}");
    assert!(body.starts_with("not ready: upstreams unreachable or unusable"), "{body}");
    assert!(body.contains("/wrong wrong: unusable: 404 Not Found"), "{body}");
    assert!(body.contains("/mcp right: legacy"), "{body}");
}
