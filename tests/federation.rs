//! Federated routes (DESIGN §11): one endpoint for many upstreams, each
//! member's tools and prompts under `<member>__<name>`, its resources under
//! `<member>+<uri>`; lists merged with sealed cursors; calls reaching the
//! member with the original name, through the member's own upstream half
//! (a legacy member's questions become rounds); a member that is down left
//! out of lists and named in errors.

mod support;

use serde_json::{json, Value};
use sessionless::config::Config;
use support::legacy::{Legacy, LEGACY};
use support::{Answer, FakeUpstream, Gateway, ModernRequest};

/// The demo server of `generation` on 127.0.0.1:0, stopped with the test's runtime.
async fn demo(generation: sessionless::demo::Generation) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    tokio::spawn(sessionless::demo::serve_generation(listener, std::future::pending(), generation));
    url
}

/// A federated route at `/mcp` over `members` (name, URL, generation).
async fn federated(members: &[(&str, &str, &str)], route_keys: &str) -> Gateway {
    let mut toml = String::new();
    for (name, url, generation) in members {
        toml.push_str(&format!(
            "[[upstreams]]\nname = \"{name}\"\nurl = \"{url}\"\ngeneration = \"{generation}\"\n\n"
        ));
    }
    let names: Vec<String> = members.iter().map(|(n, _, _)| format!("\"{n}\"")).collect();
    toml.push_str(&format!("[[routes]]\npath = \"/mcp\"\nmembers = [{}]\n{route_keys}\n", names.join(", ")));
    Gateway::with_config(Config::from_toml(&toml).expect("valid federated config")).await
}

async fn both_demos() -> Gateway {
    let legacy = demo(sessionless::demo::Generation::Legacy).await;
    let modern = demo(sessionless::demo::Generation::Modern).await;
    federated(&[("legacy", &legacy, "legacy"), ("modern", &modern, "modern")], "").await
}

fn names(result: &Value, key: &str, field: &str) -> Vec<String> {
    result[key].as_array().unwrap().iter().map(|i| i[field].as_str().unwrap().to_string()).collect()
}

fn call(gw: &Gateway, tool: &str, args: Value) -> ModernRequest {
    gw.request("tools/call").params(json!({"name": tool, "arguments": args}))
}

#[tokio::test]
async fn every_members_tools_under_their_prefix_and_calls_reach_the_original() {
    let gw = both_demos().await;

    let list = gw.request("tools/list").send().await;
    assert_eq!(list.status, 200, "{}", list.raw);
    let tools = names(list.result(), "tools", "name");
    for t in ["legacy__echo", "legacy__ask_user", "modern__echo"] {
        assert!(tools.contains(&t.to_string()), "{t} in {tools:?}");
    }
    assert!(tools.iter().all(|t| t.starts_with("legacy__") || t.starts_with("modern__")), "{tools:?}");
    assert_eq!(list.result()["resultType"], "complete");
    assert!(list.result().get("nextCursor").is_none(), "one page each: {}", list.raw);
    assert!(list.result()["ttlMs"].is_u64(), "{}", list.raw);
    assert_eq!(list.result()["cacheScope"], "private", "{}", list.raw);

    for member in ["legacy", "modern"] {
        let echo =
            call(&gw, &format!("{member}__echo"), json!({"text": format!("hi {member}")})).send().await;
        assert_eq!(echo.status, 200, "{}", echo.raw);
        assert_eq!(echo.result()["content"][0]["text"], format!("hi {member}"), "{}", echo.raw);
    }

    let unknown = call(&gw, "nobody__echo", json!({"text": "x"})).send().await;
    unknown.assert_error(400, -32602, &json!(1));
    let bare = call(&gw, "echo", json!({"text": "x"})).send().await;
    bare.assert_error(400, -32602, &json!(1));
}

#[tokio::test]
async fn prompts_and_resources_carry_their_member() {
    let gw = both_demos().await;

    let resources = gw.request("resources/list").send().await;
    let uris = names(resources.result(), "resources", "uri");
    assert!(!uris.is_empty(), "{}", resources.raw);
    assert!(uris.iter().all(|u| u.starts_with("legacy+") || u.starts_with("modern+")), "{uris:?}");
    let uri = uris.iter().find(|u| u.starts_with("legacy+")).expect("a legacy resource").clone();
    let read = gw.request("resources/read").params(json!({"uri": uri})).send().await;
    assert_eq!(read.status, 200, "{}", read.raw);
    let contents = read.result()["contents"].as_array().expect("contents");
    assert_eq!(contents[0]["uri"], uri, "the read's URI is advertised too: {}", read.raw);

    let prompts = gw.request("prompts/list").send().await;
    let listed = names(prompts.result(), "prompts", "name");
    assert!(listed.contains(&"legacy__greet".to_string()), "{listed:?}");
    let got = gw
        .request("prompts/get")
        .params(json!({"name": "legacy__greet", "arguments": {"name": "x"}}))
        .send()
        .await;
    assert_eq!(got.status, 200, "{}", got.raw);
    assert!(got.result()["messages"].is_array(), "{}", got.raw);
}

