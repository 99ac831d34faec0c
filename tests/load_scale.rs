//! Loading grows linearly: ten times the API keys, or ten times the
//! routes (validated, built into a routing table, and carried over by a
//! reload), cost about ten times as much, never a hundred (a duplicate
//! check or a lookup that scans everything loaded before). Measured as the
//! loading thread's CPU time, and compared as a ratio: an absolute time
//! would depend on the machine and the build.

use prometheus_client::registry::Registry;
use sessionless::auth::keys::{file_line, Keys};
use sessionless::live::{self, Live};
use sessionless::metrics::Metrics;
use sessionless::Config;
use tokio_util::sync::CancellationToken;

/// Ten times the items may cost at most this many times as much (a
/// quadratic load would cost a hundred).
const MOST: f64 = 30.0;

/// CPU time (user and system) this thread has used, in clock ticks.
fn cpu_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").expect("Linux /proc");
    let fields: Vec<&str> = stat[stat.rfind(')').expect("a command name") + 2..].split(' ').collect();
    // stat(5) fields 14 and 15 (utime, stime), counted from field 3 (state).
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// The CPU ticks of `load(input)`, its output dropped after.
fn cost<I: ?Sized, T>(input: &I, load: impl Fn(&I) -> T) -> u64 {
    let before = cpu_ticks();
    let out = load(input);
    let ticks = cpu_ticks() - before;
    drop(out);
    ticks
}

/// The ticks of `small` (the mean of five loads: a tick is 10 ms), of
/// `large`, and their ratio.
fn ratio<I: ?Sized, T>(small: &I, large: &I, load: impl Fn(&I) -> T) -> (f64, u64, f64) {
    let small = ((0..5).map(|_| cost(small, &load)).sum::<u64>() as f64 / 5.0).max(1.0);
    let large = cost(large, &load);
    (small, large, large as f64 / small)
}

fn key_file(n: usize) -> String {
    (0..n).map(|i| file_line(&format!("key-{i}"), &format!("secret-{i}")) + " ops,ci\n").collect()
}

#[test]
fn ten_times_the_keys_cost_about_ten_times_as_much() {
    let (small, large) = (key_file(10_000), key_file(100_000));
    let (a, b, r) = ratio(small.as_str(), large.as_str(), |text| Keys::parse(text).expect("valid"));
    eprintln!("keys: 10,000 in {a} ticks, 100,000 in {b} ticks ({r:.1}x)");
    assert!(r < MOST, "100,000 keys cost {r:.1} times what 10,000 do ({b} vs {a} ticks)");
}

/// `n` routes over ten upstreams; every other one names a host, so that
/// paths are served by two routes each.
fn routing_file(n: usize) -> String {
    let mut text = String::new();
    for u in 0..10 {
        text += &format!(
            "[[upstreams]]\nname = \"u{u}\"\nurl = \"http://127.0.0.1:9/u{u}\"\ngeneration = \"legacy\"\n\n"
        );
    }
    for i in 0..n {
        let host = if i % 2 == 1 { "host = \"a.example\"\n" } else { "" };
        text += &format!("[[routes]]\npath = \"/r{}\"\nupstream = \"u{}\"\n{host}\n", i / 2, i % 10);
    }
    text
}

/// What starting and then reloading with `text` costs: the file validated,
/// the first generation built, and the next one built from it.
fn start_and_reload(text: &str) -> (Live, Live) {
    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    let stop = CancellationToken::new();
    let first = Live::new(Config::from_toml(text).expect("valid"), &metrics, &stop).expect("builds");
    let next = Config::from_toml(text).expect("valid");
    let (next, report) = live::prepare(&first, next, &metrics, &stop).expect("builds");
    assert!(report.added.is_empty() && report.removed.is_empty() && report.changed.is_empty());
    let found = next.route(|| Some("a.example"), "/r7").expect("a route");
    assert_eq!(found.target.route.id, "a.example/r7");
    (first, next)
}

#[test]
fn ten_times_the_routes_cost_about_ten_times_as_much() {
    let (small, large) = (routing_file(2_000), routing_file(20_000));
    let (a, b, r) = ratio(small.as_str(), large.as_str(), start_and_reload);
    eprintln!("routes: 2,000 in {a} ticks, 20,000 in {b} ticks ({r:.1}x)");
    assert!(r < MOST, "20,000 routes cost {r:.1} times what 2,000 do ({b} vs {a} ticks)");
}
