//! The delivery repository: providers' reports about messages after accepting them
//! (`herald.delivery_events`, migration V12), kept once per (message id, state) and folded into
//! a task's delivery when read.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use tokio_postgres::Row;
use uuid::Uuid;

use super::sql::{column, statement, Statement};
use super::tasks::columns::state as task_state;
use super::{repository, StoreError};
use crate::callbacks::{Delivery, DeliveryState, StatusReport};
use crate::tasks::model::TaskState;

repository!(
    /// Delivery reports and the deliveries folded from them.
    DeliveryRepo
);

/// Which delivery reports speak for a task (`herald.task_reports`), applied by the migrator
/// whenever it changes.
pub const FUNCTIONS_SQL: &str = include_str!("functions.sql");

const LOCK_MESSAGES: Statement = statement!("lock_messages");
const RECORD_EVENTS: Statement = statement!("record_events");
const LINK_EVENTS: Statement = statement!("link_events");
const FAIL_DELIVERED: Statement = statement!("fail_delivered");
const TASK_DELIVERIES: Statement = statement!("task_deliveries");
const ACCEPT_AWAITING: Statement = statement!("accept_awaiting");
const AWAIT_CALLBACKS: Statement = statement!("await_callbacks");
const PIN_ATTEMPT_MESSAGES: Statement = statement!("pin_attempt_messages");
const LOCK_TASKS: Statement = statement!("lock_tasks");
const WINDOW_CLOSED: Statement = statement!("window_closed");
const RETRY_DELIVERED: Statement = statement!("retry_delivered");
const FAILED_TASKS: Statement = statement!("failed_tasks");

/// A task a report of unknown outcome changed (`await_callbacks.sql`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AwaitedSend {
    /// The task.
    pub task_id: Uuid,
    /// Its state now: SCHEDULED (waiting for a callback) or SUCCEEDED (one came first).
    pub state: TaskState,
    /// Its due time now.
    pub run_at: DateTime<Utc>,
    /// The report that came first is a failure: to be settled as a late failure.
    pub failed: bool,
}

/// A report that was recorded, or tied to its task, by this transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// The provider's message id.
    pub provider_message_id: String,
    /// The state it reports.
    pub state: DeliveryState,
    /// Its task, when known.
    pub task_id: Option<Uuid>,
}

/// The row's `state` column as a state.
fn state(r: &Row) -> Result<DeliveryState, StoreError> {
    let code: i16 = column(r, "state")?;
    DeliveryState::from_code(code)
        .ok_or_else(|| StoreError::Corrupt(format!("delivery_events.state {code} is not a state")))
}

fn recorded(rows: &[Row]) -> Result<Vec<Recorded>, StoreError> {
    rows.iter()
        .map(|r| {
            Ok(Recorded {
                provider_message_id: column(r, "provider_message_id")?,
                state: state(r)?,
                task_id: column(r, "task_id")?,
            })
        })
        .collect()
}

