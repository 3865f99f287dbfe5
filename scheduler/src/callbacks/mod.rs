//! What providers report back after a send, as executors forward it from the providers'
//! webhooks (`LeaseService.RecordProviderEvents`): delivery reports about sent messages
//! (accepted, delivered, read, failed after acceptance), an account's standing (quality rating,
//! messaging tier) and availability (disabled, restricted, reconnected), and inbound messages.
//!
//! A batch is recorded in one transaction, so the executor answers the provider 200 only once
//! all of it is durable. Every event is idempotent: delivery reports are kept once per
//! (message id, state) and a task's delivery is folded from them when read (the furthest state,
//! the first time of each), so repeats, reports out of order and reports that come before the
//! send's own report all end in the same answer. A report that comes before its task is known
//! is tied to it when the send's report names the message id ([`on_accepted`]).

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::error::Error;
use crate::store::deliveries::Recorded;
use crate::store::suppressions::InboundMessage;
use crate::store::tasks::{announce_due, announce_due_now};
use crate::store::transaction;
use crate::store::{Db, Store, StoreError};
use crate::suppressions::{is_opt_out, SuppressionReason};

/// How far a sent message got, by its provider's reports; ordered, and a delivery only moves
/// up. A failure after acceptance is final (it outranks everything).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DeliveryState {
    /// The provider accepted the message (the send's answer, or WhatsApp's `sent`).
    Accepted,
    /// The message reached the recipient's device.
    Delivered,
    /// The recipient opened it.
    Read,
    /// The provider accepted it and later reported it could not deliver it.
    FailedAfterAcceptance,
}

impl DeliveryState {
    /// The stored code (herald.v1.DeliveryState's number).
    pub fn code(self) -> i16 {
        match self {
            DeliveryState::Accepted => 1,
            DeliveryState::Delivered => 2,
            DeliveryState::Read => 3,
            DeliveryState::FailedAfterAcceptance => 4,
        }
    }

    /// The state of a stored code.
    pub fn from_code(code: i16) -> Option<Self> {
        match code {
            1 => Some(DeliveryState::Accepted),
            2 => Some(DeliveryState::Delivered),
            3 => Some(DeliveryState::Read),
            4 => Some(DeliveryState::FailedAfterAcceptance),
            _ => None,
        }
    }
}

/// A task's delivery, folded from its reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// The furthest state reached.
    pub state: DeliveryState,
    /// The provider's message id: the accepted send's, else the first report's.
    pub provider_message_id: String,
    /// When the provider accepted the message.
    pub accepted_at: Option<DateTime<Utc>>,
    /// When it was delivered.
    pub delivered_at: Option<DateTime<Utc>>,
    /// When it was read.
    pub read_at: Option<DateTime<Utc>>,
    /// When the failure was reported.
    pub failed_at: Option<DateTime<Utc>>,
    /// The failure's provider error code.
    pub error_code: Option<i64>,
    /// The failure's provider error text.
    pub error: Option<String>,
}

/// One delivery report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusReport {
    /// The provider's message id.
    pub provider_message_id: String,
    /// The state reported.
    pub state: DeliveryState,
    /// The task named by the send's callback data, if any.
    pub task_id: Option<Uuid>,
    /// The attempt of that task the callback data names, if any.
    pub attempt: Option<i32>,
    /// When it happened (None: now).
    pub occurred_at: Option<DateTime<Utc>>,
    /// A failure's provider error code.
    pub error_code: Option<i64>,
    /// A failure's provider error text.
    pub error: Option<String>,
    /// Who the provider says the message went to, when it said (WhatsApp's `recipient_id`).
    pub recipient: Option<String>,
}

impl ProviderEvent {
    /// The event's kind, for metrics: delivery, standing, availability or inbound.
    pub fn kind(&self) -> &'static str {
        match self {
            ProviderEvent::Delivery(_) => "delivery",
            ProviderEvent::Standing { .. } => "standing",
            ProviderEvent::Availability { .. } => "availability",
            ProviderEvent::Inbound { .. } => "inbound",
        }
    }
}

