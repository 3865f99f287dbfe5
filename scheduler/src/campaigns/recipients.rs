//! Adding recipients to a campaign: each one checked and rendered as its task (the campaign's
//! content with the recipient's variables, its zone and send window), then the tasks written
//! in one transaction, each due at its slot of the campaign's window. CreateCampaign's first
//! chunk, AddRecipients, StreamRecipients and the audience pages all come through here.

use std::borrow::Cow;
use std::collections::HashSet;

use chrono::{DateTime, Duration as ChronoDuration, Utc};
use herald_proto::v1 as pb;
use uuid::Uuid;

use super::model::{Added, CampaignRecord};
use super::{decode, ms, Campaigns, Recipient, MAX_CHUNK, MAX_RECIPIENTS};
use crate::error::{Error, Violations};
use crate::rules;
use crate::schedule::{fire_times, spread};
use crate::store::transaction;
use crate::store::Db;
use crate::tasks::model::{DueAt, NewTask, Origin, TaskSpec};

/// The task of one recipient before its due time is set.
pub(super) fn task_for(spec: &pb::CampaignSpec, r: &Recipient, id: Uuid) -> TaskSpec {
    let mut labels = spec.labels.clone();
    labels.insert("herald.campaign_id".into(), id.to_string());
    let mut content = spec.content.clone();
    // The recipient's variables over the campaign's.
    if let Some(pb::content::Body::Template(t)) = content.as_mut().and_then(|c| c.body.as_mut()) {
        for (k, v) in &r.variables {
            t.variables.insert(k.clone(), v.clone());
        }
    }
    TaskSpec {
        queue: spec.queue.clone(),
        recipient: r.recipient.clone(),
        content,
        priority: spec.priority,
        max_attempts: spec.max_attempts,
        // The campaign's policy, applied to every recipient's task.
        retry: spec
            .retry_policy
            .as_ref()
            .and_then(crate::tasks::model::RetryPolicy::from_wire),
        expire_at: spec.expire_at.as_ref().and_then(rules::timestamp),
        duplicate_window_ms: spec
            .duplicate_window
            .as_ref()
            .map(|d| rules::duration_ms(d).unwrap_or(-1)),
        labels,
        pool: spec.pool.clone(),
        // The window is in the recipient's zone, else the campaign's.
        send_window: spec.send_window.clone().map(|mut w| {
            if w.time_zone.is_empty() {
                w.time_zone = if r.time_zone.is_empty() {
                    spec.time_zone.clone()
                } else {
                    r.time_zone.clone()
                };
            }
            w
        }),
        ..Default::default()
    }
}

impl Campaigns {
    /// Adds recipients in one transaction: drops those already in the campaign (and repeats
    /// within `recipients`), and creates the tasks of the rest, each due at its slot: the
    /// campaign's start (in the recipient's zone for a local start) plus its spacing times its
    /// sequence number, or its stagger offset in the window. Every recipient is checked and
    /// rendered first; `path` names them in violations.
    pub async fn add(
        &self,
        namespace: &str,
        id: Uuid,
        recipients: &[Recipient],
        path: &str,
    ) -> Result<Added, Error> {
        self.add_from(namespace, id, recipients, path, None).await
    }

    /// [`Self::add`] for recipients taken from `audience` (recorded on their tasks).
    pub(super) async fn add_from(
        &self,
        namespace: &str,
        id: Uuid,
        recipients: &[Recipient],
        path: &str,
        audience: Option<&str>,
    ) -> Result<Added, Error> {
        let conn = self.tasks.store().conn().await?;
        let campaign = conn
            .campaigns()
            .get(namespace, id)
            .await?
            .ok_or_else(|| Error::NotFound(format!("campaign {id}")))?;
        let spec = decode(&campaign)?;
        let now = self.tasks.clock().now();
        let prepared = self
            .prepare_recipients(&conn, namespace, &spec, id, recipients, path, now)
            .await;
        let (recipients, prepared) = match (prepared, audience) {
            (Ok(prepared), _) => (Cow::Borrowed(recipients), prepared),
            // An audience is data that changes after the campaign was made: one contact
            // without an attribute the template needs is left out (and logged), as a
            // schedule's run does, rather than holding up every contact after it.
            (Err(Error::InvalidArgument(_)), Some(audience)) => {
                let (kept, prepared) = self
                    .prepare_each(&conn, namespace, &spec, id, recipients, audience, now)
                    .await?;
                (Cow::Owned(kept), prepared)
            }
            (Err(e), _) => return Err(e),
        };
        drop(conn);
        if recipients.is_empty() {
            return Ok(Added {
                added: 0,
                duplicates: 0,
                total: campaign.recipient_count,
                capped: false,
            });
        }
        let into = WriteTarget {
            namespace,
            spec: &spec,
            campaign: &campaign,
            path,
            audience,
            now,
        };
        self.write_recipients(&into, &recipients, prepared).await
    }

