//! Mid-call questions as 2026 `input_required` rounds: the legacy server's
//! request becomes an `inputRequests` entry under a gateway-minted key, and the
//! client's answer becomes the JSON-RPC response the upstream waits for.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

use super::pool::Exclusive;
use super::session::Session;
use super::streams::Streams;
use crate::error::Error;
use crate::upstream::SessionWire;

/// The methods an upstream may ask during a call that MRTR can carry.
pub fn is_question(method: &str) -> bool {
    matches!(method, "elicitation/create" | "sampling/createMessage" | "roots/list")
}

/// The method behind a gateway-minted input key (`elicitation_3` →
/// `elicitation/create`), for checking answers when only the key is known.
pub fn method_of_key(key: &str) -> Option<&'static str> {
    match key.rsplit_once('_')?.0 {
        "elicitation" => Some("elicitation/create"),
        "sampling" => Some("sampling/createMessage"),
        "roots" => Some("roots/list"),
        _ => None,
    }
}

/// Checks the retry's answers for `keys` (known by key only) and returns them
/// as legacy results; keys without an answer are left out.
pub fn answers_by_key<'k>(
    keys: impl Iterator<Item = &'k String>,
    params: &Map<String, Value>,
) -> Result<BTreeMap<String, Value>, Error> {
    let Some(Value::Object(responses)) = params.get("inputResponses") else {
        return Ok(BTreeMap::new());
    };
    let mut out = BTreeMap::new();
    for key in keys {
        let Some(answer) = responses.get(key) else { continue };
        let method = method_of_key(key).unwrap_or("");
        out.insert(key.clone(), legacy_answer(key, method, answer)?);
    }
    Ok(out)
}

/// One upstream question waiting for the client's answer.
#[derive(Debug, Clone)]
pub struct Question {
    /// The upstream's JSON-RPC id for it.
    pub upstream_id: Value,
    pub method: String,
    /// The 2026 `InputRequest` shown to the client, kept serialised: a parked
    /// flow holds it for minutes and a `Value` tree costs several KiB.
    pub request: Box<RawValue>,
}

/// A call paused on questions, waiting for the client's retry.
pub struct ParkedFlow {
    pub session: Arc<Session>,
    pub wire: SessionWire,
    pub stream: Streams,
    /// Set when the call has its session to itself: closes it when the flow ends.
    pub _exclusive: Option<Exclusive>,
    pub upstream_id: u64,
    pub progress_token: Option<Value>,
    /// Input key → question.
    pub pending: BTreeMap<String, Question>,
    pub round: u32,
    /// Input keys minted so far in this flow.
    pub minted: u32,
    pub deadline: tokio::time::Instant,
}

impl ParkedFlow {
    /// Mints deterministic keys (`elicitation_1`, `sampling_2`, …) for new questions.
    pub fn add_questions(&mut self, messages: Vec<Value>) {
        for msg in messages {
            let method = msg.get("method").and_then(Value::as_str).unwrap_or("").to_string();
            self.minted += 1;
            let prefix = method.split('/').next().unwrap_or("input");
            let key = format!("{prefix}_{}", self.minted);
            let question = Question {
                upstream_id: msg.get("id").cloned().unwrap_or(Value::Null),
                request: serde_json::value::to_raw_value(&input_request(&method, msg.get("params")))
                    .expect("a Value serialises"),
                method,
            };
            self.pending.insert(key, question);
        }
    }

    /// The `inputRequests` object for the pending questions.
    pub fn input_requests(&self) -> Value {
        let map: Map<String, Value> = self
            .pending
            .iter()
            .map(|(k, q)| (k.clone(), serde_json::from_str(q.request.get()).unwrap_or(Value::Null)))
            .collect();
        Value::Object(map)
    }
}

/// The 2026 shape of a legacy server request: `{method, params}`, without
/// `jsonrpc`, `id` and legacy-only fields (`_meta`, `task`, `elicitationId`).
pub fn input_request(method: &str, params: Option<&Value>) -> Value {
    let mut params = params.and_then(Value::as_object).cloned().unwrap_or_default();
    params.remove("_meta");
    params.remove("task");
    params.remove("elicitationId");
    if params.is_empty() && method == "roots/list" {
        return json!({"method": method});
    }
    json!({"method": method, "params": params})
}

