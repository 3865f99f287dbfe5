//! The schedule materialiser: turns due fire times into runs and tasks.
//!
//! One replica at a time materialises: the leader holds a session-level PostgreSQL advisory
//! lock on a dedicated connection (released by the server when that connection dies, so a
//! killed leader is replaced within [`FOLLOWER_RETRY`]). Each schedule's runs are inserted
//! with `ON CONFLICT (schedule, fire time) DO NOTHING` in the same transaction that creates
//! their tasks and advances the schedule's cursor, so even two leaders (a lock lost to a
//! network split while a pass runs) could not fire a time twice.
//!
//! The leader sleeps until the earliest cursor minus [`LOOKAHEAD`] (runs are created slightly
//! ahead; their tasks are due at the fire time itself, and the dispatcher fires them exactly),
//! capped at [`MAX_SLEEP`], and wakes on `herald_schedules` notifications sent when schedules
//! change.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Duration as ChronoDuration, SecondsFormat, Utc};
use futures::StreamExt;
use herald_proto::v1 as pb;
use prost::Message;
use tokio_postgres::AsyncMessage;
use tokio_util::sync::CancellationToken;

use super::fanout;
use super::fire_times::{DstPolicy, FireTimes, RepeatedTime, SkippedTime};
use super::model::ScheduleRecord;
use super::source::Sources;
use super::spread;
use crate::error::Error;
use crate::store::fanouts::PendingFanout;
use crate::store::transaction;
use crate::store::{Db, Store, StoreError};
use crate::tasks::duplicates::DuplicateWindows;
use crate::tasks::model::{Origin, TaskSpec, When};

/// Arbitrary but fixed: the advisory lock key of the materialiser leader.
const LEADER_LOCK_KEY: i64 = 0x6865_7261_6c64_0002;
/// How often a follower tries to become leader.
const FOLLOWER_RETRY: Duration = Duration::from_secs(1);
/// Runs are created this long before their fire time.
const LOOKAHEAD: ChronoDuration = ChronoDuration::milliseconds(500);
/// Longest sleep without an event: a backstop for a lost notification.
const MAX_SLEEP: Duration = Duration::from_secs(30);
/// CATCH_UP fires at most this many missed runs (the latest ones).
const MAX_CATCH_UP: usize = 100;
/// Shortest wait for a fan-out that is due (it failed and was not moved on).
const FANOUT_RECHECK: Duration = Duration::from_millis(200);
/// One pass handles at most this many fire times per schedule (the rest on the next pass).
const MAX_FIRES_PER_PASS: usize = 1_000;

/// Runs the materialiser (and the fan-outs of its runs, asking variables sources through
/// `sources`) until `stop`; runs' tasks of a queue with a duplicate content window in `windows`
/// are guarded.
pub async fn run(
    store: Store,
    windows: DuplicateWindows,
    sources: Sources,
    stop: CancellationToken,
) {
    loop {
        let connected = tokio::select! {
            _ = stop.cancelled() => return,
            c = store.target().connect() => c,
        };
        let (client, mut connection) = match connected {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "materialiser cannot connect; retrying");
                if sleep_or_stop(FOLLOWER_RETRY, &stop).await {
                    return;
                }
                continue;
            }
        };
        // The connection is driven here; notifications wake the leader's sleep.
        let (wake_tx, mut wake_rx) = tokio::sync::mpsc::channel::<()>(1);
        let conn_task = tokio::spawn(async move {
            let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(m) = messages.next().await {
                match m {
                    Ok(AsyncMessage::Notification(_)) => {
                        let _ = wake_tx.try_send(());
                    }
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
        });
        lead_while_connected(&store, &windows, &sources, &client, &mut wake_rx, &stop).await;
        conn_task.abort();
        if stop.is_cancelled() {
            return;
        }
        if sleep_or_stop(FOLLOWER_RETRY, &stop).await {
            return;
        }
    }
}

