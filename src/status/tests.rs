use super::recent::upstream_failed;
use super::*;

fn accept(v: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(http::header::ACCEPT, v.parse().unwrap());
    h
}

#[test]
fn json_only_when_asked_for() {
    assert!(wants_json(&accept("application/json")));
    assert!(wants_json(&accept("text/plain, Application/JSON; q=0.5")));
    let browser = "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,*/*;q=0.8";
    assert!(!wants_json(&accept(browser)));
    assert!(!wants_json(&HeaderMap::new()));
    assert!(!wants_json(&accept("application/json-seq")));
}

#[test]
fn upstream_failures_are_not_the_clients_mistakes() {
    for failed in ["upstream_unreachable", "upstream_timeout", "circuit_open", "upstream_start_failed"] {
        assert!(upstream_failed(failed), "{failed}");
    }
    for not in
        ["ok", "forwarded", "cancelled", "invalid_params", "rate_limited", "upstream_error", "upstream_busy"]
    {
        assert!(!upstream_failed(not), "{not}");
    }
}

#[test]
fn reloads_count_generations_and_keep_the_last_outcome() {
    let r = Reloads::new();
    assert_eq!(r.now().generation, 1);
    assert!(r.now().last_reload.is_none());
    r.rejected("line 3: unknown upstream `x`");
    let now = r.now();
    assert_eq!((now.generation, now.reloads_rejected), (1, 1), "a rejected reload changes nothing");
    assert_eq!(now.last_reload.as_ref().unwrap().outcome, "rejected");
    r.applied(&Reloaded { added: vec!["/b".into()], ..Default::default() });
    let now = r.now();
    assert_eq!((now.generation, now.reloads_applied), (2, 1));
    let last = now.last_reload.unwrap();
    assert_eq!(last.outcome, "applied");
    assert!(last.detail.contains("routes added: /b"), "{}", last.detail);
    r.rejected(&"x".repeat(10_000));
    assert_eq!(r.now().last_reload.unwrap().detail.len(), MAX_DETAIL);
}

#[test]
fn a_program_is_named_without_its_directory_or_arguments() {
    let argv = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(program_name(&argv(&["/usr/bin/python3", "-m", "server", "--token=secret"])), "python3");
    assert_eq!(program_name(&argv(&["npx"])), "npx");
    assert_eq!(program_name(&[]), "");
}
