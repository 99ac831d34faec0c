//! Every error the gateway can answer with, and the one function that turns an
//! error into an HTTP status and a JSON-RPC error body (DESIGN.md §6).

use http::StatusCode;
use serde_json::{json, Value};

/// JSON-RPC error codes used on the client-facing side.
pub mod code {
    pub const PARSE_ERROR: i64 = -32700;
    pub const INVALID_REQUEST: i64 = -32600;
    pub const METHOD_NOT_FOUND: i64 = -32601;
    pub const INVALID_PARAMS: i64 = -32602;
    pub const INTERNAL_ERROR: i64 = -32603;
    pub const HEADER_MISMATCH: i64 = -32020;
    pub const MISSING_CAPABILITY: i64 = -32021;
    pub const UNSUPPORTED_VERSION: i64 = -32022;
    /// Legacy "resource not found"; mapped to -32602 on the way out.
    pub const LEGACY_RESOURCE_NOT_FOUND: i64 = -32002;
    /// 2025-11-25 "URL elicitation required"; never sent to modern clients.
    pub const URL_ELICITATION_REQUIRED: i64 = -32042;
    /// "Session not found" (legacy sessions), as the reference SDKs send it.
    pub const SESSION_NOT_FOUND: i64 = -32001;
    /// Application code (outside the reserved -32768..-32000 range) for overload.
    pub const OVERLOADED: i64 = -31000;
    /// Application codes for a refused authentication (401) and authorization (403).
    pub const UNAUTHORIZED: i64 = -31001;
    pub const FORBIDDEN: i64 = -31003;
    /// Application code (outside the reserved range) for a rate limit: -31000 - 29, after HTTP 429.
    pub const RATE_LIMITED: i64 = -31029;
}

/// The HTTP status 2026-07-28 gives one of its own errors, when `code` is
/// one and `data` has its shape: -32020 (header mismatch; no data defined),
/// -32021 (missing client capability: `data.requiredCapabilities` an
/// object), -32022 (unsupported version: `data.supported` a list of strings,
/// `data.requested` a string). Everything else in -32020..-32099 is
/// reserved and undefined; -32042 is a 2025-11-25 code 2026-07-28 forbids.
pub fn spec_error_status(code: i64, data: Option<&Value>) -> Option<StatusCode> {
    let shaped = match code {
        code::HEADER_MISMATCH => true,
        code::MISSING_CAPABILITY => {
            data.and_then(|d| d.get("requiredCapabilities")).is_some_and(Value::is_object)
        }
        code::UNSUPPORTED_VERSION => {
            let supported = data.and_then(|d| d.get("supported")).and_then(Value::as_array);
            let requested = data.and_then(|d| d.get("requested"));
            supported.is_some_and(|s| s.iter().all(Value::is_string))
                && requested.is_some_and(Value::is_string)
        }
        _ => false,
    };
    shaped.then_some(StatusCode::BAD_REQUEST)
}

/// Who caused an error: feeds metrics and retry decisions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Client,
    Upstream,
    Gateway,
}

/// A rate limit's refusal, as the client is told it (`crate::ratelimit`
/// makes it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limited {
    /// Which limit: a bounded label (`principal`, `tool`, `overflow`).
    pub limit: &'static str,
    /// What it limits, in words.
    pub what: &'static str,
    /// `Retry-After`: whole seconds, at least one.
    pub retry_after_secs: u64,
}

