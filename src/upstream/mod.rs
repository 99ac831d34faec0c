//! The gateway as an HTTP client of its upstreams, used by every cell: a
//! small hardened HTTP/1.1 client ([`h1`]), size limits on what comes back
//! ([`event_limit`]), and the MCP Streamable HTTP exchanges on top
//! ([`transport`]: POST on a session, the GET stream, DELETE, SSE reading).

pub mod answers;
pub mod credentials;
pub(crate) mod event_limit;
pub(crate) mod h1;
pub mod health;
pub mod probe;
pub mod transport;

pub use transport::{
    map_post_error, sse_data, EventStream, PostError, Reply, SessionWire, StreamEnd, Streams, Transport,
    ACCEPT_BOTH,
};
