use super::*;

const GOOD: &str = r#"
[server]
listen = "127.0.0.1:9999"

[[upstreams]]
name = "a"
url = "http://127.0.0.1:9000/mcp"

[[routes]]
path = "/mcp"
upstream = "a"
cache_scope = "public"
"#;

#[test]
fn a_small_file_is_fully_defaulted() {
    let c = Config::from_toml(GOOD).unwrap();
    assert_eq!(c.listen.port(), 9999);
    let r = c.route_for(None, "/mcp").unwrap();
    assert_eq!(r.cache_scope, CacheScope::Public);
    assert_eq!(r.upstream.protocol_version, "2025-11-25");
    assert_eq!(c.limits.max_body_bytes, 4 << 20);
    assert!(c.allowed_hosts.as_ref().unwrap().contains(&"localhost".to_string()));
}

#[test]
fn unknown_keys_are_rejected_with_a_line() {
    let bad = GOOD.replace("cache_scope = \"public\"", "cache_scop = 1");
    let err = Config::from_toml(&bad).unwrap_err().0;
    assert!(err.contains("cache_scop"), "{err}");
    assert!(err.contains("line"), "{err}");
}

#[test]
fn the_reserved_tool_prefix_key_is_gone() {
    let bad = GOOD.replace("cache_scope = \"public\"", "tool_prefix = \"a_\"");
    assert!(Config::from_toml(&bad).unwrap_err().0.contains("unknown field `tool_prefix`"));
}

const FEDERATED: &str = r#"
[[upstreams]]
name = "legacy"
url = "http://127.0.0.1:9000/mcp"

[[upstreams]]
name = "tsref"
urls = ["http://127.0.0.1:9001/mcp", "http://127.0.0.1:9002/mcp"]

[[routes]]
path = "/mcp"
members = ["legacy", "tsref"]
rate_limit = { per_minute = 60 }
replay_tools = ["tsref__slow"]
"#;

#[test]
fn a_federated_route_has_a_route_per_member() {
    let c = Config::from_toml(FEDERATED).unwrap();
    let r = c.route_for(None, "/mcp").unwrap();
    assert!(r.federated());
    let members: Vec<(&str, &str, usize)> = r
        .members
        .iter()
        .map(|m| (m.name.as_str(), m.route.id.as_str(), m.route.upstream.urls.len()))
        .collect();
    assert_eq!(members, [("legacy", "/mcp#legacy", 1), ("tsref", "/mcp#tsref", 2)]);
    let tsref = &r.members[1].route;
    assert_eq!(tsref.member_of.as_deref(), Some("/mcp"));
    assert!(tsref.rate_limit.is_none(), "limits stay on the federated route");
    assert_eq!(tsref.replay_tools, ["slow"], "replay tools by the member's own names");
    assert!(!tsref.federated());
    let table = check::routing_table(&c.routes);
    assert!(table.contains("member legacy") && table.contains("member tsref"), "{table}");
}

#[test]
fn member_names_and_duplicates_are_refused_naming_the_line() {
    let bad = FEDERATED.replace("name = \"tsref\"", "name = \"TS.ref\"").replace("\"tsref\"]", "\"TS.ref\"]");
    let err = Config::from_toml(&bad).unwrap_err().0;
    assert!(err.contains("^[a-z][a-z0-9-]{0,15}$") && err.starts_with("line "), "{err}");

    let twice = FEDERATED.replace("name = \"tsref\"", "name = \"legacy\"");
    let err = Config::from_toml(&twice).unwrap_err().0;
    assert!(err.starts_with("line 7:") && err.contains("duplicate upstream name `legacy`"), "{err}");

    let both = FEDERATED.replace("members = [", "upstream = \"legacy\"\nmembers = [");
    assert!(Config::from_toml(&both).unwrap_err().0.contains("either `upstream` or `members`"));
    let none = FEDERATED.replace("members = [\"legacy\", \"tsref\"]", "members = []");
    assert!(Config::from_toml(&none).unwrap_err().0.contains("at least one"));
    let repeated = FEDERATED.replace("[\"legacy\", \"tsref\"]", "[\"legacy\", \"legacy\"]");
    assert!(Config::from_toml(&repeated).unwrap_err().0.contains("listed twice"));
}

