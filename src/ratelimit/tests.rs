use std::time::Duration;

use governor::clock::FakeRelativeClock;
use prometheus_client::registry::Registry;

use super::*;
use crate::config::Config;

/// A route with `keys` (e.g. `rate_limit = { per_minute = 6, burst = 3 }`).
fn route(keys: &str) -> Arc<Route> {
    let text = format!(
        "[[upstreams]]\nname = \"u\"\nurl = \"http://127.0.0.1:1/mcp\"\n\
         [[routes]]\npath = \"/mcp\"\nupstream = \"u\"\n{keys}\n"
    );
    Config::from_toml(&text).expect("valid").routes[0].clone()
}

fn limits(keys: &str, max_keys: usize) -> (RateLimits<FakeRelativeClock>, FakeRelativeClock, Metrics) {
    let metrics = Metrics::register(&mut Registry::default());
    let clock = FakeRelativeClock::default();
    (RateLimits::with_clock(&route(keys), max_keys, &metrics, clock.clone()), clock, metrics)
}

fn refused(metrics: &Metrics, kind: Kind) -> u64 {
    metrics.rate_limited.get_or_create(&RateLimitLabels { route: "/mcp".into(), limit: kind.label() }).get()
}

#[test]
fn a_burst_passes_and_the_next_request_waits_one_interval() {
    // 6 a minute: one every 10 s, 3 at once.
    let (l, clock, metrics) = limits("rate_limit = { per_minute = 6, burst = 3 }", 100);
    for i in 0..3 {
        assert_eq!(l.check("alice", None), Ok(()), "request {i} of the burst");
    }
    let no = l.check("alice", None).unwrap_err();
    assert_eq!(
        (no.kind, no.retry_after, no.retry_after_secs()),
        (Kind::Principal, Duration::from_secs(10), 10)
    );
    assert_eq!(refused(&metrics, Kind::Principal), 1);

    // Rounded up: 1 ms short of the interval still says one second.
    clock.advance(Duration::from_millis(9_999));
    let no = l.check("alice", None).unwrap_err();
    assert_eq!((no.retry_after, no.retry_after_secs()), (Duration::from_millis(1), 1));
    clock.advance(Duration::from_millis(1));
    assert_eq!(l.check("alice", None), Ok(()), "one more after 10 s");
    assert!(l.check("alice", None).is_err(), "and only one");

    // Another principal has an allowance of its own.
    for _ in 0..3 {
        assert_eq!(l.check("bob", None), Ok(()));
    }
    assert!(l.check("bob", None).is_err());
    assert_eq!(refused(&metrics, Kind::Principal), 4);
}

#[test]
fn burst_defaults_to_a_minute_of_requests() {
    let (l, _clock, _) = limits("rate_limit = { per_minute = 5 }", 100);
    assert!((0..5).all(|_| l.check("a", None).is_ok()));
    assert_eq!(l.check("a", None).unwrap_err().retry_after, Duration::from_secs(12));
}

#[test]
fn a_tool_limit_counts_only_that_tool_and_the_route_limit_counts_all() {
    let keys = "rate_limit = { per_minute = 60, burst = 5 }\n\
                tool_rate_limits = { slow = { per_minute = 10, burst = 2 } }";
    let (l, clock, metrics) = limits(keys, 100);
    assert_eq!(l.check("a", Some("slow")), Ok(()));
    assert_eq!(l.check("a", Some("slow")), Ok(()));
    let no = l.check("a", Some("slow")).unwrap_err();
    assert_eq!((no.kind, no.retry_after_secs()), (Kind::Tool, 6));
    // Other tools and other methods go on, on the route's allowance of 5
    // (the refused call was stopped by the tool's limit and spent none of it).
    assert_eq!(l.check("a", Some("fast")), Ok(()));
    assert_eq!(l.check("a", None), Ok(()));
    assert_eq!(l.check("a", None), Ok(()));
    let no = l.check("a", None).unwrap_err();
    assert_eq!((no.kind, no.retry_after_secs()), (Kind::Principal, 1));
    // A tool call needs the route's allowance too.
    assert_eq!(l.check("a", Some("fast")).unwrap_err().kind, Kind::Principal);
    assert_eq!((refused(&metrics, Kind::Tool), refused(&metrics, Kind::Principal)), (1, 2));
    clock.advance(Duration::from_secs(6));
    assert_eq!(l.check("a", Some("slow")), Ok(()), "both allowances are back");
}

#[test]
fn principals_beyond_the_cap_share_one_allowance_until_a_sweep_makes_room() {
    let (l, clock, metrics) = limits("rate_limit = { per_minute = 60, burst = 2 }", 2);
    assert_eq!(l.check("a", None), Ok(()));
    assert_eq!(l.check("b", None), Ok(()));
    // Two tracked: c and d are newcomers sharing one allowance of 2.
    assert_eq!(l.check("c", None), Ok(()));
    assert_eq!(l.check("d", None), Ok(()));
    let no = l.check("e", None).unwrap_err();
    assert_eq!(no.kind, Kind::Overflow);
    assert_eq!(refused(&metrics, Kind::Overflow), 1);
    // The tracked ones keep their own allowance, untouched by the flood.
    assert_eq!(l.check("a", None), Ok(()));
    assert_eq!(l.check("a", None).unwrap_err().kind, Kind::Principal);

    // Once a's and b's allowances are whole again, the sweep forgets them.
    l.sweep();
    let keys = |m: &Metrics| {
        m.rate_limit_keys.get_or_create(&RateLimitLabels { route: "/mcp".into(), limit: "principal" }).get()
    };
    assert_eq!(keys(&metrics), 2, "nothing is whole yet");
    clock.advance(Duration::from_secs(3));
    l.sweep();
    assert_eq!(keys(&metrics), 0);
    assert_eq!(l.check("e", None), Ok(()), "e is tracked now");
    assert_eq!(l.check("e", None), Ok(()));
    assert_eq!(l.check("e", None).unwrap_err().kind, Kind::Principal);
}

#[test]
fn no_limits_configured_checks_nothing() {
    let (l, _, metrics) = limits("", 1);
    assert!(l.is_empty());
    assert!((0..1000).all(|i| l.check(&format!("p{i}"), Some("t")).is_ok()));
    assert_eq!(refused(&metrics, Kind::Overflow), 0);
}

#[test]
fn limits_are_checked_when_the_file_is_read() {
    let bad = |keys: &str| {
        let text = format!(
            "[[upstreams]]\nname = \"u\"\nurl = \"http://127.0.0.1:1/mcp\"\n\
             [[routes]]\npath = \"/mcp\"\nupstream = \"u\"\n{keys}\n"
        );
        Config::from_toml(&text).err().map(|e| e.0).unwrap_or_default()
    };
    assert!(bad("rate_limit = { per_minute = 0 }").contains("at least 1"));
    assert!(bad("rate_limit = { per_minute = 6, burst = 0 }").contains("line 7: "));
    assert!(bad("rate_limit = { per_minute = 6, bursts = 1 }").contains("bursts"));
    assert!(bad("tool_rate_limits = { t = { per_minute = 0 } }").contains("at least 1"));
    assert!(bad("tool_rate_limits = { t = { per_second = 1 } }").contains("per_second"));
    assert_eq!(bad("rate_limit = { per_minute = 6 }\ntool_rate_limits = { t = { per_minute = 1 } }"), "");
}
