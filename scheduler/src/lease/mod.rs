//! Leasing: the executor session on the lease stream, the dispatcher that grants due tasks
//! within an executor's credit, the cluster event fan-out, and the sweeper for lapsed leases.

pub mod dispatch;
pub mod events;
pub mod registry;
pub mod session;
pub mod sweeper;

use std::time::Duration;

/// Settings shared by every lease session of a replica.
#[derive(Debug, Clone)]
pub struct LeaseSettings {
    /// How long a lease lasts without extension.
    pub lease_ttl: Duration,
    /// How often an idle executor should send a heartbeat.
    pub heartbeat_interval: Duration,
    /// The most leases one claim statement grants.
    pub claim_batch: u32,
    /// This replica's name.
    pub scheduler_id: String,
}