#[test]
fn semantic_errors_name_the_line() {
    let bad = GOOD.replace("upstream = \"a\"", "upstream = \"zzz\"");
    let err = Config::from_toml(&bad).unwrap_err().0;
    assert!(err.starts_with("line 11:"), "{err}");
    let bad = GOOD.replace("http://127", "ftp://127");
    assert!(Config::from_toml(&bad).is_err());
}

#[test]
fn keys_come_from_the_environment_never_inline() {
    std::env::set_var("SESSIONLESS_TEST_KEY_1", "A".repeat(43));
    let ok = format!("{GOOD}\n[[keys]]\nid = \"k1\"\nenv = \"SESSIONLESS_TEST_KEY_1\"\n");
    let c = Config::from_toml(&ok).unwrap();
    assert_eq!(c.keys[0].id, "k1");
    assert!(!format!("{:?}", c.keys[0]).contains("AAAA"));
    let inline = format!("{GOOD}\n[[keys]]\nid = \"k1\"\nvalue = \"abc\"\n");
    assert!(Config::from_toml(&inline).is_err());
}

#[test]
fn the_shipped_examples_are_valid() {
    std::env::set_var("SESSIONLESS_KEY_2026_11", "A".repeat(43));
    std::env::set_var("SESSIONLESS_CLUSTER_SECRET", "an example secret of enough bytes");
    std::env::set_var("SESSIONLESS_INSTANCE_ID", "example");
    std::env::set_var("SESSIONLESS_ADVERTISE_ADDR", "10.0.0.5:8081");
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    let mut n = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            Config::from_file(&path).unwrap_or_else(|e| panic!("{e}"));
            n += 1;
        }
    }
    assert!(n >= 2);
}

#[test]
fn cluster_mode_needs_shared_keys_and_a_secret_from_outside_the_file() {
    std::env::set_var("SESSIONLESS_TEST_KEY_2", "A".repeat(43));
    std::env::set_var("SESSIONLESS_TEST_CLUSTER_SECRET", "0123456789abcdef0123");
    let cluster = "\n[cluster]\ninstance_id = \"gw-a\"\ninternal_listen = \"127.0.0.1:9101\"\nsecret_env = \"SESSIONLESS_TEST_CLUSTER_SECRET\"\n";
    let no_keys = format!("{GOOD}{cluster}");
    assert!(Config::from_toml(&no_keys).unwrap_err().0.contains("[[keys]]"));
    let keys = "\n[[keys]]\nid = \"k\"\nenv = \"SESSIONLESS_TEST_KEY_2\"\n";
    let ok = format!("{GOOD}{cluster}{keys}");
    let c = Config::from_toml(&ok).unwrap().cluster.unwrap();
    assert_eq!(c.instance_id, "gw-a");
    assert_eq!(c.advertise, "127.0.0.1:9101");
    assert!(!format!("{c:?}").contains("0123456789"));
    let inline = ok.replace("secret_env = \"SESSIONLESS_TEST_CLUSTER_SECRET\"", "secret = \"x\"");
    assert!(Config::from_toml(&inline).is_err());
}

#[test]
fn replay_mode_per_route_or_per_tool() {
    let r = GOOD.replace("cache_scope = \"public\"", "continuity = \"replay\"");
    let c = Config::from_toml(&r).unwrap();
    assert!(c.routes[0].replays(Some("any")));
    let t = GOOD.replace("cache_scope = \"public\"", "replay_tools = [\"search\"]");
    let c = Config::from_toml(&t).unwrap();
    assert!(c.routes[0].replays(Some("search")));
    assert!(!c.routes[0].replays(Some("buy")));
    assert!(!c.routes[0].replays(None));
}

