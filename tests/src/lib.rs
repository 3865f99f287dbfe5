//! herald's end-to-end test harness: the pieces every test in `tests/tests/*.rs` builds on.
//!
//! - [`TestDb`]: a fresh database per test on one private PostgreSQL cluster shared by the whole
//!   test run (nextest runs each test in its own process, so the cluster is started once under a
//!   file lock, or taken from `HERALD_TEST_PG_URL` when `script/test` already started one).
//! - [`SchedulerProcess`] / [`ExecutorProcess`]: the real `herald-scheduler` and
//!   `herald-executor` binaries on ephemeral loopback ports, awaited until they print `READY`.
//! - [`connect_tasks`], [`connect_lease`], [`connect_health`], [`create_task`], [`read_every_page`],
//!   [`wait_for_task_state`]: gRPC client helpers.
//! - [`WebhookReceiver`]: a scriptable HTTP endpoint that records every request, for the webhook
//!   sender and as the base of provider fakes.
//! - [`otlp::OtlpReceiver`]: records the spans the binaries export over OTLP/HTTP.
//! - [`metrics`]: a service's `/metrics` body and one series' value in it.
//! - [`security`]: a throwaway PKI, tokens files and token-carrying requests.
//! - [`task_spec`], [`unique_id`]: small builders for test inputs.
//! - [`PgCluster`], [`TcpProxy`], [`FakeProvider`]: the fault suite's pieces — a private
//!   PostgreSQL cluster a test may stop and start, a proxy that cuts the network, and a
//!   provider that counts deliveries per idempotency key.
//! - [`HaCluster`]: a pg_auto_failover formation (monitor, primary, synchronous standby) for the
//!   failover tests, whose primary a test may switch over or SIGKILL.
//!
//! The binaries are not built by the harness: run `cargo build --bins` first (`script/test`
//! does), or point `HERALD_BIN_DIR` at a folder holding them.

mod db;
pub mod fakes;
mod grpc;
mod ha_cluster;
pub mod lease;
pub mod loopback_tls;
pub mod metrics;
pub mod otlp;
mod pg_cluster;
mod poll;
mod process;
mod provider;
mod proxy;
pub mod security;
mod spec;
mod webhook;

pub mod accounts;
pub use db::TestDb;
pub use grpc::{
    connect_health, connect_lease, connect_tasks, create_task, read_every_page, wait_for_task_state,
};
pub use ha_cluster::HaCluster;
pub use pg_cluster::PgCluster;
pub use poll::{until, until_moved_to_history};
pub use process::{
    herald_binary, ExecutorBuilder, ExecutorProcess, SchedulerBuilder, SchedulerProcess,
    READY_TIMEOUT,
};
pub use provider::{FakeProvider, ProviderMode};
pub use proxy::TcpProxy;
pub use spec::{task_spec, unique_id, TaskSpecExt};
pub use webhook::{Gate, RecordedRequest, Response, WebhookReceiver};
