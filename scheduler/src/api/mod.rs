//! The gRPC edge: converts wire ⇄ domain (`convert/`), maps every error to a status once
//! (`status.rs`), frames the lease stream (`lease.rs`), and calls the domains. Wire types stop
//! here; nothing outside this module imports from it.

pub mod accounts;
pub mod audiences;
pub mod campaigns;
pub mod convert;
pub mod lease;
pub mod paging;
pub mod schedules;
pub mod stats;
pub mod status;
pub mod suppressions;
pub mod tasks;
pub mod templates;