#[test]
fn cluster_tls_is_all_three_files_or_none_and_says_which_are_missing() {
    std::env::set_var("SESSIONLESS_TEST_KEY_3", "A".repeat(43));
    std::env::set_var("SESSIONLESS_TEST_CLUSTER_SECRET_3", "0123456789abcdef0123");
    let base = format!(
        "{GOOD}\n[[keys]]\nid = \"k\"\nenv = \"SESSIONLESS_TEST_KEY_3\"\n\n[cluster]\ninstance_id = \"gw-a\"\n\
         internal_listen = \"127.0.0.1:9101\"\nsecret_env = \"SESSIONLESS_TEST_CLUSTER_SECRET_3\"\n"
    );
    assert!(Config::from_toml(&base).unwrap().cluster.unwrap().tls.is_none());
    let only_cert = format!("{base}tls_cert_file = \"/x/cert.pem\"\n");
    let err = Config::from_toml(&only_cert).unwrap_err().0;
    assert!(err.contains("missing: tls_key_file, tls_ca_file"), "{err}");
    assert!(err.starts_with("line "), "{err}");
    let only_name = format!("{base}tls_server_name = \"gw\"\n");
    let err = Config::from_toml(&only_name).unwrap_err().0;
    assert!(err.contains("missing: tls_cert_file, tls_key_file, tls_ca_file"), "{err}");
    let all = format!(
        "{base}tls_cert_file = \"/x/cert.pem\"\ntls_key_file = \"/x/key.pem\"\ntls_ca_file = \"/x/ca.pem\"\n"
    );
    let err = Config::from_toml(&all).unwrap_err().0;
    assert!(err.contains("tls_cert_file /x/cert.pem"), "{err}");
    let err = Config::from_toml(&format!("{all}tls_server_name = \"not a name!\"\n")).unwrap_err().0;
    assert!(err.contains("cluster TLS: tls_server_name `not a name!`") && err.starts_with("line "), "{err}");
}

#[test]
fn several_cluster_secrets_rotate_and_each_must_be_long_enough() {
    std::env::set_var("SESSIONLESS_TEST_KEY_4", "A".repeat(43));
    let cluster = |secret: &str| {
        std::env::set_var("SESSIONLESS_TEST_CLUSTER_SECRETS_4", secret);
        Config::from_toml(&format!(
            "{GOOD}\n[[keys]]\nid = \"k\"\nenv = \"SESSIONLESS_TEST_KEY_4\"\n\n[cluster]\ninstance_id = \"gw-a\"\n\
             internal_listen = \"127.0.0.1:9101\"\nsecret_env = \"SESSIONLESS_TEST_CLUSTER_SECRETS_4\"\n"
        ))
    };
    let c = cluster("the new secret of 16+ bytes , the old secret of 16+ bytes\n").unwrap().cluster.unwrap();
    assert_eq!(
        c.secrets,
        vec![b"the new secret of 16+ bytes".to_vec(), b"the old secret of 16+ bytes".to_vec()]
    );
    assert!(!format!("{c:?}").contains("16+"), "redacted");
    assert!(cluster("the new secret of 16+ bytes,short").unwrap_err().0.contains("16 bytes"));
}

#[test]
fn abuse_limits_have_the_documented_defaults_and_are_checked() {
    let c = Config::from_toml(GOOD).unwrap();
    let k = &c.connections;
    assert_eq!(k.header_read_timeout, Duration::from_secs(10));
    assert_eq!(k.body_timeout, Duration::from_secs(30));
    assert_eq!(k.body_idle_timeout, Duration::from_secs(10));
    assert_eq!(k.client_idle_timeout, Duration::from_secs(60));
    assert_eq!(k.answer_stall_timeout, Duration::from_secs(60));
    assert_eq!(k.max_connections, 4096);
    assert_eq!(k.max_header_bytes, 64 * 1024);
    assert_eq!((k.h2_max_concurrent_streams, k.h2_max_body_bytes_in_flight), (100, 1 << 20));
    assert_eq!(c.limits.max_buffered_body_bytes, 256 << 20);
    assert_eq!(c.limits.max_parked_flows_per_principal, 100);
    assert_eq!(c.limits.max_sessions_per_principal, 32);
    let slow_sse = format!("{GOOD}\n").replace("[server]\n", "[server]\nkeepalive_interval_ms = 45000\n");
    let c = Config::from_toml(&slow_sse).unwrap();
    assert_eq!(c.connections.answer_stall_timeout, Duration::from_secs(90), "two keep-alive intervals");
    let small_budget = format!("{GOOD}\n[limits]\nmax_buffered_body_bytes = 1024\n");
    let err = Config::from_toml(&small_budget).unwrap_err().0;
    assert!(err.contains("max_buffered_body_bytes") && err.contains("line"), "{err}");
    let tiny_head = GOOD.replace("[server]\n", "[server]\nmax_header_bytes = 100\n");
    assert!(Config::from_toml(&tiny_head).unwrap_err().0.contains("max_header_bytes"));
}