impl<C: GenericClient> DeliveryRepo<'_, C> {
    /// Ends SUCCEEDED the tasks waiting, after a WhatsApp lease ran out unreported, for a
    /// status callback: one named them, as (task, message id) pairs. Returns them.
    pub async fn accept_awaiting(
        &self,
        namespace: &str,
        named: &[(Uuid, &str)],
    ) -> Result<Vec<Uuid>, StoreError> {
        if named.is_empty() {
            return Ok(Vec::new());
        }
        let tasks: Vec<Uuid> = named.iter().map(|n| n.0).collect();
        let ids: Vec<&str> = named.iter().map(|n| n.1).collect();
        ACCEPT_AWAITING
            .query(self.db, &[&namespace, &tasks, &ids])
            .await?
            .iter()
            .map(|r| column(r, "id"))
            .collect()
    }

    /// Makes the tasks a report just rescheduled after a send of unknown outcome wait `grace`
    /// for a status callback where their provider sends one (`await_callbacks.sql`); those
    /// (rescheduled or just ended) a report already named end SUCCEEDED. Returns each task
    /// changed.
    pub async fn await_callbacks(
        &self,
        namespace: &str,
        tasks: &[Uuid],
        grace: std::time::Duration,
    ) -> Result<Vec<AwaitedSend>, StoreError> {
        if tasks.is_empty() {
            return Ok(Vec::new());
        }
        let grace_ms = i64::try_from(grace.as_millis()).unwrap_or(i64::MAX);
        AWAIT_CALLBACKS
            .query(self.db, &[&namespace, &tasks, &grace_ms])
            .await?
            .iter()
            .map(|r| {
                Ok(AwaitedSend {
                    task_id: column(r, "id")?,
                    state: task_state(r, "state")?,
                    run_at: column(r, "run_at")?,
                    failed: column(r, "failed")?,
                })
            })
            .collect()
    }

    /// Waits for, then holds until the transaction ends, the lock of each task whose send may
    /// have gone out (`lock_tasks.sql`): a report of unknown outcome and a callback naming the
    /// task take it, so each sees what the other committed. After [`Self::lock_messages`].
    pub async fn lock_tasks(&self, namespace: &str, tasks: &[Uuid]) -> Result<(), StoreError> {
        if tasks.is_empty() {
            return Ok(());
        }
        LOCK_TASKS.query_one(self.db, &[&namespace, &tasks]).await?;
        Ok(())
    }

    /// Waits for, then holds until the transaction ends, the lock of each provider message id:
    /// every transaction that records reports about a message or the send that returned it
    /// takes it first, so each sees what the other committed.
    pub async fn lock_messages(
        &self,
        namespace: &str,
        provider_message_ids: &[&str],
    ) -> Result<(), StoreError> {
        if provider_message_ids.is_empty() {
            return Ok(());
        }
        LOCK_MESSAGES
            .query_one(self.db, &[&namespace, &provider_message_ids])
            .await?;
        Ok(())
    }

    /// Records reports of `namespace`; returns those that were new or newly tied to a task.
    pub async fn record(
        &self,
        namespace: &str,
        reports: &[StatusReport],
    ) -> Result<Vec<Recorded>, StoreError> {
        if reports.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<&str> = reports
            .iter()
            .map(|r| r.provider_message_id.as_str())
            .collect();
        let states: Vec<i16> = reports.iter().map(|r| r.state.code()).collect();
        let tasks: Vec<Option<Uuid>> = reports.iter().map(|r| r.task_id).collect();
        let at: Vec<Option<DateTime<Utc>>> = reports.iter().map(|r| r.occurred_at).collect();
        let codes: Vec<Option<i64>> = reports.iter().map(|r| r.error_code).collect();
        let errors: Vec<Option<&str>> = reports.iter().map(|r| r.error.as_deref()).collect();
        let rows = RECORD_EVENTS
            .query(
                self.db,
                &[&ids, &states, &tasks, &at, &codes, &errors, &namespace],
            )
            .await?;
        recorded(&rows)
    }

    /// Pins the messages failure reports name by task and attempt to those attempts' rows where
    /// a later attempt came since and the row knows no message (`pin_attempt_messages.sql`), so
    /// the failures are not taken for the current send's.
    pub async fn pin_attempt_messages(
        &self,
        namespace: &str,
        reports: &[StatusReport],
    ) -> Result<(), StoreError> {
        let named: Vec<(Uuid, i32, &str)> = reports
            .iter()
            .filter(|r| r.state == DeliveryState::FailedAfterAcceptance)
            .filter_map(|r| Some((r.task_id?, r.attempt?, r.provider_message_id.as_str())))
            .collect();
        if named.is_empty() {
            return Ok(());
        }
        let tasks: Vec<Uuid> = named.iter().map(|n| n.0).collect();
        let attempts: Vec<i32> = named.iter().map(|n| n.1).collect();
        let ids: Vec<&str> = named.iter().map(|n| n.2).collect();
        PIN_ATTEMPT_MESSAGES
            .execute(self.db, &[&namespace, &tasks, &attempts, &ids])
            .await?;
        Ok(())
    }

    /// Ties reports recorded without a task to the task now known for their message id.
    pub async fn link(
        &self,
        namespace: &str,
        pairs: &[(String, Uuid)],
    ) -> Result<Vec<Recorded>, StoreError> {
        if pairs.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<&str> = pairs.iter().map(|p| p.0.as_str()).collect();
        let tasks: Vec<Uuid> = pairs.iter().map(|p| p.1).collect();
        let rows = LINK_EVENTS
            .query(self.db, &[&namespace, &ids, &tasks])
            .await?;
        recorded(&rows)
    }

    /// The SUCCEEDED tasks among `tasks` whose current message failed after acceptance.
    pub async fn failed_tasks(
        &self,
        namespace: &str,
        tasks: &[Uuid],
    ) -> Result<Vec<Uuid>, StoreError> {
        self.task_ids(&FAILED_TASKS, namespace, tasks).await
    }

    /// The ids `statement` (taking the namespace and `tasks`) returns; none for no tasks.
    async fn task_ids(
        &self,
        statement: &Statement,
        namespace: &str,
        tasks: &[Uuid],
    ) -> Result<Vec<Uuid>, StoreError> {
        if tasks.is_empty() {
            return Ok(Vec::new());
        }
        statement
            .query(self.db, &[&namespace, &tasks])
            .await?
            .iter()
            .map(|r| column(r, "id"))
            .collect()
    }

    /// Schedules again, to send their window-closed fallback, the SUCCEEDED tasks among
    /// `tasks` whose message failed after acceptance with 131047 and whose fallback was never
    /// used; returns them.
    pub async fn window_closed(
        &self,
        namespace: &str,
        tasks: &[Uuid],
    ) -> Result<Vec<Uuid>, StoreError> {
        self.task_ids(&WINDOW_CLOSED, namespace, tasks).await
    }

    /// Schedules again the SUCCEEDED tasks among `tasks` whose message failed after acceptance
    /// with one of `codes` (each with the least wait before it is tried again, in ms) and whose
    /// attempts are not spent, after their retry policy's next delay or that wait, whichever is
    /// longer; returns them with the code and when they are due.
    pub async fn retry_delivered(
        &self,
        namespace: &str,
        tasks: &[Uuid],
        codes: &[(i64, i64)],
    ) -> Result<Vec<(Uuid, i64, DateTime<Utc>)>, StoreError> {
        if tasks.is_empty() {
            return Ok(Vec::new());
        }
        let (codes, waits): (Vec<i64>, Vec<i64>) = codes.iter().copied().unzip();
        RETRY_DELIVERED
            .query(self.db, &[&namespace, &tasks, &codes, &waits])
            .await?
            .iter()
            .map(|r| {
                Ok((
                    column(r, "id")?,
                    column(r, "error_code")?,
                    column(r, "run_at")?,
                ))
            })
            .collect()
    }

    /// Ends the SUCCEEDED tasks among `tasks` whose message failed after acceptance; returns
    /// them with the provider's error code.
    pub async fn fail_delivered(
        &self,
        namespace: &str,
        tasks: &[Uuid],
    ) -> Result<Vec<(Uuid, Option<i64>)>, StoreError> {
        if tasks.is_empty() {
            return Ok(Vec::new());
        }
        FAIL_DELIVERED
            .query(self.db, &[&namespace, &tasks])
            .await?
            .iter()
            .map(|r| Ok((column(r, "id")?, column(r, "error_code")?)))
            .collect()
    }

    /// The deliveries of the tasks among `ids` that have one: of each task's current message.
    pub async fn of_tasks(
        &self,
        namespace: &str,
        ids: &[Uuid],
    ) -> Result<HashMap<Uuid, Delivery>, StoreError> {
        self.folded(namespace, ids, false).await
    }

    /// The deliveries of the messages that window-closed fallbacks replaced, for the tasks
    /// among `ids` that have one.
    pub async fn replaced_of_tasks(
        &self,
        namespace: &str,
        ids: &[Uuid],
    ) -> Result<HashMap<Uuid, Delivery>, StoreError> {
        self.folded(namespace, ids, true).await
    }

    async fn folded(
        &self,
        namespace: &str,
        ids: &[Uuid],
        replaced: bool,
    ) -> Result<HashMap<Uuid, Delivery>, StoreError> {
        if ids.is_empty() {
            return Ok(HashMap::new());
        }
        let rows = TASK_DELIVERIES
            .query(self.db, &[&ids, &namespace, &replaced])
            .await?;
        let mut out = HashMap::with_capacity(rows.len());
        for r in &rows {
            let delivery = Delivery {
                state: state(r)?,
                provider_message_id: column(r, "provider_message_id")?,
                accepted_at: column(r, "accepted_at")?,
                delivered_at: column(r, "delivered_at")?,
                read_at: column(r, "read_at")?,
                failed_at: column(r, "failed_at")?,
                error_code: column(r, "error_code")?,
                error: column(r, "error")?,
            };
            out.insert(column(r, "task_id")?, delivery);
        }
        Ok(out)
    }
}
