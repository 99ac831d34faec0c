//! Authorization rules per route: a denied tool is absent from the lists
//! each cell passes on and refused on call (403), nothing sent upstream;
//! rules apply by key group, principal or scope, the first match deciding.

mod support;

use serde_json::{json, Value};
use sessionless::Config;
use support::legacy::Legacy;
use support::modern::ModernUpstream;
use support::{Answer, FakeUpstream, Gateway};

/// Keys alice (group ops) and bob; delete_* only for ops; secret resources for nobody.
fn config(upstream: &str, generation: &str, tag: &str) -> Config {
    let dir = std::env::temp_dir().join(format!("sessionless-authz-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let keys = format!(
        "{} ops\n{}\n",
        sessionless::auth::keys::file_line("alice", "alice-key"),
        sessionless::auth::keys::file_line("bob", "bob-key")
    );
    std::fs::write(dir.join("keys.txt"), keys).unwrap();
    let text = format!(
        r#"
[[upstreams]]
name = "u"
url = "{upstream}"
generation = "{generation}"

[auth.keys]
type = "api_key"
keys_file = "{dir}/keys.txt"

[[routes]]
path = "/mcp"
upstream = "u"
auth = "keys"

[[routes.rules]]
effect = "allow"
tools = ["delete_*"]
groups = ["ops"]

[[routes.rules]]
effect = "deny"
tools = ["delete_*"]
resources = ["file:///secret/*"]
"#,
        dir = dir.display()
    );
    Config::from_toml(&text).expect("valid config")
}

fn legacy_upstream() -> FakeUpstream {
    FakeUpstream::new()
        .on(
            "tools/list",
            Answer::Result(json!({"tools": [
            {"name": "echo", "inputSchema": {"type": "object"}},
            {"name": "delete_user", "inputSchema": {"type": "object"}}]})),
        )
        .on(
            "resources/list",
            Answer::Result(json!({"resources": [
            {"uri": "file:///public/a", "name": "a"}, {"uri": "file:///secret/b", "name": "b"}]})),
        )
        .on("tools/call", Answer::Result(json!({"content": [{"type": "text", "text": "done"}]})))
}

fn names(list: &Value, key: &str, field: &str) -> Vec<String> {
    list[key].as_array().unwrap().iter().map(|t| t[field].as_str().unwrap().to_string()).collect()
}

#[tokio::test]
async fn modern_clients_see_and_call_only_what_they_may() {
    let up = legacy_upstream().start().await;
    let gw = Gateway::with_config(config(up.url(), "legacy", "modern")).await;
    let list = |key: &str| gw.request("tools/list").bearer(key).send();
    assert_eq!(names(list("bob-key").await.result(), "tools", "name"), ["echo"]);
    assert_eq!(names(list("alice-key").await.result(), "tools", "name"), ["echo", "delete_user"]);
    let resources = gw.request("resources/list").bearer("alice-key").send().await;
    assert_eq!(
        names(resources.result(), "resources", "uri"),
        ["file:///public/a"],
        "no group opens a denied resource"
    );

    let delete = |key: &str| {
        gw.request("tools/call")
            .id(json!("d"))
            .params(json!({"name": "delete_user", "arguments": {}}))
            .bearer(key)
    };
    let refused = delete("bob-key").send().await;
    refused.assert_error(403, -31003, &json!("d"));
    assert_eq!(refused.reason(), Some("denied"));
    assert!(up.calls("tools/call").is_empty(), "nothing sent upstream");
    assert_eq!(delete("alice-key").send().await.status, 200);
    let read = gw
        .request("resources/read")
        .id(json!(7))
        .params(json!({"uri": "file:///secret/b"}))
        .bearer("alice-key");
    read.send().await.assert_error(403, -31003, &json!(7));
}

#[tokio::test]
async fn legacy_clients_are_filtered_by_the_relay_too() {
    let up = legacy_upstream().start().await;
    let gw = Gateway::with_config(config(up.url(), "legacy", "relay")).await;
    let bob = Legacy::new(&gw).bearer("bob-key");
    let session = bob.open().await;
    let list = bob
        .post(Some(&session), json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).to_string())
        .await;
    assert_eq!(names(list.result(), "tools", "name"), ["echo"], "{}", list.raw);
    let refused = bob.call(&session, json!(2), "delete_user").await;
    refused.assert_error(200, -31003, &json!(2));
    assert!(up.calls("tools/call").is_empty(), "nothing sent upstream");
    let still = bob.call(&session, json!(4), "echo").await;
    assert_eq!(still.status, 200, "the session goes on: {}", still.raw);
    let batch = json!([{"jsonrpc": "2.0", "id": 3, "method": "tools/list"}]).to_string();
    assert_eq!(bob.post(Some(&session), batch).await.status, 400, "a batch could hide a list from the rules");
}

#[tokio::test]
async fn the_pass_through_filters_a_modern_upstreams_lists() {
    let up = ModernUpstream::start().await;
    let gw = Gateway::with_config(config(&up.url, "modern", "pass")).await;
    let bob = gw.request("tools/list").bearer("bob-key").send().await;
    assert_eq!(names(bob.result(), "tools", "name"), ["echo", "annotated"], "{}", bob.raw);
    let alice = gw.request("tools/list").bearer("alice-key").send().await;
    assert_eq!(names(alice.result(), "tools", "name"), ["echo", "delete_user", "annotated"]);
}