/// Returns true when stopped.
async fn sleep_or_stop(d: Duration, stop: &CancellationToken) -> bool {
    tokio::select! {
        _ = stop.cancelled() => true,
        _ = tokio::time::sleep(d) => false,
    }
}

async fn lead_while_connected(
    store: &Store,
    windows: &DuplicateWindows,
    sources: &Sources,
    client: &tokio_postgres::Client,
    wake: &mut tokio::sync::mpsc::Receiver<()>,
    stop: &CancellationToken,
) {
    // Become leader.
    loop {
        match client
            .query_one(
                "SELECT pg_try_advisory_lock($1) AS leading",
                &[&LEADER_LOCK_KEY],
            )
            .await
        {
            Ok(row) if row.try_get::<_, bool>("leading").unwrap_or(false) => break,
            Ok(_) => {
                if sleep_or_stop(FOLLOWER_RETRY, stop).await {
                    return;
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "materialiser lost its connection");
                return;
            }
        }
    }
    tracing::info!("schedule materialiser leading");
    if let Err(e) = client.batch_execute("LISTEN herald_schedules").await {
        tracing::warn!(error = %e, "materialiser cannot listen");
        return;
    }
    // When this leader's passes began succeeding: a fire time that fell due since (less the
    // grace) fell due while it ran, and is on time however long a pass took to reach it (a slow
    // variables source, a large fan-out). Only what fell due before, or while passes failed,
    // was missed.
    let mut leading_since: Option<DateTime<Utc>> = None;
    loop {
        let began = match client.query_one("SELECT herald.now() AS now", &[]).await {
            Ok(row) => row.try_get::<_, DateTime<Utc>>("now").ok(),
            Err(e) => {
                tracing::warn!(error = %e, "materialiser lost its connection and its leadership");
                return;
            }
        };
        let sleep = match pass(store, windows, sources, leading_since).await {
            Ok(next) => {
                // The earliest start: a clock set back (the test clock, a corrected host)
                // must not leave it in the future.
                leading_since = match (leading_since, began) {
                    (Some(since), Some(began)) => Some(since.min(began)),
                    (since, began) => since.or(began),
                };
                next
            }
            Err(e) => {
                // Fire times that fall due while passes fail are not being watched.
                leading_since = None;
                tracing::warn!(error = %e, "materialiser pass failed; retrying");
                Some(FOLLOWER_RETRY)
            }
        };
        // The lock lives on `client`'s session: if it is gone, so is leadership.
        if client.is_closed() {
            tracing::warn!("materialiser lost its connection and its leadership");
            return;
        }
        let sleep = sleep.unwrap_or(MAX_SLEEP).min(MAX_SLEEP);
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(sleep) => {}
            _ = wake.recv() => {}
        }
    }
}

/// One pass over every schedule with a due cursor; returns how long to sleep. Fire times due
/// since `leading_since` (when this leader's first pass began) are on time, however late.
async fn pass(
    store: &Store,
    windows: &DuplicateWindows,
    sources: &Sources,
    leading_since: Option<DateTime<Utc>>,
) -> Result<Option<Duration>, StoreError> {
    let due = store
        .conn()
        .await?
        .schedules()
        .due(LOOKAHEAD.num_milliseconds())
        .await?;
    for d in &due {
        // Idempotent: runs are inserted ON CONFLICT DO NOTHING, their tasks are keyed, and the
        // cursor is recomputed from the locked row.
        let materialised = transaction!(store, Error, idempotent = true, |tx| materialise(
            tx,
            &d.namespace,
            &d.schedule.id,
            windows,
            leading_since,
        )
        .await);
        if let Err(e) = materialised {
            tracing::warn!(schedule_id = %d.schedule.id, error = %e, "cannot materialise a schedule");
        }
    }
    // Then the batches of runs that fan out (those just created included).
    if fanout::pass(store, windows, sources).await?.more {
        return Ok(Some(Duration::ZERO));
    }
    let ms = store.conn().await?.schedules().next_fire_ms().await?;
    let fire = ms.map(|ms| {
        Duration::from_millis((ms - LOOKAHEAD.num_milliseconds() as f64).max(0.0) as u64)
    });
    // A fan-out waiting after a failure; at least FANOUT_RECHECK, so a batch that keeps
    // failing on the database does not spin.
    let fan = fanout::next_due_ms(store)
        .await?
        .map(|ms| Duration::from_millis(ms.max(0.0) as u64).max(FANOUT_RECHECK));
    Ok(match (fire, fan) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    })
}