#[tokio::test]
async fn discover_merges_capabilities_and_keeps_each_members_instructions() {
    let gw = both_demos().await;
    let found = gw.request("server/discover").send().await;
    assert_eq!(found.status, 200, "{}", found.raw);
    let r = found.result();
    assert!(r["capabilities"]["tools"].is_object(), "{}", found.raw);
    assert!(r["supportedVersions"].as_array().unwrap().contains(&json!("2026-07-28")));
    assert_eq!(r["_meta"]["io.modelcontextprotocol/serverInfo"]["name"], "sessionless");
    assert!(r["ttlMs"].is_u64() && r["cacheScope"].is_string(), "cacheable: {}", found.raw);
}

/// Asks `member`'s `ask_user` and answers its round with `answer`: the
/// retry's result.
async fn ask_and_answer(gw: &Gateway, member: &str, answer: &str) -> support::Reply {
    let caps = json!({"elicitation": {}});
    let params = json!({"name": format!("{member}__ask_user"), "arguments": {"question": "colour?"}});
    let first = gw.request("tools/call").params(params.clone()).capabilities(caps.clone()).send().await;
    assert_eq!(first.status, 200, "{}", first.raw);
    let round = first.result().clone();
    assert_eq!(round["resultType"], "input_required", "{}", first.raw);
    let key = round["inputRequests"].as_object().unwrap().keys().next().unwrap().clone();
    let mut retry = params;
    retry["requestState"] = round["requestState"].clone();
    retry["inputResponses"] = json!({&key: {"action": "accept", "content": {"answer": answer}}});
    gw.request("tools/call").id(json!(2)).params(retry).capabilities(caps).send().await
}

#[tokio::test]
async fn a_2026_members_question_is_a_round_answered_by_the_retry() {
    let gw = both_demos().await;
    let done = ask_and_answer(&gw, "modern", "green").await;
    assert_eq!(done.status, 200, "{}", done.raw);
    assert_eq!(done.result()["resultType"], "complete", "{}", done.raw);
    assert!(done.raw.contains("green"), "the answer reached the member: {}", done.raw);
}

#[tokio::test]
async fn completion_references_name_their_member() {
    let gw = both_demos().await;
    let params = json!({"ref": {"type": "ref/prompt", "name": "legacy__greet"},
        "argument": {"name": "name", "value": "A"}});
    let done = gw.request("completion/complete").params(params).send().await;
    assert_eq!(done.status, 200, "{}", done.raw);
    assert!(done.result()["completion"]["values"].is_array(), "{}", done.raw);
    let unknown =
        json!({"ref": {"type": "ref/prompt", "name": "greet"}, "argument": {"name": "n", "value": ""}});
    gw.request("completion/complete").params(unknown).send().await.assert_error(400, -32602, &json!(1));
}

#[tokio::test]
async fn a_legacy_members_question_is_a_round_answered_by_the_retry() {
    let gw = both_demos().await;
    let done = ask_and_answer(&gw, "legacy", "blue").await;
    assert_eq!(done.status, 200, "{}", done.raw);
    assert_eq!(done.result()["resultType"], "complete", "{}", done.raw);
    assert!(done.raw.contains("blue"), "the answer reached the member: {}", done.raw);
}