/// One event a provider reported. Account events name the account by its `credentials_ref`
/// (what executors know it by) and apply to every account of the namespace with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProviderEvent {
    /// A delivery report.
    Delivery(StatusReport),
    /// The provider's view of the account's standing.
    Standing {
        /// The account's credentials_ref.
        credentials_ref: String,
        /// The quality rating (None keeps it).
        quality: Option<String>,
        /// The tier's limit (None keeps it; Some(None): no limit).
        tier: Option<Option<i32>>,
    },
    /// The provider took the account out of service (`available` false) or gave it back.
    Availability {
        /// The account's credentials_ref.
        credentials_ref: String,
        /// Whether the account may send.
        available: bool,
        /// The provider's event and details.
        reason: String,
    },
    /// A recipient wrote to the account: its customer-service window opens.
    Inbound {
        /// The account's credentials_ref.
        credentials_ref: String,
        /// Who wrote.
        sender: String,
        /// When (None: now).
        received_at: Option<DateTime<Utc>>,
        /// The provider's message type ("text", "button", ...).
        kind: String,
        /// Its text, when it had one.
        text: Option<String>,
        /// The provider's id of the message, when known: stored once however often the
        /// webhook is delivered.
        provider_message_id: Option<String>,
    },
}

/// The start of the state reason of an account its provider paused; only such a pause is
/// lifted when the provider reconnects the account.
pub const PROVIDER_PAUSE_PREFIX: &str = "paused by the provider: ";

/// How long a recipient is left alone on its account after a late failure that is a limit on
/// that recipient (as the sender's own classification does on a send's answer).
pub const RECIPIENT_LIMIT_BACKOFF_MS: i64 = 3_600_000;

/// Provider error codes of a late failure that limit one recipient: WhatsApp's per-user
/// marketing limit (131049) and pair rate limit (131056).
const RECIPIENT_LIMIT_CODES: &[i64] = &[131_049, 131_056];

/// Provider error codes of a late failure that say the recipient cannot receive messages at
/// all: WhatsApp's "message undeliverable" (131026), which Meta advises marking undeliverable.
const UNDELIVERABLE_CODES: &[i64] = &[131_026];

/// Provider error codes of a late failure worth trying again while the task has attempts
/// left, each with the least wait before it is (in milliseconds; the retry policy's delay when
/// longer): the WhatsApp codes the sender classes RATE_LIMITED or TRANSIENT when a send's
/// answer carries them, with the waits it gives them there (providers.md §1.5; `classify_code`
/// in the executor's WhatsApp sender). Meta reports several of them, 131049 above all, only by
/// webhook, after accepting the message; ending the task there would drop what Meta asks to be
/// retried later. Every other code ends the task (131047 first tries its fallback), and so
/// does 131048, the number's spam limit: at send time it also rests the account for an hour,
/// which a late report cannot do here, so the task is not sent again into it.
const RETRYABLE_LATE_CODES: &[(i64, i64)] = &[
    // Throttles: the app, the WABA, the number's throughput, a flow, registrations.
    (4, 0),
    (17, 0),
    (341, 0),
    (613, 0),
    (80_007, 0),
    (130_429, 0),
    (132_069, 0),
    (133_016, 0),
    // The pair and the user's marketing limit: no sooner than the recipient's back-off.
    (131_056, RECIPIENT_LIMIT_BACKOFF_MS),
    (131_049, RECIPIENT_LIMIT_BACKOFF_MS),
    // Temporary failures; maintenance lasts about a minute.
    (1, 0),
    (2, 0),
    (131_000, 0),
    (131_016, 0),
    (133_004, 0),
    (131_057, 60_000),
    // A paused template, back by itself after hours.
    (132_015, 3 * 3_600_000),
];

