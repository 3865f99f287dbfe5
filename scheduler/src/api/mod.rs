//! The gRPC edge: validates and converts requests, calls the store, maps errors to statuses.
//! Wire types stop here.

pub mod accounts;
pub mod campaigns;
pub mod convert;
pub mod lease;
pub mod schedules;
pub mod stats;
pub mod tasks;
pub mod templates;
pub mod validate;

/// The namespace every request acts in until authentication binds tokens to namespaces.
pub const DEFAULT_NAMESPACE: &str = "default";
