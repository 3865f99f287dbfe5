//! What both herald binaries set up the same way around their work: logs and traces
//! ([`telemetry`]) and the shutdown signals ([`shutdown`]).

pub mod shutdown;
pub mod telemetry;
