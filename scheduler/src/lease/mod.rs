//! The lease engine, on domain types: one [`session`] per connected executor, the
//! [`dispatch`]er granting leases within its credit and the [`due_marks`] steering its walks,
//! [`claim`] planning, the application of [`reports`], the cluster [`events`] over
//! LISTEN/NOTIFY, the [`registry`] of executors connected to this replica, the [`sweeper`] of
//! lapsed leases, the [`reconcile`]r of account slots and the [`fold`]er of the slots and
//! successes reports leave waiting. The wire framing of the stream lives in `api/lease.rs`.

pub mod claim;
pub mod dispatch;
pub mod due_marks;
pub mod events;
pub mod fold;
pub mod presence;
pub mod reconcile;
pub mod registry;
pub mod reports;
pub mod session;
pub mod sweeper;

use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::error::Error;
use crate::tasks::model::GrantedLease;

/// Settings shared by every lease session of a replica.
#[derive(Debug, Clone)]
pub struct LeaseSettings {
    /// How long a lease lasts without extension.
    pub lease_ttl: Duration,
    /// How often an idle executor should send a heartbeat.
    pub heartbeat_interval: Duration,
    /// The most leases one claim statement grants.
    pub claim_batch: u32,
    /// The least time between two of a session's straggler walks
    /// ([`Role::Stragglers`](dispatch::Role::Stragglers)).
    pub straggler_period: Duration,
    /// This replica's name.
    pub scheduler_id: String,
    /// Replies that put their sender on the suppression list.
    pub opt_out_keywords: Vec<String>,
    /// How long a send whose answer was lost waits for a status callback before it is due
    /// again (`HERALD_UNKNOWN_OUTCOME_GRACE`).
    pub unknown_outcome_grace: Duration,
}

/// The lease protocol version this scheduler speaks.
pub const PROTOCOL_VERSION: u32 = herald_proto::LEASE_PROTOCOL_VERSION;

/// The most credit an executor may hold at once.
pub const MAX_CREDIT: u32 = 100_000;

/// An executor's introduction, checked by the edge.
#[derive(Debug, Clone)]
pub struct Hello {
    /// Its id, unique within the namespace.
    pub executor_id: String,
    /// The newest protocol version it speaks.
    pub protocol_version: u32,
    /// Queues it serves; empty for all.
    pub queues: Vec<String>,
    /// Leases it can take at once to begin with.
    pub initial_credit: u32,
    /// Accounts (credentials refs) it can send for; empty for any.
    pub credentials_refs: Vec<String>,
}

/// A lease named by its fencing token, as the executor wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRef {
    /// The task id as sent (it may not parse).
    pub task_ref: String,
    /// The attempt.
    pub attempt: i32,
}

impl LeaseRef {
    /// The task id, when it parses.
    pub fn task_id(&self) -> Option<Uuid> {
        self.task_ref.parse().ok()
    }
}

/// A frame from the executor, after the Hello.
#[derive(Debug)]
pub enum FromExecutor {
    /// It can take this many more leases.
    Credit(u32),
    /// Outcomes of attempts.
    Reports(Vec<reports::ReportEntry>),
    /// Leases to extend.
    Extend(Vec<LeaseRef>),
    /// Its answer to a revoke.
    RevokeAck {
        /// The revoked lease.
        lease: LeaseRef,
        /// Whether it stopped before anything was sent.
        stopped_before_send: bool,
    },
    /// Leases it hands back unsent.
    Release(Vec<LeaseRef>),
    /// It is alive.
    Heartbeat,
    /// It broke the protocol: the stream ends with this error once earlier frames are answered.
    Violation(Error),
}

/// The answer to one report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ack {
    /// The report's lease.
    pub lease: LeaseRef,
    /// The verdict.
    pub verdict: reports::Verdict,
}

/// A frame to the executor.
#[derive(Debug)]
pub enum ToExecutor {
    /// The answer to Hello.
    Welcome {
        /// The negotiated protocol version.
        protocol_version: u32,
        /// How often to send a heartbeat when idle.
        heartbeat_interval: Duration,
        /// How long a lease lasts without extension.
        lease_ttl: Duration,
        /// This replica's name.
        scheduler_id: String,
    },
    /// Leases granted.
    Leases(Vec<GrantedLease>),
    /// Answers to a report batch, in its order.
    Acks(Vec<Ack>),
    /// The answer to Extend.
    ExtendAck {
        /// Leases still held.
        extended: Vec<LeaseRef>,
        /// Leases lost.
        lost: Vec<LeaseRef>,
        /// Their new expiry.
        expires_at: Option<DateTime<Utc>>,
    },
    /// Drop this lease: its task was cancelled.
    Revoke(LeaseRef),
    /// This replica is shutting down: move to another.
    Drain(String),
    /// The answer to a heartbeat.
    Heartbeat(DateTime<Utc>),
    /// The stream ends with this error.
    End(Error),
}
