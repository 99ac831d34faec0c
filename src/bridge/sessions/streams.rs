//! What a call on a legacy session reads: its own messages, and the
//! session's when the call has the session to itself.

use serde_json::Value;

use crate::upstream::channel::{Messages, StreamEnd};

/// A call's stream of messages, plus the session's own when the call has
/// the session to itself (a legacy server may ask `roots/list` there).
pub struct Streams {
    pub post: Box<dyn Messages>,
    pub get: Option<Box<dyn Messages>>,
}

impl Streams {
    /// The next message from either stream; the end of the session's own
    /// only stops reading it.
    pub async fn next(&mut self) -> Result<Value, StreamEnd> {
        loop {
            let Some(get) = self.get.as_mut() else {
                return self.post.next().await;
            };
            tokio::select! {
                biased;
                msg = self.post.next() => return msg,
                msg = get.next() => match msg {
                    Ok(v) => return Ok(v),
                    Err(_) => self.get = None,
                },
            }
        }
    }
}
