//! Reading a client's request body: under the size limit, the whole-body and
//! idle-gap timeouts, and a budget of body bytes that all requests share, so
//! that bodies in memory are bounded however many requests there are.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;

use crate::config::ConnLimits;
use crate::error::Error;

/// Request-body bytes all requests may hold at once.
pub struct Budget {
    left: AtomicUsize,
}

impl Budget {
    pub fn new(bytes: usize) -> Arc<Budget> {
        Arc::new(Budget { left: AtomicUsize::new(bytes) })
    }

    /// Adds `bytes` to `share`, or refuses when the budget cannot spare them.
    fn take(&self, share: &mut Share, bytes: usize) -> Result<(), Error> {
        self.left
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |left| left.checked_sub(bytes))
            .map_err(|_| Error::Overloaded)?;
        share.bytes += bytes;
        Ok(())
    }
}

/// A body's part of the [`Budget`], given back when dropped.
pub struct Share {
    budget: Arc<Budget>,
    bytes: usize,
}

impl Drop for Share {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.budget.left.fetch_add(self.bytes, Ordering::AcqRel);
        }
    }
}

/// Reads `body` whole. Bytes are charged to the budget as they arrive (a
/// declared length reserves nothing: a head alone holds no budget), and a body
/// that finds the budget spent is refused (503). A body that arrived with its
/// head costs no timer and no copy.
pub async fn read(
    body: Incoming,
    max: usize,
    limits: &ConnLimits,
    budget: &Arc<Budget>,
) -> Result<(Bytes, Share), Error> {
    let deadline = tokio::time::Instant::now() + limits.body_timeout;
    let declared = hyper::body::Body::size_hint(&body).exact().and_then(|n| usize::try_from(n).ok());
    if declared.is_some_and(|n| n > max) {
        return Err(Error::PayloadTooLarge(max));
    }
    let mut share = Share { budget: budget.clone(), bytes: 0 };
    let mut body = Limited::new(body, max);
    // Frames are kept as they came and joined once at the end (no buffer
    // that doubles as it grows).
    let mut frames: Vec<Bytes> = Vec::new();
    loop {
        let gap = (tokio::time::Instant::now() + limits.body_idle_timeout).min(deadline);
        let frame = match tokio::time::timeout_at(gap, body.frame()).await {
            Err(_) => return Err(Error::BodyTimeout),
            Ok(None) => break,
            Ok(Some(Ok(frame))) => frame,
            Ok(Some(Err(e))) if e.is::<http_body_util::LengthLimitError>() => {
                return Err(Error::PayloadTooLarge(max))
            }
            Ok(Some(Err(_))) => return Err(Error::InvalidRequest("could not read the body".into())),
        };
        let Ok(data) = frame.into_data() else { continue };
        budget.take(&mut share, data.len())?;
        if !data.is_empty() {
            frames.push(data);
        }
    }
    let bytes = match frames.len() {
        0 => Bytes::new(),
        1 => frames.pop().unwrap_or_default(),
        _ => {
            let mut joined = BytesMut::with_capacity(share.bytes);
            frames.iter().for_each(|f| joined.extend_from_slice(f));
            joined.freeze()
        }
    };
    Ok((bytes, share))
}

/// The request id, when the body is already here in full and small (an
/// overloaded gateway echoes it without waiting for anything).
pub fn ready_id(body: Incoming) -> Option<serde_json::Value> {
    use futures_util::FutureExt;
    #[derive(serde::Deserialize)]
    struct IdOnly {
        id: Option<serde_json::Value>,
    }
    let mut body = Limited::new(body, READY_ID_BYTES);
    let mut data = Vec::new();
    loop {
        match body.frame().now_or_never()? {
            None => break,
            Some(Ok(frame)) => data.extend_from_slice(frame.data_ref()?),
            Some(Err(_)) => return None,
        }
    }
    serde_json::from_slice::<IdOnly>(&data).ok()?.id
}

/// Largest body an overloaded gateway looks into for the request id.
const READY_ID_BYTES: usize = 64 * 1024;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_are_exact_and_given_back() {
        let budget = Budget::new(10);
        let mut a = Share { budget: budget.clone(), bytes: 0 };
        for _ in 0..10 {
            budget.take(&mut a, 1).unwrap();
        }
        let mut b = Share { budget: budget.clone(), bytes: 0 };
        assert!(matches!(budget.take(&mut b, 1), Err(Error::Overloaded)), "one byte over");
        drop(a);
        assert_eq!(budget.left.load(Ordering::Acquire), 10, "all given back");
        budget.take(&mut b, 10).unwrap();
    }
}