/// Why a paused call could not be parked (`crate::park`), so its question
/// was declined upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Declined {
    /// The lot holds its cap.
    Full,
    /// This principal holds its share.
    PrincipalFull,
    /// Shutting down.
    Closed,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("method not allowed")]
    MethodNotAllowed,
    #[error("origin not allowed")]
    OriginNotAllowed,
    #[error("host not allowed")]
    HostNotAllowed,
    #[error("content type must be application/json")]
    UnsupportedMediaType,
    #[error("request body not received in time")]
    BodyTimeout,
    #[error("request body is larger than {0} bytes")]
    PayloadTooLarge(usize),
    #[error("parse error: the body is not valid JSON")]
    Parse,
    /// A body the strict reader refused (not I-JSON): what is wrong.
    #[error("parse error: {0}")]
    Malformed(&'static str),
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("header mismatch: {0}")]
    HeaderMismatch(String),
    #[error("invalid params: {message}")]
    InvalidParams { message: String, data: Option<Value> },
    #[error("unsupported protocol version")]
    UnsupportedVersion { requested: String },
    #[error("method not found: {0}")]
    MethodNotFound(String),
    #[error("missing required client capability")]
    MissingCapability(Value),
    /// The upstream answered with a JSON-RPC error of its own (already id-mapped).
    #[error("upstream error {code}: {message}")]
    Upstream { code: i64, message: String, data: Option<Value> },
    #[error("upstream unreachable")]
    UpstreamUnreachable,
    /// The upstream speaks a stateless revision this gateway does not.
    #[error("upstream speaks an unsupported protocol revision")]
    UpstreamRefused,
    #[error("upstream timed out")]
    UpstreamTimeout,
    #[error("upstream sent an invalid response: {0}")]
    UpstreamInvalid(&'static str),
    #[error("upstream response too large")]
    UpstreamTooLarge,
    /// A stdio upstream's process could not be started: it did not finish
    /// `initialize` in time (`timed_out`), or it exited, could not be
    /// spawned, or its command is failing and backed off.
    /// `upstream`: its name, once the route is known.
    #[error("upstream process did not start")]
    ProcessStart { timed_out: bool, upstream: Option<String> },
    /// The upstream answered 401 or 403: to the client's own token when
    /// `client_token` (forwarded), else to the gateway's configured headers.
    #[error("upstream refused the credentials")]
    UpstreamDenied { status: u16, client_token: bool },
    #[error("upstream stream broke after the call was sent")]
    OutcomeUnknown,
    /// Another replica's internal listener refused a forwarded retry.
    #[error("replica refused the forwarded retry")]
    ReplicaRefused,
    #[error("gateway overloaded")]
    Overloaded,
    /// A rate limit of the route refused the caller (`crate::ratelimit`).
    #[error("rate limited")]
    RateLimited(Limited),
    /// The upstream has as many requests in flight as it may.
    #[error("upstream busy")]
    UpstreamBusy,
    /// Every instance of the upstream is down (breaker open): no new work
    /// is sent until a health probe finds one answering.
    #[error("upstream unavailable")]
    CircuitOpen,
    /// The call ran and asked a question that could not be paused: it was
    /// declined upstream on the client's behalf.
    #[error("too many paused calls: the question was declined")]
    QuestionDeclined(Declined),
    /// The caller holds as many upstream sessions as it may, all busy.
    #[error("too many upstream sessions for this caller")]
    TooManySessions,
    /// A legacy request other than `initialize` without `Mcp-Session-Id`.
    #[error("Mcp-Session-Id header is required")]
    SessionRequired,
    /// A legacy session id that does not open, has expired, belongs to
    /// another route or principal, or whose upstream session is gone.
    #[error("session not found")]
    SessionNotFound,
    /// The caller holds as many long-lived streams as it may.
    #[error("too many open streams for this caller")]
    TooManyStreams,
    /// Legacy sessions opened too fast by this caller, or by everyone.
    #[error("too many new sessions")]
    TooManyNewSessions,
    /// Missing or invalid credentials (the reason, a bounded label).
    #[error("unauthorized: {0}")]
    Unauthorized(&'static str),
    /// Valid credentials without the scopes needed (space-separated).
    #[error("insufficient scope: needs {0}")]
    Forbidden(String),
    /// An authorization rule refuses this caller the tool, prompt or resource named.
    #[error("not allowed: {0}")]
    Denied(String),
    #[error("internal error: {0}")]
    Internal(String),
    /// A federated route's member could not serve the call: its error,
    /// with `data.member` naming it.
    #[error("member {member}: {error}")]
    Member { member: String, error: Box<Error> },
}

impl Error {
    pub fn invalid_params(message: impl Into<String>) -> Self {
        Error::InvalidParams { message: message.into(), data: None }
    }

    pub fn source(&self) -> Source {
        use Error::*;
        match self {
            Member { error, .. } => error.source(),
            Upstream { .. }
            | UpstreamUnreachable
            | UpstreamRefused
            | UpstreamTimeout
            | UpstreamInvalid(_)
            | UpstreamTooLarge
            | ProcessStart { .. }
            | OutcomeUnknown
            | UpstreamDenied { client_token: false, .. } => Source::Upstream,
            Overloaded | Internal(_) | ReplicaRefused | QuestionDeclined(_) | UpstreamBusy => Source::Gateway,
            CircuitOpen => Source::Upstream,
            _ => Source::Client,
        }
    }

    /// Whether the gateway may send the same request again on its own: only when
    /// the upstream cannot have seen it.
    pub fn retryable(&self) -> bool {
        matches!(self, Error::UpstreamUnreachable)
    }

    /// Seconds to put in `Retry-After` when it is not the default one second.
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            Error::RateLimited(limited) => Some(limited.retry_after_secs),
            _ => None,
        }
    }

    /// A short, bounded label for metrics.
    pub fn reason(&self) -> &'static str {
        use Error::*;
        match self {
            MethodNotAllowed => "method_not_allowed",
            OriginNotAllowed => "origin_not_allowed",
            HostNotAllowed => "host_not_allowed",
            UnsupportedMediaType => "unsupported_media_type",
            PayloadTooLarge(_) => "payload_too_large",
            BodyTimeout => "body_timeout",
            Parse | Malformed(_) => "parse_error",
            InvalidRequest(_) => "invalid_request",
            HeaderMismatch(_) => "header_mismatch",
            InvalidParams { .. } => "invalid_params",
            UnsupportedVersion { .. } => "unsupported_version",
            MethodNotFound(_) => "method_not_found",
            MissingCapability(_) => "missing_capability",
            Upstream { .. } => "upstream_error",
            Member { error, .. } => error.reason(),
            UpstreamUnreachable => "upstream_unreachable",
            UpstreamRefused => "upstream_refused",
            UpstreamTimeout => "upstream_timeout",
            UpstreamInvalid(_) => "upstream_invalid",
            UpstreamTooLarge => "upstream_too_large",
            ProcessStart { timed_out: true, .. } => "upstream_start_timeout",
            ProcessStart { timed_out: false, .. } => "upstream_start_failed",
            UpstreamDenied { client_token: true, .. } => "upstream_refused_token",
            UpstreamDenied { client_token: false, .. } => "upstream_refused_credentials",
            OutcomeUnknown => "outcome_unknown",
            Overloaded => "overloaded",
            RateLimited(_) => "rate_limited",
            UpstreamBusy => "upstream_busy",
            CircuitOpen => "circuit_open",
            QuestionDeclined(_) => "too_many_paused_calls",
            TooManySessions | TooManyNewSessions => "too_many_sessions",
            TooManyStreams => "too_many_streams",
            SessionRequired => "session_required",
            SessionNotFound => "session_not_found",
            ReplicaRefused => "replica_refused",
            Unauthorized(_) => "unauthorized",
            Forbidden(_) => "forbidden",
            Denied(_) => "denied",
            Internal(_) => "internal",
        }
    }

    pub fn status(&self) -> StatusCode {
        use Error::*;
        match self {
            MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            OriginNotAllowed | HostNotAllowed => StatusCode::FORBIDDEN,
            UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            Parse | Malformed(_) | InvalidRequest(_) | HeaderMismatch(_) | InvalidParams { .. } => {
                StatusCode::BAD_REQUEST
            }
            UnsupportedVersion { .. } | MissingCapability(_) => StatusCode::BAD_REQUEST,
            MethodNotFound(_) => StatusCode::NOT_FOUND,
            Member { error, .. } => error.status(),
            Upstream { code, .. } if *code == code::METHOD_NOT_FOUND => StatusCode::NOT_FOUND,
            // A 2026-07-28 error passed on in its shape has that revision's status.
            Upstream { code, data, .. } => spec_error_status(*code, data.as_ref()).unwrap_or(StatusCode::OK),
            UpstreamUnreachable | UpstreamRefused | UpstreamInvalid(_) | UpstreamTooLarge
            | OutcomeUnknown => StatusCode::BAD_GATEWAY,
            UpstreamTimeout | ProcessStart { timed_out: true, .. } => StatusCode::GATEWAY_TIMEOUT,
            ProcessStart { timed_out: false, .. } => StatusCode::BAD_GATEWAY,
            UpstreamDenied { status: 403, client_token: true } => StatusCode::FORBIDDEN,
            UpstreamDenied { client_token: true, .. } => StatusCode::UNAUTHORIZED,
            // The gateway's own credentials: nothing the client can fix.
            UpstreamDenied { client_token: false, .. } => StatusCode::BAD_GATEWAY,
            ReplicaRefused => StatusCode::BAD_GATEWAY,
            Overloaded => StatusCode::SERVICE_UNAVAILABLE,
            RateLimited(_) => StatusCode::TOO_MANY_REQUESTS,
            UpstreamBusy | CircuitOpen => StatusCode::SERVICE_UNAVAILABLE,
            SessionRequired => StatusCode::BAD_REQUEST,
            SessionNotFound => StatusCode::NOT_FOUND,
            QuestionDeclined(Declined::PrincipalFull)
            | TooManySessions
            | TooManyNewSessions
            | TooManyStreams => StatusCode::TOO_MANY_REQUESTS,
            QuestionDeclined(_) => StatusCode::SERVICE_UNAVAILABLE,
            Unauthorized(_) => StatusCode::UNAUTHORIZED,
            Forbidden(_) | Denied(_) => StatusCode::FORBIDDEN,
            Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The JSON-RPC `error` object. Upstream internals never appear here: only
    /// the upstream's own JSON-RPC error (a protocol answer) is passed on.
    pub fn rpc_error(&self, supported_versions: &[&str]) -> Value {
        use Error::*;
        let (code, message, data): (i64, String, Option<Value>) = match self {
            MethodNotAllowed | OriginNotAllowed | HostNotAllowed | UnsupportedMediaType => {
                (code::INVALID_REQUEST, self.to_string(), None)
            }
            PayloadTooLarge(_) | BodyTimeout => (code::INVALID_REQUEST, self.to_string(), None),
            Parse => (code::PARSE_ERROR, "Parse error".into(), None),
            Malformed(why) => (code::PARSE_ERROR, format!("Parse error: {why}"), None),
            InvalidRequest(m) => (code::INVALID_REQUEST, format!("Invalid request: {m}"), None),
            HeaderMismatch(m) => (code::HEADER_MISMATCH, format!("Header mismatch: {m}"), None),
            InvalidParams { message, data } => {
                (code::INVALID_PARAMS, format!("Invalid params: {message}"), data.clone())
            }
            UnsupportedVersion { requested } => (
                code::UNSUPPORTED_VERSION,
                "Unsupported protocol version".into(),
                Some(json!({"supported": supported_versions, "requested": requested})),
            ),
            MethodNotFound(m) => (code::METHOD_NOT_FOUND, format!("Method not found: {m}"), None),
            MissingCapability(caps) => (
                code::MISSING_CAPABILITY,
                "Missing required client capability".into(),
                Some(json!({"requiredCapabilities": caps})),
            ),
            Upstream { code, message, data } => (*code, message.clone(), data.clone()),
            UpstreamUnreachable | UpstreamRefused | UpstreamTimeout | UpstreamInvalid(_)
            | UpstreamTooLarge | OutcomeUnknown => {
                let message = match self {
                    UpstreamInvalid(why) => format!("{} ({why})", upstream_message(self)),
                    _ => upstream_message(self).into(),
                };
                (code::INTERNAL_ERROR, message, Some(json!({"reason": self.reason()})))
            }
            ProcessStart { timed_out, upstream } => {
                let name = upstream.as_deref().map(|n| format!(" `{n}`")).unwrap_or_default();
                let what = match timed_out {
                    true => "did not finish initialize within its start_timeout_ms",
                    false => "could not be started (it exited or could not be spawned; the gateway retries with backoff)",
                };
                let data = json!({"reason": self.reason(), "upstream": upstream});
                (code::INTERNAL_ERROR, format!("The process of upstream server{name} {what}"), Some(data))
            }
            UpstreamDenied { status: 403, client_token: true } => (
                code::FORBIDDEN,
                "Forbidden: the upstream server refused this caller".into(),
                Some(json!({"reason": self.reason()})),
            ),
            UpstreamDenied { client_token: true, .. } => (
                code::UNAUTHORIZED,
                "Unauthorized: the upstream server refused the token; get a new one (see WWW-Authenticate)"
                    .into(),
                Some(json!({"reason": self.reason()})),
            ),
            UpstreamDenied { client_token: false, .. } => (
                code::INTERNAL_ERROR,
                "Upstream server refused the gateway's credentials (gateway misconfiguration)".into(),
                Some(json!({"reason": self.reason()})),
            ),
            ReplicaRefused => (
                code::INTERNAL_ERROR,
                "Another gateway replica refused the forwarded retry (cluster misconfiguration)".into(),
                Some(json!({"reason": "replica_refused"})),
            ),
            Overloaded => (
                code::OVERLOADED,
                "Gateway overloaded, retry later".into(),
                Some(json!({"reason": "overloaded"})),
            ),
            RateLimited(limited) => (
                code::RATE_LIMITED,
                format!("Rate limit exceeded: {}; retry after {} s", limited.what, limited.retry_after_secs),
                Some(json!({"reason": "rate_limited", "limit": limited.limit,
                    "retryAfter": limited.retry_after_secs})),
            ),
            UpstreamBusy => (
                code::OVERLOADED,
                "The upstream server has as many requests in flight as this gateway allows it; retry later"
                    .into(),
                Some(json!({"reason": "upstream_busy"})),
            ),
            CircuitOpen => (
                code::OVERLOADED,
                "Every instance of the upstream server is down; no new work is sent to it until a \
                 health probe finds one answering. Retry later"
                    .into(),
                Some(json!({"reason": "circuit_open"})),
            ),
            QuestionDeclined(why) => (
                code::OVERLOADED,
                match why {
                    Declined::PrincipalFull => {
                        "The call ran and asked for input, but this caller already has as many paused \
                         calls as it may; the gateway declined the question on the caller's behalf. \
                         Finish or abandon paused calls, then call again."
                    }
                    Declined::Full => {
                        "The call ran and asked for input, but the gateway holds as many paused calls \
                         as it may; it declined the question on the caller's behalf. Call again later."
                    }
                    Declined::Closed => {
                        "The call ran and asked for input while the gateway was shutting down; it \
                         declined the question on the caller's behalf. Call again."
                    }
                }
                .into(),
                Some(json!({"reason": "too_many_paused_calls", "questionDeclined": true})),
            ),
            TooManySessions => (
                code::OVERLOADED,
                "This caller holds as many upstream sessions as it may, all busy; retry later".into(),
                Some(json!({"reason": "too_many_sessions"})),
            ),
            TooManyNewSessions => (
                code::OVERLOADED,
                "Too many new sessions opened in the last minute; retry later".into(),
                Some(json!({"reason": "too_many_sessions"})),
            ),
            TooManyStreams => (
                code::OVERLOADED,
                "This caller holds as many open streams as it may; close one first".into(),
                Some(json!({"reason": "too_many_streams"})),
            ),
            SessionRequired => {
                (code::INVALID_REQUEST, "Bad Request: Mcp-Session-Id header is required".into(), None)
            }
            SessionNotFound => (code::SESSION_NOT_FOUND, "Session not found".into(), None),
            Unauthorized(why) => (
                code::UNAUTHORIZED,
                "Unauthorized: send valid credentials as a bearer token (see WWW-Authenticate)".into(),
                Some(json!({"reason": why})),
            ),
            Forbidden(scope) => (
                code::FORBIDDEN,
                format!("Forbidden: the token lacks the scope this needs ({scope})"),
                Some(json!({"reason": "insufficient_scope", "scope": scope})),
            ),
            Denied(what) => (
                code::FORBIDDEN,
                format!("Forbidden: this caller may not use {what}"),
                Some(json!({"reason": "denied"})),
            ),
            Internal(_) => (code::INTERNAL_ERROR, "Internal error".into(), None),
            Member { member, error } => {
                let mut inner = error.rpc_error(supported_versions);
                let data = match inner.get_mut("data").map(Value::take) {
                    Some(Value::Object(mut data)) => {
                        data.insert("member".into(), json!(member));
                        Value::Object(data)
                    }
                    _ => json!({"member": member}),
                };
                inner["data"] = data;
                return inner;
            }
        };
        let mut err = json!({"code": code, "message": message});
        if let Some(data) = data {
            err["data"] = data;
        }
        err
    }
}

fn upstream_message(err: &Error) -> &'static str {
    match err {
        Error::UpstreamUnreachable => "Upstream server unreachable",
        Error::UpstreamTimeout => "Upstream server timed out",
        Error::UpstreamTooLarge => "Upstream response too large",
        Error::UpstreamRefused => "Upstream server speaks a protocol revision this gateway does not support",
        Error::OutcomeUnknown => "Upstream stream broke after the call was sent; its outcome is unknown",
        _ => "Upstream server sent an invalid response",
    }
}