#[tokio::test]
async fn a_member_that_is_down_is_left_out_and_named() {
    let legacy = demo(sessionless::demo::Generation::Legacy).await;
    let closed = support::closed_port_url().await;
    let gw = federated(&[("legacy", &legacy, "legacy"), ("gone", &closed, "legacy")], "").await;

    let list = gw.request("tools/list").send().await;
    assert_eq!(list.status, 200, "{}", list.raw);
    let tools = names(list.result(), "tools", "name");
    assert!(tools.contains(&"legacy__echo".to_string()), "{tools:?}");
    assert!(tools.iter().all(|t| !t.starts_with("gone__")), "{tools:?}");

    // What an unreachable single upstream gets: 502, or 503 once its
    // breaker has opened (the list above found it down).
    let failed = call(&gw, "gone__echo", json!({"text": "x"})).send().await;
    assert!(matches!(failed.status.as_u16(), 502 | 503), "{}", failed.raw);
    assert_eq!(failed.body["error"]["data"]["member"], "gone", "{}", failed.raw);
    let (_, metrics) = gw.get("/metrics").await;
    assert!(
        metrics.contains(r#"sessionless_federation_member_up{route="/mcp",member="gone"} 0"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"sessionless_federation_member_up{route="/mcp",member="legacy"} 1"#),
        "{metrics}"
    );
}

/// A fake member whose tool list comes in pages of one, with a name no
/// strict client accepts.
fn paged_member() -> FakeUpstream {
    FakeUpstream::new().paged_tools(&["files.read", "second", "third"])
}

#[tokio::test]
async fn pages_of_every_member_come_once_each_under_sealed_cursors() {
    let paged = paged_member().on("tools/call", Answer::Result(json!({"content": []}))).start().await;
    let legacy = demo(sessionless::demo::Generation::Legacy).await;
    let gw = federated(&[("paged", paged.url(), "legacy"), ("legacy", &legacy, "legacy")], "").await;

    let mut seen = Vec::new();
    let mut cursor: Option<Value> = None;
    for _ in 0..10 {
        let params = cursor.take().map_or(json!({}), |c| json!({"cursor": c}));
        let page = gw.request("tools/list").params(params).send().await;
        assert_eq!(page.status, 200, "{}", page.raw);
        seen.extend(names(page.result(), "tools", "name"));
        cursor = page.result().get("nextCursor").cloned();
        if cursor.is_none() {
            break;
        }
    }
    let paged_tools: Vec<&String> = seen.iter().filter(|t| t.starts_with("paged__")).collect();
    assert_eq!(paged_tools.len(), 3, "{seen:?}");
    let mut unique = seen.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), seen.len(), "every item once: {seen:?}");
    let strict = regex_lite(&seen);
    assert!(strict, "every name matches ^[A-Za-z0-9_-]{{1,64}}$: {seen:?}");

    // The shortened name reaches the member as its original.
    let shortened = seen.iter().find(|t| t.starts_with("paged__files_read-")).expect("shortened").clone();
    let called = call(&gw, &shortened, json!({})).send().await;
    assert_eq!(called.status, 200, "{}", called.raw);
    let sent = paged.calls("tools/call");
    assert_eq!(sent.last().unwrap().body["params"]["name"], "files.read", "{}", paged.dump());

    let tampered = gw.request("tools/list").params(json!({"cursor": "not-a-cursor"})).send().await;
    tampered.assert_error(400, -32602, &json!(1));
}

fn regex_lite(names: &[String]) -> bool {
    names.iter().all(|n| {
        (1..=64).contains(&n.len()) && n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    })
}

#[tokio::test]
async fn a_cursor_from_another_member_set_is_refused() {
    let paged = paged_member().start().await;
    let legacy = demo(sessionless::demo::Generation::Legacy).await;
    let gw = federated(&[("paged", paged.url(), "legacy"), ("legacy", &legacy, "legacy")], "").await;
    let first = gw.request("tools/list").send().await;
    let cursor = first.result()["nextCursor"].clone();
    assert!(cursor.is_string(), "{}", first.raw);

    // Same keys, other members: a fresh gateway on a route of one member.
    let other = federated(&[("paged", paged.url(), "legacy")], "").await;
    let refused = other.request("tools/list").params(json!({"cursor": cursor})).send().await;
    refused.assert_error(400, -32602, &json!(1));
}

#[tokio::test]
async fn rules_name_advertised_tools() {
    let gw = {
        let legacy = demo(sessionless::demo::Generation::Legacy).await;
        let modern = demo(sessionless::demo::Generation::Modern).await;
        let rules = "[[routes.rules]]\neffect = \"deny\"\ntools = [\"legacy__*\"]\n";
        federated(&[("legacy", &legacy, "legacy"), ("modern", &modern, "modern")], rules).await
    };
    let list = gw.request("tools/list").send().await;
    let tools = names(list.result(), "tools", "name");
    assert!(tools.iter().all(|t| !t.starts_with("legacy__")), "{tools:?}");
    assert!(tools.contains(&"modern__echo".to_string()), "{tools:?}");
    let denied = call(&gw, "legacy__echo", json!({"text": "x"})).send().await;
    assert_eq!(denied.status, 403, "{}", denied.raw);
}

