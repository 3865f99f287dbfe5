//! Templates on the wire.

use herald_proto::v1 as pb;

use super::timestamp;
use crate::templates::model::{Components, TemplateKind, TemplateRecord, TemplateSpec};

/// A wire template as a domain definition.
pub fn template_spec(t: &pb::Template) -> TemplateSpec {
    TemplateSpec {
        id: t.id.clone(),
        description: t.description.clone(),
        kind: t.kind.as_ref().map(|k| match k {
            pb::template::Kind::Text(text) => TemplateKind::Text {
                body: text.body.clone(),
            },
            pb::template::Kind::Provider(p) => TemplateKind::Provider {
                name: p.name.clone(),
                language: p.language.clone(),
                parameters: p.parameters.clone(),
                components: Box::new(Components {
                    header: p.header.clone(),
                    buttons: p.buttons.clone(),
                }),
            },
        }),
        window_closed_fallback: t.window_closed_fallback.clone(),
    }
}

/// A stored template on the wire.
pub fn template(r: &TemplateRecord) -> pb::Template {
    pb::Template {
        id: r.id.clone(),
        description: r.description.clone(),
        kind: Some(match &r.kind {
            TemplateKind::Text { body } => {
                pb::template::Kind::Text(pb::TextTemplate { body: body.clone() })
            }
            TemplateKind::Provider {
                name,
                language,
                parameters,
                components,
            } => pb::template::Kind::Provider(pb::ProviderTemplate {
                name: name.clone(),
                language: language.clone(),
                parameters: parameters.clone(),
                header: components.header.clone(),
                buttons: components.buttons.clone(),
            }),
        }),
        variables: r.variables.clone(),
        created_at: Some(timestamp(r.created_at)),
        updated_at: Some(timestamp(r.updated_at)),
        window_closed_fallback: r.window_closed_fallback.clone(),
    }
}
