//! herald's scheduler: owns task state in PostgreSQL and leases due tasks to executors over a
//! bidirectional gRPC stream.
//!
//! Dependencies point one way: the edges (`api`, `http`) call the domains, which call the store.
//! Map of the crate:
//! - Edges: [`api`] (gRPC: wire ⇄ domain conversion, the one error → status mapping, the lease
//!   stream's framing) and [`http`] (probes, `/metrics`, the dashboard), both behind [`auth`].
//! - Domains: [`tasks`] (create, cancel, retry: every task is made here), [`lease`] (the lease
//!   engine: sessions, dispatch, claims, reports, sweeps, slot reconciliation), [`accounts`]
//!   (limits, routing, feedback), [`callbacks`] (what providers report after a send:
//!   delivery states, account events, opt-out replies), [`suppressions`] (recipients never
//!   messaged), [`schedule`], [`campaigns`], [`templates`], [`stats`]; shared
//!   field [`rules`] and the service [`error`].
//! - [`store`]: PostgreSQL, one repository per aggregate with its SQL in named `.sql` files,
//!   and the migrations.
//! - Running: [`server`] (wiring and the ordered shutdown), [`config`], [`tls`], [`telemetry`]
//!   (traces, metrics, the notification webhook), [`db_watch`], [`retention`], [`compaction`]
//!   (the hot tables' space given back after a long transaction), and [`low_water`] (where
//!   the sweeper's and retention's walks start), [`recent`] (what the unauthenticated endpoints
//!   read, worked out at most once a second).

pub mod accounts;
pub mod api;
pub mod audiences;
pub mod auth;
pub mod callbacks;
pub mod campaigns;
pub mod clock;
pub mod compaction;
pub mod config;
pub mod db_watch;
pub mod error;
pub mod http;
pub mod lease;
pub mod low_water;
pub mod planner_statistics;
pub mod recent;
pub mod retention;
pub mod rules;
pub mod schedule;
pub mod server;
pub mod stats;
pub mod store;
pub mod suppressions;
pub mod tasks;
pub mod telemetry;
pub mod templates;
pub mod tls;

pub use config::Config;
pub use server::{run, Listeners, ServeError};
