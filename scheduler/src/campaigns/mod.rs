//! Campaigns: one message to many recipients, spread over a window, with progress, pause,
//! resume and cancel. A campaign's recipients become tasks through the task domain (checked and
//! rendered per recipient); pause and cancel keep them from the claim by parking their routes
//! (`store/campaigns/`). The campaign's spec is stored as the `herald.v1.CampaignSpec` the client
//! sent, like a task's content.

pub mod model;
mod recipients;

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use chrono::{DateTime, Duration as ChronoDuration, Utc};
use herald_proto::v1 as pb;
use prost::Message;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use self::model::{CampaignRecord, FailureReason, Progress};
use self::recipients::{task_for, WriteTarget};
use crate::audiences::model::AudienceRecord;
use crate::error::{Error, Violations};
use crate::rules;
use crate::store::audiences::ContactFilter;
use crate::store::transaction;
use crate::store::{Db, StoreError};
use crate::tasks::model::MAX_AHEAD;
use crate::tasks::Tasks;

/// Most recipients per chunk.
pub const MAX_CHUNK: usize = 1_000;
/// Most recipients per campaign.
pub const MAX_RECIPIENTS: i32 = 100_000;
/// Audience pages added per background pass, over all campaigns.
const AUDIENCE_PAGES_PER_PASS: usize = 8;
/// How often the background expansion looks for work when it had none.
const AUDIENCE_IDLE_PROBE: Duration = Duration::from_secs(1);

/// One recipient of a campaign.
#[derive(Debug, Clone, Default)]
pub struct Recipient {
    /// Who.
    pub recipient: String,
    /// Their IANA time zone; empty for the campaign's.
    pub time_zone: String,
    /// Template variables over the campaign's.
    pub variables: BTreeMap<String, String>,
}

/// A campaign's state as callers see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CampaignState {
    /// Sending.
    Active,
    /// Paused by a caller.
    Paused,
    /// Cancelled.
    Cancelled,
    /// Every task ended.
    Finished,
}

impl CampaignState {
    /// The database's name for the state.
    pub fn as_str(self) -> &'static str {
        match self {
            CampaignState::Active => "active",
            CampaignState::Paused => "paused",
            CampaignState::Cancelled => "cancelled",
            CampaignState::Finished => "finished",
        }
    }
}

/// A campaign with what it has done and when it should be done.
#[derive(Debug, Clone)]
pub struct CampaignView {
    /// As stored.
    pub record: CampaignRecord,
    /// Its spec.
    pub spec: pb::CampaignSpec,
    /// Its state.
    pub state: CampaignState,
    /// Task counts.
    pub progress: Progress,
    /// When its last task should be sent.
    pub estimated_finish: Option<DateTime<Utc>>,
}

/// What cancelling a campaign did.
#[derive(Debug, Clone)]
pub struct CancelSummary {
    /// The campaign afterwards.
    pub campaign: CampaignView,
    /// Scheduled tasks cancelled.
    pub cancelled_scheduled: i64,
    /// Leased tasks revoked.
    pub revoked: i64,
    /// Of those, tasks whose send may have happened anyway.
    pub in_flight_at_cancel: i64,
}

/// The campaign operations of a replica.
#[derive(Clone)]
pub struct Campaigns {
    tasks: Tasks,
}

/// A span given in a spec in milliseconds, saturating (found by fuzzing, #10).
fn ms(d: Option<&prost_types::Duration>) -> i64 {
    d.map_or(0, |d| {
        d.seconds
            .saturating_mul(1000)
            .saturating_add(i64::from(d.nanos) / 1_000_000)
    })
}

