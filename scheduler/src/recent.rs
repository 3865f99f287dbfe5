//! A value worked out at most once per interval and shared by everyone who asks meanwhile.
//!
//! The unauthenticated endpoints (`/readyz`, and `/metrics` unless protected) read the
//! database. Worked out per request, a flood of them would take every pooled connection and
//! starve the lease path; through a [`Recent`], a flood costs one read per interval, and the
//! callers that arrive while it runs wait for it and share its answer.

use std::time::Duration;

use tokio::sync::Mutex;
use tokio::time::Instant;

/// The last value worked out and when; see the module's text.
#[derive(Debug)]
pub struct Recent<T> {
    fresh_for: Duration,
    last: Mutex<Option<(Instant, T)>>,
}

impl<T: Clone> Recent<T> {
    /// Reuses a value for `fresh_for` after it was worked out.
    pub const fn new(fresh_for: Duration) -> Self {
        Self {
            fresh_for,
            last: Mutex::const_new(None),
        }
    }

    /// The value worked out less than the interval ago, or a new one from `work`. One `work`
    /// runs at a time: callers arriving meanwhile wait for it and get its answer.
    pub async fn get<F>(&self, work: impl FnOnce() -> F) -> T
    where
        F: std::future::Future<Output = T>,
    {
        let mut last = self.last.lock().await;
        if let Some((at, value)) = last.as_ref() {
            if at.elapsed() < self.fresh_for {
                return value.clone();
            }
        }
        let value = work().await;
        *last = Some((Instant::now(), value.clone()));
        value
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn works_once_per_interval_however_many_ask() {
        let recent = Arc::new(Recent::new(Duration::from_secs(1)));
        let runs = Arc::new(AtomicU32::new(0));
        let ask = |recent: Arc<Recent<u32>>, runs: Arc<AtomicU32>| async move {
            recent
                .get(|| async {
                    // Long enough that the other callers arrive while it runs.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    runs.fetch_add(1, Ordering::SeqCst) + 1
                })
                .await
        };
        let flood: Vec<_> = (0..50)
            .map(|_| tokio::spawn(ask(recent.clone(), runs.clone())))
            .collect();
        for caller in flood {
            assert_eq!(
                caller.await.ok(),
                Some(1),
                "every caller shares the one answer"
            );
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        tokio::time::advance(Duration::from_millis(500)).await;
        assert_eq!(ask(recent.clone(), runs.clone()).await, 1, "still fresh");
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(
            ask(recent.clone(), runs.clone()).await,
            2,
            "worked out again"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 2);
    }
}
