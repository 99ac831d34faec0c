//! Whether what an upstream sent back answers the request that was sent.
//!
//! Connections to an upstream are reused by every caller. An upstream that
//! writes a response nobody asked for (a late answer to an earlier request,
//! a bug, a desynchronised proxy) puts it where the next request on that
//! connection reads its answer: possibly another principal's request. So a
//! response is delivered only when its JSON-RPC id is the one sent; anything
//! else is a gateway error, and the upstream's idle connections are dropped
//! ([`super::Transport::distrust`]). The ids the gateway mints itself are
//! random, so a stray response cannot be aimed at the next one.

use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

/// The id the Python SDK 1.x gives errors it raises before reading a
/// request (a bad header, an unreadable body): about the request, not another.
const SDK_ERROR_ID: &str = "server-error";

/// What a JSON text from the upstream is, for the request(s) sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// A JSON-RPC message or batch that answers nothing else.
    Fine,
    /// A response (or a batch holding one) to a request that was not sent.
    Foreign,
    /// Not one JSON object or array.
    NotJson,
}

#[derive(Deserialize)]
struct Message<'a> {
    #[serde(borrow)]
    id: Option<&'a RawValue>,
    method: Option<IgnoredAny>,
    result: Option<IgnoredAny>,
    error: Option<IgnoredAny>,
}

/// Judges `bytes` (a whole JSON answer, or one SSE event's data) against the
/// ids of the requests sent (`sent` empty: nothing is checked but the JSON).
pub fn judge(bytes: &[u8], sent: &[Value]) -> Verdict {
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    let answered = match first {
        Some(b'{') => serde_json::from_slice::<Message<'_>>(bytes).map(|m| answers(&m, sent)),
        Some(b'[') => serde_json::from_slice::<Vec<Message<'_>>>(bytes)
            .map(|batch| batch.iter().all(|m| answers(m, sent))),
        _ => return Verdict::NotJson,
    };
    match answered {
        // JSON that is not JSON-RPC-shaped (an odd id) is judged as JSON only.
        Err(_) if is_json_message(bytes) => Verdict::Fine,
        Err(_) => Verdict::NotJson,
        Ok(answered) if answered || sent.is_empty() => Verdict::Fine,
        Ok(_) => Verdict::Foreign,
    }
}

/// Whether one message is a request, a notification, or a response to one
/// of `sent`.
fn answers(m: &Message<'_>, sent: &[Value]) -> bool {
    if m.method.is_some() || (m.result.is_none() && m.error.is_none()) {
        return true;
    }
    let id = m.id.and_then(|raw| serde_json::from_str::<Value>(raw.get()).ok());
    addressed(m.error.is_some(), id.as_ref(), sent)
}

/// Whether a response (an error or not, with this id) answers one of `sent`.
fn addressed(error: bool, id: Option<&Value>, sent: &[Value]) -> bool {
    (error && unaddressed(id)) || id.is_some_and(|id| sent.contains(id))
}

/// Whether `msg`, already read, is a response to none of `sent`.
pub fn foreign_message(msg: &Value, sent: &[Value]) -> bool {
    let error = msg.get("error").is_some();
    let response = msg.get("method").is_none() && (error || msg.get("result").is_some());
    response && !addressed(error, msg.get("id"), sent)
}

/// Whether an error's id says it is about no request in particular: none,
/// null, or the id the Python SDK 1.x gives errors it raises before reading
/// a request (a bad header, an unreadable body). Such an error is taken as
/// the answer to the request sent; an error with another id never is.
pub fn unaddressed(id: Option<&Value>) -> bool {
    match id {
        None | Some(Value::Null) => true,
        Some(Value::String(s)) => s == SDK_ERROR_ID,
        Some(_) => false,
    }
}

/// Whether `bytes` is one JSON object or array (a JSON-RPC message or batch).
pub fn is_json_message(bytes: &[u8]) -> bool {
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    matches!(first, Some(b'{' | b'[')) && serde_json::from_slice::<IgnoredAny>(bytes).is_ok()
}

/// A fresh id for a request the gateway sends upstream: random, below 2^53
/// (so any JSON parser keeps it exact), never 0 (the handshake's).
pub fn mint_id() -> u64 {
    (rand::random::<u64>() >> 11).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_answers_to_what_was_sent_pass() {
        let sent = [json!(5)];
        let judge = |text: &str| judge(text.as_bytes(), &sent);
        assert_eq!(judge(r#"{"jsonrpc":"2.0","id":5,"result":{}}"#), Verdict::Fine);
        assert_eq!(judge(r#"{"jsonrpc":"2.0","id":6,"result":{}}"#), Verdict::Foreign);
        assert_eq!(judge(r#"{"jsonrpc":"2.0","id":"5","result":{}}"#), Verdict::Foreign, "another id's type");
        assert_eq!(judge(r#"{"jsonrpc":"2.0","id":4,"error":{"code":1,"message":"x"}}"#), Verdict::Foreign);
        assert_eq!(judge(r#"{"jsonrpc":"2.0","result":{}}"#), Verdict::Foreign, "a result without an id");
        // Errors about the request itself, before its id was read.
        assert_eq!(
            judge(r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"x"}}"#),
            Verdict::Fine
        );
        let sdk = r#"{"jsonrpc":"2.0","id":"server-error","error":{"code":-32600,"message":"x"}}"#;
        assert_eq!(judge(sdk), Verdict::Fine);
        // Requests and notifications on a stream answer nothing.
        assert_eq!(judge(r#"{"jsonrpc":"2.0","id":9,"method":"elicitation/create"}"#), Verdict::Fine);
        assert_eq!(judge(r#"{"jsonrpc":"2.0","method":"notifications/progress"}"#), Verdict::Fine);
        assert_eq!(
            judge(r#"[{"jsonrpc":"2.0","id":5,"result":{}},{"jsonrpc":"2.0","id":7,"result":{}}]"#),
            Verdict::Foreign
        );
        assert_eq!(judge("not json"), Verdict::NotJson);
        assert_eq!(judge("[1,"), Verdict::NotJson);
        assert_eq!(judge(""), Verdict::NotJson);
        assert_eq!(judge("[1,2]"), Verdict::Fine, "JSON, judged as JSON only");
        // Nothing sent to compare with: JSON is all that is asked.
        assert_eq!(super::judge(br#"{"id":6,"result":{}}"#, &[]), Verdict::Fine);
        let batch = [json!(1), json!("b")];
        let both = r#"[{"jsonrpc":"2.0","id":"b","result":{}},{"jsonrpc":"2.0","id":1,"result":{}}]"#;
        assert_eq!(super::judge(both.as_bytes(), &batch), Verdict::Fine);
    }

    #[test]
    fn minted_ids_are_not_predictable() {
        let ids: Vec<u64> = (0..1000).map(|_| mint_id()).collect();
        assert!(ids.iter().all(|id| *id > 0 && *id < 1 << 53));
        let consecutive = ids.windows(2).filter(|w| w[1] == w[0] + 1).count();
        assert_eq!(consecutive, 0, "no id follows from the one before");
        let mut unique = ids.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), ids.len());
    }
}