/// Checks a campaign spec before anything is stored: the campaign's own fields, and its
/// content, queue and target as a task would be checked. Empty when valid.
pub fn check_spec(spec: &pb::CampaignSpec, now: DateTime<Utc>) -> Violations {
    let mut v = Violations::default();
    if spec.name.chars().count() > 200 {
        v.add("campaign.name", "must be at most 200 characters");
    }
    if !spec.time_zone.is_empty() && !rules::is_time_zone(&spec.time_zone) {
        v.add("campaign.time_zone", "is not an IANA time zone name");
    }
    if !spec.local_start.is_empty() && rules::parse_local_time(&spec.local_start).is_none() {
        v.add(
            "campaign.local_start",
            "must be a date-time like 2026-12-24T09:00",
        );
    }
    if !(0..=7 * 86_400_000).contains(&ms(spec.window.as_ref())) {
        v.add("campaign.window", "must be between 0 and 7 days");
    }
    if !(0..=86_400_000).contains(&ms(spec.spacing.as_ref())) {
        v.add("campaign.spacing", "must be between 0 and 24 hours");
    }
    if spec.labels.keys().any(|k| k.starts_with("herald.")) {
        v.add("campaign.labels", "keys starting with herald. are reserved");
    } else if spec.labels.len() >= 32 {
        // Every task of the campaign also carries herald.campaign_id, and a task has at most 32.
        v.add("campaign.labels", "must have at most 31 entries");
    } else {
        rules::labels(&spec.labels, "campaign.labels", &mut v);
    }
    // The bounds a task's due time and deadline have: a campaign starting in 2200 made tasks
    // CreateTask would refuse, and one expiring before it starts made tasks that could only
    // expire.
    let start_at = match spec.start_at.as_ref() {
        None => None,
        Some(t) => match rules::timestamp(t) {
            None => {
                v.add("campaign.start_at", "is not a valid timestamp");
                None
            }
            Some(at) if at > now + MAX_AHEAD => {
                v.add("campaign.start_at", "is more than 366 days ahead");
                None
            }
            Some(at) => Some(at),
        },
    };
    // A wall-clock start is compared in UTC, a day of slack either way for its zone.
    if rules::parse_local_time(&spec.local_start)
        .is_some_and(|local| local.and_utc() > now + MAX_AHEAD + chrono::Duration::days(1))
    {
        v.add("campaign.local_start", "is more than 366 days ahead");
    }
    // A wall-clock start is at its earliest in the zone furthest ahead (UTC+14): a deadline
    // before even that would expire every recipient's task unsent.
    let starts = rules::parse_local_time(&spec.local_start)
        .map(|local| local.and_utc() - chrono::Duration::hours(14))
        .or(start_at)
        .unwrap_or(now)
        .max(now);
    match spec.expire_at.as_ref().map(rules::timestamp) {
        None => {}
        Some(None) => v.add("campaign.expire_at", "is not a valid timestamp"),
        Some(Some(expire)) if expire <= starts => v.add(
            "campaign.expire_at",
            "must be after the campaign starts (and after now)",
        ),
        _ => {}
    }
    // The content, queue and target are checked as a task would be.
    let probe = Recipient {
        recipient: "probe".into(),
        ..Default::default()
    };
    let mut tv = Violations::default();
    task_for(spec, &probe, Uuid::nil()).validate("campaign", now, &mut tv);
    // The labels were checked above, without the herald.campaign_id the probe carries.
    for f in tv.as_slice() {
        if !f.field.starts_with("campaign.labels") {
            v.add(f.field.clone(), f.description.clone());
        }
    }
    v
}

impl Campaigns {
    /// Campaigns creating their tasks through `tasks`.
    pub fn new(tasks: Tasks) -> Self {
        Campaigns { tasks }
    }

