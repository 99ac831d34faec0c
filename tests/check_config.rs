//! `sessionless check-config` as an operator runs it: offline, with none of
//! the secrets a config names, on every example config; errors name the line.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn check_config(file: &Path, env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sessionless"))
        .arg("check-config")
        .arg(file)
        .env_clear()
        .envs(env.iter().copied())
        .output()
        .expect("the binary runs")
}

fn examples() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("docker/compose.toml"));
    files.sort();
    files
}

fn temp_file(name: &str, text: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("sessionless-check-{}-{name}", std::process::id()));
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn every_example_passes_with_an_empty_environment() {
    let files = examples();
    assert!(files.len() >= 4, "{files:?}");
    for file in files {
        let out = check_config(&file, &[]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{}: {stderr}", file.display());
        assert!(stdout.contains(": ok"), "{stdout}");
        assert!(stdout.contains("route") && stdout.contains("upstream"), "{stdout}");
    }
}

#[test]
fn the_cluster_example_lists_what_it_needs_without_values() {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/cluster.toml");
    let out = check_config(&file, &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // The routing table: path, upstream, its URL, generation, continuity, auth, rules.
    let row = stdout.lines().find(|l| l.starts_with("*     /mcp")).unwrap_or_else(|| panic!("{stdout}"));
    for cell in ["tools", "http://127.0.0.1:9000/mcp", "auto", "park (replay: search)", "none", "0"] {
        assert!(row.contains(cell), "{cell} in {row}");
    }
    assert!(stdout.contains("$SESSIONLESS_KEY_2026_11  sealing key `2026-11`: ABSENT"), "{stdout}");
    assert!(stdout.contains("$SESSIONLESS_CLUSTER_SECRET  cluster secret: ABSENT"), "{stdout}");
    assert!(stdout.contains("$SESSIONLESS_ADVERTISE_ADDR"), "{stdout}");

    // Present: marked so, checked, never printed.
    let key = "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVphYmNkZWY";
    let secret = "a cluster secret of enough bytes";
    let env = [
        ("SESSIONLESS_KEY_2026_11", key),
        ("SESSIONLESS_CLUSTER_SECRET", secret),
        ("SESSIONLESS_ADVERTISE_ADDR", "10.0.0.5:8081"),
        ("HOSTNAME", "gw-a"),
    ];
    let out = check_config(&file, &env);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("sealing key `2026-11`: present"), "{stdout}");
    assert!(stdout.contains("cluster secret: present"), "{stdout}");
    assert!(!stdout.contains(key) && !stdout.contains(secret), "{stdout}");

    // Present but unusable: the check fails, still without the value.
    let short = "short";
    let out = check_config(&file, &[("SESSIONLESS_CLUSTER_SECRET", short)]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("at least 16 bytes") && !stderr.contains("short\""), "{stderr}");
}

#[test]
fn auth_files_are_listed_and_not_needed() {
    let text = r#"
[[upstreams]]
name = "a"
url = "http://127.0.0.1:9000/mcp"

[auth.machines]
type = "api_key"
keys_file = "/nonexistent/keys.txt"

[auth.users]
type = "jwt"
issuer = "https://idp.example.com"
audience = "https://gw.example.com/mcp"
jwks_file = "/nonexistent/jwks.json"

[auth.hs]
type = "jwt"
issuer = "https://idp.example.com"
audience = "gw"
hs256_secret_env = "HS_SECRET"

[[routes]]
path = "/mcp"
upstream = "a"
auth = "machines"

[[routes]]
path = "/users"
upstream = "a"
auth = "users"
"#;
    let file = temp_file("auth.toml", text);
    let out = check_config(&file, &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("/nonexistent/keys.txt  auth.machines API key file: ABSENT"), "{stdout}");
    assert!(stdout.contains("/nonexistent/jwks.json  auth.users JWKS file: ABSENT"), "{stdout}");
    assert!(stdout.contains("$HS_SECRET  auth.hs HS256 secret: ABSENT"), "{stdout}");
    assert!(stdout.lines().any(|l| l.contains(" /users ") && l.contains("users (jwt)")), "{stdout}");
    std::fs::remove_file(file).unwrap();
}

#[test]
fn the_gateway_still_fails_fast_without_its_secrets() {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/cluster.toml");
    let run = |env: &[(&str, &str)]| {
        let out = Command::new(env!("CARGO_BIN_EXE_sessionless"))
            .arg("--config")
            .arg(&file)
            .env_clear()
            .envs(env.iter().copied())
            .env("SESSIONLESS_LOG", "error")
            .output()
            .expect("the binary runs");
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let mut env = vec![("HOSTNAME", "gw-a"), ("SESSIONLESS_ADVERTISE_ADDR", "10.0.0.5:8081")];
    let stderr = run(&env);
    assert!(stderr.contains("SESSIONLESS_CLUSTER_SECRET is not set"), "{stderr}");
    env.push(("SESSIONLESS_CLUSTER_SECRET", "a cluster secret of enough bytes"));
    let stderr = run(&env);
    assert!(stderr.contains("SESSIONLESS_KEY_2026_11 is not set"), "{stderr}");
    assert!(!stderr.contains("a cluster secret of enough bytes"), "{stderr}");
}

#[test]
fn a_syntax_error_names_the_line() {
    let file =
        temp_file("syntax.toml", "[server]\nlisten = \"127.0.0.1:8080\"\n\n[[routes]\npath = \"/mcp\"\n");
    let out = check_config(&file, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("line 4"), "{stderr}");
    std::fs::remove_file(file).unwrap();
}

#[test]
fn what_the_gateway_builds_from_its_files_is_checked_offline_too() {
    let dir = std::env::temp_dir().join(format!("sessionless-check-built-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let write = |name: &str, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    };
    // A certificate and the key of another pair: both decode, the pair does not match.
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["gw.test".to_string()]).unwrap().self_signed(&key).unwrap();
    let (cert, other_key) = (
        write("cert.pem", &cert.pem()),
        write("other.pem", &rcgen::KeyPair::generate().unwrap().serialize_pem()),
    );
    let upstream = "[[upstreams]]\nname = \"a\"\nurl = \"http://127.0.0.1:9000/mcp\"\n\n";
    let tls = format!(
        "[server]\nlisten = \"127.0.0.1:8443\"\n[server.tls]\ncert_file = \"{cert}\"\nkey_file = \"{other_key}\"\n\n\
         {upstream}[[routes]]\npath = \"/mcp\"\nupstream = \"a\"\n"
    );
    let out = check_config(&temp_file("mismatch.toml", &tls), &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("server.tls: cert_file/key_file"), "{stderr}");
    // A JWKS holding only a symmetric key: none usable with RS256.
    let jwks = write("jwks.json", r#"{"keys":[{"kty":"oct","k":"c2VjcmV0","kid":"s"}]}"#);
    let jwt = format!(
        "{upstream}[auth.users]\ntype = \"jwt\"\nissuer = \"https://idp\"\naudience = \"gw\"\n\
         jwks_file = \"{jwks}\"\n\n[[routes]]\npath = \"/mcp\"\nupstream = \"a\"\nauth = \"users\"\n"
    );
    let out = check_config(&temp_file("jwks.toml", &jwt), &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("auth.users: jwks_file") && stderr.contains("no key usable"), "{stderr}");
    std::fs::remove_dir_all(&dir).ok();
}
