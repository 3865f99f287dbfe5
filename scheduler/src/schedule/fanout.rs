//! Fan-out: a run of a schedule that targets an audience (or asks a variables source) becomes
//! one task per matching recipient, in batches of [`BATCH`].
//!
//! The materialiser records such a run with a fan-out row in the run's transaction; the
//! leader then writes the batches, each in its own transaction that creates its tasks and
//! moves the fan-out past its last recipient. Recipients are walked in recipient order, so a
//! batch is fenced by where the previous one ended: a replica that lost the race for a batch
//! finds the fan-out moved on and writes nothing, and a batch written twice (a commit in
//! doubt) creates nothing new, its tasks being keyed by (schedule, fire time, recipient).
//!
//! A variables source is asked outside any transaction; a failure is recorded on the fan-out,
//! which is tried again from the same recipient as the schedule's retry policy spaces it
//! ([`source::retry_delay`]), until its attempt budget is spent.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use herald_proto::v1 as pb;
use prost::Message;

use super::materializer::{run_task, Run};
use super::model::ScheduleRecord;
use super::source::{self, RunContext, Sources};
use crate::audiences::model::Contact;
use crate::error::Error;
use crate::store::audiences::ContactFilter;
use crate::store::fanouts::PendingFanout;
use crate::store::transaction;
use crate::store::{Db, Store, StoreError};
use crate::tasks::duplicates::DuplicateWindows;
use crate::tasks::model::{Origin, TaskSpec};

/// Recipients per batch (one transaction, one variables-source request).
pub const BATCH: i64 = 500;
/// Fan-outs looked at per pass.
const FANOUTS_PER_PASS: i64 = 16;
/// Batches written per pass, over all fan-outs: the materialiser gets its turn between
/// passes, so a million-contact run does not delay other schedules' fire times.
const BATCHES_PER_PASS: usize = 40;

/// What one pass did.
#[derive(Debug, Default)]
pub struct PassOutcome {
    /// Some fan-out has more batches ready now.
    pub more: bool,
}

/// Writes due fan-out batches, up to [`BATCHES_PER_PASS`].
/// Tasks of a queue with a duplicate content window in `windows` are guarded.
pub async fn pass(
    store: &Store,
    windows: &DuplicateWindows,
    sources: &Sources,
) -> Result<PassOutcome, StoreError> {
    let pending = store
        .conn()
        .await?
        .fanouts()
        .pending(FANOUTS_PER_PASS)
        .await?;
    let mut budget = BATCHES_PER_PASS;
    let mut outcome = PassOutcome::default();
    for mut f in pending {
        loop {
            if budget == 0 {
                outcome.more = true;
                return Ok(outcome);
            }
            budget -= 1;
            match batch(store, windows, sources, &f).await {
                Ok(Some(last)) => {
                    f.after_recipient = last;
                    // The batch's commit reset the stored count (failures in a row): a later
                    // batch of this pass that fails is its first.
                    f.failures = 0;
                }
                Ok(None) => break,
                Err(BatchError::Source { error: e, retry_in }) => {
                    let delay = retry_in;
                    tracing::warn!(schedule_id = %f.schedule_id, fire_time = %f.fire_time,
                        failures = f.failures + 1, retry_in = ?delay, error = %e,
                        "variables source failed");
                    let ms = delay.map_or(0, |d| d.as_millis() as i64);
                    store
                        .conn()
                        .await?
                        .fanouts()
                        .fail(&f, ms, &e.to_string(), delay.is_none())
                        .await?;
                    break;
                }
                Err(BatchError::Other(e)) => {
                    tracing::warn!(schedule_id = %f.schedule_id, fire_time = %f.fire_time,
                        error = %e, "fan-out batch failed; trying again");
                    break;
                }
            }
        }
    }
    Ok(outcome)
}

/// Milliseconds until a fan-out is due again (after a failure); None without one.
pub async fn next_due_ms(store: &Store) -> Result<Option<f64>, StoreError> {
    store.conn().await?.fanouts().next_due_ms().await
}

