//! Bounds for the steps of a shutdown after the drain (declining parked
//! flows, closing upstream sessions, exporting the last spans): each step
//! has its own time, cut to [`HURRIED`] once a second signal asks to stop
//! now ([`crate::Stopper::now`]).

use std::future::Future;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// The most any step still takes once `hurry` is cancelled.
pub const HURRIED: Duration = Duration::from_secs(1);

/// `step`'s output, or `None` when it took longer than `limit`, or than
/// [`HURRIED`] from the moment `hurry` is cancelled (at once when it was).
pub async fn bounded<F: Future>(step: F, limit: Duration, hurry: &CancellationToken) -> Option<F::Output> {
    let hurried = async {
        hurry.cancelled().await;
        tokio::time::sleep(HURRIED).await;
    };
    tokio::select! {
        out = step => Some(out),
        _ = tokio::time::sleep(limit) => None,
        _ = hurried => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_step_gets_its_limit_or_a_second_after_the_hurry() {
        let hurry = CancellationToken::new();
        let slow = || tokio::time::sleep(Duration::from_secs(60));
        let started = tokio::time::Instant::now();
        assert!(bounded(slow(), Duration::from_secs(5), &hurry).await.is_none());
        assert_eq!(started.elapsed(), Duration::from_secs(5));

        let started = tokio::time::Instant::now();
        let hurrying = hurry.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(2)).await;
            hurrying.cancel();
        });
        assert!(bounded(slow(), Duration::from_secs(30), &hurry).await.is_none());
        assert_eq!(started.elapsed(), Duration::from_secs(2) + HURRIED);

        // Already hurried: a second at most.
        let started = tokio::time::Instant::now();
        assert!(bounded(slow(), Duration::from_secs(30), &hurry).await.is_none());
        assert_eq!(started.elapsed(), HURRIED);
        // A quick step is never cut.
        assert_eq!(bounded(async { 7 }, Duration::from_secs(30), &hurry).await, Some(7));
    }
}
