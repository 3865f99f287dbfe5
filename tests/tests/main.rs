//! herald's end-to-end tests, one module per area, compiled as one test binary (see
//! `tests/Cargo.toml`): each runs the real scheduler and executor against a real PostgreSQL and
//! the providers' fakes. `cargo nextest run -p herald-tests -E 'test(/^faults::/)'` runs one
//! area.

mod account_slots;
mod accounts;
mod audiences;
mod bulk_operations;
mod campaigns;
mod console;
mod content;
mod dashboard;
mod duplicate_content;
mod end_reasons;
mod end_to_end;
mod executor_presence;
mod failover;
mod fanout;
mod faults;
mod fuzz_lease;
mod grant_claim;
mod harness_smoke;
mod history;
mod lease_protocol;
mod notifications;
mod pacing;
mod policies_and_edits;
mod schedule_overrun;
mod scheduler_health;
mod schedules;
mod security;
mod stack_smoke;
mod stats;
mod suppression;
mod tasks_api;
mod templates;
mod tracing;
mod whatsapp_callbacks;
mod whatsapp_stack;