#[tokio::test]
async fn a_legacy_client_on_a_federated_route_is_translated() {
    let gw = both_demos().await;
    let client = Legacy::new(&gw);
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": "old", "version": "1"}}});
    let init = client.post(None, init.to_string()).await;
    assert_eq!(init.status, 200, "{}", init.raw);
    let session = init.header("mcp-session-id").expect("a session id").to_string();

    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}});
    let list = client.post(Some(&session), list.to_string()).await;
    assert_eq!(list.status, 200, "{}", list.raw);
    let tools = names(list.result(), "tools", "name");
    assert!(tools.contains(&"legacy__echo".to_string()) && tools.contains(&"modern__echo".to_string()));

    for member in ["legacy", "modern"] {
        let echo = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
            "params": {"name": format!("{member}__echo"), "arguments": {"text": member}}});
        let echo = client.post(Some(&session), echo.to_string()).await;
        assert_eq!(echo.status, 200, "{}", echo.raw);
        assert_eq!(echo.result()["content"][0]["text"], member, "{}", echo.raw);
    }
}

#[tokio::test]
async fn unknown_shortened_names_cannot_make_every_call_walk_a_members_list() {
    let paged = paged_member().on("tools/call", Answer::Result(json!({"content": []}))).start().await;
    let gw = federated(&[("paged", paged.url(), "legacy")], "").await;
    let mut walks = Vec::new();
    for i in 0..5 {
        // Shaped like a shortened name, held by no list.
        let name = format!("paged__nothing-{:08x}", 0xabc0 + i);
        let called = call(&gw, &name, json!({})).send().await;
        assert_eq!(called.status, 200, "{}", called.raw);
        walks.push(paged.calls("tools/list").len());
    }
    // The first call reads the list twice: to resolve the name, and for the
    // tools' Mcp-Param annotations (cached); later calls read nothing.
    assert_eq!(walks, [6, 6, 6, 6, 6], "{}", paged.dump());
    let sent: Vec<Value> =
        paged.calls("tools/call").iter().map(|c| c.body["params"]["name"].clone()).collect();
    assert_eq!(sent[0], "nothing-0000abc0", "an unknown name is its own original: {sent:?}");
}

/// A member whose `regional` tool's `region` argument must be mirrored in
/// `Mcp-Param-Region`; `stateless`: it keeps no sessions (a 2026 server).
async fn regional_member(stateless: bool) -> support::Upstream {
    let fake = if stateless { FakeUpstream::new().without_session_ids() } else { FakeUpstream::new() };
    fake.on(
        "tools/list",
        Answer::Result(json!({"tools": [{"name": "regional", "inputSchema": {
                "type": "object",
                "properties": {"region": {"type": "string", "x-mcp-header": "Region"}}}}]})),
    )
    .on("tools/call", Answer::Result(json!({"content": []})))
    .start()
    .await
}

#[tokio::test]
async fn a_2026_clients_param_headers_are_checked_for_members_of_either_generation() {
    let old = regional_member(false).await;
    let new = regional_member(true).await;
    let gw = federated(&[("old", old.url(), "legacy"), ("new", new.url(), "modern")], "").await;
    for member in ["old", "new"] {
        let call = |id: i64| {
            gw.request("tools/call")
                .id(json!(id))
                .params(json!({"name": format!("{member}__regional"), "arguments": {"region": "eu-west"}}))
        };
        call(1).send().await.assert_error(400, -32020, &json!(1));
        call(2).header("mcp-param-region", "us-east").send().await.assert_error(400, -32020, &json!(2));
        let right = call(3).header("mcp-param-region", "eu-west").send().await;
        assert_eq!(right.status, 200, "{member}: {}", right.raw);
    }
    assert_eq!(old.calls("tools/call").len(), 1, "{}", old.dump());
    assert_eq!(new.calls("tools/call").len(), 1, "{}", new.dump());
    let sent = &new.calls("tools/call")[0];
    assert_eq!(sent.header("mcp-param-region"), Some("eu-west"), "the 2026 member gets its own header");
    assert_eq!(sent.header("mcp-name"), Some("regional"), "and its own name");
}