/// Records one provider webhook delivery's events for `namespace` in one transaction; returns
/// how many changed something.
pub async fn record(
    store: &Store,
    namespace: &str,
    events: &[ProviderEvent],
    opt_out_keywords: &[String],
) -> Result<u32, Error> {
    let reports: Vec<StatusReport> = events
        .iter()
        .filter_map(|e| match e {
            ProviderEvent::Delivery(r) => Some(r.clone()),
            _ => None,
        })
        .collect();
    // Idempotent: reports are keyed, and every account change sets a value or keeps the latest.
    let ids: Vec<&str> = reports
        .iter()
        .map(|r| r.provider_message_id.as_str())
        .collect();
    let applied = transaction!(store, Error, idempotent = true, |tx| {
        tx.deliveries().lock_messages(namespace, &ids).await?;
        // The tasks the reports name: a report of unknown outcome on one of them waits for, or
        // is waited for by, this batch (lock_tasks.sql).
        let named_tasks: Vec<Uuid> = reports.iter().filter_map(|r| r.task_id).collect();
        tx.deliveries().lock_tasks(namespace, &named_tasks).await?;
        // The tasks a failure names back from the history first, waiting for a move under
        // way: the pin below must find their attempts, and an attempt row deleted from the
        // hot table by an uncommitted move is seen by neither of its two looks.
        let failing: Vec<Uuid> = reports
            .iter()
            .filter(|r| r.state == DeliveryState::FailedAfterAcceptance)
            .filter_map(|r| r.task_id)
            .collect();
        tx.history().restore(&failing).await?;
        let recorded = tx.deliveries().record(namespace, &reports).await?;
        // Before anything judges a task by its reports: an earlier attempt's message's failure
        // must not be taken for the current send's.
        tx.deliveries()
            .pin_attempt_messages(namespace, &reports)
            .await?;
        let mut applied = u32::try_from(recorded.len()).unwrap_or(u32::MAX);
        // A task waiting after its WhatsApp lease ran out unreported: its message went out.
        // Before settling, so that a failure among the reports then ends it FAILED.
        let named: Vec<(Uuid, &str)> = recorded
            .iter()
            .filter_map(|r| Some((r.task_id?, r.provider_message_id.as_str())))
            .collect();
        for task in tx.deliveries().accept_awaiting(namespace, &named).await? {
            tracing::info!(task_id = %task, "a status callback showed the unreported send went out");
        }
        // Account rows before recipient marks (inbound windows, the blocks below), all at once
        // and in id order, as a claim's grant takes them: otherwise the two could deadlock.
        let locked = tx
            .accounts()
            .lock_by_credentials_refs(namespace, &changed_accounts(events))
            .await?;
        let mut woke = false;
        for event in events {
            let (n, resumed) = account_event(tx, namespace, event, &locked).await?;
            applied = applied.saturating_add(n);
            woke |= resumed;
        }
        settle(tx, namespace, recorded, &[]).await?;
        // After the account rows: a suppression it completes revokes leases, which frees
        // account slots.
        learn_aliases(tx, namespace, &reports).await?;
        for event in events {
            let opted_out = reply(tx, namespace, event, opt_out_keywords).await?;
            applied = applied.saturating_add(u32::from(opted_out));
        }
        if woke {
            announce_due_now(tx).await?;
        }
        Ok::<_, Error>(applied)
    })?;
    Ok(applied)
}

/// Records the names the provider gave the reports' recipients where they differ from their
/// tasks' (WhatsApp's id for a number): a suppression of either name stops messages to the
/// other, and a name that is listed already has its other name listed now, its leased tasks
/// revoked as a new listing's are.
async fn learn_aliases(
    db: &impl Db,
    namespace: &str,
    reports: &[StatusReport],
) -> Result<(), StoreError> {
    let named: Vec<(Uuid, &str)> = reports
        .iter()
        .filter_map(|r| Some((r.task_id?, r.recipient.as_deref()?)))
        .collect();
    let listed = db.suppressions().learn_aliases(namespace, &named).await?;
    if !listed.is_empty() {
        tracing::info!(
            count = listed.len(),
            "suppressed another name of a suppressed recipient"
        );
        let listed: Vec<&str> = listed.iter().map(String::as_str).collect();
        crate::suppressions::revoke_leased(db, namespace, &listed).await?;
    }
    Ok(())
}

