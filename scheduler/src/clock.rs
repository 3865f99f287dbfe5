//! The scheduler's clock in Rust: the database's notion of now (`herald.now()`), which is the
//! wall clock plus a skew that only tests set (`herald.set_test_clock`, migration V10). Every
//! replica follows the skew through the `herald_clock` notification, so Rust code that needs
//! "now" for a decision the database also makes (a schedule's next fire time, a campaign's
//! start) agrees with SQL. Durations to sleep are always computed by the database.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};

/// Now, as the database sees it. Cheap to clone; clones share the skew.
#[derive(Debug, Clone, Default)]
pub struct Clock {
    skew_ms: Arc<AtomicI64>,
}

impl Clock {
    /// The current instant by herald's clock.
    pub fn now(&self) -> DateTime<Utc> {
        Utc::now() + Duration::milliseconds(self.skew_ms.load(Ordering::Relaxed))
    }

    /// Follows a new skew (tests only: production never sets one).
    pub fn set_skew_ms(&self, ms: i64) {
        self.skew_ms.store(ms, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_skew_moves_now() {
        let clock = Clock::default();
        let before = clock.now();
        clock.set_skew_ms(86_400_000);
        assert!(clock.now() - before >= Duration::hours(24));
    }
}