/// `GOOD` with `extra` appended to its upstream's table.
fn upstream_with(extra: &str) -> String {
    GOOD.replace(
        "url = \"http://127.0.0.1:9000/mcp\"\n",
        &format!("url = \"http://127.0.0.1:9000/mcp\"\n{extra}\n"),
    )
}

#[test]
fn upstream_header_values_are_never_inline_and_never_repeated() {
    let inline = upstream_with("headers = { X-Api-Key = \"sk-live-very-secret\" }");
    let err = Config::from_toml(&inline).unwrap_err().0;
    assert!(err.contains("value_env") && err.contains("X-Api-Key") && err.contains("line"), "{err}");
    assert!(!err.contains("sk-live-very-secret"), "{err}");
    let unknown = upstream_with("headers = { X-Api-Key = { value = \"sk-live-very-secret\" } }");
    assert!(!Config::from_toml(&unknown).unwrap_err().0.contains("sk-live"));
    for name in ["Host", "Content-Length", "Connection", "Mcp-Session-Id", "Transfer-Encoding", "bad name"] {
        let bad = upstream_with(&format!("headers = {{ \"{name}\" = {{ value_env = \"K\" }} }}"));
        assert!(Config::from_toml(&bad).is_err(), "{name}");
    }
    let both = upstream_with("headers = { X-Api-Key = { value_env = \"K\", value_file = \"f\" } }");
    assert!(Config::from_toml(&both).is_err());
    // A value that is not there: listed by `check-config`, an error for the gateway.
    let good = upstream_with("headers = { X-Api-Key = { value_env = \"SESSIONLESS_UNSET_FOR_TEST\" } }");
    let checked = super::check::Checked::from_toml(&good).unwrap();
    assert_eq!(checked.routes()[0].upstream.headers[0].name, "x-api-key");
    assert!(checked.needs().iter().any(|n| n.what.contains("x-api-key") && n.missing.is_some()));
    let err = Config::from_toml(&good).unwrap_err().0;
    assert!(err.contains("SESSIONLESS_UNSET_FOR_TEST is not set"), "{err}");
}

#[test]
fn forwarding_the_client_token_needs_a_jwt_route_of_the_upstreams_audience() {
    let policy =
        "\n[auth.users]\ntype = \"jwt\"\nissuer = \"https://idp\"\naudience = \"https://api.test\"\n\
                  hs256_secret_env = \"S\"\n";
    let fwd = |aud: &str, auth: &str| {
        upstream_with(&format!("forward_authorization = true\naudience = \"{aud}\""))
            .replace("cache_scope = \"public\"", auth)
            + policy
    };
    // Checked as `check-config` does: the policy's HS256 secret is not in this environment.
    let check = |text: &str| super::check::Checked::from_toml(text).map(|_| ());
    assert!(check(&fwd("https://api.test", "auth = \"users\"")).is_ok());
    let err = check(&fwd("https://other.test", "auth = \"users\"")).unwrap_err().0;
    assert!(err.contains("audience"), "{err}");
    assert!(check(&fwd("https://api.test", "")).is_err(), "a route without a policy");
    let no_aud = upstream_with("forward_authorization = true");
    assert!(Config::from_toml(&no_aud).unwrap_err().0.contains("audience"));
}

#[test]
fn cors_origins_are_bare_and_a_wildcard_goes_without_credentials() {
    let with = |cors: &str| format!("{GOOD}\n[server.cors]\n{cors}\n");
    let c = Config::from_toml(&with("allowed_origins = [\"https://app.example\"]")).unwrap();
    assert!(c.routes[0].cors.as_ref().unwrap().allows("https://app.example"));
    assert!(Config::from_toml(&with("allowed_origins = [\"*\"]")).is_ok());
    assert!(Config::from_toml(&with("allowed_origins = [\"*\"]\nallow_credentials = true")).is_err());
    assert!(Config::from_toml(&with("allowed_origins = [\"https://app.example/path\"]")).is_err());
    assert!(Config::from_toml(&with("allowed_origins = []")).is_err());
    assert!(Config::from_toml(GOOD).unwrap().routes[0].cors.is_none(), "off by default");
}

