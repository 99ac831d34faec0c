//! Why a sealed value was refused, in every cell and for every purpose: one
//! enum, one metric label each, one mapping to the client's error.

use serde_json::json;

use super::Purpose;
use crate::error::Error;
use crate::metrics::{Metrics, ReasonLabels};

/// Why a sealed value was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejected {
    /// Not a blob at all (not base64url, truncated, not the payload of its kind).
    Malformed,
    /// Altered, or sealed under another key ring.
    Forged,
    /// Sealed under a key this gateway no longer has.
    UnknownKey,
    /// Sealed by this gateway for another purpose (a cursor sent as a `requestState`...).
    WrongPurpose,
    /// Longer than its purpose allows (refused before decrypting).
    TooLarge,
    /// A format this build does not know (sealed by a newer one).
    UnknownVersion,
    OtherRoute,
    OtherPrincipal,
    /// Issued for another method, name or arguments.
    OtherRequest,
    Expired,
    /// Sealed for an upstream instance its route no longer has.
    OtherInstance,
    /// A relayed session's id on a route whose legacy clients are now
    /// translated, or the reverse (the upstream changed).
    OtherCell,
    /// The paused call it names has finished or is no longer parked.
    FlowGone,
    /// An earlier round of the call it names.
    StaleRound,
    /// The owner replica is gone and the upstream stream cannot be resumed.
    FlowLost,
    /// The upstream instance holding the call or session cannot be reached,
    /// or its route no longer has it.
    InstanceGone,
    /// The upstream no longer knows the session.
    UpstreamGone,
}

impl Rejected {
    /// The metric label and the client's `data.reason`. Every "not one of
    /// ours for this use" is `invalid` to both; [`Rejected::detail`] tells
    /// them apart in logs.
    pub fn reason(self) -> &'static str {
        match self {
            Rejected::Malformed
            | Rejected::Forged
            | Rejected::UnknownKey
            | Rejected::WrongPurpose
            | Rejected::TooLarge
            | Rejected::UnknownVersion => "invalid",
            Rejected::OtherRoute => "other_route",
            Rejected::OtherPrincipal => "wrong_principal",
            Rejected::OtherRequest => "wrong_request",
            Rejected::Expired => "expired",
            Rejected::OtherInstance => "other_instance",
            Rejected::OtherCell => "other_cell",
            Rejected::FlowGone => "flow_finished",
            Rejected::StaleRound => "stale_round",
            Rejected::FlowLost => "flow_lost",
            Rejected::InstanceGone => "instance_unreachable",
            Rejected::UpstreamGone => "upstream_gone",
        }
    }

    /// The precise reason, for logs.
    pub fn detail(self) -> &'static str {
        match self {
            Rejected::Malformed => "malformed",
            Rejected::Forged => "forged",
            Rejected::UnknownKey => "unknown_key",
            Rejected::WrongPurpose => "wrong_purpose",
            Rejected::TooLarge => "too_large",
            Rejected::UnknownVersion => "unknown_version",
            other => other.reason(),
        }
    }

    /// Counts the refusal (the purpose's metric, on `route`) and returns
    /// the client's error.
    pub fn refuse(self, purpose: Purpose, route: &str, metrics: &Metrics) -> Error {
        let family = match purpose {
            Purpose::FlowState | Purpose::UpstreamState => Some(&metrics.request_state_rejected),
            Purpose::LegacySession => Some(&metrics.session_tokens_rejected),
            Purpose::Cursor | Purpose::Question | Purpose::FederatedCursor => None,
        };
        if let Some(family) = family {
            family.get_or_create(&ReasonLabels { route: route.to_string(), reason: self.reason() }).inc();
        }
        tracing::debug!(route, purpose = purpose.what(), reason = self.detail(), "sealed value refused");
        self.error(purpose)
    }

    /// The client's error: a legacy session id is unknown (404); anything
    /// else is a bad parameter (400, -32602) with `data.reason`.
    pub fn error(self, purpose: Purpose) -> Error {
        let message = match purpose {
            Purpose::LegacySession => return Error::SessionNotFound,
            Purpose::FlowState | Purpose::UpstreamState => self.state_message().to_string(),
            Purpose::Cursor | Purpose::Question | Purpose::FederatedCursor => {
                format!("invalid {}", purpose.what())
            }
        };
        Error::InvalidParams { message, data: Some(json!({"reason": self.reason()})) }
    }

    fn state_message(self) -> &'static str {
        match self {
            Rejected::Expired => "requestState expired: the paused call was abandoned; start the call again",
            Rejected::OtherPrincipal => "requestState was issued to another caller",
            Rejected::OtherRequest => "requestState belongs to another request (method, name or arguments differ)",
            Rejected::OtherRoute => "requestState was issued on another route",
            Rejected::FlowGone => {
                "requestState refers to a call that has finished or is no longer paused; start the call again"
            }
            Rejected::StaleRound => "requestState is from an earlier round of this call",
            Rejected::FlowLost => {
                "the gateway replica holding this call is gone and the upstream call cannot be resumed; start the call again"
            }
            Rejected::InstanceGone | Rejected::OtherInstance | Rejected::UpstreamGone => {
                "the upstream instance holding this call cannot be reached; start the call again"
            }
            _ => "requestState is not valid",
        }
    }
}