    /// [`Self::prepare_recipients`] one recipient at a time: the recipients that check and
    /// render, with their preparation; the others are logged and left out.
    #[allow(clippy::too_many_arguments)]
    async fn prepare_each(
        &self,
        conn: &impl deadpool_postgres::GenericClient,
        namespace: &str,
        spec: &pb::CampaignSpec,
        id: Uuid,
        recipients: &[Recipient],
        audience: &str,
        now: DateTime<Utc>,
    ) -> Result<(Vec<Recipient>, PreparedRecipients), Error> {
        let mut kept = Vec::with_capacity(recipients.len());
        let mut prepared = PreparedRecipients {
            zones: Vec::with_capacity(recipients.len()),
            tasks: Vec::with_capacity(recipients.len()),
        };
        for r in recipients {
            let one = std::slice::from_ref(r);
            match self
                .prepare_recipients(conn, namespace, spec, id, one, "contact", now)
                .await
            {
                Ok(mut p) => {
                    kept.push(r.clone());
                    prepared.zones.append(&mut p.zones);
                    prepared.tasks.append(&mut p.tasks);
                }
                Err(Error::InvalidArgument(problems)) => {
                    tracing::warn!(campaign_id = %id, audience_id = audience,
                        recipient = %r.recipient, problems = %crate::error::describe(&problems),
                        "an audience contact's task does not validate; it is left out of the campaign");
                }
                Err(e) => return Err(e),
            }
        }
        Ok((kept, prepared))
    }

    /// Checks and renders `recipients` as tasks of campaign `id` with `spec`, writing nothing:
    /// each recipient's zone and its task, or INVALID_ARGUMENT naming every bad one under
    /// `path`.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn prepare_recipients(
        &self,
        conn: &impl deadpool_postgres::GenericClient,
        namespace: &str,
        spec: &pb::CampaignSpec,
        id: Uuid,
        recipients: &[Recipient],
        path: &str,
        now: DateTime<Utc>,
    ) -> Result<PreparedRecipients, Error> {
        if recipients.len() > MAX_CHUNK {
            return Err(Error::invalid(
                path,
                "must hold at most 1,000 recipients per chunk",
            ));
        }
        let zones = zones(spec, recipients, path)?;
        let specs: Vec<TaskSpec> = recipients.iter().map(|r| task_for(spec, r, id)).collect();
        let each = |i: usize| format!("{path}[{i}]");
        let mut tasks = crate::tasks::prepare(conn, namespace, specs, &each, now).await?;
        self.tasks.duplicate_windows().apply(&mut tasks);
        Ok(PreparedRecipients { zones, tasks })
    }

    /// Writes prepared recipients into the campaign in one transaction (see [`Self::add`]).
    pub(super) async fn write_recipients(
        &self,
        into: &WriteTarget<'_>,
        recipients: &[Recipient],
        prepared: PreparedRecipients,
    ) -> Result<Added, Error> {
        let WriteTarget {
            namespace,
            spec,
            campaign,
            path,
            audience,
            now,
        } = *into;
        let id = campaign.id;
        let PreparedRecipients {
            zones,
            tasks: prepared,
        } = prepared;
        let each = |i: usize| format!("{path}[{i}]");
        let slots = Slots::of(spec, campaign, id);
        transaction!(self.tasks.store(), Error, |tx| {
            let Some((state, count)) = tx.campaigns().lock(namespace, id).await? else {
                return Err(Error::NotFound(format!("campaign {id}")));
            };
            if state == "cancelled" || state == "finished" {
                return Err(Error::FailedPrecondition(format!(
                    "campaign {id} is {state}"
                )));
            }
            // Both spellings of each recipient are looked for, and compared by their shared
            // form: "+1650…" and "1650…" are one person, who must get the campaign once.
            let keys: Vec<&str> = recipients
                .iter()
                .map(|r| rules::recipient_key(&r.recipient))
                .collect();
            let spellings: Vec<String> = keys
                .iter()
                .flat_map(|k| [(*k).to_owned(), format!("+{k}")])
                .collect();
            let names: Vec<&str> = spellings.iter().map(String::as_str).collect();
            let present: HashSet<String> = tx
                .campaigns()
                .present(id, &names)
                .await?
                .iter()
                .map(|r| rules::recipient_key(r).to_owned())
                .collect();
            let mut seen: HashSet<&str> = HashSet::new();
            let origin = Origin::Campaign {
                campaign_id: id,
                paused: state == "paused",
                audience_id: audience.map(str::to_owned),
            };
            let trace_parent = crate::tasks::origin_trace(&origin);
            let mut fresh: Vec<NewTask> = Vec::new();
            // An audience's page adds the contacts that fit under the cap, and the expansion
            // stops there; recipients a client sends are added whole or refused.
            let mut capped = false;
            let mut duplicates = 0;
            for (i, r) in recipients.iter().enumerate() {
                let key = keys[i];
                if present.contains(key) || !seen.insert(key) {
                    duplicates += 1;
                    continue;
                }
                if audience.is_some()
                    && count.saturating_add(i32::try_from(fresh.len()).unwrap_or(i32::MAX))
                        >= MAX_RECIPIENTS
                {
                    capped = true;
                    break;
                }
                let seq = count + fresh.len() as i32;
                let mut task = prepared[i].clone();
                task.due = DueAt::At(slots.due(&r.recipient, zones[i], seq).max(now));
                task.origin = origin.clone();
                task.trace_parent.clone_from(&trace_parent);
                fresh.push(task);
            }
            // Only the recipients new to the campaign count towards its cap: a stream resumed
            // from its start, or an audience page added twice, adds nobody.
            if count.saturating_add(i32::try_from(fresh.len()).unwrap_or(i32::MAX)) > MAX_RECIPIENTS
            {
                return Err(Error::FailedPrecondition(format!(
                    "campaign {id} would exceed 100,000 recipients"
                )));
            }
            if fresh.is_empty() {
                return Ok(Added {
                    added: 0,
                    duplicates,
                    total: count,
                    capped,
                });
            }
            crate::tasks::insert(tx, namespace, &fresh, &each).await?;
            let total = tx
                .campaigns()
                .count_recipients(namespace, id, fresh.len() as i32)
                .await?;
            Ok(Added {
                added: fresh.len(),
                duplicates,
                total,
                capped,
            })
        })
    }
}

