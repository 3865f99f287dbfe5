//! Sending accounts: what an account is and the limits it sends within ([`model`]), which
//! account of a pool sends each task ([`routing`]), and what lease endings tell an account
//! ([`feedback`]). The limits themselves are enforced in PostgreSQL, in the claiming
//! transaction, so they hold across every scheduler replica (`store/accounts/functions.sql`).

pub mod feedback;
pub mod model;
pub mod routing;

use herald_proto::SenderKind;

/// Whether `kind` is a sender kind executors implement (the kinds are defined once, in
/// `herald-proto`, with the executor's registry checked against them).
pub fn is_sender_kind(kind: &str) -> bool {
    SenderKind::parse(kind).is_some()
}

/// Every sender kind, quoted, for error messages.
pub fn sender_kinds() -> String {
    SenderKind::expected()
}
