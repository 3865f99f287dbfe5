//! Sending accounts: what an account is and the limits it sends within ([`model`]), which
//! account of a pool sends each task ([`routing`]), and what lease endings tell an account
//! ([`feedback`]). The limits themselves are enforced in PostgreSQL, in the claiming
//! transaction, so they hold across every scheduler replica (`store/accounts/functions.sql`).

pub mod feedback;
pub mod model;
pub mod routing;

/// The sender kinds an account may name: exactly those executors implement.
pub fn sender_kinds() -> Vec<&'static str> {
    SENDER_KINDS.to_vec()
}

/// Whether `kind` is a sender kind executors implement.
pub fn is_sender_kind(kind: &str) -> bool {
    SENDER_KINDS.contains(&kind)
}

const SENDER_KINDS: &[&str] = &["whatsapp_cloud", "wecom", "wecom_robot", "webhook", "log"];
