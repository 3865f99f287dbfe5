//! What both herald services send over HTTP to addresses that operators (or clients)
//! configure: the executor's `webhook` sender, its media fetches, and the scheduler's
//! notification webhook.
//!
//! - [`signing`]: Standard Webhooks signatures (`webhook-id`, `webhook-timestamp`,
//!   `webhook-signature: v1,<base64 HMAC-SHA256>`), one [`SigningKey`] for both services.
//!
//! - [`guard`]: fetching a URL a client gave (media links) without reaching herald's own
//!   network: https only, addresses checked after resolution and on every redirect, size and
//!   time caps. Both services use it, so both refuse the same addresses.

pub mod guard;
pub mod signing;

pub use signing::{InvalidSecret, SigningKey};
