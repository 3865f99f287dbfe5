//! herald's wire contract: the `herald.v1` messages and services generated from
//! `proto/herald/v1/*.proto`, plus the encoded descriptor set for gRPC server reflection.
//!
//! Only wire types live here; the services convert them to their own domain types at the API
//! edge. [`SenderKind`] is the one hand-written type: the values `Account.sender_kind` may take,
//! which both services must agree on; [`content`] is what a task's content may hold, per sender
//! kind, which both check; [`framing`] how large a lease-stream message may be, which both
//! split by.

pub mod content;
pub mod framing;
mod sender_kind;

pub use sender_kind::{SenderKind, UnknownSenderKind};

/// The `herald.v1` package.
#[allow(missing_docs, unreachable_pub, clippy::all, clippy::unwrap_used)]
pub mod v1 {
    tonic::include_proto!("herald.v1");
}

/// The encoded `FileDescriptorSet` of every herald proto, for `tonic-reflection`.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/herald_descriptor.bin"));

/// The lease-stream protocol version this build speaks.
pub const LEASE_PROTOCOL_VERSION: u32 = 1;