/// Each recipient's zone (the campaign's when it names none); INVALID_ARGUMENT naming every
/// recipient whose zone is not an IANA name.
fn zones(
    spec: &pb::CampaignSpec,
    recipients: &[Recipient],
    path: &str,
) -> Result<Vec<Option<chrono_tz::Tz>>, Error> {
    let mut v = Violations::default();
    let zones = recipients
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let zone = if r.time_zone.is_empty() {
                &spec.time_zone
            } else {
                &r.time_zone
            };
            let parsed = zone.parse::<chrono_tz::Tz>().ok();
            if parsed.is_none() {
                v.add(
                    format!("{path}[{i}].time_zone"),
                    "is not an IANA time zone name",
                );
            }
            parsed
        })
        .collect();
    v.into_result(zones)
}

/// Where a campaign's recipients fall in time.
/// Recipients checked and rendered, not yet written: each one's zone and task, in order.
pub(super) struct PreparedRecipients {
    zones: Vec<Option<chrono_tz::Tz>>,
    tasks: Vec<NewTask>,
}

/// Where prepared recipients are written: the campaign, its spec, and what their tasks record.
#[derive(Clone, Copy)]
pub(super) struct WriteTarget<'a> {
    pub(super) namespace: &'a str,
    pub(super) spec: &'a pb::CampaignSpec,
    pub(super) campaign: &'a CampaignRecord,
    /// Names the recipients in violations.
    pub(super) path: &'a str,
    /// The audience they came from, if any.
    pub(super) audience: Option<&'a str>,
    pub(super) now: DateTime<Utc>,
}

struct Slots {
    start: DateTime<Utc>,
    local_start: Option<chrono::NaiveDateTime>,
    window: i64,
    spacing: i64,
    scope: String,
}

impl Slots {
    fn of(spec: &pb::CampaignSpec, c: &CampaignRecord, id: Uuid) -> Self {
        Slots {
            start: spec
                .start_at
                .as_ref()
                .and_then(rules::timestamp)
                .unwrap_or(c.created_at),
            local_start: rules::parse_local_time(&spec.local_start),
            window: ms(spec.window.as_ref()),
            spacing: ms(spec.spacing.as_ref()),
            scope: id.to_string(),
        }
    }

    /// The due time of the recipient with sequence number `seq`.
    fn due(&self, recipient: &str, zone: Option<chrono_tz::Tz>, seq: i32) -> DateTime<Utc> {
        let base = match (self.local_start, zone) {
            (Some(local), Some(zone)) => {
                fire_times::local_to_instant(&zone, local).unwrap_or(self.start)
            }
            _ => self.start,
        };
        if self.spacing > 0 {
            base + ChronoDuration::milliseconds(self.spacing * i64::from(seq))
        } else {
            base + spread::stagger_offset(
                &self.scope,
                recipient,
                ChronoDuration::milliseconds(self.window),
            )
        }
    }
}
