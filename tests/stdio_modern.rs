//! A 2026-07-28 server over stdio (`generation = "modern"`, issue 24): the
//! real `mcp==2.3.0` everything-server (from the pinned sdist that
//! `scripts/setup-peers` unpacks) run with `transport="stdio"`. 2026
//! clients' calls are written to any process of the upstream's pool under
//! ids and progress tokens of the gateway's, and come back under their own;
//! an `input_required` round's retry is served by another replica's own
//! process (the server seals its state with a fixed key); a legacy client is
//! translated; `subscriptions/listen` is refused clearly.
//!
//! Needs the peers: `SESSIONLESS_PEERS` (default `.peers`). Without them
//! each test says so and passes, unless `SESSIONLESS_REQUIRE_PEERS=1`
//! (as `scripts/test` sets once the peers are installed).

mod support;

use std::path::PathBuf;

use serde_json::{json, Value};
use sessionless::Config;
use support::cluster::{ClusterEnv, Replica};
use support::legacy::Legacy;
use support::{Gateway, Reply};

const SPAWNS: &str = "sessionless_stdio_spawns_total";

/// The server's argv and working directory, or `None` (said why) without peers.
fn everything_server() -> Option<(Vec<String>, PathBuf)> {
    let root = std::env::var_os("SESSIONLESS_PEERS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".peers"));
    let python = root.join("py-modern/bin/python");
    let dir = root.join("sdist/mcp-2.3.0/examples/servers/everything-server");
    if !python.exists() || !dir.join("mcp_everything_server/server.py").exists() {
        let required = std::env::var("SESSIONLESS_REQUIRE_PEERS").is_ok_and(|v| v == "1");
        assert!(!required, "no peers in {} (run scripts/setup-peers)", root.display());
        eprintln!("SKIP: no peers in {} (run scripts/setup-peers)", root.display());
        return None;
    }
    let run = "from mcp_everything_server.server import mcp; mcp.run(transport='stdio')";
    let argv = vec![python.to_str().unwrap().to_string(), "-c".into(), run.into()];
    Some((argv, dir))
}

/// What makes the upstream the server as a modern stdio upstream, beside `command`.
fn modern_keys(dir: &std::path::Path) -> String {
    format!("cwd = {}\ngeneration = \"modern\"", serde_json::to_string(dir.to_str().unwrap()).unwrap())
}

async fn gateway(extra: &str) -> Option<Gateway> {
    let (argv, dir) = everything_server()?;
    let toml = format!(
        "[[upstreams]]\nname = \"everything\"\ncommand = {}\n{}\n{extra}\n\n[[routes]]\npath = \"/mcp\"\nupstream = \"everything\"\n",
        serde_json::to_string(&argv).unwrap(),
        modern_keys(&dir)
    );
    let config = Config::from_toml(&toml).unwrap_or_else(|e| panic!("test config: {e:?}\n{toml}"));
    Some(Gateway::with_config(config).await)
}

fn text_of(reply: &Reply) -> &str {
    reply.result()["content"][0]["text"].as_str().unwrap_or_else(|| panic!("a text result: {}", reply.raw))
}

fn call_params(tool: &str) -> Value {
    json!({"name": tool, "arguments": {}})
}

#[tokio::test]
async fn modern_clients_list_and_call_through_a_2026_server_over_stdio() {
    let Some(gw) = gateway("").await else { return };

    let discover = gw.request("server/discover").id(json!("d")).send().await;
    assert_eq!(discover.status, 200, "{}", discover.raw);
    assert!(discover.result()["supportedVersions"].to_string().contains("2026-07-28"), "{}", discover.raw);

    let list = gw.request("tools/list").id(json!("list")).send().await;
    assert_eq!(list.status, 200, "{}", list.raw);
    assert_eq!(list.body["id"], "list", "the client's id: {}", list.raw);
    let tools = list.result()["tools"].as_array().expect("tools");
    assert!(tools.iter().any(|t| t["name"] == "test_simple_text"), "{}", list.raw);

    let simple = gw.request("tools/call").id(json!(7)).params(call_params("test_simple_text")).send().await;
    assert_eq!(simple.body["id"], 7, "{}", simple.raw);
    assert!(text_of(&simple).contains("simple text"), "{}", simple.raw);

    // Progress under the client's own token (the process saw the gateway's).
    let progress = gw
        .request("tools/call")
        .id(json!("p"))
        .params(call_params("test_tool_with_progress"))
        .progress_token(json!("my-token"))
        .send()
        .await;
    assert_eq!(progress.body["id"], "p", "{}", progress.raw);
    let notes: Vec<&Value> =
        progress.notes.iter().filter(|n| n["method"] == "notifications/progress").collect();
    assert_eq!(notes.len(), 3, "its three progress notifications: {}", progress.raw);
    assert!(notes.iter().all(|n| n["params"]["progressToken"] == "my-token"), "{}", progress.raw);
    // The tool answers with the token it was given: the gateway's, not the client's.
    assert_ne!(text_of(&progress), "my-token", "{}", progress.raw);

    // Log lines name no request: they reach the call that asked (it had a
    // process to itself), and no other.
    let (logged, quiet) = tokio::join!(
        gw.request("tools/call")
            .id(json!("l"))
            .params(call_params("test_tool_with_logging"))
            .log_level("info")
            .send(),
        gw.request("tools/call").id(json!("q")).params(call_params("test_tool_with_logging")).send(),
    );
    let lines = |r: &Reply| r.notes.iter().filter(|n| n["method"] == "notifications/message").count();
    assert_eq!(lines(&logged), 3, "{}", logged.raw);
    assert_eq!(lines(&quiet), 0, "{}", quiet.raw);
    assert!(text_of(&quiet).contains("executed successfully"), "{}", quiet.raw);

    let error =
        gw.request("tools/call").id(json!("e")).params(call_params("test_error_handling")).send().await;
    assert_eq!(error.status, 200, "{}", error.raw);
    assert_eq!(error.result()["isError"], true, "{}", error.raw);

    // No listen stream over stdio: refused, clearly.
    let listen = gw
        .request("subscriptions/listen")
        .id(json!("s"))
        .params(json!({"notifications": {"toolsListChanged": true}}))
        .send()
        .await;
    listen.assert_error(404, -32601, &json!("s"));
    assert!(listen.raw.contains("stdio"), "{}", listen.raw);

    assert!(gw.metric(SPAWNS).await >= 1.0);
}

#[tokio::test]
async fn a_round_of_questions_is_retried_on_another_replica_and_its_process() {
    let Some((argv, dir)) = everything_server() else { return };
    let env = ClusterEnv::new("stdio-modern");
    let replica = |name: &str| env.replica(name, "unused").command(argv.clone()).upstream(&modern_keys(&dir));
    let a = Replica::start(&replica("gw-a")).await;
    let b = Replica::start(&replica("gw-b")).await;

    let tool = "test_input_required_result_request_state";
    let first = a
        .request("tools/call")
        .id(json!(1))
        .params(call_params(tool))
        .capabilities(json!({"elicitation": {}}))
        .send()
        .await;
    assert_eq!(first.status, 200, "{}", first.raw);
    let result = first.result();
    assert_eq!(result["resultType"], "input_required", "{}", first.raw);
    assert_eq!(result["inputRequests"]["confirm"]["method"], "elicitation/create", "{}", first.raw);
    let state = result["requestState"].as_str().expect("requestState");
    assert!(!state.starts_with("v1."), "the server's state travels sealed in the gateway's: {state}");

    let mut params = call_params(tool);
    params["requestState"] = json!(state);
    params["inputResponses"] = json!({"confirm": {"action": "accept", "content": {"ok": true}}});
    let retry = b
        .request("tools/call")
        .id(json!(2))
        .params(params)
        .capabilities(json!({"elicitation": {}}))
        .send()
        .await;
    assert_eq!(retry.status, 200, "{}", retry.raw);
    assert_eq!(retry.body["id"], 2, "{}", retry.raw);
    assert_eq!(text_of(&retry), "state-ok: confirmation received", "{}", retry.raw);

    // Nothing parked or forwarded: gw-b's own process served the retry.
    assert_eq!(a.metric("sessionless_parked_flows_open").await, 0.0);
    assert_eq!(b.metric_where(SPAWNS, "outcome=\"started\"").await, 1.0);
    assert_eq!(b.metric_where("sessionless_requests_total", "outcome=\"forwarded\"").await, 0.0);

    // A state changed by one byte is refused by the gateway, before any process.
    let mut tampered = state.to_string();
    let last = tampered.pop().unwrap();
    tampered.push(if last == 'A' { 'B' } else { 'A' });
    let mut params = call_params(tool);
    params["requestState"] = json!(tampered);
    params["inputResponses"] = json!({"confirm": {"action": "accept", "content": {"ok": true}}});
    let refused = b
        .request("tools/call")
        .id(json!(3))
        .params(params)
        .capabilities(json!({"elicitation": {}}))
        .send()
        .await;
    assert!(refused.error_code().is_some(), "{}", refused.raw);
}

#[tokio::test]
async fn a_legacy_client_is_translated_onto_a_2026_server_over_stdio() {
    let Some(gw) = gateway("").await else { return };
    let client = Legacy::new(&gw);
    let session = client.open().await;

    let list = client
        .post(Some(&session), json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}).to_string())
        .await;
    assert_eq!(list.status, 200, "{}", list.raw);
    assert!(list.raw.contains("test_simple_text"), "{}", list.raw);
    assert!(list.result().get("resultType").is_none(), "no 2026-only fields: {}", list.raw);

    let call = |id: Value, tool: &str| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": call_params(tool)}).to_string()
    };
    let simple = client.post(Some(&session), call(json!("s"), "test_simple_text")).await;
    assert_eq!(simple.body["id"], "s", "{}", simple.raw);
    assert!(simple.raw.contains("simple text"), "{}", simple.raw);

    // The server's question is pushed on the POST's stream; the answer goes
    // back as the retry, to any process.
    let mut events =
        client.stream(&session, call(json!("ask"), "test_input_required_result_request_state")).await;
    assert_eq!(events.status, 200);
    let question = events.next().await.expect("a question");
    assert_eq!(question["method"], "elicitation/create", "{question}");
    let answer = json!({"jsonrpc": "2.0", "id": question["id"], "result": {"action": "accept", "content": {"ok": true}}});
    let taken = client.post(Some(&session), answer.to_string()).await;
    assert_eq!(taken.status, 202, "{}", taken.raw);
    let done = events.next().await.expect("the result");
    assert_eq!(done["id"], "ask", "{done}");
    assert!(done.to_string().contains("state-ok: confirmation received"), "{done}");

    let get = client.verb(http::Method::GET, Some(&session)).await;
    assert_eq!(get.status(), 405, "no session stream over stdio");
}