/// Parses a stored schedule's fire-time rules.
pub fn fire_times_of(s: &ScheduleRecord) -> Option<FireTimes> {
    let policy = DstPolicy {
        skipped: if s.skipped_time == "skip" {
            SkippedTime::Skip
        } else {
            SkippedTime::ShiftForward
        },
        repeated: if s.repeated_time == "fire_twice" {
            RepeatedTime::FireTwice
        } else {
            RepeatedTime::FireOnce
        },
    };
    FireTimes::parse(&s.cron, &s.time_zone, policy).ok()
}

/// A run to create.
pub(super) struct Run {
    /// Its fire time.
    pub(super) fire_time: DateTime<Utc>,
    /// Fired late, after downtime.
    pub(super) catch_up: bool,
    /// The fire time whose predecessor starts the period the run reports on: itself, or for
    /// a catch-up of several missed fire times the first of them. Only fan-outs need the
    /// period, so the predecessor is looked for only for them.
    pub(super) period_from: DateTime<Utc>,
    /// Asked for by an operator (RunScheduleNow), outside the fire-time rules.
    pub(super) manual: bool,
}

/// The fire times of a schedule that were missed: before `before`, from its cursor on.
struct Missed {
    /// The first of them (a FIRE_ONCE_NOW run's period starts there).
    first: Option<DateTime<Utc>>,
    /// The latest [`MAX_CATCH_UP`] of them, oldest first (what CATCH_UP fires).
    latest: Vec<DateTime<Utc>>,
}

/// The fire times from `cursor` that fall before `before`, and the first fire time at or after
/// it. After a long outage (a schedule every minute misses 100,000 fire times in 69 days) the
/// walk forward stops after a while and the latest are found walking back from `before`, so
/// the cost stays bounded and CATCH_UP still fires the latest, not the oldest, of them.
fn missed_fires(
    fires: &FireTimes,
    cursor: DateTime<Utc>,
    before: DateTime<Utc>,
) -> (Missed, Option<DateTime<Utc>>) {
    const WALK: usize = MAX_CATCH_UP * 2;
    let mut latest: std::collections::VecDeque<DateTime<Utc>> =
        std::collections::VecDeque::with_capacity(MAX_CATCH_UP + 1);
    let mut first = None;
    let mut next = Some(cursor);
    let mut walked = 0;
    while let Some(t) = next.filter(|t| *t < before) {
        if walked == WALK {
            // The rest: the latest MAX_CATCH_UP from `t` on before `before`.
            let back = latest_before(fires, t, before);
            let last = back.last().copied().unwrap_or(t);
            latest.extend(back);
            while latest.len() > MAX_CATCH_UP {
                latest.pop_front();
            }
            next = fires.next_after(last);
            break;
        }
        first.get_or_insert(t);
        latest.push_back(t);
        if latest.len() > MAX_CATCH_UP {
            latest.pop_front();
        }
        walked += 1;
        next = fires.next_after(t);
    }
    let mut latest: Vec<DateTime<Utc>> = latest.into();
    latest.dedup();
    (Missed { first, latest }, next)
}

