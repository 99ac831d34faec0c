//! What a reload reads besides the routing file, here an API key file: read
//! off the async workers (`/healthz` answers while 100,000 keys load), a
//! regular file only once symlinks are followed (a FIFO, `/dev/zero`, a
//! directory are refused at once, naming the key), within its size cap; a
//! refused reload leaves the running configuration serving. The same
//! checks stop the start.

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::json;
use support::{Answer, FakeUpstream, Gateway, Upstream};

const RELOADS: &str = "sessionless_config_reloads_total";

fn dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("sessionless-reload-files-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn line(id: &str, key: &str) -> String {
    sessionless::auth::keys::file_line(id, key) + "\n"
}

/// A routing file with one route behind an `api_key` policy reading `keys`.
fn keyed_file(d: &Path, up: &Upstream, keys: &Path) -> PathBuf {
    let file = d.join("gateway.toml");
    let text = format!(
        "[[upstreams]]\nname = \"u\"\nurl = \"{}\"\ngeneration = \"legacy\"\n\n\
         [auth.keys]\ntype = \"api_key\"\nkeys_file = \"{}\"\n\n\
         [[routes]]\npath = \"/mcp\"\nupstream = \"u\"\nauth = \"keys\"\n",
        up.url(),
        keys.display()
    );
    std::fs::write(&file, text).unwrap();
    file
}

async fn start_upstream() -> Upstream {
    FakeUpstream::new()
        .on("tools/call", Answer::Result(json!({"content": [{"type": "text", "text": "hi"}]})))
        .start()
        .await
}

/// The status of a call made with `key`.
async fn call_with(gw: &Gateway, key: &str) -> http::StatusCode {
    let call = gw.request("tools/call").id(json!(1)).params(json!({"name": "echo", "arguments": {}}));
    call.bearer(key).send().await.status
}

/// Replaces whatever is at `path` (a file, a link, a FIFO, a directory).
fn clear(path: &Path) {
    let _ = std::fs::remove_file(path);
    let _ = std::fs::remove_dir_all(path);
}

/// Puts something at a path.
type Make<'a> = &'a dyn Fn(&Path);

fn mkfifo(path: &Path) {
    let made = std::process::Command::new("mkfifo").arg(path).status().expect("mkfifo runs");
    assert!(made.success());
}

/// Asks `/healthz` again and again until `work` is done: its outcome, how
/// many answers came meanwhile, and the slowest.
async fn healthz_during<T>(gw: &Gateway, work: impl std::future::Future<Output = T>) -> (T, u32, Duration) {
    tokio::pin!(work);
    let (mut answered, mut slowest) = (0, Duration::ZERO);
    loop {
        let started = tokio::time::Instant::now();
        tokio::select! {
            biased;
            outcome = &mut work => return (outcome, answered, slowest),
            (status, _) = gw.get("/healthz") => {
                assert_eq!(status, 200);
                answered += 1;
                slowest = slowest.max(started.elapsed());
            }
        }
    }
}

// The default runtime: one thread. Were the keys parsed on it, `/healthz`
// could not answer until they were.
#[tokio::test]
async fn healthz_answers_while_100000_keys_are_reloaded() {
    let d = dir("big");
    let up = start_upstream().await;
    let keys = d.join("keys.txt");
    std::fs::write(&keys, line("alice", "alice-key")).unwrap();
    let gw = Gateway::from_file(&keyed_file(&d, &up, &keys), false).await;
    let many: String = (0..100_000).map(|i| line(&format!("k{i}"), &format!("key-{i}"))).collect();
    std::fs::write(&keys, many).unwrap();

    let (outcome, answered, slowest) = healthz_during(&gw, gw.reload()).await;
    let report = outcome.expect("100,000 keys are a valid file");
    assert!(report.needs_restart.is_empty(), "{report}");
    eprintln!("/healthz answered {answered} times during the reload, the slowest in {slowest:?}");
    assert!(answered > 0, "/healthz waited for the reload");
    assert!(slowest < Duration::from_secs(1), "/healthz took {slowest:?} during the reload");
    assert_eq!(call_with(&gw, "key-99999").await, 200);
    assert_eq!(call_with(&gw, "alice-key").await, 401);
    gw.stop().await;
}

#[tokio::test]
async fn a_key_file_that_is_not_a_regular_file_or_too_large_is_refused_and_the_old_one_serves() {
    let d = dir("kinds");
    let up = start_upstream().await;
    // As Kubernetes mounts a secret: the configured path is a symlink.
    let (keys, real) = (d.join("keys.txt"), d.join("real-keys.txt"));
    std::fs::write(&real, line("alice", "alice-key")).unwrap();
    std::os::unix::fs::symlink(&real, &keys).unwrap();
    let file = keyed_file(&d, &up, &keys);
    let gw = Gateway::from_file(&file, false).await;
    assert_eq!(call_with(&gw, "alice-key").await, 200);

    let big = d.join("big-keys.txt");
    // Sparse: over the cap without writing 32 MiB.
    std::fs::File::create(&big).unwrap().set_len((32 << 20) + 1).unwrap();
    let cases: [(&str, Make); 4] = [
        ("a FIFO", &mkfifo),
        ("a device", &|p| std::os::unix::fs::symlink("/dev/zero", p).unwrap()),
        ("a directory", &|p| std::fs::create_dir(p).unwrap()),
        ("larger than 33554432 bytes", &|p| std::os::unix::fs::symlink(&big, p).unwrap()),
    ];
    for (n, (why, make)) in cases.iter().enumerate() {
        clear(&keys);
        make(&keys);
        let reload = tokio::time::timeout(Duration::from_secs(10), gw.reload()).await;
        let err = reload.expect("the reload does not hang").expect_err(why);
        assert!(err.contains("auth.keys: keys_file") && err.contains(why), "{why}: {err}");
        assert_eq!(call_with(&gw, "alice-key").await, 200, "the old keys serve after {why}");
        assert_eq!(gw.metric(&format!("{RELOADS}{{outcome=\"rejected\"}}")).await, n as f64 + 1.0);
    }

    // A symlink to a regular file again: applied.
    clear(&keys);
    std::fs::write(&real, line("bob", "bob-key")).unwrap();
    std::os::unix::fs::symlink(&real, &keys).unwrap();
    gw.reload().await.expect("a symlink to a regular file is read");
    assert_eq!(call_with(&gw, "bob-key").await, 200);
    assert_eq!(call_with(&gw, "alice-key").await, 401);
    gw.stop().await;

    // The same checks at start.
    clear(&keys);
    mkfifo(&keys);
    let listen = Some("127.0.0.1:0".parse().unwrap());
    let source = sessionless::reload::Source { path: file, listen, watch: false };
    let started = tokio::time::timeout(Duration::from_secs(10), sessionless::run_from(source)).await;
    let err = started.expect("the start does not hang").err().expect("a FIFO stops the start");
    assert!(err.contains("auth.keys: keys_file") && err.contains("a FIFO"), "{err}");
}
