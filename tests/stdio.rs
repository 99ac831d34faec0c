//! Stdio upstreams (issue 24, DESIGN §12): MCP servers the gateway spawns as
//! programs and speaks to over stdin/stdout, one process per legacy session.
//! Each test runs `tests/support/stdio_fake.py` (a small 2025-11-25 server,
//! see its docstring) and checks one rule: calls sharing a process, answers
//! and notifications reaching their own caller, questions parked (and their
//! retries forwarded between replicas), the process cap and admission,
//! crashes, backoff, the start timeout, oversized and non-JSON output, a
//! stderr flood, the child's environment, idle stop, reload and shutdown.
//!
//! Processes are checked in `/proc`: a PID is gone when `/proc/PID` is
//! (a zombie left behind is a failure). Every test's fakes write their PID to
//! a count file in a scratch directory of the test's own; whatever is left
//! of them when the test ends (even failing) is killed and the directory removed.

mod support;

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sessionless::Config;
use support::cluster::{ClusterEnv, Replica};
use support::legacy::Legacy;
use support::{Gateway, ModernRequest, Reply};

const FAKE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/stdio_fake.py");
const SPAWNS: &str = "sessionless_stdio_spawns_total";
const PROCESSES: &str = "sessionless_stdio_processes";
const PARKED: &str = "sessionless_parked_flows_open";

// ---------------------------------------------------------------- helpers

/// The Python interpreter itself, not a wrapper script on PATH (pyenv's
/// shim is a shell script that adds variables to the environment and
/// spawns slowly).
fn python() -> &'static str {
    static PYTHON: OnceLock<String> = OnceLock::new();
    PYTHON.get_or_init(|| {
        let out = Command::new("python3")
            .args(["-c", "import sys; print(sys.executable)"])
            .output()
            .expect("python3 runs");
        let path = String::from_utf8(out.stdout).unwrap().trim().to_string();
        assert!(!path.is_empty(), "python3 names its interpreter");
        path
    })
}

static NEXT: AtomicUsize = AtomicUsize::new(1);

