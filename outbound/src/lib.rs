//! What both herald services send over HTTP to addresses that operators configure: the
//! executor's `webhook` sender and the scheduler's notification webhook.
//!
//! - [`signing`]: Standard Webhooks signatures (`webhook-id`, `webhook-timestamp`,
//!   `webhook-signature: v1,<base64 HMAC-SHA256>`), one [`SigningKey`] for both services.
//!
//! An outbound address guard (which hosts a configured URL may reach) belongs here too when it
//! comes, so that both services refuse the same addresses.

pub mod signing;

pub use signing::{InvalidSecret, SigningKey};