    /// Creates a campaign (and adds its first recipients).
    pub async fn create(
        &self,
        namespace: &str,
        spec: pb::CampaignSpec,
        recipients: &[Recipient],
        idempotency_key: Option<&str>,
    ) -> Result<CampaignView, Error> {
        let mut v = check_spec(&spec, self.tasks.clock().now());
        if let Some(problem) = idempotency_key.and_then(rules::idempotency_key_problem) {
            v.add("idempotency_key", problem);
        }
        v.into_result(())?;
        let conn = self.tasks.store().conn().await?;
        let audience = match &spec.audience {
            Some(target) => Some(
                crate::audiences::target_audience(&conn, namespace, target, "campaign.audience")
                    .await?,
            ),
            None => None,
        };
        if !spec.pool.is_empty() {
            let found = conn
                .accounts()
                .existing_targets(namespace, &[spec.pool.as_str()], &[])
                .await?;
            if !found.pools.contains_key(&spec.pool) {
                return Err(Error::invalid(
                    "campaign.pool",
                    format!("pool {} does not exist", spec.pool),
                ));
            }
        }
        let mut stored = spec.clone();
        if stored.time_zone.is_empty() {
            stored.time_zone = "UTC".into();
        }
        if let Some(key) = idempotency_key {
            if let Some(made) = conn.campaigns().by_key(namespace, key).await? {
                drop(conn);
                return self
                    .created_before(namespace, made, &stored, recipients)
                    .await;
            }
        }
        let pool = (!spec.pool.is_empty()).then_some(spec.pool.as_str());
        // Dates ("birthday is today") are compared at the campaign's start (or, with
        // local_start, on its date: add_audience_page).
        let audience_at = audience.as_ref().map(|_| {
            spec.start_at
                .as_ref()
                .and_then(rules::timestamp)
                .unwrap_or_else(|| self.tasks.clock().now())
        });
        // The first recipients are checked and rendered before the campaign is written: a
        // bad one then changes nothing (it left an ACTIVE campaign without recipients behind,
        // its id never given to the caller).
        let id = Uuid::now_v7();
        let now = self.tasks.clock().now();
        let first = if recipients.is_empty() {
            None
        } else {
            Some(
                self.prepare_recipients(
                    &conn,
                    namespace,
                    &stored,
                    id,
                    recipients,
                    "recipients",
                    now,
                )
                .await?,
            )
        };
        let created = conn
            .campaigns()
            .create(
                namespace,
                id,
                &spec.name,
                &stored.encode_to_vec(),
                pool,
                audience_at,
                idempotency_key,
            )
            .await?;
        let Some(campaign) = created else {
            // A concurrent call with the same key made it first.
            let key = idempotency_key.unwrap_or_default();
            let made = conn
                .campaigns()
                .by_key(namespace, key)
                .await?
                .ok_or_else(|| Error::Aborted(format!("campaign of key {key:?} vanished")))?;
            drop(conn);
            return self
                .created_before(namespace, made, &stored, recipients)
                .await;
        };
        drop(conn);
        if let Some(prepared) = first {
            let into = WriteTarget {
                namespace,
                spec: &stored,
                campaign: &campaign,
                path: "recipients",
                audience: None,
                now,
            };
            self.write_recipients(&into, recipients, prepared).await?;
        }
        // The first page now, so a small audience is complete when the call answers; the
        // rest in the background ([`audience_expansion`]), resumable after a restart.
        if audience.is_some() {
            self.add_audience_page(namespace, campaign.id).await?;
        }
        self.get(namespace, campaign.id).await
    }

    /// A retried CreateCampaign: the campaign its key made before, with the call's first
    /// recipients added if the first try did not get that far (those it added are dropped as
    /// duplicates). A different campaign under the same key is ALREADY_EXISTS, as a task's key is.
    async fn created_before(
        &self,
        namespace: &str,
        made: CampaignRecord,
        stored: &pb::CampaignSpec,
        recipients: &[Recipient],
    ) -> Result<CampaignView, Error> {
        if made.spec != stored.encode_to_vec() {
            return Err(Error::AlreadyExists(format!(
                "idempotency_key: already used for a different campaign ({})",
                made.id
            )));
        }
        // A campaign that has ended takes no recipients; the retry still gets it, as a retried
        // CreateTask gets its finished task.
        let ended = made.state == "finished" || made.state == "cancelled";
        if !recipients.is_empty() && !ended {
            self.add(namespace, made.id, recipients, "recipients")
                .await?;
        }
        self.get(namespace, made.id).await
    }

