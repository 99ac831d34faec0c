//! The seam between the two halves of a call (DESIGN §10).
//!
//! A *client half* turns what a client sent into a typed 2026 [`Call`] and
//! its [`Outcome`] back into what that client reads: the front door and the
//! writer of 2026 answers for 2026 clients; the translated session of a
//! legacy client ([`super::legacy_client`]). An *upstream half* runs a call
//! on one kind of server and says how it ended: pooled legacy sessions with
//! their questions turned into rounds ([`super::sessions`]), or a
//! stateless 2026 server ([`super::stateless`]). The server picks one of
//! each; neither half knows which the other is.
//!
//! Between them: the call in; notifications on the way (progress, log
//! messages, keep-alives, written by the upstream half to the client's
//! [`Reply`], which the client half owns and which speaks every generation
//! the same way); one [`Outcome`] out.

use std::future::Future;

use serde_json::{Map, Value};

use super::relay::Rewrite;
use super::{Caller, Target};
use crate::error::Error;
use crate::front::Call;
use crate::reply::{Body, Reply};
use http::Response;

/// How a call ended, as an upstream half says it.
#[derive(Debug)]
pub enum Outcome {
    /// The call's result.
    Complete(Payload),
    /// Questions for the user: the `input_required` result, with its
    /// `inputRequests` and the `requestState` the retry must carry back
    /// (sealed by the upstream half when it is the gateway's own).
    InputRequired(Map<String, Value>),
    /// The call failed: the gateway's error, or the upstream's JSON-RPC
    /// error object.
    Failed(Failure),
    /// The client left; the upstream was told to stop where it could be.
    Gone,
    /// Answered whole by the replica that holds the call (a 2026 client's
    /// retry, forwarded there): for the client half that sent the retry.
    Answered(Box<Response<Body>>),
}

/// A result: as a tree, or as JSON text already shaped (the common case
/// of a 2026 client, passed on without building a tree).
#[derive(Debug)]
pub enum Payload {
    Tree(Map<String, Value>),
    Text(String),
}

impl Payload {
    /// The result as a tree (text is parsed).
    pub fn into_tree(self) -> Result<Map<String, Value>, Error> {
        match self {
            Payload::Tree(tree) => Ok(tree),
            Payload::Text(text) => {
                serde_json::from_str(&text).map_err(|_| Error::UpstreamInvalid("result is not an object"))
            }
        }
    }
}

/// Why a call failed.
#[derive(Debug)]
pub enum Failure {
    /// The gateway's own refusal or an upstream it could not use.
    Gateway(Error),
    /// The upstream's JSON-RPC error object (`code`, `message`, `data`).
    Upstream(Value),
}

impl Outcome {
    /// A result as its `resultType` says: complete, or questions.
    pub fn of_result(result: Map<String, Value>) -> Outcome {
        match result.get("resultType").and_then(Value::as_str) {
            Some("input_required") => Outcome::InputRequired(result),
            _ => Outcome::Complete(Payload::Tree(result)),
        }
    }

    /// Whether the upstream could not be reached (it may come back as
    /// another generation: [`Target::observed`]).
    pub fn unreachable(&self) -> bool {
        matches!(self, Outcome::Failed(Failure::Gateway(Error::UpstreamUnreachable)))
    }

    /// The metric outcome of a call that ended so (a round of questions
    /// is an answer like a result).
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Complete(_) | Outcome::InputRequired(_) => "ok",
            Outcome::Failed(Failure::Gateway(e)) => e.reason(),
            Outcome::Failed(Failure::Upstream(_)) => "upstream_error",
            Outcome::Gone => "cancelled",
            Outcome::Answered(_) => "forwarded",
        }
    }
}

impl From<Error> for Outcome {
    fn from(e: Error) -> Outcome {
        Outcome::Failed(Failure::Gateway(e))
    }
}

/// An upstream half: runs one call to its outcome. `notes` is the client's
/// answer, for notifications on the way (and to notice a client that left);
/// the outcome itself is never written to it.
pub trait UpstreamHalf: Send + Sync {
    fn call(
        &self,
        target: &Target,
        call: Call,
        caller: &Caller,
        notes: &mut Reply,
    ) -> impl Future<Output = Outcome> + Send;

    /// The upstream's stream of list changes for `call` (a
    /// `subscriptions/listen`), as an SSE answer whose events `rewrite`
    /// shapes for the client; `hold` lives as long as the stream.
    fn listen(
        &self,
        target: &Target,
        call: Call,
        caller: &Caller,
        rewrite: Rewrite,
        hold: Box<dyn std::any::Any + Send + Sync>,
    ) -> impl Future<Output = Result<Response<Body>, Error>> + Send;
}