fn malformed(key: &str, why: &str) -> Error {
    Error::InvalidParams {
        message: format!("inputResponses.{key}: {why}"),
        data: Some(json!({"reason": "malformed_input_response"})),
    }
}

/// Checks `inputResponses` is an object of objects (any request may carry it).
pub fn check_responses_shape(params: &Map<String, Value>) -> Result<(), Error> {
    match params.get("inputResponses") {
        None => Ok(()),
        Some(Value::Object(m)) => match m.iter().find(|(_, v)| !v.is_object()) {
            Some((k, _)) => Err(malformed(k, "must be an object")),
            None => Ok(()),
        },
        Some(_) => Err(Error::InvalidParams {
            message: "inputResponses must be an object".into(),
            data: Some(json!({"reason": "malformed_input_response"})),
        }),
    }
}

/// The legacy JSON-RPC `result` for a client's answer to `question`.
pub fn legacy_answer(key: &str, method: &str, answer: &Value) -> Result<Value, Error> {
    let Value::Object(obj) = answer else {
        return Err(malformed(key, "must be an object"));
    };
    let mut obj = obj.clone();
    obj.remove("resultType");
    let problem = match method {
        "elicitation/create" => {
            let action = obj.get("action").and_then(Value::as_str);
            if !matches!(action, Some("accept" | "decline" | "cancel")) {
                Some("action must be accept, decline or cancel")
            } else if obj.get("content").is_some_and(|c| !c.is_object()) {
                Some("content must be an object")
            } else {
                None
            }
        }
        "sampling/createMessage"
            if !obj.get("role").is_some_and(Value::is_string) || obj.get("content").is_none() =>
        {
            Some("a sampling result needs role and content")
        }
        "roots/list" if !obj.get("roots").is_some_and(Value::is_array) => {
            Some("a roots result needs a roots array")
        }
        _ => None,
    };
    match problem {
        Some(why) => Err(malformed(key, why)),
        None => Ok(Value::Object(obj)),
    }
}

/// The response that declines `msg` on the client's behalf: elicitation
/// `cancel`, anything else a JSON-RPC error.
pub fn decline(msg: &Value) -> Value {
    let id = msg.get("id").cloned().unwrap_or(Value::Null);
    match msg.get("method").and_then(Value::as_str) {
        Some("ping") => json!({"jsonrpc": "2.0", "id": id, "result": {}}),
        Some("elicitation/create") => {
            json!({"jsonrpc": "2.0", "id": id, "result": {"action": "cancel"}})
        }
        _ => json!({"jsonrpc": "2.0", "id": id, "error": {
            "code": -32601, "message": "Declined by the gateway: the client cannot answer this request now"}}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legacy_only_fields_are_stripped() {
        let r = input_request(
            "elicitation/create",
            Some(
                &json!({"mode": "url", "url": "https://x", "message": "go", "elicitationId": "e1", "_meta": {"a": 1}}),
            ),
        );
        assert_eq!(
            r,
            json!({"method": "elicitation/create", "params": {"mode": "url", "url": "https://x", "message": "go"}})
        );
        assert_eq!(input_request("roots/list", None), json!({"method": "roots/list"}));
    }

    #[test]
    fn answers_are_validated_per_method() {
        assert!(legacy_answer("k", "elicitation/create", &json!({"action": "accept", "content": {"a": 1}}))
            .is_ok());
        assert!(legacy_answer("k", "elicitation/create", &json!({"action": "maybe"})).is_err());
        assert!(legacy_answer("k", "elicitation/create", &json!(12345)).is_err());
        assert!(legacy_answer(
            "k",
            "sampling/createMessage",
            &json!({"role": "assistant", "content": {"type": "text", "text": "hi"}, "model": "m"})
        )
        .is_ok());
        assert!(legacy_answer("k", "sampling/createMessage", &json!({"content": {}})).is_err());
        assert!(legacy_answer("k", "roots/list", &json!({"roots": []})).is_ok());
        assert!(legacy_answer("k", "roots/list", &json!({})).is_err());
    }

    #[test]
    fn response_maps_must_hold_objects() {
        let p =
            |v: Value| serde_json::from_value::<Map<String, Value>>(json!({"inputResponses": v})).unwrap();
        assert!(check_responses_shape(&p(json!({"a": {}}))).is_ok());
        assert!(check_responses_shape(&p(json!({"a": 12345}))).is_err());
        assert!(check_responses_shape(&p(Value::Null)).is_err());
    }
}