#[tokio::test]
async fn concurrent_callers_with_one_id_and_one_token_each_get_their_own_progress() {
    let Some(gw) = gateway("max_processes = 2").await else { return };
    gw.request("tools/list").send().await;

    let calls = (0..4).map(|_| {
        gw.request("tools/call")
            .id(json!(7))
            .params(call_params("test_tool_with_progress"))
            .progress_token(json!("same"))
            .send()
    });
    let replies = futures_util::future::join_all(calls).await;

    let mut seen = Vec::new();
    for (i, reply) in replies.iter().enumerate() {
        assert_eq!(reply.body["id"], 7, "caller {i}: {}", reply.raw);
        let notes: Vec<&Value> =
            reply.notes.iter().filter(|n| n["method"] == "notifications/progress").collect();
        assert_eq!(notes.len(), 3, "caller {i}: exactly its own three: {}", reply.raw);
        assert!(notes.iter().all(|n| n["params"]["progressToken"] == "same"), "{}", reply.raw);
        seen.push(text_of(reply).to_string());
    }
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 4, "each call had a token of the gateway's own: {seen:?}");
    let started = gw.metric(SPAWNS).await;
    assert!((1.0..=2.0).contains(&started), "within max_processes: {started}");
}

#[tokio::test]
async fn check_config_probe_lists_the_tools_of_a_2026_server_over_stdio() {
    let Some((argv, dir)) = everything_server() else { return };
    let toml = format!(
        "[[upstreams]]\nname = \"everything\"\ncommand = {}\n{}\n\n[[routes]]\npath = \"/mcp\"\nupstream = \"everything\"\n",
        serde_json::to_string(&argv).unwrap(),
        modern_keys(&dir)
    );
    let config = Config::from_toml(&toml).unwrap();
    let probed = sessionless::probe_upstreams(&config).await.expect("probed");
    let found = &probed[0].found;
    assert!(found.starts_with("modern over stdio (2026-07-28)"), "{found}");
    assert!(found.contains("test_simple_text"), "{found}");
}