#[tokio::test]
async fn a_legacy_clients_get_stream_carries_every_members_list_changes() {
    let stream = |method: &str| vec![support::Step::notify(method, json!({})), support::Step::hang()];
    let one = FakeUpstream::new().get_stream(stream("notifications/tools/list_changed")).start().await;
    let two = FakeUpstream::new().get_stream(stream("notifications/prompts/list_changed")).start().await;
    let gw = federated(&[("one", one.url(), "legacy"), ("two", two.url(), "legacy")], "").await;
    let client = Legacy::new(&gw);
    let session = client.open().await;

    let mut events = support::Events::of(client.verb(http::Method::GET, Some(&session)).await);
    assert_eq!(events.status, 200);
    let mut heard = vec![
        events.next().await.expect("a list change")["method"].as_str().unwrap().to_string(),
        events.next().await.expect("another")["method"].as_str().unwrap().to_string(),
    ];
    heard.sort();
    assert_eq!(heard, ["notifications/prompts/list_changed", "notifications/tools/list_changed"]);

    // The client leaves: each member's stream session is closed.
    drop(events);
    for up in [&one, &two] {
        let listened_on = up.http(http::Method::GET).remove(0).session().expect("a session").to_string();
        up.wait_for("a DELETE of the stream's session", |s| {
            s.method == http::Method::DELETE && s.session() == Some(listened_on.as_str())
        })
        .await;
    }
}

#[tokio::test]
async fn a_2026_clients_listen_hears_every_member_tagged_and_advertised() {
    let one = FakeUpstream::new()
        .get_stream(vec![
            support::Step::notify("notifications/tools/list_changed", json!({})),
            support::Step::notify("notifications/resources/updated", json!({"uri": "file:///a"})),
            support::Step::hang(),
        ])
        .start()
        .await;
    let two = FakeUpstream::new()
        .get_stream(vec![
            support::Step::notify("notifications/prompts/list_changed", json!({})),
            support::Step::hang(),
        ])
        .start()
        .await;
    let gw = federated(&[("one", one.url(), "legacy"), ("two", two.url(), "legacy")], "").await;
    let filter = json!({"toolsListChanged": true, "promptsListChanged": true,
        "resourceSubscriptions": ["one+file:///a"]});
    let mut events = gw
        .request("subscriptions/listen")
        .id(json!("l-1"))
        .params(json!({"notifications": filter}))
        .open()
        .await;
    assert_eq!(events.status, 200);
    let ack = events.next().await.expect("one acknowledgement");
    assert_eq!(ack["method"], "notifications/subscriptions/acknowledged", "{ack}");
    assert_eq!(ack["params"]["notifications"], filter);
    let mut heard = Vec::new();
    for _ in 0..3 {
        let n = events.next().await.expect("a change");
        assert_eq!(n["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"], "l-1", "{n}");
        assert_ne!(n["method"], "notifications/subscriptions/acknowledged", "members' own acks dropped: {n}");
        heard.push(match n["method"].as_str().unwrap() {
            "notifications/resources/updated" => format!("updated {}", n["params"]["uri"].as_str().unwrap()),
            other => other.to_string(),
        });
    }
    heard.sort();
    assert_eq!(
        heard,
        ["notifications/prompts/list_changed", "notifications/tools/list_changed", "updated one+file:///a"]
    );
    let subscribed = one.calls("resources/subscribe");
    assert_eq!(subscribed.len(), 1, "{}", one.dump());
    assert_eq!(subscribed[0].body["params"]["uri"], "file:///a", "the member's own URI");
    assert!(two.calls("resources/subscribe").is_empty(), "{}", two.dump());
}

