//! herald's scheduler: owns task state in PostgreSQL and leases due tasks to executors over a
//! bidirectional gRPC stream.
//!
//! Map of the crate:
//! - [`config`]: flags and their environment twins.
//! - [`server`]: wiring, start-up and the ordered shutdown.
//! - [`auth`]: tokens, roles, namespaces bound to tokens, per-token rates.
//! - [`tls`]: TLS of the gRPC port.
//! - [`api`]: the gRPC edge (validation, conversion, status mapping); wire types stop there.
//! - [`model`]: domain types of tasks, attempts and leases.
//! - [`store`]: PostgreSQL access, migrations and the SQL (in `store/queries/`).
//! - [`lease`]: executor sessions, the dispatcher, cluster events and the lease sweeper.
//! - [`schedule`]: cron fire times, the schedule materialiser, campaign spreading.
//! - [`retention`]: pruning of finished tasks and old idempotency keys.
//! - [`template`]: checking and rendering message templates.
//! - [`telemetry`]: logs, OTLP traces, Prometheus metrics and the notification webhook.
//! - [`http`]: health endpoints and `/metrics`.
//! - [`db_watch`]: grpc.health.v1 follows whether the database answers.
//! - [`dashboard`]: the operator's web page and its JSON endpoints, on the HTTP listener.
//! - [`error`]: the service error and its single mapping to `tonic::Status`.

pub mod api;
pub mod auth;
pub mod config;
pub mod dashboard;
pub mod db_watch;
pub mod error;
pub mod http;
pub mod lease;
pub mod model;
pub mod retention;
pub mod schedule;
pub mod server;
pub mod store;
pub mod telemetry;
pub mod template;
pub mod tls;

pub use config::Config;
pub use server::{run, Listeners, ServeError};