/// The latest [`MAX_CATCH_UP`] fire times from `from` (a fire time) on that fall before
/// `before`, oldest first: looked for in windows before `before` growing eightfold, so a
/// schedule every few seconds reads a few hundred fire times, not the whole outage.
fn latest_before(
    fires: &FireTimes,
    from: DateTime<Utc>,
    before: DateTime<Utc>,
) -> Vec<DateTime<Utc>> {
    let mut window = ChronoDuration::minutes(1);
    loop {
        let start = before - window;
        let mut found: std::collections::VecDeque<DateTime<Utc>> =
            std::collections::VecDeque::with_capacity(MAX_CATCH_UP + 1);
        let mut next = if start <= from {
            Some(from)
        } else {
            fires.next_after(start)
        };
        while let Some(t) = next.filter(|t| *t < before) {
            found.push_back(t);
            if found.len() > MAX_CATCH_UP {
                found.pop_front();
            }
            next = fires.next_after(t);
        }
        if found.len() >= MAX_CATCH_UP || start <= from || window > ChronoDuration::days(12_000) {
            return found.into();
        }
        window = window * 8;
    }
}

/// The fire time before `t`, looked for in windows growing eightfold from a minute to about
/// 32 years, so a schedule per second costs a minute's fire times and a daily one a few
/// windows, while a yearly one (and one on 29 February, which can go eight years without a
/// fire) still finds its period's start. None when it has not fired within that before `t`.
fn previous_fire(fires: &FireTimes, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
    let mut window = ChronoDuration::minutes(1);
    while window <= ChronoDuration::days(12_000) {
        let mut last = None;
        let mut next = fires.next_after(t - window);
        while let Some(n) = next.filter(|n| *n < t) {
            last = Some(n);
            next = fires.next_after(n);
        }
        if last.is_some() {
            return last;
        }
        window = window * 8;
    }
    None
}

/// Materialises one schedule's due fire times in the transaction `tx`: its runs, their tasks
/// and the advanced cursor commit together.
async fn materialise(
    tx: &deadpool_postgres::Transaction<'_>,
    namespace: &str,
    id: &str,
    windows: &DuplicateWindows,
    leading_since: Option<DateTime<Utc>>,
) -> Result<(), Error> {
    // Re-read under a lock: a pause, resume or delete since the pass began wins.
    let Some((s, now)) = tx.schedules().lock(namespace, id).await? else {
        return Ok(());
    };
    let Some(cursor) = s.next_fire_at else {
        return Ok(());
    };
    let Some(fires) = fire_times_of(&s) else {
        tracing::error!(schedule_id = %s.id, "stored schedule does not parse; not firing it");
        return Ok(());
    };
    let spec = pb::ScheduleSpec::decode(s.spec.as_slice())
        .map_err(|e| StoreError::Corrupt(format!("schedule {} spec: {e}", s.id)))?;

    // Collect the fire times up to now + lookahead; those later than the grace are missed,
    // unless they fell due while this leader was running (it was busy, not gone).
    let horizon = now + LOOKAHEAD;
    let grace = ChronoDuration::milliseconds(s.misfire_grace_ms);
    let watched_from = leading_since.map_or(now, |since| since.min(now)) - grace;
    let (missed, mut next) = missed_fires(&fires, cursor, watched_from.min(horizon));
    let mut on_time: Vec<DateTime<Utc>> = Vec::new();
    while let Some(t) = next {
        if t > horizon || on_time.len() > MAX_FIRES_PER_PASS {
            break;
        }
        on_time.push(t);
        next = fires.next_after(t);
    }
    let mut runs: Vec<Run> = Vec::new();
    let missed_first = missed.first;
    let missed = missed.latest;
    if let Some(first) = missed_first {
        tracing::info!(schedule_id = %s.id, first_missed = %first, policy = %s.misfire,
            "fire times missed while no materialiser ran");
        match s.misfire.as_str() {
            "skip" => {}
            "catch_up" => {
                let from = missed.len().saturating_sub(MAX_CATCH_UP);
                runs.extend(missed[from..].iter().map(|&t| Run {
                    fire_time: t,
                    catch_up: true,
                    period_from: t,
                    manual: false,
                }));
            }
            _ => {
                if let (Some(first), Some(&t)) = (missed_first, missed.last()) {
                    // One run for every missed fire time: its period covers them all.
                    runs.push(Run {
                        fire_time: t,
                        catch_up: true,
                        period_from: first,
                        manual: false,
                    });
                }
            }
        }
    }
    runs.extend(on_time.iter().take(MAX_FIRES_PER_PASS).map(|&t| Run {
        fire_time: t,
        catch_up: false,
        period_from: t,
        manual: false,
    }));
    let new_cursor = if on_time.len() > MAX_FIRES_PER_PASS {
        Some(on_time[MAX_FIRES_PER_PASS])
    } else {
        next
    };

    let mut last_fired = s.last_fire_at;
    for run in &runs {
        if fire_run(tx, namespace, &s, &spec, &fires, run, now, windows).await? {
            last_fired = last_fired.max(Some(run.fire_time));
        }
    }
    tx.schedules()
        .advance(namespace, &s.id, new_cursor, last_fired)
        .await?;
    Ok(())
}

