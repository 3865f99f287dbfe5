//! Conversions between wire types and domain types, one file per service's types. Wire
//! problems a domain type cannot hold (a malformed timestamp, a negative duration) are
//! reported here as field violations; every other rule is the domain's.

pub mod accounts;
pub mod audiences;
pub mod callbacks;
pub mod campaigns;
pub mod tasks;
pub mod templates;

use crate::error::Error;
use base64::Engine as _;
use chrono::{DateTime, Utc};
use herald_proto::v1 as pb;

/// Domain time to wire time.
pub fn timestamp(t: DateTime<Utc>) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: t.timestamp(),
        nanos: t.timestamp_subsec_nanos() as i32,
    }
}

/// Wire time to domain time; None when malformed or out of range (see
/// [`crate::rules::timestamp`]).
pub fn from_timestamp(t: &prost_types::Timestamp) -> Option<DateTime<Utc>> {
    crate::rules::timestamp(t)
}

/// Milliseconds to a wire duration.
pub fn duration_from_ms(ms: i64) -> prost_types::Duration {
    prost_types::Duration {
        seconds: ms / 1000,
        nanos: ((ms % 1000) * 1_000_000) as i32,
    }
}

/// A std duration on the wire.
pub fn duration(d: std::time::Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: d.subsec_nanos() as i32,
    }
}

pub use crate::rules::duration_ms;

/// An opaque page token for a text key.
pub fn page_token(key: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(key)
}

/// The key of a page token; None when it is not one this service returned.
pub fn page_key(token: &str) -> Option<Vec<u8>> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .ok()
}

/// Bytes that tell one List request's selection from another's: the first 8 bytes of a SHA-256
/// of the namespace and the request with its paging fields cleared (`without_paging`). A page
/// token carries them, so that a token handed back with another filter or in another namespace
/// is refused instead of paging through a selection the client did not ask for (AIP-158).
/// Stable across replicas: protobuf's encoding of a message without maps is deterministic.
pub fn selection_binding<M: prost::Message>(namespace: &str, without_paging: &M) -> [u8; 8] {
    use sha2::Digest as _;
    let mut hash = sha2::Sha256::new();
    hash.update(namespace.as_bytes());
    hash.update([0]);
    hash.update(without_paging.encode_to_vec());
    let digest = hash.finalize();
    let mut binding = [0; 8];
    binding.copy_from_slice(&digest[..8]);
    binding
}

/// A page token for `key` bound to a selection ([`selection_binding`]).
pub fn bound_page_token(key: &[u8], binding: &[u8; 8]) -> String {
    page_token(&[key, binding.as_slice()].concat())
}

/// The key of a token from [`bound_page_token`] of `key_len` bytes. A token of the bare key
/// (before tokens were bound; a replica of the previous release hands those out during a
/// rolling upgrade) is taken as it is. Err: what is wrong with `page_token`, when it is not a
/// token `rpc` returned or was returned for another selection.
pub fn bound_page_key(
    token: &str,
    key_len: usize,
    binding: &[u8; 8],
    rpc: &str,
) -> Result<Vec<u8>, String> {
    let bytes = page_key(token).unwrap_or_default();
    if bytes.len() == key_len {
        return Ok(bytes);
    }
    if bytes.len() != key_len + binding.len() {
        return Err(format!("is not a token returned by {rpc}"));
    }
    let (key, bound) = bytes.split_at(key_len);
    if bound != binding.as_slice() {
        return Err(format!(
            "was returned by {rpc} for other filters or another namespace; keep them the same \
             between pages, or start again without a token"
        ));
    }
    Ok(key.to_vec())
}

/// The name a List page goes on after, from its `page_token` (empty: the first page), for the
/// lists ordered by a text id; INVALID_ARGUMENT naming `rpc` when it is not one `rpc` returned.
pub fn page_after_name(token: &str, rpc: &str) -> Result<Option<String>, Error> {
    if token.is_empty() {
        return Ok(None);
    }
    page_key(token)
        .and_then(|b| String::from_utf8(b).ok())
        .map(Some)
        .ok_or_else(|| Error::invalid("page_token", format!("is not a token returned by {rpc}")))
}

/// How far accepted messages got, on the wire.
pub fn delivery_counts(d: &crate::stats::DeliveryCounts) -> pb::DeliveryCounts {
    pb::DeliveryCounts {
        accepted: d.accepted,
        delivered: d.delivered,
        read: d.read,
        failed_after_acceptance: d.failed_after_acceptance,
    }
}
