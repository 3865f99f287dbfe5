//! The compactor: gives back the disk space a long-open transaction made herald's hot tables
//! grow into.
//!
//! While any transaction holds a snapshot, VACUUM may remove no row version that became dead
//! after it began, so a busy queue table grows by every task that passes through it meanwhile.
//! Once the transaction ends, VACUUM frees that space for new rows, but a table's file shrinks
//! only by empty pages at its very end, which a queue table, whose new rows land wherever the
//! free space map points, seldom has. In S6 the hot tables ended about four times their size
//! before a five-minute hold (docs/performance.md). The compactor rewrites such a table with
//! `VACUUM FULL`: a copy of its live rows, few by then, with its indexes built anew.
//!
//! The rewrite holds an exclusive lock on the table for as long as it reads the old file
//! (about 0.7 s per GiB on the benchmark machine), and every claim, report and create
//! on the table waits for it. So a table is rewritten only when that buys most of its size
//! back and the wait is bounded: at least `min_bytes` and at most `max_bytes` on disk, a heap
//! at least [`WASTE_FACTOR`] times what the rewrite would keep, no transaction older than
//! `long_transaction` still open, at most once per [`COOLDOWN`] per table, and the lock waited
//! for at most `lock_wait`. A larger table is left to `pg_repack`, which works online
//! (docs/operations.md, "Giving back space").
//!
//! What the rewrite keeps is the live rows and every row version that died after the oldest
//! open snapshot was taken: that snapshot may still read them. A busy table fills with such
//! versions within seconds of a transaction opening, long before the transaction counts as
//! long, and a rewrite then copies them all, pausing the table's traffic for seconds and giving
//! nothing back (in S6, a 5.5 s pause half a minute into the held transaction). So the
//! compactor samples each table's running count of dead versions every round ([`Churn`]) and
//! counts those left dead since the newest sample taken before the oldest snapshot as kept.
//!
//! Safe on every replica at once: one replica rewrites at a time (an advisory lock), and it
//! reads which tables are bloated again once it holds the lock, so a table another replica just
//! rewrote is not rewritten twice.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::store::storage::{Candidate, Rewrite};
use crate::store::{Db, Store, StoreError};

mod kept;

pub use kept::Churn;
use kept::{worth_rewriting, Held};

/// How often the compactor looks: two cheap reads (file sizes, the session list), and a table
/// left mostly empty is given back within this much of the transaction's end.
pub const INTERVAL: Duration = Duration::from_secs(10);

/// A table is rewritten only when its heap is at least this many times what the rewrite keeps
/// (its live rows and the dead ones an open snapshot may still read): the rewrite then gives
/// back at least three quarters of the heap. A busy queue table carries a few seconds of dead
/// rows between autovacuum's visits, which the minimum size keeps out of reach.
pub const WASTE_FACTOR: f64 = 4.0;

/// A table rewritten is not rewritten again for this long, whatever it looks like: a table that
/// regrows at once (a rate whose own churn crosses the minimum size) is rewritten at most once
/// per period, and each rewrite holds its traffic for a moment.
pub const COOLDOWN: Duration = Duration::from_secs(600);

/// A rewrite that gave back less than half the table's size most likely copied dead rows that
/// a transaction out of herald's sight still needs (another role's, when herald's role may not
/// see other roles' sessions); that table waits this long before it is tried again.
pub const HELD_BACK_PAUSE: Duration = Duration::from_secs(3600);

/// When the compactor rewrites a table (docs/operations.md, "Giving back space").
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Compaction {
    /// Tables smaller than this on disk are left alone: the space is not worth a pause.
    pub min_bytes: i64,
    /// Tables larger than this are left alone: their rewrite would pause traffic too long.
    pub max_bytes: i64,
    /// How many times what a rewrite would keep a table's heap must be.
    pub factor: f64,
    /// How long a rewrite waits for its lock before it gives up until the next round.
    pub lock_wait: Duration,
    /// No table is rewritten while a transaction open longer than this holds VACUUM back.
    pub long_transaction: Duration,
}

