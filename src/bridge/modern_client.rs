//! The 2026 client half's answer (DESIGN §10): the front door reads a 2026
//! client's call ([`crate::front`]); this writes the [`Outcome`] an upstream
//! half gave as 2026-07-28 has it: the result or the `input_required` round
//! in a JSON-RPC response (JSON, or the last event of an SSE answer that
//! carried notifications), an error with the status its code calls for.

use http::StatusCode;
use serde_json::{Map, Value};

use super::half::{Failure, Outcome, Payload};
use crate::error::{error_body, Error};
use crate::front::SUPPORTED_VERSIONS;
use crate::reply::Reply;

/// Writes `outcome` as the answer to the call `id`; the metric outcome.
pub async fn answer(id: &Value, outcome: Outcome, reply: Reply) -> &'static str {
    let label = outcome.label();
    match outcome {
        Outcome::Complete(Payload::Text(result)) => {
            reply.finish_raw(StatusCode::OK, result_response(id, &result)).await;
        }
        Outcome::Complete(Payload::Tree(result)) | Outcome::InputRequired(result) => {
            reply.finish(StatusCode::OK, &response(id, result)).await;
        }
        Outcome::Failed(failure) => {
            let err = failure.into_error();
            reply.finish(err.status(), &error_body(Some(id), &err, SUPPORTED_VERSIONS)).await;
        }
        Outcome::Gone => {}
        Outcome::Answered(response) => {
            let _ = reply.relay(*response);
        }
    }
    label
}

impl Failure {
    /// The failure as the gateway's error (an upstream's error object as
    /// [`Error::Upstream`], its code and data kept).
    pub fn into_error(self) -> Error {
        match self {
            Failure::Gateway(e) => e,
            Failure::Upstream(error) => {
                let code = error.get("code").and_then(Value::as_i64).unwrap_or(-32603);
                let message = error.get("message").and_then(Value::as_str).unwrap_or("error").to_string();
                Error::Upstream { code, message, data: error.get("data").cloned() }
            }
        }
    }
}

/// `{"jsonrpc":"2.0","id":…,"result":…}`, built by hand: `json!` would
/// deep-copy the result.
fn response(id: &Value, result: Map<String, Value>) -> Value {
    let mut msg = Map::new();
    msg.insert("jsonrpc".into(), Value::from("2.0"));
    msg.insert("id".into(), id.clone());
    msg.insert("result".into(), Value::Object(result));
    Value::Object(msg)
}

/// [`response`] around a result already in JSON text.
fn result_response(id: &Value, result: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(result.len() + 48);
    out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
    serde_json::to_writer(&mut out, id).expect("an id serialises");
    out.extend_from_slice(b",\"result\":");
    out.extend_from_slice(result.as_bytes());
    out.push(b'}');
    out
}