/// Why a batch was not written.
#[derive(Debug, thiserror::Error)]
enum BatchError {
    /// The variables source failed: recorded, tried again after `retry_in` (None: the
    /// schedule's attempt budget is spent and the run gives up).
    #[error("{error}")]
    Source {
        /// What failed.
        error: source::SourceError,
        /// When to ask again.
        retry_in: Option<std::time::Duration>,
    },
    /// Anything else (the database): the next pass tries again.
    #[error(transparent)]
    Other(#[from] Error),
}

impl From<StoreError> for BatchError {
    fn from(e: StoreError) -> Self {
        BatchError::Other(Error::Store(e))
    }
}

/// Writes the batch after `f.after_recipient`; returns its last recipient when more may
/// follow, None when the fan-out is finished (or another replica moved it on).
async fn batch(
    store: &Store,
    windows: &DuplicateWindows,
    sources: &Sources,
    f: &PendingFanout,
) -> Result<Option<String>, BatchError> {
    let conn = store.conn().await?;
    let Some(current) = conn.schedules().get(&f.namespace, &f.schedule_id).await? else {
        // Deleted: its runs and fan-outs went with it.
        return Ok(None);
    };
    let (s, spec) = as_made(current, f)?;
    let (page, default_zone) = match &spec.audience {
        Some(target) => {
            let Some(audience) = conn
                .audiences()
                .get(&f.namespace, &target.audience_id)
                .await?
            else {
                tracing::error!(schedule_id = %s.id, audience_id = %target.audience_id,
                    "schedule's audience is gone; the run sends nothing");
                drop(conn);
                give_up(store, f, "the audience no longer exists").await?;
                return Ok(None);
            };
            let filter = ContactFilter {
                tags: target.tags.clone(),
                ..Default::default()
            };
            let page = conn
                .audiences()
                .list_contacts(
                    &f.namespace,
                    &audience.id,
                    &f.after_recipient,
                    &filter,
                    BATCH,
                )
                .await?;
            (page, audience.default_time_zone)
        }
        None => (inline_page(&spec, &f.after_recipient), s.time_zone.clone()),
    };
    drop(conn);
    let more = page.len() as i64 == BATCH;
    let last = page.last().map(|c| c.recipient.clone());
    let date_attribute = spec
        .audience
        .as_ref()
        .map(|a| a.date_attribute.as_str())
        .filter(|a| !a.is_empty());
    let matching: Vec<&Contact> = page
        .iter()
        .filter(|c| match date_attribute {
            Some(attr) => crate::audiences::is_today(c, attr, &default_zone, f.fire_time),
            None => true,
        })
        .collect();
    let ctx = RunContext {
        schedule_id: s.id.clone(),
        fire_time: f.fire_time,
        period_start: f.period_start,
        period_end: f.period_end,
        catch_up: f.catch_up,
    };
    let fetched = match &spec.variables_source {
        Some(src) if !matching.is_empty() => {
            let owned: Vec<Contact> = matching.iter().map(|c| (*c).clone()).collect();
            let id = format!(
                "herald:schedule:{}:{}:after:{}",
                s.id,
                source::rfc3339(f.fire_time),
                f.after_recipient
            );
            let answer = sources.fetch(src, &ctx, &owned, &id).await;
            Some(answer.map_err(|error| {
                BatchError::Source {
                    // The guard refuses the same URL every time: no point asking again.
                    retry_in: (!matches!(error, source::SourceError::Refused(_)))
                        .then(|| source::retry_delay(&spec, f.failures + 1))
                        .flatten(),
                    error,
                }
            })?)
        }
        _ => None,
    };
    let written = transaction!(store, Error, idempotent = true, |tx| {
        let Some((after, now)) = tx.fanouts().lock(f).await? else {
            return Ok(false);
        };
        if after != f.after_recipient {
            return Ok(false);
        }
        let specs: Vec<TaskSpec> = matching
            .iter()
            .filter_map(|c| {
                let from_source = match &fetched {
                    Some(vars) => Some(vars.get(&c.recipient)?),
                    None => None,
                };
                let zone = c.zone_or(&default_zone);
                let vars = variables(&spec, c, zone, &ctx, from_source);
                contact_task(&s, &spec, f, now, c, vars)
            })
            .collect();
        let audience_id = spec.audience.as_ref().map(|a| a.audience_id.as_str());
        let created = insert_tasks(tx, f, &s.id, audience_id, specs, now, windows).await?;
        tx.fanouts()
            .advance(
                f,
                last.as_deref().unwrap_or(&f.after_recipient),
                created,
                !more,
            )
            .await?;
        Ok::<_, Error>(true)
    })?;
    Ok(if written && more { last } else { None })
}

/// The schedule as the fan-out's run was made (its content, recipients, audience, source,
/// spread), not as an UpdateSchedule since has it: a run already made keeps what it sends.
/// Runs made before migration 39 carry no copy and follow the schedule.
fn as_made(
    current: ScheduleRecord,
    f: &PendingFanout,
) -> Result<(ScheduleRecord, pb::ScheduleSpec), StoreError> {
    let corrupt = |e: prost::DecodeError| {
        StoreError::Corrupt(format!("schedule {} spec: {e}", f.schedule_id))
    };
    let Some(made) = f.spec.as_deref() else {
        let spec = pb::ScheduleSpec::decode(current.spec.as_slice()).map_err(corrupt)?;
        return Ok((current, spec));
    };
    let spec = pb::ScheduleSpec::decode(made).map_err(corrupt)?;
    // The spread the run was made with; the spec was checked when it was stored.
    let record = match super::spec::check(&spec, f.fire_time) {
        Ok((record, _)) => ScheduleRecord {
            jitter_ms: record.jitter_ms,
            stagger_ms: record.stagger_ms,
            stagger_off_round: record.stagger_off_round,
            time_zone: record.time_zone,
            ..current
        },
        Err(_) => current,
    };
    Ok((record, spec))
}

/// Records a fan-out as given up with `why`.
async fn give_up(store: &Store, f: &PendingFanout, why: &str) -> Result<(), StoreError> {
    store.conn().await?.fanouts().fail(f, 0, why, true).await
}

/// The page after `after` of a schedule's inline recipients, in recipient order.
fn inline_page(spec: &pb::ScheduleSpec, after: &str) -> Vec<Contact> {
    let mut recipients: Vec<&String> = spec
        .recipients
        .iter()
        .filter(|r| r.as_str() > after)
        .collect();
    recipients.sort();
    recipients
        .into_iter()
        .take(BATCH as usize)
        .map(|r| Contact {
            recipient: r.clone(),
            ..Default::default()
        })
        .collect()
}

/// A contact's template variables, lowest precedence first: the schedule's own template
/// variables, the contact's attributes, its fields, the run's context, then what the
/// variables source answered for it.
pub fn variables(
    spec: &pb::ScheduleSpec,
    c: &Contact,
    zone: &str,
    ctx: &RunContext,
    from_source: Option<&BTreeMap<String, String>>,
) -> BTreeMap<String, String> {
    let mut vars = match &spec.content {
        Some(pb::Content {
            body: Some(pb::content::Body::Template(t)),
            ..
        }) => t.variables.clone(),
        _ => BTreeMap::new(),
    };
    vars.extend(crate::audiences::contact_variables(c, zone));
    let local_date = zone
        .parse::<chrono_tz::Tz>()
        .map(|z| ctx.fire_time.with_timezone(&z).date_naive().to_string())
        .unwrap_or_default();
    for (k, v) in [
        ("fire_time", source::rfc3339(ctx.fire_time)),
        ("fire_date", local_date),
        (
            "period_start",
            ctx.period_start.map(source::rfc3339).unwrap_or_default(),
        ),
        ("period_end", source::rfc3339(ctx.period_end)),
        ("catch_up", ctx.catch_up.to_string()),
    ] {
        vars.insert(k.to_owned(), v);
    }
    if let Some(extra) = from_source {
        vars.extend(extra.clone());
    }
    vars
}

/// The task one contact of a fan-out gets: the run's task for its recipient, with the
/// template's variables set to the contact's. None for a catch-up's contact whose task would
/// have expired by now (see [`run_task`]): a batch written late sends nothing stale either.
fn contact_task(
    s: &ScheduleRecord,
    spec: &pb::ScheduleSpec,
    f: &PendingFanout,
    now: DateTime<Utc>,
    c: &Contact,
    vars: BTreeMap<String, String>,
) -> Option<TaskSpec> {
    let run = Run {
        fire_time: f.fire_time,
        catch_up: f.catch_up,
        period_from: f.fire_time,
        manual: false,
    };
    let mut task = run_task(s, spec, &run, now, &c.recipient)?;
    if let Some(pb::Content {
        body: Some(pb::content::Body::Template(t)),
        ..
    }) = &mut task.content
    {
        t.variables = vars;
    }
    Some(task)
}

/// Prepares (checks, renders) and inserts a batch's tasks; returns how many were new. A task
/// that does not render (a contact without an attribute the template needs) is left out and
/// logged, rather than holding up every other contact of the run.
async fn insert_tasks(
    tx: &deadpool_postgres::Transaction<'_>,
    f: &PendingFanout,
    schedule_id: &str,
    audience_id: Option<&str>,
    specs: Vec<TaskSpec>,
    now: DateTime<Utc>,
    windows: &DuplicateWindows,
) -> Result<i32, Error> {
    if specs.is_empty() {
        return Ok(0);
    }
    let recipients: Vec<String> = specs.iter().map(|s| s.recipient.clone()).collect();
    let path = |i: usize| {
        let recipient = recipients.get(i).map_or("?", String::as_str);
        format!(
            "schedule {schedule_id} run {} recipient {recipient}",
            f.fire_time
        )
    };
    let (prepared, left_out) =
        crate::tasks::prepare_leaving_out(tx, &f.namespace, specs, &path, now).await?;
    for problems in &left_out {
        tracing::warn!(schedule_id, fire_time = %f.fire_time, %problems,
            "a recipient's task does not validate; it is left out of the run");
    }
    let origin = Origin::ScheduleRun {
        schedule_id: schedule_id.to_owned(),
        fire_time: f.fire_time,
        audience_id: audience_id.map(str::to_owned),
    };
    let mut tasks = crate::tasks::with_origin(prepared, &origin);
    windows.apply(&mut tasks);
    let inserted = crate::tasks::insert(tx, &f.namespace, &tasks, &path).await?;
    Ok(i32::try_from(inserted.inserted.len()).unwrap_or(i32::MAX))
}