impl Compaction {
    /// The compactor's settings from `config`; `None` when it is turned off
    /// (`HERALD_COMPACT_MAX_MIB=0`).
    pub fn of(config: &crate::config::Config) -> Option<Self> {
        const MIB: u64 = 1 << 20;
        if config.compact_max_mib == 0 {
            return None;
        }
        let bytes = |mib: u64| i64::try_from(mib.saturating_mul(MIB)).unwrap_or(i64::MAX);
        Some(Compaction {
            min_bytes: bytes(config.compact_min_mib),
            max_bytes: bytes(config.compact_max_mib),
            factor: WASTE_FACTOR,
            lock_wait: Duration::from_millis(100),
            long_transaction: Duration::from_secs(60),
        })
    }
}

/// What a round did to one table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Rewritten, and at least half its size given back.
    Compacted {
        /// Its size on disk before, indexes and TOAST included.
        before: i64,
        /// Its size on disk after.
        after: i64,
    },
    /// Rewritten, but it kept more than half its size: something still held its dead rows.
    HeldBack {
        /// Its size on disk before, indexes and TOAST included.
        before: i64,
        /// Its size on disk after.
        after: i64,
    },
    /// Another session held the table longer than the lock wait; tried again next round.
    LockBusy,
}

impl Outcome {
    /// The outcome's label in `herald_compactions_total`.
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Compacted { .. } => "compacted",
            Outcome::HeldBack { .. } => "held_back",
            Outcome::LockBusy => "lock_busy",
        }
    }
}

/// What the compactor remembers between rounds.
#[derive(Debug, Default)]
pub struct Memory {
    /// When each table may be rewritten again.
    pub cooldowns: Cooldowns,
    /// Each table's dead row versions, sampled every round.
    pub churn: Churn,
}

/// When each table may be rewritten again.
#[derive(Debug, Default)]
pub struct Cooldowns {
    next: HashMap<String, Instant>,
}

impl Cooldowns {
    /// Whether `table` may be rewritten at `now`.
    pub fn ready(&self, table: &str, now: Instant) -> bool {
        self.next.get(table).is_none_or(|at| *at <= now)
    }

    /// Notes what a round did to `table` at `now`.
    pub fn record(&mut self, table: &str, outcome: Outcome, now: Instant) {
        let pause = match outcome {
            Outcome::Compacted { .. } => COOLDOWN,
            Outcome::HeldBack { .. } => HELD_BACK_PAUSE,
            Outcome::LockBusy => return,
        };
        self.next.insert(table.to_owned(), now + pause);
    }
}

/// Runs until `stop`, looking every [`INTERVAL`].
pub async fn run(store: Store, settings: Compaction, stop: CancellationToken) {
    let memory = Arc::new(tokio::sync::Mutex::new(Memory::default()));
    crate::server::background::every(INTERVAL, stop, "compact tables", || {
        let (store, memory) = (store.clone(), memory.clone());
        async move { compact_bloated(&store, &settings, &mut *memory.lock().await).await }
    })
    .await;
}

/// One round: rewrites every table `settings` and `memory` allow; returns what it did to
/// each table it tried (nothing while a long transaction is open or another replica is
/// rewriting).
pub async fn compact_bloated(
    store: &Store,
    settings: &Compaction,
    memory: &mut Memory,
) -> Result<Vec<(String, Outcome)>, StoreError> {
    let conn = store.conn().await?;
    let asked_at = Instant::now();
    let oldest = conn.storage().oldest_transaction().await?;
    if oldest.seconds > settings.long_transaction.as_secs_f64() {
        return Ok(Vec::new());
    }
    let held = Held::of(asked_at, oldest.seconds);
    if bloated(&conn, settings, memory, held).await?.is_empty() {
        return Ok(Vec::new());
    }
    // Taken only now, so the session that holds it (until it closes) is one about to rewrite.
    let locked = conn.storage().lock_compaction().await;
    let done = match locked {
        Ok(true) => rewrite_all(&conn, settings, memory, held).await,
        Ok(false) => Ok(Vec::new()),
        Err(e) => Err(e),
    };
    // Its lock_timeout was changed and it may hold the advisory lock: closed, not reused.
    Store::discard(conn);
    done
}

