//! What a stored template is, and the rules it must meet when stored.

use chrono::{DateTime, Utc};
use herald_proto::v1 as pb;

use crate::error::Violations;
use crate::rules;

/// Largest text template body, in bytes.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// What a stored template renders into.
#[derive(Debug, Clone, PartialEq)]
pub enum TemplateKind {
    /// Final text from a Jinja body.
    Text {
        /// The body.
        body: String,
    },
    /// A provider's own template with positional parameters.
    Provider {
        /// The provider's template name.
        name: String,
        /// Its language code.
        language: String,
        /// Variable names in parameter order.
        parameters: Vec<String>,
        /// Fixed header and button parameters, sent unless a task gives its own.
        components: Box<Components>,
    },
}

/// A provider template's fixed header and button parameters.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Components {
    /// The header's parameter.
    pub header: Option<pb::TemplateHeader>,
    /// The buttons' parameters.
    pub buttons: Vec<pb::TemplateButton>,
}

impl Components {
    /// Whether there is nothing fixed.
    pub fn is_empty(&self) -> bool {
        self.header.is_none() && self.buttons.is_empty()
    }

    /// The shared rules' violations of these components (`herald_proto::content`), under
    /// `path` (e.g. `template.provider`).
    pub fn violations(&self, path: &str) -> Vec<herald_proto::content::Violation> {
        let content = pb::Content {
            body: Some(pb::content::Body::Template(pb::TemplateContent {
                // Only the components are checked here; the name has its own rule.
                template_id: "t".into(),
                header: self.header.clone(),
                buttons: self.buttons.clone(),
                ..Default::default()
            })),
            ..Default::default()
        };
        let prefix = format!("{path}.template.");
        herald_proto::content::check(&content, path)
            .into_iter()
            .map(|mut v| {
                if let Some(rest) = v.field.strip_prefix(&prefix) {
                    v.field = format!("{path}.{rest}");
                }
                v
            })
            .collect()
    }
}

/// A stored template.
#[derive(Debug, Clone)]
pub struct TemplateRecord {
    /// Id.
    pub id: String,
    /// Description.
    pub description: String,
    /// What it renders into.
    pub kind: TemplateKind,
    /// The variables it needs.
    pub variables: Vec<String>,
    /// Created.
    pub created_at: DateTime<Utc>,
    /// Last changed.
    pub updated_at: DateTime<Utc>,
    /// The window-closed fallback of the tasks that name it and have none of their own.
    pub window_closed_fallback: Option<pb::TemplateContent>,
}

/// A template as a caller defines it.
#[derive(Debug, Clone)]
pub struct TemplateSpec {
    /// Id.
    pub id: String,
    /// Description.
    pub description: String,
    /// What it renders into; None when the request set neither kind.
    pub kind: Option<TemplateKind>,
    /// The window-closed fallback of the tasks that name it and have none of their own.
    pub window_closed_fallback: Option<pb::TemplateContent>,
}

impl TemplateSpec {
    /// Checks every rule under `path` (`template`) and returns the template to store, with the
    /// variables it needs.
    pub fn validate(&self, path: &str, v: &mut Violations) -> Option<TemplateRecord> {
        let before = v.len();
        let f = |name: &str| format!("{path}.{name}");
        if let Some(p) = rules::name_problem(&self.id) {
            v.add(f("id"), p);
        }
        if self.description.chars().count() > 1024 {
            v.add(f("description"), "must be at most 1024 characters");
        }
        let variables = match &self.kind {
            None => {
                v.add(path, "set text or provider");
                Vec::new()
            }
            Some(TemplateKind::Text { body }) => {
                if body.trim().is_empty() || body.len() > MAX_BODY_BYTES {
                    v.add(f("text.body"), "must be 1 byte to 64 KiB");
                    Vec::new()
                } else {
                    super::render::variables_of(body).unwrap_or_else(|e| {
                        v.add(f("text.body"), e);
                        Vec::new()
                    })
                }
            }
            Some(TemplateKind::Provider {
                name,
                language,
                parameters,
                components,
            }) => {
                for violation in components.violations(&f("provider")) {
                    v.add(violation.field, violation.description);
                }
                if name.is_empty() || name.len() > 512 {
                    v.add(f("provider.name"), "must be 1 to 512 characters");
                }
                if language.len() > 35 {
                    v.add(f("provider.language"), "must be at most 35 characters");
                }
                if parameters.len() > 100 || parameters.iter().any(String::is_empty) {
                    v.add(
                        f("provider.parameters"),
                        "must be at most 100 non-empty names",
                    );
                }
                parameters.clone()
            }
        };
        if let Some(t) = &self.window_closed_fallback {
            crate::tasks::spec_checks::check_window_closed_fallback(
                t,
                &f("window_closed_fallback"),
                v,
            );
        }
        if v.len() > before {
            return None;
        }
        Some(TemplateRecord {
            id: self.id.clone(),
            description: self.description.clone(),
            kind: self.kind.clone()?,
            variables,
            created_at: Utc::now(),
            updated_at: Utc::now(),
            window_closed_fallback: self.window_closed_fallback.clone(),
        })
    }
}
