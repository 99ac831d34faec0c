//! `subscriptions/listen` end to end: a session of its own upstream, its GET
//! stream filtered and tagged for the client, and its end.

mod support;
use support::single_route;

use http::Method;
use serde_json::json;
use support::{Answer, FakeUpstream, Gateway, Step};

const SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";

#[tokio::test]
async fn listen_forwards_only_the_requested_notifications_and_closes_its_session() {
    let up = FakeUpstream::new()
        .get_stream(vec![
            Step::notify("notifications/prompts/list_changed", json!({})),
            Step::notify("notifications/tools/list_changed", json!({})),
            Step::hang(),
        ])
        .start()
        .await;
    let gw = Gateway::start(up.url()).await;

    let mut events = gw
        .request("subscriptions/listen")
        .id(json!("listen-1"))
        .params(json!({"notifications": {"toolsListChanged": true}}))
        .open()
        .await;
    assert_eq!(events.status, 200);
    assert_eq!(events.headers.get("content-type").unwrap(), "text/event-stream");

    let ack = events.next().await.expect("an acknowledgement");
    assert_eq!(ack["method"], "notifications/subscriptions/acknowledged", "{ack}");
    assert_eq!(ack["params"]["_meta"][SUBSCRIPTION_ID], "listen-1");
    assert_eq!(ack["params"]["notifications"], json!({"toolsListChanged": true}));
    let changed = events.next().await.expect("the tools notification");
    assert_eq!(changed["method"], "notifications/tools/list_changed", "{changed}");
    assert_eq!(changed["params"]["_meta"][SUBSCRIPTION_ID], "listen-1");

    let get = up.http(Method::GET).remove(0);
    let session = get.session().expect("the GET names its session").to_string();
    drop(events);
    let deleted = up
        .wait_for("a DELETE of the listen session", |s| {
            s.method == Method::DELETE && s.session() == Some(session.as_str())
        })
        .await;
    assert_eq!(deleted.status, 200);
    assert_eq!(gw.settled_metric("sessionless_listen_streams_open", 0.0).await, 0.0);
    assert_eq!(gw.settled_metric("sessionless_upstream_sessions_open", 0.0).await, 0.0);
}

#[tokio::test]
async fn listen_ends_with_a_complete_result_when_the_upstream_closes_its_stream() {
    let up = FakeUpstream::new()
        .get_stream(vec![Step::notify("notifications/tools/list_changed", json!({}))])
        .start()
        .await;
    let gw = Gateway::start(up.url()).await;

    let reply = gw
        .request("subscriptions/listen")
        .id(json!(77))
        .params(json!({"notifications": {"toolsListChanged": true}}))
        .send()
        .await;

    assert_eq!(reply.status, 200, "{}", reply.raw);
    assert_eq!(reply.notes.len(), 2, "{:#?}", reply.notes);
    assert_eq!(reply.notes[0]["method"], "notifications/subscriptions/acknowledged");
    assert_eq!(reply.notes[1]["method"], "notifications/tools/list_changed");
    assert_eq!(reply.body["id"], 77);
    assert_eq!(reply.result()["resultType"], "complete");
    assert_eq!(reply.result()["_meta"][SUBSCRIPTION_ID], 77);
}

#[tokio::test]
async fn listen_subscribes_to_resources_and_forwards_only_their_updates() {
    let up = FakeUpstream::new()
        .on("resources/subscribe", Answer::Result(json!({})))
        .get_stream(vec![
            Step::notify("notifications/resources/updated", json!({"uri": "file:///other"})),
            Step::notify("notifications/resources/updated", json!({"uri": "file:///watched"})),
            Step::hang(),
        ])
        .start()
        .await;
    let gw = Gateway::start(up.url()).await;

    let mut events = gw
        .request("subscriptions/listen")
        .id(json!(5))
        .params(json!({"notifications": {"resourceSubscriptions": ["file:///watched"]}}))
        .open()
        .await;

    let ack = events.next().await.expect("an acknowledgement");
    assert_eq!(ack["params"]["notifications"], json!({"resourceSubscriptions": ["file:///watched"]}));
    let updated = events.next().await.expect("the update");
    assert_eq!(updated["method"], "notifications/resources/updated");
    assert_eq!(updated["params"]["uri"], "file:///watched");
    assert_eq!(updated["params"]["_meta"][SUBSCRIPTION_ID], 5);
    let subscribe = up.calls("resources/subscribe").remove(0);
    assert_eq!(subscribe.body["params"]["uri"], "file:///watched");
    let get = up.http(Method::GET).remove(0);
    assert_eq!(subscribe.session(), get.session());
}

fn small_responses() -> String {
    single_route("", "[limits]\nmax_upstream_response_bytes = 2048")
}

#[tokio::test]
async fn a_long_listen_stream_is_not_cut_by_the_response_size_limit() {
    // Each notification is ~100 bytes, far below the 2 KiB limit; a
    // subscription that lives long enough carries more than that in total.
    let mut steps: Vec<Step> =
        (0..40).map(|n| Step::notify("notifications/tools/list_changed", json!({"n": n}))).collect();
    steps.push(Step::hang());
    let up = FakeUpstream::new().get_stream(steps).start().await;
    let gw = Gateway::from_toml(&small_responses(), up.url()).await;

    let mut events = gw
        .request("subscriptions/listen")
        .id(json!(1))
        .params(json!({"notifications": {"toolsListChanged": true}}))
        .open()
        .await;

    let ack = events.next().await.expect("an acknowledgement");
    assert_eq!(ack["method"], "notifications/subscriptions/acknowledged");
    for n in 0..40 {
        let note = events.next().await.expect("the stream goes on");
        assert_eq!(note["method"], "notifications/tools/list_changed", "notification {n}: {note}");
        assert_eq!(note["params"]["n"], n);
    }
}

#[tokio::test]
async fn shutdown_ends_listen_streams_with_a_complete_result() {
    let up = FakeUpstream::new().get_stream(vec![Step::hang()]).start().await;
    let gw = Gateway::start(up.url()).await;
    let mut events = gw
        .request("subscriptions/listen")
        .id(json!("l-9"))
        .params(json!({"notifications": {"toolsListChanged": true}}))
        .open()
        .await;
    let ack = events.next().await.expect("an acknowledgement");
    assert_eq!(ack["method"], "notifications/subscriptions/acknowledged");

    gw.begin_shutdown();

    let end = events.next().await.expect("a final result");
    assert_eq!(end["id"], "l-9", "{end}");
    assert_eq!(end["result"]["resultType"], "complete");
    assert_eq!(end["result"]["_meta"][SUBSCRIPTION_ID], "l-9");
    assert_eq!(events.next().await, None, "the stream ends");
    up.wait_for("the listen session to be closed", |s| s.method == Method::DELETE).await;
}
