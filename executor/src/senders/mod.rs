//! Senders: the registry of sender kinds and what they share.
//!
//! - [`SenderConfig`] is the registry: one variant per [`SenderKind`], chosen by a config
//!   table's `sender = "..."`. Each kind's module owns its settings struct (serde,
//!   `deny_unknown_fields`), their validation and the construction of its sender.
//! - [`Sender`] is what a kind implements (one `send`); [`Sender::boxed`] is the one
//!   `tower::Service` adapter for all of them, and [`layered`] adds the executor's tower layers
//!   (timeout, concurrency) to every route.
//! - [`http`]: the shared HTTP client and transport-error classifier of the HTTP senders.
//! - [`SendRequest`] → [`SendReceipt`] or [`SendError`]: the contract, in `request.rs`.
//!
//! Adding a sender kind: a module here with its settings and its [`Sender`], one line in
//! `registry!` below, and the kind in `herald_proto::SenderKind` (proto/src/sender_kind.rs)
//! and in the comment on `Account.sender_kind` (account.proto). docs/senders.md has the list.

pub(crate) mod config;
pub mod http;
pub mod limiter;
pub mod log;
pub mod media;
pub mod noop;
mod request;
mod service;
pub mod webhook;
pub mod wecom;
pub mod whatsapp;

use herald_proto::SenderKind;

use config::{parse_settings, BuildContext, BuildSender, ConfigError};
pub use request::{
    Content, OutcomeClass, SendError, SendReceipt, SendRequest, RECIPIENT_SCOPE_MARKER,
};
pub use service::{boxed, fallback_posted, layered, BoxSender, RouteLimits, Sender};

/// Declares [`SenderConfig`] from one line per kind: `Variant(settings type) = SenderKind`.
macro_rules! registry {
    ($($(#[$doc:meta])* $variant:ident($settings:ty) = $kind:ident,)+) => {
        /// One sender's settings, by kind: the registry of sender kinds. A config table's
        /// `sender = "..."` picks the variant; the rest of the table is that kind's settings.
        pub enum SenderConfig {
            $($(#[$doc])* $variant($settings),)+
        }

        impl SenderConfig {
            /// The kinds the registry holds, in declaration order.
            pub const KINDS: &'static [SenderKind] = &[$(SenderKind::$kind,)+];

            /// This config's kind.
            pub fn kind(&self) -> SenderKind {
                match self {
                    $(SenderConfig::$variant(_) => SenderKind::$kind,)+
                }
            }

            /// Reads the settings of `kind` from a table's settings (all but `sender`,
            /// `timeout` and `concurrency`).
            pub(crate) fn parse(
                cx: &BuildContext<'_>,
                kind: SenderKind,
                settings: toml_edit::InlineTable,
            ) -> Result<Self, ConfigError> {
                match kind {
                    $(SenderKind::$kind => {
                        parse_settings(cx, kind.as_str(), settings).map(SenderConfig::$variant)
                    })+
                }
            }

            /// Checks the settings and builds the sender.
            pub(crate) fn build(self, cx: &mut BuildContext<'_>) -> Result<BoxSender, ConfigError> {
                match self {
                    $(SenderConfig::$variant(settings) => settings.build(cx),)+
                }
            }
        }
    };
}

registry! {
    /// WhatsApp Business Cloud API: one business phone number.
    WhatsappCloud(whatsapp::WhatsAppConfig) = WhatsappCloud,
    /// WeCom application messages: one app of one corp.
    Wecom(wecom::WeComConfig) = Wecom,
    /// A WeCom group robot's webhook.
    WecomRobot(wecom::robot::RobotConfig) = WecomRobot,
    /// A signed JSON POST to one URL.
    Webhook(webhook::WebhookConfig) = Webhook,
    /// Logs each send and succeeds.
    Log(log::LogConfig) = Log,
    /// Succeeds silently.
    Noop(noop::NoopConfig) = Noop,
}

impl SenderConfig {
    /// The WhatsApp number's identity in webhooks, for a `whatsapp_cloud` table.
    pub(crate) fn whatsapp_number(&self) -> Option<whatsapp::WhatsAppNumber> {
        match self {
            SenderConfig::WhatsappCloud(c) => Some(c.number()),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::config::Source;
    use super::*;

    /// The registry and the shared list of kinds (what the scheduler accepts) agree both ways:
    /// every kind the registry builds is in `SenderKind::ALL`, and every kind in it is read by
    /// its own variant's settings.
    #[test]
    fn registry_and_the_shared_list_of_kinds_agree() {
        let mut registry = SenderConfig::KINDS.to_vec();
        registry.sort();
        let mut shared = SenderKind::ALL.to_vec();
        shared.sort();
        assert_eq!(registry, shared);

        let source = Source {
            text: "",
            origin: "executor.toml",
        };
        let cx = BuildContext::new(source, &|_| None);
        for kind in SenderKind::ALL {
            match SenderConfig::parse(&cx, kind, toml_edit::InlineTable::new()) {
                // Kinds without required settings: the variant must be the kind's own.
                Ok(config) => assert_eq!(config.kind(), kind),
                // The others ask for their own settings.
                Err(e) => {
                    let e = e.to_string();
                    assert!(
                        e.contains(&format!("{kind} sender: missing field")),
                        "{kind}: {e}"
                    );
                }
            }
        }
    }
}
