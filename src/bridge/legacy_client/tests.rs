use serde_json::json;

use super::*;

#[test]
fn a_legacy_client_gets_no_code_of_the_reserved_range() {
    let needs = json!({"requiredCapabilities": {"sampling": {}}});
    let error = legacy_error(&json!({"code": -32021, "message": "needs sampling", "data": needs}));
    assert_eq!(error, json!({"code": -32600, "message": "needs sampling", "data": needs}));
    for code in [-32020, -32022, -32042, -32099, -32050] {
        let error = legacy_error(&json!({"code": code, "message": "m", "data": {"x": 1}}));
        assert_eq!(error["code"], -32603, "{code}");
        assert_eq!(error["data"], json!({"x": 1}), "data kept");
    }
    for code in [-32002, -32019, -32100, -32601, -32602, 7] {
        assert_eq!(legacy_error(&json!({"code": code, "message": "m"}))["code"], code, "{code}");
    }
}

/// An upstream half of the test's own (no server, no HTTP): one question,
/// then a result made from its answer. What it was called with is kept.
#[derive(Default)]
struct Scripted {
    calls: std::sync::Mutex<Vec<Call>>,
}

impl UpstreamHalf for Scripted {
    async fn call(&self, _target: &Target, call: Call, _caller: &Caller, _notes: &mut Reply) -> Outcome {
        self.calls.lock().unwrap().push(call.clone());
        let result = match call.params.get("inputResponses") {
            None => json!({"resultType": "input_required", "requestState": "the-upstream's-own",
                "inputRequests": {"q": {"method": "elicitation/create", "params": {
                    "message": "Your name?", "requestedSchema": {"type": "object"}}}}}),
            Some(answers) => json!({"resultType": "complete", "ttlMs": 0, "content": [{"type": "text",
                "text": format!("hello {}", answers["q"]["content"]["name"].as_str().unwrap_or("?"))}]}),
        };
        Outcome::of_result(result.as_object().unwrap().clone())
    }

    async fn listen(
        &self,
        _target: &Target,
        _call: Call,
        _caller: &Caller,
        _rewrite: crate::bridge::relay::Rewrite,
        _hold: Box<dyn std::any::Any + Send + Sync>,
    ) -> Result<Response<Body>, Error> {
        Err(Error::MethodNotAllowed)
    }
}

/// The seam of DESIGN §10, without a server: a translated request runs on
/// whatever upstream half it is given; its `input_required` outcome becomes
/// a question pushed on the client's stream, and the answer goes back to the
/// same half as `inputResponses` with the half's own `requestState`.
#[tokio::test]
async fn a_round_goes_through_any_upstream_half() {
    use http_body_util::BodyExt;
    let config = Config::single("http://127.0.0.1:9/mcp", "127.0.0.1:0".parse().unwrap()).unwrap();
    let metrics = crate::metrics::Metrics::register(&mut prometheus_client::registry::Registry::default());
    let targets = crate::bridge::Targets::new(&config, &metrics).unwrap();
    let target = targets.all().next().unwrap().clone();
    let services = Arc::new(Services::new(&config, None, metrics, Default::default()));
    let bridge = Bridge::new(&config, services.clone(), Arc::new(quota::Creations::new(100, 100)));
    let mut headers = http::HeaderMap::new();
    headers.insert(header::ACCEPT, HeaderValue::from_static("application/json, text/event-stream"));
    let caller =
        Caller { principal: "alice".into(), headers, body: Bytes::new(), forwarded: false, access: None };
    let translated = Translated {
        capabilities: json!({"elicitation": {}}),
        client_info: json!({"name": "old", "version": "1"}),
        session_id: Some("s1".into()),
    };
    let claims = Claims {
        route: target.route.id.clone(),
        instance: String::new(),
        upstream_session: None,
        version: Some("2025-11-25".into()),
        principal: "alice".into(),
        issued: 0,
        expires: u64::MAX / 2000,
        translated: Some(translated),
    };
    // The client's own MRTR members never reach the upstream half.
    let params = json!({"name": "greet", "arguments": {}, "requestState": "forged", "inputResponses": {},
        "_meta": {"progressToken": 7, "io.modelcontextprotocol/clientCapabilities": {"sampling": {}}}});
    let call = typed_call(&claims, Method::ToolsCall, json!(1), params.as_object().cloned()).unwrap();
    let upstream = Scripted::default();
    let (mut reply, answer) = Reply::new(true);
    let run = bridge.run(&upstream, &target, &caller, &claims, call, &mut reply);
    let client = async {
        let mut body = answer.await.unwrap().into_body();
        let frame = body.frame().await.unwrap().unwrap().into_data().unwrap();
        let text = std::str::from_utf8(&frame).unwrap();
        let data = text.lines().find_map(|l| l.strip_prefix("data:")).expect("an SSE event");
        let question: Value = serde_json::from_str(data.trim()).unwrap();
        assert_eq!(question["method"], "elicitation/create", "{question}");
        let id = question["id"].as_str().unwrap();
        let q = question::open(&services.sealer, id, &target.route.id, "alice").unwrap();
        let answer = Answer {
            key: q.key.clone(),
            outcome: Ok(json!({"action": "accept", "content": {"name": "Ada"}})),
        };
        assert!(bridge.rounds.deliver(&q.round, answer));
        body
    };
    let (result, _body) = tokio::join!(run, client);
    let result = result.unwrap_or_else(|_| panic!("the call completes"));
    assert_eq!(result, json!({"content": [{"type": "text", "text": "hello Ada"}]}), "no 2026-only fields");
    let calls = upstream.calls.lock().unwrap();
    assert_eq!(calls.len(), 2);
    assert!(calls[0].params.get("requestState").is_none() && calls[0].params.get("inputResponses").is_none());
    assert_eq!(calls[0].meta.capabilities, *json!({"elicitation": {}}).as_object().unwrap(), "the token's");
    assert_eq!(calls[0].meta.progress_token, Some(json!(7)));
    assert_eq!(calls[1].params["requestState"], "the-upstream's-own");
    assert_eq!(calls[1].params["inputResponses"]["q"]["content"]["name"], "Ada");
}