#[tokio::test]
async fn a_member_that_comes_back_is_listed_again_without_a_restart() {
    let legacy = demo(sessionless::demo::Generation::Legacy).await;
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let later = format!("http://127.0.0.1:{port}/mcp");
    let gw = federated(&[("legacy", &legacy, "legacy"), ("later", &later, "legacy")], "").await;

    let list = gw.request("tools/list").send().await;
    assert!(names(list.result(), "tools", "name").iter().all(|t| !t.starts_with("later__")), "{}", list.raw);
    let up = r#"sessionless_federation_member_up{route="/mcp",member="later"}"#;
    let (_, metrics) = gw.get("/metrics").await;
    assert!(metrics.contains(&format!("{up} 0")), "{metrics}");

    let member = FakeUpstream::new()
        .on(
            "tools/list",
            Answer::Result(json!({"tools": [{"name": "hello", "inputSchema": {"type": "object"}}]})),
        )
        .start_at(&format!("127.0.0.1:{port}"))
        .await;
    // The health probe takes the instance back; lists include it again.
    let mut back = false;
    for _ in 0..100 {
        let list = gw.request("tools/list").send().await;
        if names(list.result(), "tools", "name").contains(&"later__hello".to_string()) {
            back = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(back, "the member is listed again: {}", member.dump());
    let (_, metrics) = gw.get("/metrics").await;
    assert!(metrics.contains(&format!("{up} 1")), "{metrics}");
}

#[tokio::test]
async fn tool_rate_limits_name_advertised_tools() {
    let legacy = demo(sessionless::demo::Generation::Legacy).await;
    let modern = demo(sessionless::demo::Generation::Modern).await;
    let limits = "tool_rate_limits = { \"legacy__echo\" = { per_minute = 1, burst = 1 } }";
    let gw = federated(&[("legacy", &legacy, "legacy"), ("modern", &modern, "modern")], limits).await;
    let first = call(&gw, "legacy__echo", json!({"text": "a"})).send().await;
    assert_eq!(first.status, 200, "{}", first.raw);
    let second = call(&gw, "legacy__echo", json!({"text": "b"})).send().await;
    assert_eq!(second.status, 429, "{}", second.raw);
    let other = call(&gw, "modern__echo", json!({"text": "c"})).send().await;
    assert_eq!(other.status, 200, "another member's echo has no limit: {}", other.raw);
}

#[tokio::test]
async fn uris_inside_results_are_advertised() {
    let member = FakeUpstream::new()
        .on(
            "tools/call",
            Answer::Result(json!({"content": [
                {"type": "text", "text": "see"},
                {"type": "resource_link", "uri": "file:///report.txt", "name": "report"},
                {"type": "resource", "resource": {"uri": "file:///inline.txt", "text": "x"}}
            ]})),
        )
        .on(
            "prompts/get",
            Answer::Result(json!({"messages": [{"role": "user",
                "content": {"type": "resource", "resource": {"uri": "file:///p.txt", "text": "y"}}}]})),
        )
        .start()
        .await;
    let gw = federated(&[("files", member.url(), "legacy")], "").await;
    let called = call(&gw, "files__report", json!({})).send().await;
    assert_eq!(called.status, 200, "{}", called.raw);
    let content = &called.result()["content"];
    assert_eq!(content[0]["text"], "see");
    assert_eq!(content[1]["uri"], "files+file:///report.txt", "{}", called.raw);
    assert_eq!(content[2]["resource"]["uri"], "files+file:///inline.txt", "{}", called.raw);
    let got = gw.request("prompts/get").params(json!({"name": "files__p"})).send().await;
    assert_eq!(
        got.result()["messages"][0]["content"]["resource"]["uri"],
        "files+file:///p.txt",
        "{}",
        got.raw
    );
}

#[tokio::test]
async fn a_list_no_member_answered_is_an_error_not_an_empty_list() {
    let closed = support::closed_port_url().await;
    let gw = federated(&[("gone", &closed, "legacy")], "").await;
    let list = gw.request("tools/list").send().await;
    assert!(matches!(list.status.as_u16(), 502 | 503), "{}", list.raw);
    assert_eq!(list.body["error"]["data"]["member"], "gone", "{}", list.raw);
}

#[tokio::test]
async fn a_member_slower_than_the_list_timeout_is_left_out_and_marked_down() {
    let slow = FakeUpstream::new()
        .on("tools/list", Answer::delayed(3_000, Answer::Result(json!({"tools": [{"name": "late"}]}))))
        .start()
        .await;
    let legacy = demo(sessionless::demo::Generation::Legacy).await;
    let gw = federated(
        &[("legacy", &legacy, "legacy"), ("slow", slow.url(), "legacy")],
        "federation_list_timeout_ms = 300",
    )
    .await;
    let started = std::time::Instant::now();
    let list = gw.request("tools/list").send().await;
    assert_eq!(list.status, 200, "{}", list.raw);
    assert!(
        started.elapsed() < std::time::Duration::from_millis(2_500),
        "the list waited for the slow member"
    );
    let tools = names(list.result(), "tools", "name");
    assert!(tools.contains(&"legacy__echo".to_string()) && !tools.iter().any(|t| t.starts_with("slow__")));
    let (_, metrics) = gw.get("/metrics").await;
    assert!(
        metrics.contains(r#"sessionless_federation_member_up{route="/mcp",member="slow"} 0"#),
        "{metrics}"
    );
}