/// Creates a run of schedule `id` now, outside its fire-time rules (RunScheduleNow), in `tx`:
/// the same tasks (or fan-out) a fire would create, for the period since the last fire time.
/// Returns the run's fire time. A paused schedule, or with overlap SKIP one whose last run is
/// still going, is FAILED_PRECONDITION; the schedule's cursor does not move.
pub(super) async fn run_now(
    tx: &deadpool_postgres::Transaction<'_>,
    namespace: &str,
    id: &str,
    windows: &DuplicateWindows,
) -> Result<DateTime<Utc>, Error> {
    let Some((s, now)) = tx.schedules().lock(namespace, id).await? else {
        return Err(Error::FailedPrecondition(format!(
            "schedule {id} is paused (or gone): resume it to run it"
        )));
    };
    let fires = fire_times_of(&s)
        .ok_or_else(|| Error::FailedPrecondition("stored schedule does not parse".into()))?;
    let spec = pb::ScheduleSpec::decode(s.spec.as_slice())
        .map_err(|e| StoreError::Corrupt(format!("schedule {} spec: {e}", s.id)))?;
    if s.overlap == "skip" && tx.schedules().run_in_progress(namespace, &s.id).await? {
        return Err(Error::FailedPrecondition(format!(
            "schedule {id}'s last run is still going and its overlap policy is SKIP"
        )));
    }
    // Millisecond precision, as runs are listed and keyed.
    let fire_time = DateTime::from_timestamp_millis(now.timestamp_millis()).unwrap_or(now);
    let run = Run {
        fire_time,
        catch_up: false,
        period_from: fire_time,
        manual: true,
    };
    if !fire_run(tx, namespace, &s, &spec, &fires, &run, now, windows).await? {
        return Err(Error::FailedPrecondition(format!(
            "schedule {id} already has a run at {fire_time}"
        )));
    }
    Ok(fire_time)
}