/// Stores a reply (once per event, under the credentials_ref the account is known by to the
/// executor) and, when its text is an opt-out keyword, lists the sender on the namespace's
/// suppression list. Returns whether the sender was newly listed. Not a reply: nothing.
/// A webhook delivered twice stores a reply the provider named by id once and acts on it once:
/// a STOP delivered again after an operator removed the entry does not list the sender again.
async fn reply(
    db: &impl Db,
    namespace: &str,
    event: &ProviderEvent,
    opt_out_keywords: &[String],
) -> Result<bool, StoreError> {
    let ProviderEvent::Inbound {
        credentials_ref,
        sender,
        received_at,
        kind,
        text,
        provider_message_id,
    } = event
    else {
        return Ok(false);
    };
    let suppressions = db.suppressions();
    let first_delivery = suppressions
        .record_inbound(
            namespace,
            &InboundMessage {
                credentials_ref,
                sender,
                kind,
                body: text.as_deref(),
                received_at: *received_at,
                provider_message_id: provider_message_id.as_deref(),
            },
        )
        .await?;
    // A STOP delivered again is the same STOP: after an operator removed the entry (the
    // person subscribed again), a redelivery must not list them again.
    if !first_delivery {
        return Ok(false);
    }
    let Some(text) = text.as_deref().filter(|t| is_opt_out(t, opt_out_keywords)) else {
        return Ok(false);
    };
    let note = if credentials_ref.is_empty() {
        format!("replied {:?}", text.trim())
    } else {
        format!("replied {:?} to {credentials_ref}", text.trim())
    };
    let listed = suppressions
        .add(namespace, &[sender], SuppressionReason::OptOut, &note)
        .await?;
    let added = listed.iter().any(|(_, new)| *new);
    if added {
        crate::telemetry::metrics::opted_out();
        tracing::info!(%credentials_ref, "recipient opted out by reply; suppressed");
    }
    // Listed before or not, nothing leased to them goes out after their STOP.
    crate::suppressions::revoke_leased(db, namespace, &[sender.as_str()]).await?;
    Ok(added)
}

/// Called in a report batch's transaction for the sends it recorded as accepted, with the
/// message id each returned: records the acceptance, ties reports that came before it, and
/// ends a task whose message already failed. The batch must have locked those message ids
/// before applying the reports (`DeliveryRepo::lock_messages`).
pub async fn on_accepted(
    db: &impl Db,
    namespace: &str,
    accepted: &[(Uuid, String)],
) -> Result<(), StoreError> {
    if accepted.is_empty() {
        return Ok(());
    }
    let reports: Vec<StatusReport> = accepted
        .iter()
        .map(|(task, id)| StatusReport {
            provider_message_id: id.clone(),
            state: DeliveryState::Accepted,
            task_id: Some(*task),
            attempt: None,
            occurred_at: None,
            error_code: None,
            error: None,
            recipient: None,
        })
        .collect();
    // What it returns is among `accepted` already: every accepted send is settled below.
    db.deliveries().record(namespace, &reports).await?;
    // Every accepted task: reports that came before its send's are tied to it, and a failure
    // among them ends it now.
    let tasks: Vec<Uuid> = accepted.iter().map(|(t, _)| *t).collect();
    let sends: Vec<Recorded> = accepted
        .iter()
        .map(|(task, id)| Recorded {
            provider_message_id: id.clone(),
            state: DeliveryState::Accepted,
            task_id: Some(*task),
        })
        .collect();
    settle(db, namespace, sends, &tasks).await
}