    /// Adds the next page of [`MAX_CHUNK`] contacts of a campaign's audience that match its
    /// target, each a recipient with its zone and its variables, and moves the campaign's
    /// cursor past them. Returns whether more pages follow. A page added twice (a replica
    /// that lost the race, a crash before the cursor moved) adds nothing: recipients already
    /// in the campaign are dropped. The campaign's recipient cap, its cancellation or a deleted
    /// audience stop it, with why kept on the campaign.
    async fn add_audience_page(&self, namespace: &str, id: Uuid) -> Result<bool, Error> {
        let conn = self.tasks.store().conn().await?;
        let Some(campaign) = conn.campaigns().get(namespace, id).await? else {
            return Ok(false);
        };
        let progress = campaign.audience.clone();
        if !progress.pending {
            return Ok(false);
        }
        let spec = decode(&campaign)?;
        let Some(target) = spec.audience.as_ref() else {
            return Ok(false);
        };
        let after = progress.after.as_str();
        let stop = |why: String| async move {
            self.tasks
                .store()
                .conn()
                .await?
                .campaigns()
                .advance_audience(namespace, id, after, after, false, Some(&why))
                .await?;
            Ok::<bool, Error>(false)
        };
        let Some(audience) = conn.audiences().get(namespace, &target.audience_id).await? else {
            drop(conn);
            return stop(format!("audience {} no longer exists", target.audience_id)).await;
        };
        let filter = ContactFilter {
            tags: target.tags.clone(),
            ..Default::default()
        };
        let page = conn
            .audiences()
            .list_contacts(
                namespace,
                &audience.id,
                &progress.after,
                &filter,
                MAX_CHUNK as i64,
            )
            .await?;
        drop(conn);
        // With local_start every contact is sent to on that local date, whatever its zone:
        // "birthday is today" means that date. Else the campaign's start in each zone.
        let day = match rules::parse_local_time(&spec.local_start) {
            Some(local) => ContactsDay::Local(local.date()),
            None => ContactsDay::At(progress.at.unwrap_or(campaign.created_at)),
        };
        let recipients = audience_recipients(&page, target, &audience, day);
        if !recipients.is_empty() {
            let added = self
                .add_from(
                    namespace,
                    id,
                    &recipients,
                    "campaign.audience",
                    Some(&audience.id),
                )
                .await;
            match added {
                Ok(added) if added.capped => {
                    return stop(format!(
                        "campaign {id} reached 100,000 recipients; the audience's other \
                         contacts were left out"
                    ))
                    .await
                }
                Ok(_) => {}
                Err(Error::FailedPrecondition(why)) => return stop(why).await,
                Err(e) => return Err(e),
            }
        }
        let more = page.len() == MAX_CHUNK;
        let last = page
            .last()
            .map_or(progress.after.as_str(), |c| c.recipient.as_str());
        let moved = self
            .tasks
            .store()
            .conn()
            .await?
            .campaigns()
            .advance_audience(namespace, id, &progress.after, last, more, None)
            .await?;
        Ok(moved && more)
    }

    /// One pass of the background expansion: up to [`AUDIENCE_PAGES_PER_PASS`] pages over the
    /// campaigns with audience contacts still to add. Returns whether any has more.
    pub async fn add_audience_pages(&self) -> Result<bool, Error> {
        let pending = self
            .tasks
            .store()
            .conn()
            .await?
            .campaigns()
            .pending_audiences(AUDIENCE_PAGES_PER_PASS as i64)
            .await?;
        let mut more = false;
        for (namespace, id) in pending {
            // One campaign's failure must not hold up every campaign listed after it.
            match self.add_audience_page(&namespace, id).await {
                Ok(has_more) => more |= has_more,
                Err(e) => tracing::warn!(campaign_id = %id, %namespace, error = %e,
                    "adding a campaign's audience contacts failed; trying again next pass"),
            }
        }
        Ok(more)
    }

    /// Reads a campaign with its progress.
    pub async fn get(&self, namespace: &str, id: Uuid) -> Result<CampaignView, Error> {
        let conn = self.tasks.store().conn().await?;
        let record = conn
            .campaigns()
            .get(namespace, id)
            .await?
            .ok_or_else(|| Error::NotFound(format!("campaign {id}")))?;
        let progress = conn
            .campaigns()
            .progress(namespace, id, record.pool.as_deref())
            .await?;
        view(record, progress)
    }

