//! Which tasks a ListTasks page or a bulk operation is about: the filter both share, checked
//! here once. A bulk operation stores its filter as the `herald.v1.TaskFilter` it was given
//! (states narrowed to the action's), like a schedule stores its spec, so a filter added to
//! the wire message (an end reason, an audience) needs no migration.

use chrono::{DateTime, Utc};
use herald_proto::v1 as pb;
use uuid::Uuid;

use super::model::{EndReason, TaskState};
use crate::error::Violations;
use crate::rules;

/// A selection of tasks: every field set narrows it (AND); empty or None selects any value.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Selection {
    /// States to include; empty means all.
    pub states: Vec<TaskState>,
    /// Queue.
    pub queue: Option<String>,
    /// Campaign.
    pub campaign_id: Option<Uuid>,
    /// Schedule.
    pub schedule_id: Option<String>,
    /// Pinned or (last) sending account.
    pub account_id: Option<String>,
    /// Created at or after.
    pub created_after: Option<DateTime<Utc>>,
    /// Created before.
    pub created_before: Option<DateTime<Utc>>,
    /// Due at or after.
    pub run_after: Option<DateTime<Utc>>,
    /// Due before.
    pub run_before: Option<DateTime<Utc>>,
    /// End reasons to include; empty means any (and tasks that have not ended).
    pub end_reasons: Vec<EndReason>,
    /// This recipient, spelled with or without a leading `+` (the console's search; indexed
    /// by migration V22).
    pub recipient: Option<String>,
    /// Exactly this task.
    pub id: Option<Uuid>,
    /// Made for this audience.
    pub audience_id: Option<String>,
}

impl TaskState {
    /// The wire state.
    pub fn to_wire(self) -> pb::TaskState {
        match self {
            TaskState::Scheduled => pb::TaskState::Scheduled,
            TaskState::Leased => pb::TaskState::Leased,
            TaskState::Succeeded => pb::TaskState::Succeeded,
            TaskState::Failed => pb::TaskState::Failed,
            TaskState::Cancelled => pb::TaskState::Cancelled,
            TaskState::Expired => pb::TaskState::Expired,
        }
    }

    /// A wire state; None for UNSPECIFIED or unknown numbers.
    pub fn from_wire(value: i32) -> Option<Self> {
        Some(match pb::TaskState::try_from(value).ok()? {
            pb::TaskState::Unspecified => return None,
            pb::TaskState::Scheduled => TaskState::Scheduled,
            pb::TaskState::Leased => TaskState::Leased,
            pb::TaskState::Succeeded => TaskState::Succeeded,
            pb::TaskState::Failed => TaskState::Failed,
            pb::TaskState::Cancelled => TaskState::Cancelled,
            pb::TaskState::Expired => TaskState::Expired,
        })
    }
}

impl EndReason {
    /// The wire end reason (a filter names end reasons in their wire form, so the mapping
    /// lives with the filter, as the states' does).
    pub fn to_wire(self) -> pb::EndReason {
        match self {
            EndReason::Sent => pb::EndReason::Sent,
            EndReason::Exhausted => pb::EndReason::Exhausted,
            EndReason::PermanentError => pb::EndReason::PermanentError,
            EndReason::Expired => pb::EndReason::Expired,
            EndReason::Cancelled => pb::EndReason::Cancelled,
            EndReason::Suppressed => pb::EndReason::Suppressed,
            EndReason::InvalidRecipient => pb::EndReason::InvalidRecipient,
            EndReason::DuplicateContent => pb::EndReason::DuplicateContent,
            EndReason::FailedAfterAcceptance => pb::EndReason::FailedAfterAcceptance,
        }
    }

    /// A wire end reason; None for UNSPECIFIED or unknown numbers.
    pub fn from_wire(value: i32) -> Option<Self> {
        let wire = pb::EndReason::try_from(value).ok()?;
        Self::ALL.into_iter().find(|r| r.to_wire() == wire)
    }
}

impl Selection {
    /// A wire filter as a selection; problems are recorded under `path` (`filter`).
    pub fn from_wire(f: &pb::TaskFilter, path: &str, v: &mut Violations) -> Selection {
        let field = |name: &str| {
            if path.is_empty() {
                name.to_string()
            } else {
                format!("{path}.{name}")
            }
        };
        let mut s = Selection::default();
        for (i, state) in f.states.iter().enumerate() {
            match TaskState::from_wire(*state) {
                Some(state) => s.states.push(state),
                None => v.add(field(&format!("states[{i}]")), "is not a task state"),
            }
        }
        for (i, reason) in f.end_reasons.iter().enumerate() {
            match EndReason::from_wire(*reason) {
                Some(reason) => s.end_reasons.push(reason),
                None => v.add(field(&format!("end_reasons[{i}]")), "is not an end reason"),
            }
        }
        let mut name = |name: &str, value: &str| -> Option<String> {
            if value.is_empty() {
                return None;
            }
            match rules::name_problem(value) {
                Some(p) => {
                    v.add(field(name), p);
                    None
                }
                None => Some(value.to_string()),
            }
        };
        s.queue = name("queue", &f.queue);
        s.schedule_id = name("schedule_id", &f.schedule_id);
        s.account_id = name("account_id", &f.account_id);
        s.audience_id = name("audience_id", &f.audience_id);
        if !f.campaign_id.is_empty() {
            match Uuid::parse_str(&f.campaign_id) {
                Ok(id) => s.campaign_id = Some(id),
                Err(_) => v.add(field("campaign_id"), "is not a campaign id"),
            }
        }
        let mut time = |name: &str, ts: &Option<prost_types::Timestamp>| {
            ts.as_ref().and_then(|t| {
                let parsed = rules::timestamp(t);
                if parsed.is_none() {
                    v.add(field(name), "is not a valid timestamp");
                }
                parsed
            })
        };
        s.created_after = time("created_after", &f.created_after);
        s.created_before = time("created_before", &f.created_before);
        s.run_after = time("run_after", &f.run_after);
        s.run_before = time("run_before", &f.run_before);
        s
    }

    /// Whether it narrows by more than states: a bulk operation must, or it would act on the
    /// whole namespace.
    pub fn is_narrow(&self) -> bool {
        self.queue.is_some()
            || self.campaign_id.is_some()
            || self.schedule_id.is_some()
            || self.account_id.is_some()
            || self.audience_id.is_some()
            || self.created_after.is_some()
            || self.created_before.is_some()
            || self.run_after.is_some()
            || self.run_before.is_some()
    }

    /// The end reasons as the SQL filter takes them (None: any).
    pub fn end_reason_names(&self) -> Option<Vec<&'static str>> {
        (!self.end_reasons.is_empty())
            .then(|| self.end_reasons.iter().map(|r| r.as_str()).collect())
    }

    /// The states as the SQL filter takes them (None: any).
    pub fn state_names(&self) -> Option<Vec<&'static str>> {
        (!self.states.is_empty()).then(|| self.states.iter().map(|s| s.as_str()).collect())
    }
}