/// Inserts one run and its tasks; false when it was skipped or already there.
// Each argument is a different part of one firing (the schedule, its rules, the run, the
// queue windows); bundling them would only move the list into a struct used once.
#[allow(clippy::too_many_arguments)]
async fn fire_run(
    tx: &deadpool_postgres::Transaction<'_>,
    namespace: &str,
    s: &ScheduleRecord,
    spec: &pb::ScheduleSpec,
    fires: &FireTimes,
    run: &Run,
    now: DateTime<Utc>,
    windows: &DuplicateWindows,
) -> Result<bool, Error> {
    if s.overlap == "skip"
        && !run.catch_up
        && !run.manual
        && tx.schedules().run_in_progress(namespace, &s.id).await?
    {
        tx.schedules()
            .insert_run(
                namespace,
                &s.id,
                run.fire_time,
                "skipped_overlap",
                0,
                None,
                None,
            )
            .await?;
        return Ok(false);
    }
    // A missed run whose tasks would all have expired by now (even its last stagger slot's) is
    // stale: recorded, not sent. Recipients of a run still in time are judged one by one
    // (run_task).
    if let Some(expire_after) = expire_after(spec) {
        let last_slot = ChronoDuration::milliseconds(s.stagger_ms);
        if run.catch_up && !run.manual && run.fire_time + last_slot + expire_after <= now {
            tx.schedules()
                .insert_run(
                    namespace,
                    &s.id,
                    run.fire_time,
                    "skipped_expired",
                    0,
                    None,
                    None,
                )
                .await?;
            return Ok(false);
        }
    }
    let kind = match (run.manual, run.catch_up) {
        (true, _) => "manual",
        (false, true) => "catch_up",
        (false, false) => "fired",
    };
    // Checked for overrunning against the spec in force when it fired.
    let overrun_deadline = spec.overrun_after.as_ref().map(|d| {
        run.fire_time
            + ChronoDuration::seconds(d.seconds)
            + ChronoDuration::nanoseconds(i64::from(d.nanos))
    });
    if spec.audience.is_some() || spec.variables_source.is_some() {
        // Its tasks are written batch by batch (`fanout`), counted on the run as they are.
        if tx
            .schedules()
            .insert_run(
                namespace,
                &s.id,
                run.fire_time,
                kind,
                0,
                overrun_deadline,
                None,
            )
            .await?
        {
            tx.fanouts()
                .insert(&PendingFanout {
                    namespace: namespace.to_owned(),
                    schedule_id: s.id.clone(),
                    fire_time: run.fire_time,
                    catch_up: run.catch_up,
                    period_start: previous_fire(fires, run.period_from),
                    period_end: run.fire_time,
                    after_recipient: String::new(),
                    failures: 0,
                    spec: Some(s.spec.clone()),
                })
                .await?;
            return Ok(true);
        }
        return Ok(false);
    }
    let specs = run_tasks(s, spec, run, now);
    let recipients = specs.len();
    let path = |i: usize| format!("schedule {} run {} recipient {i}", s.id, run.fire_time);
    // Checked and rendered as any task is: a stored template becomes its text here. A task that
    // no longer passes (a template changed or deleted since, an account deleted) is left out
    // and the run says why, rather than failing the materialiser for every other schedule or
    // recording a run that looks fired and sent nothing.
    let (tasks, left_out) =
        crate::tasks::prepare_leaving_out(tx, namespace, specs, &path, now).await?;
    let error = left_out.first().map(|first| {
        format!(
            "{} of {recipients} recipients left out, their tasks do not validate: {first}",
            left_out.len()
        )
    });
    if let Some(error) = &error {
        tracing::error!(schedule_id = %s.id, fire_time = %run.fire_time, %error,
            "schedule run's tasks do not validate");
    }
    let count = i32::try_from(tasks.len()).unwrap_or(i32::MAX);
    if !tx
        .schedules()
        .insert_run(
            namespace,
            &s.id,
            run.fire_time,
            kind,
            count,
            overrun_deadline,
            error.as_deref(),
        )
        .await?
    {
        return Ok(false);
    }
    let origin = Origin::ScheduleRun {
        schedule_id: s.id.clone(),
        fire_time: run.fire_time,
        audience_id: None,
    };
    let mut tasks = crate::tasks::with_origin(tasks, &origin);
    windows.apply(&mut tasks);
    crate::tasks::insert(tx, namespace, &tasks, &path).await?;
    Ok(true)
}

/// The spec's `expire_after`, if it has one.
fn expire_after(spec: &pb::ScheduleSpec) -> Option<ChronoDuration> {
    spec.expire_after.as_ref().map(|d| {
        ChronoDuration::seconds(d.seconds) + ChronoDuration::nanoseconds(i64::from(d.nanos))
    })
}