    /// One page of campaigns with their progress, newest first: `limit` campaigns in one of
    /// `states` (empty: any) with an id before `before`.
    pub async fn list(
        &self,
        namespace: &str,
        states: &[CampaignState],
        before: Option<Uuid>,
        limit: i64,
    ) -> Result<Vec<CampaignView>, Error> {
        let conn = self.tasks.store().conn().await?;
        let names: Vec<&str> = states.iter().map(|s| s.as_str()).collect();
        let records = conn
            .campaigns()
            .list(
                namespace,
                (!names.is_empty()).then_some(names.as_slice()),
                before,
                limit,
            )
            .await?;
        let mut views = Vec::with_capacity(records.len());
        for record in records {
            let progress = conn
                .campaigns()
                .progress(namespace, record.id, record.pool.as_deref())
                .await?;
            views.push(view(record, progress)?);
        }
        Ok(views)
    }

    /// Pauses (parks live tasks) or resumes (unparks them) a campaign; a cancelled or finished
    /// one is returned unchanged.
    pub async fn set_paused(
        &self,
        namespace: &str,
        id: Uuid,
        paused: bool,
    ) -> Result<CampaignView, Error> {
        transaction!(self.tasks.store(), Error, |tx| {
            let Some((state, _)) = tx.campaigns().lock(namespace, id).await? else {
                return Err(Error::NotFound(format!("campaign {id}")));
            };
            // Pausing a paused campaign or resuming an active one changes nothing and is no
            // error; a campaign that has ended can be neither.
            if state == "cancelled" || state == "finished" {
                return Err(Error::FailedPrecondition(format!(
                    "campaign {id} is {state}; only an active or paused campaign can be {}",
                    if paused { "paused" } else { "resumed" }
                )));
            }
            let from = if paused { "active" } else { "paused" };
            if state == from {
                tx.campaigns().set_paused(namespace, id, paused).await?;
            }
            Ok(())
        })?;
        self.get(namespace, id).await
    }

    /// A campaign's failed tasks grouped by why they ended and the provider's code (at most
    /// `limit` groups, largest first).
    pub async fn failure_reasons(
        &self,
        namespace: &str,
        id: Uuid,
        limit: i64,
    ) -> Result<Vec<FailureReason>, Error> {
        let conn = self.tasks.store().conn().await?;
        if conn.campaigns().get(namespace, id).await?.is_none() {
            return Err(Error::NotFound(format!("campaign {id}")));
        }
        Ok(conn.campaigns().failure_reasons(id, limit).await?)
    }

    /// Sends per interval of `interval` over the last `intervals` of them, per campaign of
    /// `ids` (index 0 the latest): the console's throughput sparkline.
    pub async fn sends_per_interval(
        &self,
        ids: &[Uuid],
        intervals: i32,
        interval: Duration,
    ) -> Result<HashMap<Uuid, Vec<i64>>, Error> {
        Ok(self
            .tasks
            .store()
            .conn()
            .await?
            .campaigns()
            .sends_per_interval(ids, intervals, interval.as_millis() as i64)
            .await?)
    }

    /// Cancels a campaign: its scheduled tasks at once, its leased ones by revoking them from
    /// their executors (waiting a bounded time for their answers).
    pub async fn cancel(&self, namespace: &str, id: Uuid) -> Result<CancelSummary, Error> {
        let rows = transaction!(self.tasks.store(), Error, |tx| tx
            .campaigns()
            .cancel(namespace, id)
            .await)?
        .ok_or_else(|| Error::NotFound(format!("campaign {id}")))?;
        let (revoked, scheduled) = self.tasks.cancel_leased(namespace, &rows.leased).await?;
        let records = self.tasks.get_many(namespace, &rows.leased).await?;
        let in_flight = records
            .iter()
            .filter(|r| {
                !matches!(
                    r.cancel_outcome,
                    Some(
                        crate::tasks::model::CancelOutcome::NotStarted
                            | crate::tasks::model::CancelOutcome::StoppedBeforeSend
                    )
                ) && r.state == crate::tasks::model::TaskState::Cancelled
            })
            .count() as i64;
        Ok(CancelSummary {
            campaign: self.get(namespace, id).await?,
            cancelled_scheduled: rows.scheduled as i64 + scheduled as i64,
            revoked: revoked as i64,
            in_flight_at_cancel: in_flight,
        })
    }
}

