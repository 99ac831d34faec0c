//! The gateway as a client of its upstreams, used by every cell: the
//! message channel a legacy session is reached through ([`channel`]), a
//! small hardened HTTP/1.1 client ([`h1`]), size limits on what comes back
//! ([`event_limit`]), and the MCP Streamable HTTP exchanges on top
//! ([`transport`]: the channel over HTTP, POST on a session, the GET
//! stream, DELETE, SSE reading; the raw exchanges of the pass-through and
//! the relay).

pub mod answers;
pub mod channel;
pub mod credentials;
pub(crate) mod event_limit;
pub(crate) mod h1;
pub mod health;
pub mod probe;
pub mod stdio;
pub mod transport;

pub use channel::{map_send_error, Channel, SendError, SessionWire};
pub use stdio::Stdio;
pub use transport::{sse_data, Transport, ACCEPT_BOTH};
