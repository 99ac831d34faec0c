//! Why a `requestState` was refused, in every cell that opens one: the
//! metrics label and the client's error (400, -32602, `data.reason`).

use serde_json::json;

use crate::error::Error;

/// Why a `requestState` was refused; each is a `data.reason` and a metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejected {
    Invalid,
    Expired,
    WrongPrincipal,
    WrongRequest,
    FlowGone,
    StaleRound,
    /// The owner replica is gone and the upstream stream cannot be resumed.
    FlowLost,
    /// The upstream instance holding the call cannot be reached, or this
    /// route no longer has it.
    InstanceGone,
}

impl Rejected {
    pub fn reason(self) -> &'static str {
        match self {
            Rejected::Invalid => "invalid",
            Rejected::Expired => "expired",
            Rejected::WrongPrincipal => "wrong_principal",
            Rejected::WrongRequest => "wrong_request",
            Rejected::FlowGone => "flow_finished",
            Rejected::StaleRound => "stale_round",
            Rejected::FlowLost => "flow_lost",
            Rejected::InstanceGone => "instance_unreachable",
        }
    }

    pub fn error(self) -> Error {
        let message = match self {
            Rejected::Invalid => "requestState is not valid",
            Rejected::Expired => "requestState expired: the paused call was abandoned; start the call again",
            Rejected::WrongPrincipal => "requestState was issued to another caller",
            Rejected::WrongRequest => "requestState belongs to another request (method, name or arguments differ)",
            Rejected::FlowGone => {
                "requestState refers to a call that has finished or is no longer paused; start the call again"
            }
            Rejected::StaleRound => "requestState is from an earlier round of this call",
            Rejected::FlowLost => {
                "the gateway replica holding this call is gone and the upstream call cannot be resumed; start the call again"
            }
            Rejected::InstanceGone => {
                "the upstream instance holding this call cannot be reached; start the call again"
            }
        };
        Error::InvalidParams { message: message.into(), data: Some(json!({"reason": self.reason()})) }
    }
}
