//! What both herald binaries set up the same way around their work: logs and traces
//! ([`telemetry`]), the shutdown signals ([`shutdown`]) and how their memory is backed
//! ([`memory`]).

pub mod memory;
pub mod shutdown;
pub mod telemetry;