/// One test's scratch directory (its fakes' count file in it); on drop,
/// kills whatever is left of the processes it started and removes itself.
struct Scratch {
    dir: PathBuf,
    /// Grandchildren (`sleep 1000`) the test learnt of.
    watched: Mutex<Vec<i32>>,
}

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let dir = std::env::temp_dir().join(format!("sessionless-stdio-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch { dir, watched: Mutex::new(Vec::new()) }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// What identifies this test's fakes in `/proc/PID/cmdline`.
    fn marker(&self) -> String {
        self.dir.to_str().unwrap().to_string()
    }

    /// The fake's argv, counting its starts in `count` (a file in the scratch directory).
    fn argv_counted(&self, count: &str, flags: &[&str]) -> Vec<String> {
        let mut argv = vec![
            python().to_string(),
            FAKE.to_string(),
            "--count-file".to_string(),
            self.path(count).to_str().unwrap().to_string(),
        ];
        argv.extend(flags.iter().map(|f| f.to_string()));
        argv
    }

    fn argv(&self, flags: &[&str]) -> Vec<String> {
        self.argv_counted("spawns", flags)
    }

    /// The PIDs of the fakes started with count file `count`, in order.
    fn spawned_in(&self, count: &str) -> Vec<i32> {
        std::fs::read_to_string(self.path(count))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    fn spawned(&self) -> Vec<i32> {
        self.spawned_in("spawns")
    }

    fn watch(&self, pid: i32) {
        self.watched.lock().unwrap().push(pid);
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let marker = self.marker();
        for pid in live_fakes(&marker) {
            kill(pid);
        }
        for &pid in self.watched.lock().unwrap().iter() {
            if cmdline(pid).as_deref() == Some("sleep 1000") {
                kill(pid);
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn kill(pid: i32) {
    // SAFETY: kill(2) with a PID checked to be one of this test's processes.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
    }
}

/// `/proc/PID/cmdline` with its NULs as spaces; `None` when there is no such
/// process (or it is a zombie: no command line).
fn cmdline(pid: i32) -> Option<String> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    if raw.is_empty() {
        return None;
    }
    let text = String::from_utf8_lossy(&raw);
    Some(text.trim_end_matches('\0').replace('\0', " "))
}

/// The state letter of `/proc/PID/stat` (`R`, `S`, `Z`, …); `None` when gone.
fn proc_state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.trim_start().chars().next()
}

fn is_running(pid: i32) -> bool {
    proc_state(pid).is_some_and(|s| s != 'Z')
}

/// Live (not zombie) processes running a fake whose command line holds `marker`.
fn live_fakes(marker: &str) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| cmdline(pid).is_some_and(|c| c.contains(marker) && c.contains("stdio_fake.py")))
        .filter(|&pid| is_running(pid))
        .collect()
}

/// Waits until every one of `pids` is gone from `/proc` (reaped, not a
/// zombie); fails naming what is left after `within`.
async fn assert_gone(pids: &[i32], within: Duration, what: &str) {
    let deadline = Instant::now() + within;
    loop {
        let left: Vec<(i32, char)> = pids.iter().filter_map(|&p| proc_state(p).map(|s| (p, s))).collect();
        if left.is_empty() {
            return;
        }
        if Instant::now() > deadline {
            let described: Vec<String> = left
                .iter()
                .map(|(p, s)| match s {
                    'Z' => format!("{p} is a zombie"),
                    s => format!("{p} still running (state {s}: {})", cmdline(*p).unwrap_or_default()),
                })
                .collect();
            panic!("{what}: after {within:?}, {}", described.join("; "));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Samples, on a thread of its own, the number of live fakes of a test.
struct Sampler {
    stop: Arc<AtomicBool>,
    max: Arc<AtomicUsize>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Sampler {
    fn start(marker: String) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let max = Arc::new(AtomicUsize::new(0));
        let (s, m) = (stop.clone(), max.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                m.fetch_max(live_fakes(&marker).len(), Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        Sampler { stop, max, thread: Some(thread) }
    }

    /// Stops sampling; the most live fakes seen at once.
    fn finish(mut self) -> usize {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.take().unwrap().join().unwrap();
        self.max.load(Ordering::SeqCst)
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn command_line(argv: &[String]) -> String {
    format!("command = {}", serde_json::to_string(argv).unwrap())
}

/// A routing file with the stdio upstream `fake` running `argv` (with
/// `upstream_keys` in its table) served at `/mcp`, then `tables`.
fn stdio_toml(argv: &[String], upstream_keys: &str, tables: &str) -> String {
    format!(
        "[[upstreams]]\nname = \"fake\"\n{}\n{upstream_keys}\n\n[[routes]]\npath = \"/mcp\"\nupstream = \"fake\"\n\n{tables}\n",
        command_line(argv)
    )
}

fn parse(text: &str) -> Config {
    Config::from_toml(text).unwrap_or_else(|e| panic!("test config: {e:?}\n{text}"))
}

/// An in-process gateway (127.0.0.1:0) in front of the fake running `argv`.
async fn gateway(argv: &[String], upstream_keys: &str, tables: &str) -> Gateway {
    Gateway::with_config(parse(&stdio_toml(argv, upstream_keys, tables))).await
}

fn tool(gw: &Gateway, id: Value, name: &str, args: Value) -> ModernRequest {
    gw.request("tools/call").id(id).params(json!({"name": name, "arguments": args}))
}

/// The JSON object the fake answered a tool call with (its text).
fn answer(reply: &Reply, what: &str) -> Value {
    assert_eq!(reply.status, 200, "{what}: {}", reply.raw);
    let text = reply.result()["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("{what}: a text answer: {}", reply.raw));
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{what}: the fake's JSON ({e}): {text}"))
}

fn pid_in(answer: &Value) -> i32 {
    answer["pid"].as_i64().expect("the fake names its pid") as i32
}

/// The PID of the process that serves `gw`'s next plain call.
async fn serving_pid(gw: &Gateway, id: u64) -> i32 {
    let reply = tool(gw, json!(id), "pid", json!({})).send().await;
    pid_in(&answer(&reply, "pid"))
}

/// The sum of the samples of `name` whose labels contain `label`.
fn metric_where(text: &str, name: &str, label: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn gw_metric_where(gw: &Gateway, name: &str, label: &str) -> f64 {
    let (_, text) = gw.get("/metrics").await;
    metric_where(&text, name, label)
}

/// Asserts an admission refusal: `status`, a JSON-RPC error with `id`, and a
/// `Retry-After` of whole seconds.
fn assert_refused(reply: &Reply, status: u16, id: &Value, what: &str) {
    assert_eq!(reply.status.as_u16(), status, "{what}: {}", reply.raw);
    assert!(reply.error_code().is_some(), "{what}: a JSON-RPC error: {}", reply.raw);
    assert_eq!(&reply.body["id"], id, "{what}: the id echoed: {}", reply.raw);
    let after =
        reply.header("retry-after").unwrap_or_else(|| panic!("{what}: Retry-After: {:?}", reply.headers));
    assert!(after.parse::<u64>().is_ok_and(|s| s >= 1), "{what}: Retry-After in seconds: {after}");
}

/// Round 1's `(requestState, key)` and the one question it asks.
fn round(reply: &Reply, what: &str) -> (String, String, Value) {
    assert_eq!(reply.status, 200, "{what}: {}", reply.raw);
    let r = reply.result();
    assert_eq!(r["resultType"], "input_required", "{what}: {}", reply.raw);
    let requests = r["inputRequests"].as_object().expect("inputRequests");
    assert_eq!(requests.len(), 1, "{what}: one question: {}", reply.raw);
    let (key, question) = requests.iter().next().unwrap();
    assert!(question.get("id").is_none(), "{what}: no JSON-RPC id in an input request: {question}");
    let state = r["requestState"].as_str().expect("requestState").to_string();
    (state, key.clone(), question.clone())
}

fn retry_params(name: &str, state: &str, key: &str, response: &Value) -> Value {
    json!({"name": name, "arguments": {}, "requestState": state, "inputResponses": {key: response}})
}

fn elicitation() -> Value {
    json!({"elicitation": {}})
}

fn ada() -> Value {
    json!({"action": "accept", "content": {"name": "Ada"}})
}

// ---------------------------------------------------------------- sharing and routing

#[tokio::test]
async fn concurrent_calls_share_one_process() {
    let s = Scratch::new("share");
    let gw = gateway(&s.argv(&[]), "", "").await;
    let first = serving_pid(&gw, 1).await;

    let (a, b) = tokio::join!(
        tool(&gw, json!(2), "slow", json!({"ms": 1500, "tag": "a"})).send(),
        tool(&gw, json!(3), "slow", json!({"ms": 1500, "tag": "b"})).send(),
    );

    let (a, b) = (answer(&a, "slow a"), answer(&b, "slow b"));
    assert_eq!((a["tag"].as_str(), b["tag"].as_str()), (Some("a"), Some("b")), "each its own answer");
    assert_eq!(pid_in(&a), first, "{a}");
    assert_eq!(pid_in(&b), first, "{b}");
    let (a0, a1) = (a["started"].as_f64().unwrap(), a["ended"].as_f64().unwrap());
    let (b0, b1) = (b["started"].as_f64().unwrap(), b["ended"].as_f64().unwrap());
    assert!(a0 < b1 && b0 < a1, "the two calls ran at the same time in the process: {a} {b}");
    assert_eq!(s.spawned(), vec![first], "one process");
    assert_eq!(gw_metric_where(&gw, PROCESSES, "upstream=\"fake\"").await, 1.0);
    assert_eq!(gw_metric_where(&gw, SPAWNS, "outcome=\"started\"").await, 1.0);
}

#[tokio::test]
async fn answers_and_progress_reach_their_own_caller() {
    let s = Scratch::new("progress");
    let gw = gateway(&s.argv(&[]), "", "").await;
    let first = serving_pid(&gw, 1).await;

    // Four callers, all with the same JSON-RPC id, each its own progress
    // token (one of them equal to another's id), and one without a token.
    let tokens = [json!("tok-0"), json!(7), json!("tok-2"), json!(1)];
    let calls = tokens.iter().enumerate().map(|(i, token)| {
        tool(&gw, json!(7), "progress", json!({"tag": format!("caller-{i}"), "ms": 100}))
            .progress_token(token.clone())
            .send()
    });
    let without = tool(&gw, json!(7), "progress", json!({"tag": "quiet", "ms": 100})).send();
    let (replies, quiet) = tokio::join!(futures_util::future::join_all(calls), without);

    for (i, reply) in replies.iter().enumerate() {
        let what = format!("caller {i}");
        let got = answer(reply, &what);
        assert_eq!(reply.body["id"], 7, "{what}: {}", reply.raw);
        assert_eq!(got["tag"], format!("caller-{i}"), "{what}: its own answer: {}", reply.raw);
        assert_eq!(pid_in(&got), first, "{what}: on the shared process");
        let progress: Vec<&Value> =
            reply.notes.iter().filter(|n| n["method"] == "notifications/progress").collect();
        assert_eq!(progress.len(), 3, "{what}: its three progress notifications: {}", reply.raw);
        for note in &progress {
            assert_eq!(note["params"]["progressToken"], tokens[i], "{what}: its own token: {note}");
            let message = note["params"]["message"].as_str().unwrap_or_default();
            assert!(message.starts_with(&format!("caller-{i} ")), "{what}: its own progress: {note}");
        }
        assert_eq!(reply.notes.len(), 3, "{what}: nothing else: {}", reply.raw);
    }
    let got = answer(&quiet, "the caller without a token");
    assert_eq!(got["tag"], "quiet");
    assert!(quiet.notes.is_empty(), "no progress without a token: {}", quiet.raw);
    assert_eq!(s.spawned(), vec![first], "one process served them all");
}

#[tokio::test]
async fn log_lines_reach_only_the_call_that_asked_for_them() {
    let s = Scratch::new("log");
    let gw = gateway(&s.argv(&[]), "", "").await;
    serving_pid(&gw, 1).await;

    let (info, none, warning) = tokio::join!(
        tool(&gw, json!("a"), "log", json!({"tag": "A", "ms": 300})).log_level("info").send(),
        tool(&gw, json!("b"), "log", json!({"tag": "B", "ms": 300})).send(),
        tool(&gw, json!("c"), "log", json!({"tag": "C", "ms": 300})).log_level("warning").send(),
    );

    let lines = |reply: &Reply| -> Vec<String> {
        reply
            .notes
            .iter()
            .filter(|n| n["method"] == "notifications/message")
            .map(|n| n["params"]["data"].as_str().unwrap_or_default().to_string())
            .collect()
    };
    assert_eq!(answer(&info, "A")["tag"], "A");
    assert_eq!(answer(&none, "B")["tag"], "B");
    assert_eq!(answer(&warning, "C")["tag"], "C");
    assert_eq!(lines(&info), vec!["A info line", "A warning line"], "{}", info.raw);
    assert!(lines(&none).is_empty(), "no log lines for a call that asked for none: {}", none.raw);
    assert_eq!(lines(&warning), vec!["C warning line"], "{}", warning.raw);
    for (reply, own) in [(&info, "A"), (&none, "B"), (&warning, "C")] {
        for other in ["A ", "B ", "C "].iter().filter(|o| !o.starts_with(own)) {
            assert!(!reply.raw.contains(&format!("{other}info line")), "{own} got {other}'s: {}", reply.raw);
            assert!(
                !reply.raw.contains(&format!("{other}warning line")),
                "{own} got {other}'s: {}",
                reply.raw
            );
        }
    }
}

// ---------------------------------------------------------------- questions

#[tokio::test]
async fn questions_become_input_required_and_the_retry_is_answered_by_the_same_process() {
    let s = Scratch::new("ask");
    let gw = gateway(&s.argv(&[]), "", "").await;

    // A caller that cannot answer: the process it gets was started without
    // the capability, and the fake never asks.
    let plain = tool(&gw, json!(1), "ask", json!({})).send().await;
    let plain = answer(&plain, "ask without elicitation");
    assert!(plain["error"].as_str().is_some_and(|e| e.contains("elicitation")), "{plain}");

    let cases = [
        ("ask", json!({"elicitation": {}}), "elicitation/create", ada()),
        (
            "sample",
            json!({"sampling": {}}),
            "sampling/createMessage",
            json!({"role": "assistant", "content": {"type": "text", "text": "hello"}, "model": "m"}),
        ),
        ("roots", json!({"roots": {}}), "roots/list", json!({"roots": [{"uri": "file:///srv/data"}]})),
    ];
    for (i, (name, caps, method, response)) in cases.into_iter().enumerate() {
        let id = 10 * (i as u64 + 1);
        let first = gw
            .request("tools/call")
            .id(json!(id))
            .params(json!({"name": name, "arguments": {}}))
            .capabilities(caps.clone())
            .send()
            .await;
        let (state, key, question) = round(&first, name);
        assert_eq!(question["method"], method, "{name}: {question}");
        if name == "ask" {
            assert_eq!(question["params"]["message"], "What is your name?", "{question}");
        }
        assert_eq!(gw.metric(PARKED).await, 1.0, "{name}: parked");

        let retry = gw
            .request("tools/call")
            .id(json!(id + 1))
            .params(retry_params(name, &state, &key, &response))
            .capabilities(caps)
            .send()
            .await;
        assert_eq!(retry.body["id"], id + 1, "{name}: {}", retry.raw);
        assert_eq!(retry.result()["resultType"], "complete", "{name}: {}", retry.raw);
        let got = answer(&retry, name);
        assert_eq!(got["answer"], response, "{name}: the process got the client's answer: {got}");
        assert_eq!(gw.metric(PARKED).await, 0.0, "{name}: nothing parked any more");
    }
    // The plain caller and each capability set had a process of their own.
    assert_eq!(s.spawned().len(), 4, "{:?}", s.spawned());
}

#[tokio::test]
async fn a_parked_question_is_answered_through_the_other_replica() {
    let s = Scratch::new("forward");
    let env = ClusterEnv::new("stdio-forward");
    let a = Replica::start(&env.replica("gw-a", "unused").command(s.argv(&[]))).await;
    let b = Replica::start(&env.replica("gw-b", "unused").command(s.argv(&[]))).await;

    let first = a
        .request("tools/call")
        .id(json!(1))
        .params(json!({"name": "ask", "arguments": {}}))
        .capabilities(elicitation())
        .send()
        .await;
    let (state, key, question) = round(&first, "round 1 on gw-a");
    assert_eq!(question["method"], "elicitation/create");
    assert_eq!(a.metric(PARKED).await, 1.0, "parked on gw-a, holding its process");
    let owner = s.spawned();
    assert_eq!(owner.len(), 1, "{owner:?}");

    let done = b
        .request("tools/call")
        .id(json!(2))
        .params(retry_params("ask", &state, &key, &ada()))
        .capabilities(elicitation())
        .send()
        .await;

    assert_eq!(done.body["id"], 2, "{}", done.raw);
    let got = answer(&done, "the retry through gw-b");
    assert_eq!(got["answer"], ada(), "{got}");
    assert_eq!(pid_in(&got), owner[0], "answered by the process of round 1");
    assert_eq!(s.spawned(), owner, "gw-b started no process for it");
    assert_eq!(b.metric(SPAWNS).await, 0.0);
    assert_eq!(b.metric_where("sessionless_requests_total", "outcome=\"forwarded\"").await, 1.0);
    assert_eq!(a.metric(PARKED).await, 0.0);
}

// ---------------------------------------------------------------- bounds

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_process_cap_holds_under_forty_concurrent_principals() {
    let s = Scratch::new("cap");
    let gw = Arc::new(gateway(&s.argv(&[]), "max_processes = 4", "").await);
    let sampler = Sampler::start(s.marker());
    let gauge_max = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let gauge = {
        let (gw, max, done) = (gw.clone(), gauge_max.clone(), done.clone());
        tokio::spawn(async move {
            while !done.load(Ordering::SeqCst) {
                let v = gw_metric_where(&gw, PROCESSES, "upstream=\"fake\"").await;
                max.fetch_max(v as u64, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };

    let calls = (0..40).map(|i| {
        let gw = gw.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let reply = tool(&gw, json!(format!("call-{i}")), "slow", json!({"ms": 300}))
                .bearer(&format!("principal-{i}"))
                .send()
                .await;
            (i, reply, started.elapsed())
        })
    });
    let replies = futures_util::future::join_all(calls).await;
    done.store(true, Ordering::SeqCst);
    gauge.await.unwrap();
    let most = sampler.finish();

    let mut served = 0;
    for r in replies {
        let (i, reply, took) = r.unwrap();
        let what = format!("principal {i} (after {took:?})");
        if reply.status == 200 {
            answer(&reply, &what);
            served += 1;
        } else {
            assert!(matches!(reply.status.as_u16(), 429 | 503), "{what}: {}", reply.raw);
            assert_refused(&reply, reply.status.as_u16(), &json!(format!("call-{i}")), &what);
        }
    }
    eprintln!(
        "cap: {served} of 40 served, at most {most} live, gauge at most {:?}, {} spawns",
        gauge_max,
        s.spawned().len()
    );
    assert!(most <= 4, "{most} live processes at once, over max_processes = 4");
    assert!(gauge_max.load(Ordering::SeqCst) <= 4, "the gauge said {}", gauge_max.load(Ordering::SeqCst));
    assert!(most >= 1, "the sampler saw the processes");
    assert!(served >= 4, "the gateway kept serving: {served} of 40 served");
    assert!(s.spawned().len() >= served.min(4), "{:?}", s.spawned());
}

#[tokio::test]
async fn over_the_upstreams_cap_a_call_is_refused_503_within_two_seconds() {
    let s = Scratch::new("cap503");
    let gw = gateway(&s.argv(&[]), "max_processes = 1", "").await;

    let hold = tool(&gw, json!("alice-1"), "slow", json!({"ms": 6000})).bearer("alice").send();
    let refused = async {
        // Once alice's call runs on the only process, bob needs another.
        let deadline = Instant::now() + Duration::from_secs(10);
        while s.spawned().is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let started = Instant::now();
        let reply = tool(&gw, json!("bob-1"), "pid", json!({})).bearer("bob").send().await;
        (reply, started.elapsed())
    };
    let (held, (reply, took)) = tokio::join!(hold, refused);

    assert_refused(&reply, 503, &json!("bob-1"), "bob, the upstream full");
    assert!(took < Duration::from_secs(4), "refused after at most about 2 s, not {took:?}");
    answer(&held, "alice's call finishes");
    assert_eq!(s.spawned().len(), 1, "{:?}", s.spawned());
}

#[tokio::test]
async fn over_its_own_share_a_call_is_refused_429_within_two_seconds() {
    let s = Scratch::new("cap429");
    let gw = gateway(&s.argv(&[]), "max_processes = 8", "[limits]\nmax_sessions_per_principal = 1").await;

    // A call that asks for log lines has its process to itself.
    let hold = tool(&gw, json!("a-1"), "slow", json!({"ms": 6000})).bearer("alice").log_level("info").send();
    let refused = async {
        let deadline = Instant::now() + Duration::from_secs(10);
        while s.spawned().is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let started = Instant::now();
        let reply = tool(&gw, json!("a-2"), "log", json!({"tag": "a2"}))
            .bearer("alice")
            .log_level("info")
            .send()
            .await;
        let elsewhere = tool(&gw, json!("b-1"), "pid", json!({})).bearer("bob").send().await;
        (reply, started.elapsed(), elsewhere)
    };
    let (held, (reply, took, elsewhere)) = tokio::join!(hold, refused);

    assert_refused(&reply, 429, &json!("a-2"), "alice's second call, her share used");
    assert!(took < Duration::from_secs(4), "refused after at most about 2 s, not {took:?}");
    answer(&elsewhere, "another principal is served meanwhile");
    answer(&held, "alice's first call finishes");
}

// ---------------------------------------------------------------- lifecycle

#[tokio::test]
async fn a_crashed_process_is_reaped_and_replaced_on_next_use() {
    let s = Scratch::new("crash");
    let gw = gateway(&s.argv(&[]), "", "").await;
    let first = serving_pid(&gw, 1).await;

    let crashed = tool(&gw, json!(2), "crash", json!({})).send().await;
    assert!(crashed.status.is_server_error(), "{}", crashed.raw);
    assert!(crashed.error_code().is_some(), "{}", crashed.raw);
    assert_eq!(crashed.body["id"], 2, "{}", crashed.raw);
    assert_gone(&[first], Duration::from_secs(10), "the crashed process is reaped").await;

    let second = serving_pid(&gw, 3).await;
    assert_ne!(second, first);
    assert_eq!(s.spawned(), vec![first, second]);
    assert_eq!(gw.settled_metric(PROCESSES, 1.0).await, 1.0);
    assert_eq!(gw_metric_where(&gw, SPAWNS, "outcome=\"started\"").await, 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_that_keeps_failing_backs_off() {
    let s = Scratch::new("backoff");
    let gw = Arc::new(gateway(&s.argv(&["--exit-at-once"]), "", "").await);
    let started = Instant::now();
    let window = Duration::from_secs(10);

    // Four principals call as fast as they are answered for ten seconds.
    let callers = (0..4).map(|p| {
        let gw = gw.clone();
        tokio::spawn(async move {
            let mut answered = 0u32;
            let mut n = 0u64;
            while started.elapsed() < window {
                n += 1;
                let id = json!(format!("p{p}-{n}"));
                let reply = tool(&gw, id.clone(), "pid", json!({})).bearer(&format!("p{p}")).send().await;
                assert!(reply.status.is_server_error(), "{}", reply.raw);
                assert_eq!(reply.body["id"], id, "{}", reply.raw);
                assert!(reply.error_code().is_some(), "{}", reply.raw);
                answered += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            answered
        })
    });
    let answered: u32 = futures_util::future::join_all(callers).await.into_iter().map(|r| r.unwrap()).sum();
    let spawns = s.spawned().len();

    eprintln!("backoff: {spawns} spawns for {answered} calls");
    assert!(answered >= 8, "the calls were answered, not held: {answered}");
    assert!(spawns >= 2, "the command was tried again: {spawns}");
    assert!(spawns <= 12, "{spawns} spawns in about ten seconds for {answered} calls: no backoff");
    assert!(gw_metric_where(&gw, SPAWNS, "outcome=\"exited\"").await >= 1.0);
    assert_eq!(gw_metric_where(&gw, SPAWNS, "outcome=\"started\"").await, 0.0);
}

#[tokio::test]
async fn a_process_that_never_initializes_is_killed_at_the_start_timeout() {
    let s = Scratch::new("start-timeout");
    let gw = gateway(&s.argv(&["--no-init"]), "start_timeout_ms = 500", "").await;

    let started = Instant::now();
    let reply = tool(&gw, json!(1), "pid", json!({})).send().await;
    let took = started.elapsed();

    assert!(matches!(reply.status.as_u16(), 502 | 504), "{}", reply.raw);
    assert_eq!(reply.body["id"], 1, "{}", reply.raw);
    assert!(reply.raw.contains("fake"), "the error names the upstream: {}", reply.raw);
    assert!(took < Duration::from_secs(5), "answered soon after the start timeout, not {took:?}");
    let spawned = s.spawned();
    assert!(!spawned.is_empty());
    assert_gone(&spawned, Duration::from_secs(10), "the process that never initialized").await;
    assert!(gw_metric_where(&gw, SPAWNS, "outcome=\"start_timeout\"").await >= 1.0);
}

#[tokio::test]
async fn an_idle_process_is_stopped() {
    let s = Scratch::new("idle");
    let gw = gateway(&s.argv(&[]), "process_idle_timeout_ms = 1000", "").await;
    let first = serving_pid(&gw, 1).await;

    assert_gone(&[first], Duration::from_secs(15), "the idle process").await;
    assert_eq!(gw.settled_metric(PROCESSES, 0.0).await, 0.0);
    let second = serving_pid(&gw, 2).await;
    assert_ne!(second, first, "a new process for the next call");
}

// ---------------------------------------------------------------- output

#[tokio::test]
async fn an_oversized_stdout_line_fails_the_call_and_replaces_the_process() {
    let s = Scratch::new("huge");
    let gw = gateway(&s.argv(&[]), "", "[limits]\nmax_upstream_response_bytes = 65536").await;
    let first = serving_pid(&gw, 1).await;

    let fits = tool(&gw, json!(2), "huge", json!({"bytes": 20000})).send().await;
    assert_eq!(fits.status, 200, "{}", fits.raw);
    assert!(fits.result()["content"][0]["text"].as_str().is_some_and(|t| t.len() > 19000));

    let over = tool(&gw, json!(3), "huge", json!({"bytes": 300000})).send().await;
    assert_eq!(over.status, 502, "{}", over.raw);
    assert_eq!(over.body["id"], 3, "{}", over.raw);
    assert!(over.error_code().is_some(), "{}", over.raw);
    assert_gone(&[first], Duration::from_secs(10), "the process that wrote it").await;

    let second = serving_pid(&gw, 4).await;
    assert_ne!(second, first);
}

#[tokio::test]
async fn a_stdout_line_that_is_not_json_rpc_is_dropped() {
    let s = Scratch::new("garbage");
    let gw = gateway(&s.argv(&[]), "", "").await;
    let first = serving_pid(&gw, 1).await;

    let reply = tool(&gw, json!(2), "garbage", json!({"text": "still here"})).send().await;
    let got = answer(&reply, "garbage");
    assert_eq!(got["text"], "still here");
    assert!(!reply.raw.contains("not JSON-RPC"), "{}", reply.raw);
    assert_eq!(serving_pid(&gw, 3).await, first, "the same process goes on");
    assert_eq!(s.spawned(), vec![first]);
}

/// The gateway binary on 127.0.0.1:0 with a routing file; its log (stderr)
/// counted and kept in part; killed when dropped.
struct Binary {
    child: Child,
    addr: std::net::SocketAddr,
    log_bytes: Arc<AtomicU64>,
    log_matching: Arc<Mutex<Vec<String>>>,
}

impl Drop for Binary {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Binary {
    /// Starts it; log lines containing `watch` are kept (the first hundred).
    fn start(config: &Path, watch: &'static str) -> Binary {
        let mut child = Command::new(env!("CARGO_BIN_EXE_sessionless"))
            .args(["--config", config.to_str().unwrap()])
            .env_remove("SESSIONLESS_LOG")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the gateway binary starts");
        let mut log = BufReader::new(child.stderr.take().unwrap());
        let marker = "listening on http://";
        let addr = loop {
            let mut line = String::new();
            assert!(log.read_line(&mut line).unwrap() > 0, "the binary logs its address");
            if let Some(at) = line.find(marker) {
                let rest = &line[at + marker.len()..];
                break rest.split_whitespace().next().unwrap().parse().unwrap();
            }
        };
        let log_bytes = Arc::new(AtomicU64::new(0));
        let log_matching = Arc::new(Mutex::new(Vec::new()));
        let (bytes, matching) = (log_bytes.clone(), log_matching.clone());
        // Keeps reading its log, so that it never blocks on a full pipe.
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            loop {
                buf.clear();
                match log.by_ref().take(1 << 20).read_until(b'\n', &mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        bytes.fetch_add(n as u64, Ordering::SeqCst);
                        let line = String::from_utf8_lossy(&buf);
                        let mut kept = matching.lock().unwrap();
                        if line.contains(watch) && kept.len() < 100 {
                            kept.push(line.chars().take(4096).collect());
                        }
                    }
                }
            }
        });
        Binary { child, addr, log_bytes, log_matching }
    }

    fn request(&self, id: Value, name: &str, args: Value) -> ModernRequest {
        ModernRequest::new(support::client::http_client(), format!("http://{}/mcp", self.addr), "tools/call")
            .id(id)
            .params(json!({"name": name, "arguments": args}))
    }

    fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap()
    }
}

#[tokio::test]
async fn a_stderr_flood_costs_bounded_memory_and_log() {
    let s = Scratch::new("stderr");
    let config = s.path("gateway.toml");
    std::fs::write(
        &config,
        format!("[server]\nlisten = \"127.0.0.1:0\"\n\n{}", stdio_toml(&s.argv(&[]), "", "")),
    )
    .unwrap();
    let gw = Binary::start(&config, "stderr flood");
    let warm = gw.request(json!(1), "pid", json!({})).send().await;
    let first = pid_in(&answer(&warm, "warm-up"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (rss_before, log_before) = (gw.rss_kib(), gw.log_bytes.load(Ordering::SeqCst));

    // 128 MiB of 1 KiB lines, then one line of 8 MiB.
    let flood = gw
        .request(json!(2), "stderr_flood", json!({"mb": 128, "line_bytes": 1000, "long_line_bytes": 8 << 20}))
        .send()
        .await;
    let got = answer(&flood, "the flood's call");
    assert!(got["written"].as_u64().is_some_and(|w| w >= 128 << 20), "{got}");
    let after = gw.request(json!(3), "pid", json!({})).send().await;
    assert_eq!(pid_in(&answer(&after, "after the flood")), first, "the same process goes on");
    tokio::time::sleep(Duration::from_millis(300)).await;

    let rss_growth_mib = gw.rss_kib().saturating_sub(rss_before) / 1024;
    let logged = gw.log_bytes.load(Ordering::SeqCst) - log_before;
    eprintln!("stderr flood: RSS grew {rss_growth_mib} MiB, {logged} bytes logged");
    assert!(rss_growth_mib < 48, "136 MiB of stderr grew the gateway by {rss_growth_mib} MiB");
    assert!(logged < 4 << 20, "136 MiB of stderr became {logged} bytes of the gateway's log");
    let kept = gw.log_matching.lock().unwrap().clone();
    assert!(!kept.is_empty(), "the child's stderr is in the gateway's log");
    assert!(kept.iter().all(|l| l.contains("fake")), "tagged with the upstream: {:?}", &kept[..1]);
}

#[tokio::test]
async fn the_child_gets_only_the_listed_environment() {
    let s = Scratch::new("env");
    let n = NEXT.fetch_add(1, Ordering::SeqCst);
    let secret_var = format!("SESSIONLESS_TEST_STDIO_SECRET_{n}");
    let token_var = format!("SESSIONLESS_TEST_STDIO_TOKEN_{n}");
    let secret = format!("gateway-secret-{n}-do-not-leak");
    std::env::set_var(&secret_var, &secret);
    std::env::set_var(&token_var, "token-from-env");
    let ca = s.path("ca.pem");
    std::fs::write(&ca, "CA-FROM-FILE").unwrap();
    let keys = format!(
        "env = {{ \"ROOT\" = {{ value = \"/srv/data\" }}, \"TOKEN\" = {{ value_env = \"{token_var}\" }}, \"CA\" = {{ value_file = {} }} }}",
        serde_json::to_string(ca.to_str().unwrap()).unwrap()
    );
    let gw = gateway(&s.argv(&[]), &keys, "").await;

    let reply = tool(&gw, json!(1), "env", json!({}))
        .bearer("bearer-secret-in-a-request")
        .header("x-api-secret", "header-secret-in-a-request")
        .send()
        .await;
    let got = answer(&reply, "env");
    let pid = pid_in(&got);
    let from_proc: serde_json::Map<String, Value> = std::fs::read(format!("/proc/{pid}/environ"))
        .expect("the child's /proc/PID/environ")
        .split(|b| *b == 0)
        .filter_map(|kv| {
            let kv = String::from_utf8_lossy(kv);
            let (k, v) = kv.split_once('=')?;
            Some((k.to_string(), json!(v)))
        })
        .collect();
    let initial = got["initial"].as_object().expect("the environment it was started with");
    assert_eq!(initial, &from_proc, "the fake read what /proc shows");

    let allowed = ["ROOT", "TOKEN", "CA", "PATH", "HOME", "LANG", "TMPDIR"];
    for key in from_proc.keys() {
        assert!(allowed.contains(&key.as_str()), "{key} is in the child's environment: {from_proc:?}");
    }
    assert_eq!(from_proc["ROOT"], "/srv/data");
    assert_eq!(from_proc["TOKEN"], "token-from-env");
    assert_eq!(from_proc["CA"], "CA-FROM-FILE");
    for key in ["PATH", "HOME", "LANG", "TMPDIR"] {
        assert_eq!(from_proc.get(key).and_then(Value::as_str), std::env::var(key).ok().as_deref(), "{key}");
    }
    // What Python shows (it may add LC_CTYPE, PEP 538) holds nothing more.
    for key in got["environ"].as_object().unwrap().keys() {
        assert!(allowed.contains(&key.as_str()) || key == "LC_CTYPE", "{key}: {}", got["environ"]);
    }
    let all = got.to_string();
    for leak in
        [secret.as_str(), &secret_var, &token_var, "bearer-secret", "header-secret", "SESSIONLESS_TEST"]
    {
        assert!(!all.contains(leak), "{leak} reached the child: {all}");
    }
    std::env::remove_var(&secret_var);
}

// ---------------------------------------------------------------- reload and shutdown

/// Writes `text` to `path` as editors do: a new file renamed over the old.
fn write(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[tokio::test]
async fn a_reload_that_changes_the_command_retires_its_processes() {
    let s = Scratch::new("reload");
    let file = s.path("gateway.toml");
    write(&file, &stdio_toml(&s.argv_counted("v1", &[]), "", ""));
    let gw = Gateway::from_file(&file, false).await;

    let old = serving_pid(&gw, 1).await;
    // A call parked on a question, on a process of its own.
    let first = gw
        .request("tools/call")
        .id(json!(2))
        .params(json!({"name": "ask", "arguments": {}}))
        .capabilities(elicitation())
        .send()
        .await;
    let (state, key, _) = round(&first, "round 1 before the reload");
    let asked = *s.spawned_in("v1").iter().find(|&&p| p != old).expect("the asking process");

    write(&file, &stdio_toml(&s.argv_counted("v2", &[]), "", ""));
    gw.reload().await.expect("the new command is applied");

    assert_gone(&[old], Duration::from_secs(10), "the old command's idle process").await;
    assert!(is_running(asked), "a process with a parked call stays until it is answered");
    let new = serving_pid(&gw, 3).await;
    assert_eq!(s.spawned_in("v2"), vec![new], "new calls run the new command");

    let done = gw
        .request("tools/call")
        .id(json!(4))
        .params(retry_params("ask", &state, &key, &ada()))
        .capabilities(elicitation())
        .send()
        .await;
    let got = answer(&done, "the retry after the reload");
    assert_eq!(got["answer"], ada());
    assert_eq!(pid_in(&got), asked, "answered by the process that asked");
    assert_gone(&[asked], Duration::from_secs(10), "the retired process, once its call is answered").await;
    assert_eq!(s.spawned_in("v1").len(), 2, "nothing new ran the old command");

    // The upstream removed: its processes stop too.
    let other = s.argv_counted("v3", &[]);
    write(
        &file,
        &format!(
            "[[upstreams]]\nname = \"other\"\n{}\n\n[[routes]]\npath = \"/mcp\"\nupstream = \"other\"\n",
            command_line(&other)
        ),
    );
    gw.reload().await.expect("the upstream is removed");
    assert_gone(&[new], Duration::from_secs(10), "the removed upstream's process").await;
    let last = serving_pid(&gw, 5).await;
    assert_eq!(s.spawned_in("v3"), vec![last]);
}

#[tokio::test]
async fn shutdown_leaves_no_child_nor_grandchild() {
    let s = Scratch::new("shutdown");
    let toml = format!(
        "[server]\ndrain_timeout_ms = 1000\n\n\
         [[upstreams]]\nname = \"fake\"\n{}\n\n[[upstreams]]\nname = \"stubborn\"\n{}\n\n\
         [[routes]]\npath = \"/mcp\"\nupstream = \"fake\"\n\n[[routes]]\npath = \"/stubborn\"\nupstream = \"stubborn\"\n",
        command_line(&s.argv(&[])),
        command_line(&s.argv(&["--ignore-term"])),
    );
    let gw = Gateway::with_config(parse(&toml)).await;

    let mut pids = Vec::new();
    for path in ["/mcp", "/stubborn"] {
        let call = |id: u64, name: &str| {
            gw.request_to(path, "tools/call").id(json!(id)).params(json!({"name": name, "arguments": {}}))
        };
        let pid = pid_in(&answer(&call(1, "pid").send().await, path));
        let spawned = answer(&call(2, "spawn_grandchild").send().await, path);
        let grandchild = spawned["grandchild"].as_i64().unwrap() as i32;
        s.watch(grandchild);
        assert_eq!(pid_in(&spawned), pid, "{path}: one process");
        assert_eq!(spawned["pgid"], pid, "{path}: the process leads a process group of its own");
        assert!(is_running(grandchild));
        pids.extend([pid, grandchild]);
    }
    // A third process, started with other capabilities.
    let third = gw
        .request("tools/call")
        .params(json!({"name": "pid", "arguments": {}}))
        .capabilities(json!({"sampling": {}}))
        .send()
        .await;
    pids.push(pid_in(&answer(&third, "a process of another key")));
    assert_eq!(s.spawned().len(), 3);

    let started = Instant::now();
    gw.stop().await;
    let left = Duration::from_secs(9).saturating_sub(started.elapsed());
    assert_gone(&pids, left, "after shutdown (TERM, then KILL after 5 s)").await;
    assert!(live_fakes(&s.marker()).is_empty());
}

// ---------------------------------------------------------------- legacy clients

#[tokio::test]
async fn a_legacy_client_is_translated_onto_the_stdio_route() {
    let s = Scratch::new("legacy");
    let gw = gateway(&s.argv(&[]), "", "").await;
    let client = Legacy::new(&gw);
    let session = client.open().await;
    let other = client.open().await;

    let call = |id: Value, name: &str, args: Value| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": name, "arguments": args}})
            .to_string()
    };
    let echo = client.post(Some(&session), call(json!("e"), "echo", json!({"text": "hi"}))).await;
    assert_eq!(echo.status, 200, "{}", echo.raw);
    assert_eq!(echo.body["id"], "e");
    assert!(echo.result().get("resultType").is_none(), "{}", echo.raw);
    let text: Value = serde_json::from_str(echo.result()["content"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(text["text"], "hi");
    let again = client.post(Some(&other), call(json!("e2"), "echo", json!({"text": "again"}))).await;
    let text2: Value = serde_json::from_str(again.result()["content"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(text2["pid"], text["pid"], "two client sessions, one process: never pinned");

    // A question is pushed on the POST's SSE answer; the answer is POSTed back.
    let mut events = client.stream(&session, call(json!("q"), "ask", json!({"message": "Your name?"}))).await;
    assert_eq!(events.status, 200);
    let question = events.next().await.expect("a question");
    assert_eq!(question["method"], "elicitation/create", "{question}");
    assert_eq!(question["params"]["message"], "Your name?", "{question}");
    let qid = question["id"].clone();
    let reply = json!({"jsonrpc": "2.0", "id": qid, "result": ada()});
    assert_eq!(client.post(Some(&session), reply.to_string()).await.status, 202);
    let done = events.next().await.expect("the result");
    assert_eq!(done["id"], "q", "{done}");
    assert!(done.to_string().contains("Ada"), "{done}");
}

// ---------------------------------------------------------------- configuration

#[test]
fn keys_that_only_make_sense_over_http_are_refused_beside_command_naming_the_line() {
    let argv = vec!["/bin/true".to_string()];
    for (key, line) in [
        ("url = \"http://127.0.0.1:9/mcp\"", "url"),
        ("urls = [\"http://127.0.0.1:9/mcp\"]", "urls"),
        ("headers = { \"X-A\" = { value = \"b\" } }", "headers"),
        ("connect_timeout_ms = 100", "connect_timeout_ms"),
        ("forward_authorization = \"Authorization\"", "forward_authorization"),
        ("legacy_clients = \"relay\"", "legacy_clients"),
    ] {
        let text = stdio_toml(&argv, key, "");
        let err = match Config::from_toml(&text) {
            Ok(_) => panic!("`{key}` beside `command` is accepted:\n{text}"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains("line 4") && err.contains(line), "{key}: {err}");
    }
    // Without them, the same table is a valid stdio upstream.
    parse(&stdio_toml(&argv, "max_processes = 2\nstart_timeout_ms = 1000\nspare_processes = 1", ""));
}

fn check_config(file: &Path, probe: bool, env: &[(&str, &str)]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_sessionless"))
        .arg("check-config")
        .args(probe.then_some("--probe"))
        .arg(file)
        .env_clear()
        .envs(env.iter().copied())
        .output()
        .expect("the binary runs")
}

const CHECK_KEYS: &str =
    "env = { \"ROOT\" = { value = \"/srv/value-not-shown\" }, \"TOKEN\" = { value_env = \"STDIO_CHECK_TOKEN\" } }";

#[test]
fn check_config_shows_the_command_with_env_values_redacted() {
    let s = Scratch::new("check");
    let file = s.path("ok.toml");
    std::fs::write(&file, stdio_toml(&s.argv(&[]), CHECK_KEYS, "")).unwrap();
    let out = check_config(&file, false, &[("STDIO_CHECK_TOKEN", "token-not-shown")]);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("stdio_fake.py"), "the command is shown: {stdout}");
    assert!(stdout.contains("ROOT"), "the variables are named: {stdout}");
    for hidden in ["value-not-shown", "token-not-shown"] {
        assert!(!stdout.contains(hidden) && !stderr.contains(hidden), "{hidden} printed: {stdout}{stderr}");
    }
    assert!(s.spawned().is_empty(), "offline: nothing started");
}

#[test]
fn check_config_refuses_a_program_that_is_missing_or_not_executable() {
    let s = Scratch::new("check-program");
    let script = s.path("not-executable.sh");
    std::fs::write(&script, "#!/bin/sh\n").unwrap();
    let script = script.to_str().unwrap();
    for (name, program) in [("missing.toml", "/nonexistent/mcp-server"), ("not-executable.toml", script)] {
        let file = s.path(name);
        std::fs::write(&file, stdio_toml(&[program.to_string()], "", "")).unwrap();
        let out = check_config(&file, false, &[]);
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(!out.status.success(), "{program} is refused: {stdout}{stderr}");
        assert!(stderr.contains(program), "{program} is named: {stderr}");
    }
}

#[tokio::test]
async fn check_config_probe_starts_initializes_lists_tools_and_stops_the_process() {
    let s = Scratch::new("check-probe");
    let file = s.path("ok.toml");
    std::fs::write(&file, stdio_toml(&s.argv(&[]), CHECK_KEYS, "")).unwrap();
    let out = check_config(&file, true, &[("STDIO_CHECK_TOKEN", "token-not-shown")]);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("spawn_grandchild") && stdout.contains("stderr_flood"), "its tools: {stdout}");
    let probed = s.spawned();
    assert_eq!(probed.len(), 1, "one process started: {probed:?}\n{stdout}");
    assert_gone(&probed, Duration::from_secs(5), "the probed process").await;
}

// ---------------------------------------------------------------- federation

/// A federated route whose members are a stdio upstream and an HTTP one:
/// lists merged, a call and a question reach the stdio member's process.
#[tokio::test]
async fn a_stdio_member_of_a_federated_route_serves_lists_calls_and_questions() {
    let s = Scratch::new("federated");
    let http = support::FakeUpstream::new().paged_tools(&["remote"]).start().await;
    let toml = format!(
        "[[upstreams]]\nname = \"local\"\n{}\n\n[[upstreams]]\nname = \"remote\"\nurl = \"{}\"\ngeneration = \"legacy\"\n\n\
         [[routes]]\npath = \"/mcp\"\nmembers = [\"local\", \"remote\"]\n",
        command_line(&s.argv(&[])),
        http.url()
    );
    let gw = Gateway::with_config(parse(&toml)).await;

    let listed = gw.request("tools/list").send().await;
    assert_eq!(listed.status, 200, "{}", listed.raw);
    let names: Vec<&str> =
        listed.result()["tools"].as_array().unwrap().iter().filter_map(|t| t["name"].as_str()).collect();
    assert!(names.contains(&"local__echo") && names.contains(&"local__ask"), "{names:?}");
    assert!(names.iter().any(|n| n.starts_with("remote__")), "{names:?}");

    let echoed = tool(&gw, json!(2), "local__echo", json!({"text": "hi"})).send().await;
    let got = answer(&echoed, "local__echo");
    assert_eq!(got["text"], "hi", "{got}");
    let pid = pid_in(&got);
    assert_eq!(s.spawned(), vec![pid], "the stdio member's one process served the list and the call");

    let first = tool(&gw, json!(3), "local__ask", json!({})).capabilities(elicitation()).send().await;
    let (state, key, question) = round(&first, "round 1 on the federated route");
    assert_eq!(question["method"], "elicitation/create");
    let done = gw
        .request("tools/call")
        .id(json!(4))
        .params(retry_params("local__ask", &state, &key, &ada()))
        .capabilities(elicitation())
        .send()
        .await;
    let got = answer(&done, "the retry on the federated route");
    assert_eq!(got["answer"], ada(), "{got}");
}

// ---------------------------------------------------------------- a hostile or careless child, a caller who leaves

/// A log line no call takes, whose data has a multibyte character across
/// the log's cut: logged, and the process goes on serving.
#[tokio::test]
async fn a_log_line_cut_inside_a_character_does_not_break_the_process() {
    let s = Scratch::new("multibyte");
    let gw = gateway(&s.argv(&[]), "call_timeout_ms = 8000", "").await;
    let first = serving_pid(&gw, 1).await;
    let logged = tool(&gw, json!(2), "log", json!({"tag": "é".repeat(1500), "ms": 10})).send().await;
    answer(&logged, "the call that logs");
    assert_eq!(serving_pid(&gw, 3).await, first, "the same process serves on");
}

/// A client that leaves while a process is being started for its call:
/// the process is stopped, not left in no session.
#[tokio::test]
async fn a_caller_that_leaves_during_a_start_leaves_no_process() {
    let s = Scratch::new("hangup");
    let gw = gateway(&s.argv(&["--init-delay-ms", "1500"]), "process_idle_timeout_ms = 1000", "").await;
    let a = tool(&gw, json!("a"), "slow", json!({"ms": 4000})).log_level("info").send();
    let b = async {
        let deadline = Instant::now() + Duration::from_secs(10);
        while s.spawned().is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(2000)).await;
        let b = tool(&gw, json!("b"), "echo", json!({"text": "b"})).log_level("info");
        gw.hang_up_after(b, Duration::from_millis(500)).await;
    };
    let (a, ()) = tokio::join!(a, b);
    answer(&a, "a");
    let spawned = s.spawned();
    assert_eq!(spawned.len(), 2, "{spawned:?}");
    assert_gone(&spawned, Duration::from_secs(10), "the idle process and the one whose caller left").await;
}

/// One principal whose calls each need a process of their own cannot hold
/// every process: another principal is still served.
#[tokio::test]
async fn one_principal_cannot_hold_every_process() {
    let s = Scratch::new("monopoly");
    let gw = gateway(&s.argv(&[]), "max_processes = 3", "[limits]\nmax_sessions_per_principal = 2").await;
    let holds = (0..3).map(|i| {
        tool(&gw, json!(format!("a-{i}")), "slow", json!({"ms": 4000}))
            .bearer("alice")
            .log_level("info")
            .send()
    });
    let holds = futures_util::future::join_all(holds);
    let bob = async {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        tool(&gw, json!("bob"), "pid", json!({})).bearer("bob").send().await
    };
    let (holds, bob) = tokio::join!(holds, bob);
    answer(&bob, "bob, beside alice's calls");
    let refused = holds.iter().filter(|h| h.status == 429).count();
    let served = holds.iter().filter(|h| h.status == 200).count();
    assert!(
        refused >= 1 && served >= 1,
        "alice is held to her share: {}",
        holds.iter().map(|h| h.raw.as_str()).collect::<Vec<_>>().join("\n")
    );
}

/// A caller that leaves while its large request waits for a child that
/// reads nothing: no half line is left for the next request, and the
/// process goes idle (the leaver's request is not left linked).
#[tokio::test]
async fn a_caller_that_leaves_mid_write_leaves_no_half_line() {
    let s = Scratch::new("midwrite");
    let gw = gateway(&s.argv(&[]), "process_idle_timeout_ms = 1000\ncall_timeout_ms = 8000", "").await;
    let first = serving_pid(&gw, 1).await;
    let a = tool(&gw, json!("a"), "block_stdin", json!({"ms": 3000})).send();
    let rest = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let big = "x".repeat(512 * 1024);
        gw.hang_up_after(tool(&gw, json!("b"), "echo", json!({"text": big})), Duration::from_millis(800))
            .await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        tool(&gw, json!("c"), "echo", json!({"text": "c"})).send().await
    };
    let (a, c) = tokio::join!(a, rest);
    answer(&a, "a");
    let got = answer(&c, "c, after b's caller left mid-write");
    assert_eq!(got["text"], "c", "{got}");
    assert_gone(&[first], Duration::from_secs(10), "the process, idle once b's request is let go").await;
}

/// A child that writes requests no call can take as fast as it can, and
/// reads nothing: the gateway's tasks stay bounded (the child is stopped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_requests_from_the_child_costs_bounded_tasks() {
    let s = Scratch::new("reqflood");
    let gw = gateway(&s.argv(&[]), "", "").await;
    serving_pid(&gw, 1).await;
    let handle = tokio::runtime::Handle::current();
    let call = tool(&gw, json!(2), "flood_requests", json!({"n": 300000, "ms": 3000})).send();
    let most = async {
        let mut most = 0;
        for _ in 0..8 {
            tokio::time::sleep(Duration::from_millis(500)).await;
            most = most.max(handle.metrics().num_alive_tasks());
        }
        most
    };
    let (_, most) = tokio::join!(call, most);
    assert!(most < 1000, "{most} tasks alive");
}

/// The server dies while a grandchild holds its stdout open: the exit is
/// noticed, the call fails, and the next call gets a new process.
#[tokio::test]
async fn a_crash_is_noticed_while_a_grandchild_holds_stdout() {
    let s = Scratch::new("gcrash");
    let gw = gateway(&s.argv(&[]), "call_timeout_ms = 20000", "").await;
    let first = serving_pid(&gw, 1).await;
    let started = Instant::now();
    let crashed = tool(&gw, json!(2), "crash_leaving_grandchild", json!({})).send().await;
    assert!(crashed.status.is_server_error(), "{}", crashed.raw);
    assert!(started.elapsed() < Duration::from_secs(10), "noticed at once, not at the call timeout");
    let next = serving_pid(&gw, 3).await;
    assert_ne!(next, first);
    // The grandchild went with the group.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !group_members(first).is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(group_members(first), Vec::<i32>::new(), "the crashed server's group is gone");
}

/// The processes whose process group is `pgid`.
fn group_members(pgid: i32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    let pgrp = |pid: i32| -> Option<i32> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        stat.rsplit_once(')')?.1.split_whitespace().nth(2)?.parse().ok()
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| pgrp(pid) == Some(pgid))
        .collect()
}

/// One newcomer waiting for a place stops one idle process, not every one.
#[tokio::test]
async fn a_newcomer_stops_one_idle_process_not_every_one() {
    let s = Scratch::new("evict");
    let gw = gateway(&s.argv(&["--ignore-term"]), "max_processes = 4", "").await;
    for i in 0..4 {
        answer(&tool(&gw, json!(i), "pid", json!({})).bearer(&format!("p{i}")).send().await, "warm");
    }
    let warm = s.spawned();
    assert_eq!(warm.len(), 4);
    tokio::time::sleep(Duration::from_millis(600)).await;
    let _ = tool(&gw, json!("e"), "pid", json!({})).bearer("newcomer").send().await;
    tokio::time::sleep(Duration::from_secs(7)).await;
    let gone = warm.iter().filter(|p| !is_running(**p)).count();
    assert!(gone <= 1, "{gone} warm processes stopped to make room for one");
}
