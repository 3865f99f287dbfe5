//! The sender kinds: the values `Account.sender_kind` may take (account.proto), and the
//! `sender = "..."` values of the executor's config file. Defined once, here, because they are
//! part of the wire contract: the scheduler accepts exactly these, and the executor's sender
//! registry has one variant for each (a test in herald-executor checks both directions).

use std::fmt;
use std::str::FromStr;

/// A kind of sender: which provider API an account sends through.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SenderKind {
    /// WhatsApp Business Cloud API: one business phone number.
    WhatsappCloud,
    /// WeCom (企业微信) application messages: one app of one corp.
    Wecom,
    /// WeCom group robot webhook.
    WecomRobot,
    /// A signed (Standard Webhooks) JSON POST to a URL.
    Webhook,
    /// Writes a line to the executor's log and succeeds: for local runs.
    Log,
    /// Sends nothing and succeeds at once, silently: for load tests, so that they measure
    /// herald rather than a provider.
    Noop,
}

impl SenderKind {
    /// Every kind, in declaration order.
    pub const ALL: [SenderKind; 6] = [
        SenderKind::WhatsappCloud,
        SenderKind::Wecom,
        SenderKind::WecomRobot,
        SenderKind::Webhook,
        SenderKind::Log,
        SenderKind::Noop,
    ];

    /// The name on the wire and in config files, e.g. `"whatsapp_cloud"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            SenderKind::WhatsappCloud => "whatsapp_cloud",
            SenderKind::Wecom => "wecom",
            SenderKind::WecomRobot => "wecom_robot",
            SenderKind::Webhook => "webhook",
            SenderKind::Log => "log",
            SenderKind::Noop => "noop",
        }
    }

    /// The kind named `name` (exact, lower-case), if there is one.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == name)
    }

    /// Every name, quoted and comma-separated, for error messages: `"whatsapp_cloud", "wecom", …`.
    pub fn expected() -> String {
        Self::ALL
            .iter()
            .map(|k| format!("{:?}", k.as_str()))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl fmt::Display for SenderKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The name is not a sender kind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownSenderKind(pub String);

impl fmt::Display for UnknownSenderKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown sender kind {:?} (expected one of {})",
            self.0,
            SenderKind::expected()
        )
    }
}

impl std::error::Error for UnknownSenderKind {}

impl FromStr for SenderKind {
    type Err = UnknownSenderKind;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s).ok_or_else(|| UnknownSenderKind(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn all_holds_every_kind_once_in_declaration_order() {
        for (i, kind) in SenderKind::ALL.iter().enumerate() {
            assert_eq!(*kind as usize, i, "{kind}");
            assert_eq!(SenderKind::parse(kind.as_str()), Some(*kind));
            assert_eq!(kind.to_string().parse::<SenderKind>().unwrap(), *kind);
        }
        assert_eq!(SenderKind::parse("WhatsApp_Cloud"), None);
        assert_eq!(
            "fax".parse::<SenderKind>().unwrap_err().to_string(),
            format!(
                "unknown sender kind \"fax\" (expected one of {})",
                SenderKind::expected()
            )
        );
    }

    /// Clients in other languages learn the allowed values from account.proto alone, so its
    /// comment on `sender_kind` must list exactly [`SenderKind::ALL`].
    #[test]
    fn account_proto_documents_exactly_these_kinds() {
        let proto = include_str!("../herald/v1/account.proto");
        let field = proto
            .find("string sender_kind = 2;")
            .expect("account.proto declares sender_kind");
        let comment: String = proto[..field]
            .lines()
            .rev()
            .skip_while(|l| l.trim().is_empty())
            .take_while(|l| l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        let mut documented: Vec<&str> = comment.split('"').skip(1).step_by(2).collect();
        documented.sort_unstable();
        let mut expected: Vec<&str> = SenderKind::ALL.iter().map(|k| k.as_str()).collect();
        expected.sort_unstable();
        assert_eq!(
            documented, expected,
            "the comment above `sender_kind` in account.proto must quote every SenderKind name \
             and nothing else:\n{comment}"
        );
    }
}