/// The full JSON-RPC error response for `err`, echoing `id` (null when unknown).
pub fn error_body(id: Option<&Value>, err: &Error, supported_versions: &[&str]) -> Value {
    json!({
        "jsonrpc": "2.0",
        "id": id.cloned().unwrap_or(Value::Null),
        "error": err.rpc_error(supported_versions),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_follow_the_design_table() {
        assert_eq!(Error::MethodNotFound("ping".into()).status(), 404);
        assert_eq!(Error::HeaderMismatch("x".into()).status(), 400);
        assert_eq!(Error::UpstreamTimeout.status(), 504);
        assert_eq!(Error::OutcomeUnknown.status(), 502);
        let up = Error::Upstream { code: -32601, message: "nope".into(), data: None };
        assert_eq!(up.status(), 404);
        let up = Error::Upstream { code: -32602, message: "bad".into(), data: None };
        assert_eq!(up.status(), 200);
    }

    #[test]
    fn spec_errors_are_known_by_code_and_shape() {
        let caps = json!({"requiredCapabilities": {"elicitation": {}}});
        assert_eq!(spec_error_status(-32021, Some(&caps)), Some(StatusCode::BAD_REQUEST));
        for bad in [json!({"requiredCapabilities": "elicitation"}), json!({}), json!([1]), json!("x")] {
            assert_eq!(spec_error_status(-32021, Some(&bad)), None, "{bad}");
        }
        assert_eq!(spec_error_status(-32021, None), None);
        assert_eq!(spec_error_status(-32020, None), Some(StatusCode::BAD_REQUEST));
        let version = json!({"supported": ["2026-07-28"], "requested": "1900-01-01"});
        assert_eq!(spec_error_status(-32022, Some(&version)), Some(StatusCode::BAD_REQUEST));
        for bad in [json!({"supported": ["2026-07-28"]}), json!({"supported": [1], "requested": "x"})] {
            assert_eq!(spec_error_status(-32022, Some(&bad)), None, "{bad}");
        }
        for undefined in [-32042, -32023, -32099, -32002, -32603] {
            assert_eq!(spec_error_status(undefined, Some(&caps)), None, "{undefined}");
        }
        let up = Error::Upstream { code: -32021, message: "m".into(), data: Some(caps) };
        assert_eq!(up.status(), 400);
        let up = Error::Upstream { code: -32021, message: "m".into(), data: Some(json!(1)) };
        assert_eq!(up.status(), 200);
    }

    #[test]
    fn bodies_echo_the_id_and_hide_internals() {
        let body = error_body(Some(&json!(7)), &Error::Internal("secret path".into()), &[]);
        assert_eq!(body["id"], 7);
        assert!(!body.to_string().contains("secret"));
        let body = error_body(None, &Error::Parse, &[]);
        assert!(body["id"].is_null());
        assert_eq!(body["error"]["code"], -32700);
    }

    #[test]
    fn unsupported_version_lists_what_is_supported() {
        let err = Error::UnsupportedVersion { requested: "1900-01-01".into() };
        let body = error_body(Some(&json!("a")), &err, &["2026-07-28"]);
        assert_eq!(body["error"]["data"]["supported"][0], "2026-07-28");
        assert_eq!(body["error"]["data"]["requested"], "1900-01-01");
    }

    #[test]
    fn upstream_failures_carry_a_reason() {
        let body = error_body(Some(&json!(1)), &Error::OutcomeUnknown, &[]);
        assert_eq!(body["error"]["data"]["reason"], "outcome_unknown");
        assert_eq!(body["error"]["code"], -32603);
    }
}
