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
