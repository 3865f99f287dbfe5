//! Builders for test inputs.

use std::time::{Duration, SystemTime};

use herald_proto::v1::{content, task_spec, Content, TaskSpec};

/// A unique identifier with a readable prefix, for queues, recipients and idempotency keys that
/// must not collide between tests sharing a cluster.
pub fn unique_id(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

/// A task sending `text` to `recipient` on `queue`, due now, every other field at its default.
/// Refine it with [`TaskSpecExt`].
pub fn task_spec(queue: &str, recipient: &str, text: &str) -> TaskSpec {
    TaskSpec {
        queue: queue.to_owned(),
        recipient: recipient.to_owned(),
        content: Some(Content {
            body: Some(content::Body::Text(text.to_owned())),
            ..Default::default()
        }),
        ..TaskSpec::default()
    }
}

/// Chainable refinements of a [`TaskSpec`].
pub trait TaskSpecExt: Sized {
    /// Due `delay` after the server receives the request.
    fn with_delay(self, delay: Duration) -> Self;
    /// Due at `at`.
    fn with_run_at(self, at: SystemTime) -> Self;
    /// Created idempotently under `key`.
    fn with_idempotency_key(self, key: &str) -> Self;
    /// At most `attempts` charged attempts.
    fn with_max_attempts(self, attempts: i32) -> Self;
    /// Ends EXPIRED if not sent by `at`.
    fn with_expire_at(self, at: SystemTime) -> Self;
    /// Adds one label.
    fn with_label(self, key: &str, value: &str) -> Self;
}

impl TaskSpecExt for TaskSpec {
    fn with_delay(mut self, delay: Duration) -> Self {
        // Test delays are seconds to hours, far inside prost's Duration range.
        self.when = prost_types::Duration::try_from(delay)
            .ok()
            .map(task_spec::When::Delay);
        self
    }

    fn with_run_at(mut self, at: SystemTime) -> Self {
        self.when = Some(task_spec::When::RunAt(at.into()));
        self
    }

    fn with_idempotency_key(mut self, key: &str) -> Self {
        self.idempotency_key = key.to_owned();
        self
    }

    fn with_max_attempts(mut self, attempts: i32) -> Self {
        self.max_attempts = Some(attempts);
        self
    }

    fn with_expire_at(mut self, at: SystemTime) -> Self {
        self.expire_at = Some(at.into());
        self
    }

    fn with_label(mut self, key: &str, value: &str) -> Self {
        self.labels.insert(key.to_owned(), value.to_owned());
        self
    }
}