/// After reports were recorded: ties the reports of the same messages recorded without a task
/// to it, schedules again the tasks whose message failed with 131047 to send their
/// window-closed fallback and those whose message failed with a code worth trying again, ends
/// the other tasks whose message failed after acceptance (among those reports' tasks and
/// `also`), and leaves alone the recipients of failures that limit one recipient.
async fn settle(
    db: &impl Db,
    namespace: &str,
    recorded: Vec<Recorded>,
    also: &[Uuid],
) -> Result<(), StoreError> {
    let mut pairs: Vec<(String, Uuid)> = recorded
        .iter()
        .filter_map(|r| r.task_id.map(|t| (r.provider_message_id.clone(), t)))
        .collect();
    pairs.sort();
    pairs.dedup_by(|a, b| a.0 == b.0);
    let linked = db.deliveries().link(namespace, &pairs).await?;
    let reported: Vec<Uuid> = recorded
        .iter()
        .chain(&linked)
        .filter(|r| r.state == DeliveryState::FailedAfterAcceptance)
        .filter_map(|r| r.task_id)
        .collect();
    // A late failure may name a task that ended long ago and moved into the history: back to
    // the hot table, where the statements below change tasks. (`also` were just accepted.)
    db.history().restore(&reported).await?;
    let mut candidates: HashSet<Uuid> = also.iter().copied().collect();
    candidates.extend(reported);
    let candidates: Vec<Uuid> = candidates.into_iter().collect();
    settle_failures(db, namespace, &candidates).await
}

/// Among the SUCCEEDED tasks `candidates` (namespace `namespace`), those whose current message
/// failed after acceptance: schedules again those with an unused window-closed fallback (131047)
/// or a failure worth trying again, ends the rest FAILED, and leaves alone the recipients of
/// failures that limit one recipient. Called after a report batch or a webhook (`settle`) and
/// by the sweeper for a lapsed lease it ended SUCCEEDED because a status named its message:
/// if that status was a failure, no report will ever come to settle it.
pub async fn settle_failures(
    db: &impl Db,
    namespace: &str,
    candidates: &[Uuid],
) -> Result<(), StoreError> {
    // Most batches hold no failure at all: one look, then nothing more to do.
    let failed = db.deliveries().failed_tasks(namespace, candidates).await?;
    if failed.is_empty() {
        return Ok(());
    }
    // Before ending anything: a task with an unused fallback is not over yet.
    let rescheduled = db.deliveries().window_closed(namespace, &failed).await?;
    for task in &rescheduled {
        tracing::info!(task_id = %task, "window closed after acceptance; the fallback template goes next");
    }
    if !rescheduled.is_empty() {
        announce_due_now(db).await?;
    }
    let retried = db
        .deliveries()
        .retry_delivered(namespace, &failed, RETRYABLE_LATE_CODES)
        .await?;
    for (task, code, due) in &retried {
        tracing::info!(task_id = %task, code, due = %due, "failed after acceptance; trying again");
    }
    // Dispatchers sleeping past the earliest of them wake for it.
    if let Some(earliest) = retried.iter().map(|(_, _, due)| *due).min() {
        announce_due(db, earliest).await?;
    }
    let ended = db.deliveries().fail_delivered(namespace, &failed).await?;
    let blocks: Vec<(Uuid, i64)> = ended
        .iter()
        .map(|(task, code)| (*task, *code))
        .chain(retried.iter().map(|(task, code, _)| (*task, Some(*code))))
        .filter(|(_, code)| code.is_some_and(|c| RECIPIENT_LIMIT_CODES.contains(&c)))
        .map(|(task, _)| (task, RECIPIENT_LIMIT_BACKOFF_MS))
        .collect();
    db.leases().block_recipients(&blocks).await?;
    for (task, code) in &ended {
        tracing::info!(task_id = %task, code = ?code, "task failed after acceptance");
    }
    // A recipient the provider says it cannot deliver to at all is listed, as a send refused
    // with the same code is (lease/reports.rs).
    let undeliverable: Vec<Uuid> = ended
        .iter()
        .filter(|(_, code)| code.is_some_and(|c| UNDELIVERABLE_CODES.contains(&c)))
        .map(|(task, _)| *task)
        .collect();
    db.suppressions()
        .list_undeliverable(namespace, &undeliverable, true)
        .await?;
    Ok(())
}

