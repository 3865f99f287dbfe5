//! The bulk operation repository: durable operations with their cursor and counts, the dry
//! run's count, and the batches the workers walk (see `tasks::bulk`).

use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use tokio_postgres::Row;
use uuid::Uuid;

use super::sql::{column, FromRow, Statement};
use super::tasks::{with_filter, SelectionParams};
use super::{repository, StoreError};
use crate::tasks::bulk::OperationRecord;
use crate::tasks::selection::Selection;

repository!(
    /// Bulk operations.
    BulkRepo
);

/// What an operation read selects; decoded by [`OperationRecord::from_row`].
const OPERATION_COLUMNS: &str = "id, action, filter, run_at, shift_ms, state, matched, \
     processed, changed, cursor_id, created_at, updated_at, finished_at";

fn expand(name: &'static str, sql: &str) -> Statement {
    Statement::built(
        name,
        with_filter(sql).replace("{operation_columns}", OPERATION_COLUMNS),
    )
}

static INSERT_OPERATION: LazyLock<Statement> =
    LazyLock::new(|| expand("insert_operation", include_str!("insert_operation.sql")));
static GET_OPERATION: LazyLock<Statement> =
    LazyLock::new(|| expand("get_operation", include_str!("get_operation.sql")));
static LIST_OPERATIONS: LazyLock<Statement> =
    LazyLock::new(|| expand("list_operations", include_str!("list_operations.sql")));
static TAKE_RUNNING: LazyLock<Statement> =
    LazyLock::new(|| expand("take_running", include_str!("take_running.sql")));
static HOLD_MOVES: LazyLock<Statement> =
    LazyLock::new(|| expand("hold_moves", include_str!("hold_moves.sql")));
static NEXT_BATCH: LazyLock<Statement> =
    LazyLock::new(|| expand("next_batch", include_str!("next_batch.sql")));
static ADVANCE_OPERATION: LazyLock<Statement> =
    LazyLock::new(|| expand("advance_operation", include_str!("advance_operation.sql")));
static COUNT_SELECTED: LazyLock<Statement> =
    LazyLock::new(|| expand("count_selected", include_str!("count_selected.sql")));

impl FromRow for OperationRecord {
    fn from_row(r: &Row) -> Result<Self, StoreError> {
        Ok(OperationRecord {
            id: column(r, "id")?,
            action: column(r, "action")?,
            filter: column(r, "filter")?,
            run_at: column(r, "run_at")?,
            shift_ms: column(r, "shift_ms")?,
            state: column(r, "state")?,
            matched: column(r, "matched")?,
            processed: column(r, "processed")?,
            changed: column(r, "changed")?,
            cursor_id: column(r, "cursor_id")?,
            created_at: column(r, "created_at")?,
            updated_at: column(r, "updated_at")?,
            finished_at: column(r, "finished_at")?,
        })
    }
}

/// A new operation, as [`BulkRepo::insert`] records it.
pub struct NewOperation<'a> {
    /// Id.
    pub id: Uuid,
    /// 'cancel' | 'retry' | 'reschedule'.
    pub action: &'a str,
    /// Encoded `herald.v1.TaskFilter`.
    pub filter: &'a [u8],
    /// Reschedule: new due time.
    pub run_at: Option<DateTime<Utc>>,
    /// Reschedule: shift.
    pub shift_ms: Option<i64>,
    /// Tasks selected at the start.
    pub matched: i64,
}

impl<C: GenericClient> BulkRepo<'_, C> {
    /// How many tasks `selection` picks in the namespace now.
    pub async fn count(&self, namespace: &str, selection: &Selection) -> Result<i64, StoreError> {
        let p = SelectionParams::of(selection);
        column(
            &COUNT_SELECTED
                .query_one(self.db, &p.params(&namespace))
                .await?,
            "selected",
        )
    }

    /// Records an operation.
    pub async fn insert(
        &self,
        namespace: &str,
        op: &NewOperation<'_>,
    ) -> Result<OperationRecord, StoreError> {
        OperationRecord::from_row(
            &INSERT_OPERATION
                .query_one(
                    self.db,
                    &[
                        &namespace,
                        &op.id,
                        &op.action,
                        &op.filter,
                        &op.run_at,
                        &op.shift_ms,
                        &op.matched,
                    ],
                )
                .await?,
        )
    }

    /// Reads an operation.
    pub async fn get(
        &self,
        namespace: &str,
        id: Uuid,
    ) -> Result<Option<OperationRecord>, StoreError> {
        GET_OPERATION.fetch_opt(self.db, &[&namespace, &id]).await
    }

    /// A page of operations, newest first, with an id before `before`.
    pub async fn list(
        &self,
        namespace: &str,
        before: Option<Uuid>,
        limit: i64,
    ) -> Result<Vec<OperationRecord>, StoreError> {
        LIST_OPERATIONS
            .fetch(self.db, &[&namespace, &before, &limit])
            .await
    }

    /// The oldest unfinished operation no one else holds, locked for this transaction, with
    /// its namespace.
    pub async fn take_running(&self) -> Result<Option<(String, OperationRecord)>, StoreError> {
        let Some(row) = TAKE_RUNNING.query_opt(self.db, &[]).await? else {
            return Ok(None);
        };
        Ok(Some((
            column(&row, "namespace")?,
            OperationRecord::from_row(&row)?,
        )))
    }

    /// The next batch of at most `limit` task ids of an operation, locked.
    pub async fn next_batch(
        &self,
        namespace: &str,
        selection: &Selection,
        op: &OperationRecord,
        limit: i64,
    ) -> Result<Vec<Uuid>, StoreError> {
        HOLD_MOVES.query(self.db, &[]).await?;
        let p = SelectionParams::of(selection);
        let mut params = p.params(&namespace);
        params.push(&op.cursor_id);
        params.push(&limit);
        params.push(&op.created_at);
        NEXT_BATCH
            .query(self.db, &params)
            .await?
            .iter()
            .map(|r| column(r, "id"))
            .collect()
    }

    /// Records a committed batch: `last` is its last task id, `done` that it found nothing.
    pub async fn advance(
        &self,
        namespace: &str,
        id: Uuid,
        last: Option<Uuid>,
        processed: i64,
        changed: i64,
        done: bool,
    ) -> Result<(), StoreError> {
        ADVANCE_OPERATION
            .execute(
                self.db,
                &[&namespace, &id, &last, &processed, &changed, &done],
            )
            .await?;
        Ok(())
    }
}