/// The tasks of one run: one per recipient (see [`run_task`]).
fn run_tasks(
    s: &ScheduleRecord,
    spec: &pb::ScheduleSpec,
    run: &Run,
    now: DateTime<Utc>,
) -> Vec<TaskSpec> {
    spec.recipients
        .iter()
        .filter_map(|recipient| run_task(s, spec, run, now, recipient))
        .collect()
}

/// The task one recipient of a run gets: due at the fire time plus its stagger slot and
/// jitter (catch-ups: now), keyed by (schedule, fire time, recipient) so that even a second
/// insert of the run could not create a second task. None for a catch-up's recipient whose
/// task would have expired by now (`expire_after` past its on-time slot): it would be stale.
pub(super) fn run_task(
    s: &ScheduleRecord,
    spec: &pb::ScheduleSpec,
    run: &Run,
    now: DateTime<Utc>,
    recipient: &str,
) -> Option<TaskSpec> {
    let fire = run.fire_time.to_rfc3339_opts(SecondsFormat::Millis, true);
    let stagger = ChronoDuration::milliseconds(s.stagger_ms);
    let jitter = ChronoDuration::milliseconds(s.jitter_ms);
    let on_time = run.fire_time + spread::stagger_offset(&s.id, recipient, stagger);
    // A catch-up's recipient whose task would have expired by now gets none: it would be stale.
    if run.catch_up && expire_after(spec).is_some_and(|d| on_time + d <= now) {
        return None;
    }
    let mut due = if run.catch_up { now } else { on_time };
    if s.stagger_off_round && s.stagger_ms > 0 && !run.catch_up {
        due = spread::off_round_minutes(due);
    }
    due += spread::jitter(jitter);
    let mut labels: BTreeMap<String, String> = spec.labels.clone();
    labels.insert("herald.schedule_id".into(), s.id.clone());
    labels.insert("herald.fire_time".into(), fire.clone());
    if run.catch_up {
        labels.insert("herald.catch_up".into(), "true".into());
    }
    Some(TaskSpec {
        // A run far in the past (catch-up) is due now, so the bounds hold.
        when: Some(When::At(due)),
        idempotency_key: format!("herald:schedule:{}:{}:{}", s.id, fire, recipient),
        // Counted from when the task was meant to go, so a catch-up keeps only what is left of
        // its time (fire_run skips a run with none left); never before it is due, which a
        // task may not be.
        expire_at: expire_after(spec).map(|d| {
            let meant = if run.catch_up { on_time } else { due };
            (meant + d).max(due + ChronoDuration::seconds(1))
        }),
        labels,
        ..super::spec::task_of(spec, recipient)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn fires(cron: &str) -> FireTimes {
        match FireTimes::parse(cron, "UTC", DstPolicy::default()) {
            Ok(f) => f,
            Err(e) => panic!("{cron}: {e}"),
        }
    }

    /// A period's start is the fire before it, however long ago: yearly and half-yearly
    /// reports had none (the search gave up after 182 days), nor a 29 February one.
    #[test]
    fn the_previous_fire_is_found_for_yearly_and_rarer_schedules() {
        let t = Utc.with_ymd_and_hms(2026, 12, 7, 10, 0, 0).unwrap();
        let at = |y, m, d| Utc.with_ymd_and_hms(y, m, d, 9, 0, 0).unwrap();
        assert_eq!(previous_fire(&fires("0 9 1 * *"), t), Some(at(2026, 12, 1)));
        assert_eq!(previous_fire(&fires("0 9 1 6 *"), t), Some(at(2026, 6, 1)));
        assert_eq!(previous_fire(&fires("0 9 1 1 *"), t), Some(at(2026, 1, 1)));
        assert_eq!(
            previous_fire(&fires("0 9 29 2 *"), t),
            Some(at(2024, 2, 29))
        );
        let after_2100 = Utc.with_ymd_and_hms(2103, 3, 1, 0, 0, 0).unwrap();
        assert_eq!(
            previous_fire(&fires("0 9 29 2 *"), after_2100),
            Some(at(2096, 2, 29))
        );
    }
}