/// The credentials refs whose accounts the events change (standing, availability); inbound
/// messages only write the recipient's window.
fn changed_accounts(events: &[ProviderEvent]) -> Vec<&str> {
    let mut refs: Vec<&str> = events
        .iter()
        .filter_map(|e| match e {
            ProviderEvent::Standing {
                credentials_ref, ..
            }
            | ProviderEvent::Availability {
                credentials_ref, ..
            } => Some(credentials_ref.as_str()),
            ProviderEvent::Delivery(_) | ProviderEvent::Inbound { .. } => None,
        })
        .collect();
    refs.sort_unstable();
    refs.dedup();
    refs
}

/// Applies one account event to every account with its credentials_ref; returns how many
/// accounts it changed and whether one was made active again. `locked` holds the accounts of
/// the batch's standing and availability events by credentials_ref, as the batch locked them.
async fn account_event(
    db: &impl Db,
    namespace: &str,
    event: &ProviderEvent,
    locked: &HashMap<String, Vec<String>>,
) -> Result<(u32, bool), StoreError> {
    let credentials_ref = match event {
        ProviderEvent::Delivery(_) => return Ok((0, false)),
        ProviderEvent::Standing {
            credentials_ref, ..
        }
        | ProviderEvent::Availability {
            credentials_ref, ..
        }
        | ProviderEvent::Inbound {
            credentials_ref, ..
        } => credentials_ref,
    };
    let accounts = db.accounts();
    let ids = match event {
        // Written to a number its executor does not hold: only its opt-out counts (`reply`).
        ProviderEvent::Inbound { .. } if credentials_ref.is_empty() => return Ok((0, false)),
        // An inbound message writes only the recipient's window: its accounts are not locked.
        ProviderEvent::Inbound { .. } => {
            accounts
                .ids_by_credentials_ref(namespace, credentials_ref)
                .await?
        }
        _ => locked.get(credentials_ref).cloned().unwrap_or_default(),
    };
    if ids.is_empty() {
        tracing::info!(%credentials_ref, "provider event for no account of the namespace");
    }
    let (mut changed, mut resumed) = (0u32, false);
    for id in &ids {
        let did = match event {
            ProviderEvent::Delivery(_) => false,
            ProviderEvent::Standing { quality, tier, .. } => {
                accounts
                    .record_standing(namespace, id, quality.as_deref(), *tier)
                    .await?
            }
            ProviderEvent::Availability {
                available: false,
                reason,
                ..
            } => {
                let reason = format!("{PROVIDER_PAUSE_PREFIX}{reason}");
                let paused = accounts.provider_pause(namespace, id, &reason).await?;
                if paused {
                    tracing::warn!(account = %id, %reason, "provider took the account out of service");
                }
                paused
            }
            ProviderEvent::Availability {
                available: true,
                reason,
                ..
            } => {
                let reason = format!("resumed by the provider: {reason}");
                let back = accounts
                    .provider_resume(namespace, id, &reason, PROVIDER_PAUSE_PREFIX)
                    .await?;
                if back {
                    tracing::info!(account = %id, "provider gave the account back");
                }
                resumed |= back;
                back
            }
            ProviderEvent::Inbound {
                sender,
                received_at,
                ..
            } => accounts
                .record_inbound(namespace, id, sender, *received_at)
                .await?
                .is_some(),
        };
        changed += u32::from(did);
    }
    Ok((changed, resumed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_are_ordered_and_round_trip() {
        use DeliveryState::*;
        assert!(Accepted < Delivered && Delivered < Read && Read < FailedAfterAcceptance);
        for s in [Accepted, Delivered, Read, FailedAfterAcceptance] {
            assert_eq!(DeliveryState::from_code(s.code()), Some(s));
        }
        assert_eq!(DeliveryState::from_code(0), None);
        assert_eq!(DeliveryState::from_code(5), None);
    }
}