#[test]
fn every_file_the_config_names_must_be_a_regular_file_and_errors_name_its_key() {
    let dir = std::env::temp_dir().join(format!("sessionless-unit-config-files-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (fifo, d) = (dir.join("fifo"), dir.display());
    let _ = std::fs::remove_file(&fifo);
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let cases = [
        (format!("{GOOD}\n[[keys]]\nid = \"k1\"\nfile = \"{d}\"\n"), "sealing key `k1`", "a directory"),
        (
            upstream_with("headers = { X-Api-Key = { value_file = \"/dev/zero\" } }"),
            "header `X-Api-Key`",
            "a device",
        ),
        (
            format!(
                "{GOOD}auth = \"users\"\n\n[auth.users]\ntype = \"jwt\"\nissuer = \"https://idp\"\n\
                 audience = \"https://api.test\"\njwks_file = \"{}\"\n",
                fifo.display()
            ),
            "auth.users: jwks_file",
            "a FIFO",
        ),
        (
            GOOD.replace(
                "9999\"\n",
                &format!("9999\"\n\n[server.tls]\ncert_file = \"{d}\"\nkey_file = \"{d}\"\n"),
            ),
            "server.tls: cert_file",
            "a directory",
        ),
    ];
    for (text, key, why) in cases {
        let err = Config::from_toml(&text).unwrap_err().0;
        assert!(err.contains(key) && err.contains(&format!("not a regular file ({why})")), "{err}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn configured_origins_are_bare_origins() {
    assert!(super::valid_origin("https://app.example"));
    assert!(super::valid_origin("http://localhost:5173"));
    for bad in ["app.example", "https://app.example/", "https://a.example/path", "ftp://x", "https://"] {
        assert!(!super::valid_origin(bad), "{bad}");
    }
}

#[test]
fn reserved_paths_are_refused_by_name() {
    for path in RESERVED_PATHS {
        let bad = GOOD.replace("path = \"/mcp\"", &format!("path = \"{path}\""));
        let err = Config::from_toml(&bad).unwrap_err().0;
        assert!(err.contains(&format!("route path `{path}` is the gateway's own")), "{err}");
        assert!(err.contains("/status") && err.contains("choose another path"), "{err}");
        assert!(err.starts_with("line 10: "), "{err}");
    }
    let err = Config::from_toml(&GOOD.replace("path = \"/mcp\"", "path = \"mcp\"")).unwrap_err().0;
    assert!(err.contains("a path starts with `/`"), "{err}");
    // Only the exact paths are the gateway's.
    assert!(Config::from_toml(&GOOD.replace("path = \"/mcp\"", "path = \"/status/mcp\"")).is_ok());
}

#[test]
fn status_allowed_defaults_to_loopback_and_takes_addresses_and_ranges() {
    let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
    let c = Config::from_toml(GOOD).unwrap();
    assert!(c.status_allowed.iter().any(|r| r.contains(ip("127.0.0.1"))));
    assert!(c.status_allowed.iter().any(|r| r.contains(ip("::1"))));
    assert!(!c.status_allowed.iter().any(|r| r.contains(ip("10.0.0.1"))));
    assert_eq!(c.ops_hosts, None, "allowed_hosts unset");
    let set = GOOD.replace(
        "listen = \"127.0.0.1:9999\"",
        "listen = \"127.0.0.1:9999\"\nstatus_allowed = [\"10.0.0.0/8\", \"192.168.1.7\"]\nallowed_hosts = [\"gw.example\"]",
    );
    let c = Config::from_toml(&set).unwrap();
    assert!(c.status_allowed.iter().any(|r| r.contains(ip("10.9.8.7"))));
    assert!(c.status_allowed.iter().any(|r| r.contains(ip("192.168.1.7"))));
    assert!(!c.status_allowed.iter().any(|r| r.contains(ip("127.0.0.1"))), "the list replaces the default");
    assert_eq!(c.ops_hosts, Some(vec!["gw.example".to_string()]));
    let none =
        GOOD.replace("listen = \"127.0.0.1:9999\"", "listen = \"127.0.0.1:9999\"\nstatus_allowed = []");
    assert!(Config::from_toml(&none).unwrap().status_allowed.is_empty(), "[]: nobody");
    let bad = GOOD.replace(
        "listen = \"127.0.0.1:9999\"",
        "listen = \"127.0.0.1:9999\"\nstatus_allowed = [\"10.0.0.1/8\"]",
    );
    let err = Config::from_toml(&bad).unwrap_err().0;
    assert!(err.contains("line 4: status_allowed: `10.0.0.1/8` has host bits set"), "{err}");
}