/// The tables within `settings`' sizes that a rewrite would shrink to a small part of their
/// heap, with what `held` keeps, and that the cooldowns allow now. Samples every table's dead
/// versions on the way.
async fn bloated(
    conn: &deadpool_postgres::Object,
    settings: &Compaction,
    memory: &mut Memory,
    held: Held,
) -> Result<Vec<Candidate>, StoreError> {
    let found = conn
        .storage()
        .candidates(settings.min_bytes, settings.max_bytes)
        .await?;
    let read_at = Instant::now();
    // A snapshot older than the long-transaction limit stops the round before this, so no
    // older sample is needed; two rounds' slack for rounds that ran late.
    let keep = settings.long_transaction + 2 * INTERVAL;
    let mut worth = Vec::new();
    for table in found {
        let pinned = held.pinned(&memory.churn, &table);
        memory
            .churn
            .observe(&table.table, read_at, table.dead_versions, keep);
        if !memory.cooldowns.ready(&table.table, read_at) {
            continue;
        }
        if worth_rewriting(&table, pinned, settings.factor) {
            worth.push(table);
        } else if worth_rewriting(&table, Some(0), settings.factor) {
            tracing::debug!(
                table = %table.table, ?pinned,
                "mostly empty, but an open snapshot may still read its dead rows: not rewritten"
            );
        }
    }
    Ok(worth)
}

/// Under the compactor's lock: reads the bloated tables again (another replica may have just
/// rewritten one) and rewrites each.
async fn rewrite_all(
    conn: &deadpool_postgres::Object,
    settings: &Compaction,
    memory: &mut Memory,
    held: Held,
) -> Result<Vec<(String, Outcome)>, StoreError> {
    let mut done = Vec::new();
    for table in bloated(conn, settings, memory, held).await? {
        let started = Instant::now();
        let outcome = match conn
            .storage()
            .rewrite(&table.table, settings.lock_wait)
            .await?
        {
            Rewrite::LockBusy => Outcome::LockBusy,
            Rewrite::Done => {
                let after = conn.storage().table_bytes(&table.table).await?;
                if after.saturating_mul(2) > table.bytes {
                    Outcome::HeldBack {
                        before: table.bytes,
                        after,
                    }
                } else {
                    Outcome::Compacted {
                        before: table.bytes,
                        after,
                    }
                }
            }
        };
        log(&table, outcome, started.elapsed());
        crate::telemetry::metrics::compacted(&table.table, outcome.label());
        memory
            .cooldowns
            .record(&table.table, outcome, Instant::now());
        done.push((table.table, outcome));
    }
    Ok(done)
}