/// A stored campaign's spec.
fn decode(c: &CampaignRecord) -> Result<pb::CampaignSpec, Error> {
    pb::CampaignSpec::decode(c.spec.as_slice())
        .map_err(|e| Error::Store(StoreError::Corrupt(format!("campaign {} spec: {e}", c.id))))
}

/// The contacts of `page` that match `target` (dates compared at `at`) as recipients, each
/// with its zone and its variables.
/// The day an audience's date filter ("birthday is today") compares each contact with.
#[derive(Debug, Clone, Copy)]
enum ContactsDay {
    /// This instant's date in the contact's zone.
    At(DateTime<Utc>),
    /// This date, every contact's own (a campaign's `local_start`).
    Local(chrono::NaiveDate),
}

fn audience_recipients(
    page: &[crate::audiences::model::Contact],
    target: &pb::AudienceTarget,
    audience: &AudienceRecord,
    day: ContactsDay,
) -> Vec<Recipient> {
    let attr = target.date_attribute.as_str();
    page.iter()
        .filter(|c| {
            attr.is_empty()
                || match day {
                    ContactsDay::At(at) => {
                        crate::audiences::is_today(c, attr, &audience.default_time_zone, at)
                    }
                    ContactsDay::Local(date) => crate::audiences::is_on(c, attr, date),
                }
        })
        .map(|c| {
            let zone = c.zone_or(&audience.default_time_zone);
            Recipient {
                recipient: c.recipient.clone(),
                time_zone: zone.to_owned(),
                variables: crate::audiences::contact_variables(c, zone),
            }
        })
        .collect()
}

/// Adds campaigns' audience contacts in the background until `stop`: every replica works on
/// them (a page added twice adds nothing), so a campaign left by a replica that died is
/// completed by another.
pub async fn audience_expansion(campaigns: Campaigns, stop: CancellationToken) {
    loop {
        let wait = match campaigns.add_audience_pages().await {
            Ok(true) => Duration::ZERO,
            Ok(false) => AUDIENCE_IDLE_PROBE,
            Err(e) => {
                tracing::warn!(error = %e, "adding campaign audience contacts failed; retrying");
                AUDIENCE_IDLE_PROBE
            }
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// A stored campaign with its state and finish estimate.
fn view(record: CampaignRecord, progress: Progress) -> Result<CampaignView, Error> {
    let spec = decode(&record)?;
    let mut state = match record.state.as_str() {
        "paused" => CampaignState::Paused,
        "cancelled" => CampaignState::Cancelled,
        "finished" => CampaignState::Finished,
        _ => CampaignState::Active,
    };
    if state == CampaignState::Active
        && progress.live == 0
        && record.recipient_count > 0
        && !record.audience.pending
    {
        state = CampaignState::Finished;
    }
    // The later of the last slot and what the pool's current rates allow for what is left. A
    // pool with no account able to send (every one paused or offline) has no rate: no estimate
    // then, rather than "now" for a campaign that cannot move.
    let blocked = record.pool.is_some() && progress.pool_rate <= 0.0;
    let estimated_finish = match (state, progress.now) {
        (CampaignState::Active, Some(now)) if progress.live > 0 && !blocked => {
            let by_rate = (progress.pool_rate > 0.0).then(|| {
                now + ChronoDuration::milliseconds(
                    (progress.live as f64 / progress.pool_rate * 1000.0) as i64,
                )
            });
            [Some(now), progress.last_due, by_rate]
                .into_iter()
                .flatten()
                .max()
        }
        _ => None,
    };
    Ok(CampaignView {
        record,
        spec,
        state,
        progress,
        estimated_finish,
    })
}