/// Logs a rewrite with what made the table a candidate (its heap against the estimate of its
/// live rows), so an operator can tell a rewrite that was worth its pause from one that was not.
fn log(table: &Candidate, outcome: Outcome, took: Duration) {
    let took_ms = took.as_millis();
    let (heap_bytes, live_bytes) = (table.heap_bytes, table.live_bytes);
    match outcome {
        Outcome::Compacted { before, after } => tracing::info!(
            table = %table.table, bytes_before = before, bytes_after = after, heap_bytes,
            live_bytes, took_ms,
            "table rewritten: the space a long transaction left is given back"
        ),
        Outcome::HeldBack { before, after } => tracing::warn!(
            table = %table.table, bytes_before = before, bytes_after = after, heap_bytes,
            live_bytes, took_ms,
            "table rewritten but it kept most of its size: a transaction herald's role cannot \
             see (grant it pg_read_all_stats) may still hold its dead rows; not tried again \
             for an hour"
        ),
        Outcome::LockBusy => tracing::info!(
            table = %table.table, took_ms,
            "table not rewritten: another session held it; trying again next round"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::scratch::{insert_tasks, OtherRole, ScratchStore};

    /// Settings that take any table of a few MiB that is mostly empty, waiting `lock_wait`
    /// for its lock and counting every open transaction as long.
    fn small_tables(lock_wait: Duration) -> Compaction {
        Compaction {
            min_bytes: 1 << 20,
            max_bytes: 1 << 30,
            factor: WASTE_FACTOR,
            lock_wait,
            long_transaction: Duration::ZERO,
        }
    }

    /// A session outside the scratch pool (two connections, both in use meanwhile).
    async fn other_session(store: &ScratchStore) -> tokio_postgres::Client {
        let (client, connection) = store
            .target()
            .config()
            .connect(tokio_postgres::NoTls)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        tokio::spawn(connection);
        client
    }

    /// A replica's first round: nothing rewritten before.
    async fn first_round(store: &ScratchStore, settings: &Compaction) -> Vec<(String, Outcome)> {
        round(store, settings, &mut Memory::default()).await
    }

    /// A round by a replica that remembers `memory` from its earlier rounds.
    async fn round(
        store: &ScratchStore,
        settings: &Compaction,
        memory: &mut Memory,
    ) -> Vec<(String, Outcome)> {
        compact_bloated(store, settings, memory)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    async fn heap_bytes(conn: &deadpool_postgres::Object) -> i64 {
        conn.query_one("SELECT pg_relation_size('herald.tasks') AS bytes", &[])
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .get("bytes")
    }

    async fn scheduled_ids(conn: &deadpool_postgres::Object) -> Vec<uuid::Uuid> {
        conn.query(
            "SELECT id FROM herald.tasks WHERE state = 'scheduled' ORDER BY id",
            &[],
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .iter()
        .map(|r| r.get("id"))
        .collect()
    }

    /// Waits until every transaction that began before now and holds a snapshot has ended, in
    /// any database: one taken before the test's deletes would keep the deleted rows through a
    /// rewrite. Besides an automatic ANALYZE here, another test's CREATE DATABASE does, whose
    /// snapshot holds back every database's horizon while it copies the template.
    async fn await_older_snapshots(conn: &deadpool_postgres::Object) {
        let now: chrono::DateTime<chrono::Utc> = conn
            .query_one("SELECT clock_timestamp() AS now", &[])
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .get("now");
        loop {
            let older: i64 = conn
                .query_one(
                    "SELECT count(*) AS older FROM pg_stat_activity
                     WHERE pid <> pg_backend_pid() AND xact_start < $1
                       AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)",
                    &[&now],
                )
                .await
                .unwrap_or_else(|e| panic!("{e}"))
                .get("older");
            if older == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// `herald.tasks` with 20,000 finished tasks and 100 scheduled ones, all live. Autovacuum
    /// is off, so only the compactor changes its file.
    async fn filled_tasks(store: &ScratchStore) -> deadpool_postgres::Object {
        let conn = store.conn().await.unwrap_or_else(|e| panic!("{e}"));
        conn.batch_execute("ALTER TABLE herald.tasks SET (autovacuum_enabled = false)")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        insert_tasks(&conn, 20_000, "succeeded").await;
        insert_tasks(&conn, 100, "scheduled").await;
        conn.batch_execute("SELECT pg_stat_force_next_flush()")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        conn
    }

    /// Deletes the finished tasks of [`filled_tasks`], leaving mostly empty space.
    async fn delete_finished(conn: &deadpool_postgres::Object) {
        conn.batch_execute(
            "DELETE FROM herald.tasks WHERE state = 'succeeded'; SELECT pg_stat_force_next_flush()",
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    }

    /// [`filled_tasks`] with the finished tasks deleted, as after a hold, and no snapshot left
    /// that could still read them.
    async fn bloated_tasks(store: &ScratchStore) -> deadpool_postgres::Object {
        let conn = filled_tasks(store).await;
        delete_finished(&conn).await;
        await_older_snapshots(&conn).await;
        conn
    }

    /// Asserts that a round rewrote `herald.tasks`, and nothing else.
    fn assert_tasks_compacted(done: &[(String, Outcome)]) {
        assert!(
            matches!(done, [(t, Outcome::Compacted { .. })] if t == "tasks"),
            "{done:?}"
        );
    }

    /// A `REPEATABLE READ` transaction on `holder` that has taken its snapshot.
    async fn hold_snapshot(holder: &mut tokio_postgres::Client) -> tokio_postgres::Transaction<'_> {
        let held = holder
            .build_transaction()
            .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
            .start()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        held.query_one("SELECT count(*) FROM herald.accounts", &[])
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        held
    }

    /// A table left mostly empty is rewritten to a fraction of its size, keeps every live row,
    /// and is not rewritten again in the next round.
    #[tokio::test]
    async fn a_mostly_empty_table_is_rewritten_and_keeps_its_live_rows() {
        let store = ScratchStore::migrated().await;
        let conn = bloated_tasks(&store).await;
        let live = scheduled_ids(&conn).await;
        let before = heap_bytes(&conn).await;
        let mut memory = Memory::default();
        let settings = small_tables(Duration::from_secs(1));

        let done = round(&store, &settings, &mut memory).await;
        assert_eq!(done.len(), 1, "{done:?}");
        assert_eq!(done[0].0, "tasks");
        assert!(
            matches!(done[0].1, Outcome::Compacted { before, after } if after * 4 < before),
            "{done:?}"
        );
        let after = heap_bytes(&conn).await;
        assert!(after * 10 < before, "heap {before} -> {after} bytes");
        assert_eq!(scheduled_ids(&conn).await, live);

        let again = round(&store, &settings, &mut memory).await;
        assert_eq!(again, Vec::new());
    }

    /// While a transaction holds a snapshot (which would keep the dead rows a rewrite is for),
    /// nothing is rewritten.
    #[tokio::test]
    async fn nothing_is_rewritten_while_a_long_transaction_is_open() {
        let store = ScratchStore::migrated().await;
        let conn = bloated_tasks(&store).await;
        let before = heap_bytes(&conn).await;
        let mut holder = other_session(&store).await;
        let held = hold_snapshot(&mut holder).await;

        let done = first_round(&store, &small_tables(Duration::from_secs(1))).await;
        assert_eq!(done, Vec::new());
        assert_eq!(heap_bytes(&conn).await, before);
        drop(held);
    }

    /// A transaction far from long (the limit is a minute) that took its snapshot before the
    /// table's rows died would keep them all through a rewrite: while it is open the table is
    /// not rewritten (a rewrite would pause its traffic and give nothing back, as in S6), and
    /// once it ends the next round rewrites it.
    #[tokio::test]
    async fn a_young_snapshot_that_still_reads_the_dead_rows_defers_the_rewrite() {
        let store = ScratchStore::migrated().await;
        let conn = filled_tasks(&store).await;
        await_older_snapshots(&conn).await;
        let settings = Compaction {
            long_transaction: Duration::from_secs(60),
            ..small_tables(Duration::from_secs(1))
        };
        let mut memory = Memory::default();
        // Full of live rows: nothing to rewrite, but the round samples the table.
        let done = round(&store, &settings, &mut memory).await;
        assert_eq!(done, Vec::new());

        let mut holder = other_session(&store).await;
        let held = hold_snapshot(&mut holder).await;
        delete_finished(&conn).await;
        let before = heap_bytes(&conn).await;

        let done = round(&store, &settings, &mut memory).await;
        assert_eq!(done, Vec::new());
        assert_eq!(heap_bytes(&conn).await, before);

        held.commit().await.unwrap_or_else(|e| panic!("{e}"));
        await_older_snapshots(&conn).await;
        let done = round(&store, &settings, &mut memory).await;
        assert_tasks_compacted(&done);
    }

    /// A rewrite that cannot have its lock within the wait gives up, changes nothing, and
    /// leaves the table to the next round, which rewrites it once the lock is free.
    #[tokio::test]
    async fn a_rewrite_kept_waiting_gives_up_until_the_next_round() {
        let store = ScratchStore::migrated().await;
        let conn = bloated_tasks(&store).await;
        let before = heap_bytes(&conn).await;
        let mut holder = other_session(&store).await;
        // A lock without a snapshot: READ COMMITTED drops the statement's snapshot after it.
        let held = holder.transaction().await.unwrap_or_else(|e| panic!("{e}"));
        held.batch_execute("LOCK TABLE herald.tasks IN ACCESS SHARE MODE")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let mut memory = Memory::default();
        let settings = small_tables(Duration::from_millis(50));

        let done = round(&store, &settings, &mut memory).await;
        assert_eq!(done, vec![("tasks".to_owned(), Outcome::LockBusy)]);
        assert_eq!(heap_bytes(&conn).await, before);

        held.rollback().await.unwrap_or_else(|e| panic!("{e}"));
        let done = round(&store, &settings, &mut memory).await;
        assert_tasks_compacted(&done);
    }

    /// Tables smaller than the minimum, or larger than the maximum, are left alone.
    #[tokio::test]
    async fn tables_outside_the_size_bounds_are_left_alone() {
        let store = ScratchStore::migrated().await;
        let conn = bloated_tasks(&store).await;
        let before = heap_bytes(&conn).await;
        let base = small_tables(Duration::from_secs(1));
        for settings in [
            Compaction {
                min_bytes: 1 << 30,
                max_bytes: 1 << 31,
                ..base
            },
            Compaction {
                max_bytes: 1 << 20,
                ..base
            },
        ] {
            let done = first_round(&store, &settings).await;
            assert_eq!(done, Vec::new(), "{settings:?}");
        }
        assert_eq!(heap_bytes(&conn).await, before);
    }

    /// A role that does not own herald's tables may not rewrite them (PostgreSQL's VACUUM only
    /// warns and does nothing): to such a role no table looks bloated, so none is tried and
    /// counted every round.
    #[tokio::test]
    async fn tables_another_role_owns_are_left_alone() {
        let store = ScratchStore::migrated().await;
        let conn = bloated_tasks(&store).await;
        let settings = small_tables(Duration::from_secs(1));
        let bloated = || async {
            conn.storage()
                .candidates(settings.min_bytes, settings.max_bytes)
                .await
                .unwrap_or_else(|e| panic!("{e}"))
                .into_iter()
                .map(|b| b.table)
                .collect::<Vec<_>>()
        };
        let other = OtherRole::assume(&conn).await;
        let as_other = bloated().await;
        other.leave(&conn).await;
        assert_eq!(as_other, Vec::<String>::new());
        assert_eq!(bloated().await, vec!["tasks".to_owned()]);
    }

    /// A table full of live rows whose running row count was reset (as a crash resets it) is
    /// not taken for an empty one: the catalog's count from the last ANALYZE still counts.
    #[tokio::test]
    async fn a_full_table_whose_row_count_was_reset_is_left_alone() {
        let store = ScratchStore::migrated().await;
        let conn = store.conn().await.unwrap_or_else(|e| panic!("{e}"));
        conn.batch_execute("ALTER TABLE herald.tasks SET (autovacuum_enabled = false)")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        insert_tasks(&conn, 20_000, "scheduled").await;
        conn.batch_execute(
            "ANALYZE herald.tasks;
             SELECT pg_stat_reset_single_table_counters('herald.tasks'::regclass);
             SELECT pg_stat_force_next_flush()",
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        let counted: i64 = conn
            .query_one(
                "SELECT n_live_tup FROM pg_stat_user_tables WHERE relid = 'herald.tasks'::regclass",
                &[],
            )
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .get("n_live_tup");
        assert_eq!(counted, 0, "the running count was not reset");
        let done = first_round(&store, &small_tables(Duration::from_secs(1))).await;
        assert_eq!(done, Vec::new());
    }

    #[test]
    fn a_table_rewritten_waits_its_cooldown_and_one_held_back_waits_longer() {
        let now = Instant::now();
        let mut cooldowns = Cooldowns::default();
        cooldowns.record("tasks", Outcome::LockBusy, now);
        assert!(cooldowns.ready("tasks", now));
        cooldowns.record(
            "tasks",
            Outcome::Compacted {
                before: 100,
                after: 10,
            },
            now,
        );
        assert!(!cooldowns.ready("tasks", now + COOLDOWN - Duration::from_secs(1)));
        assert!(cooldowns.ready("tasks", now + COOLDOWN));
        assert!(cooldowns.ready("attempts", now));
        cooldowns.record(
            "attempts",
            Outcome::HeldBack {
                before: 100,
                after: 90,
            },
            now,
        );
        assert!(!cooldowns.ready("attempts", now + COOLDOWN));
        assert!(cooldowns.ready("attempts", now + HELD_BACK_PAUSE));
    }
}
