//! Rendering: checking a template body when it is stored, and rendering a task's content
//! when the task is created, so what is stored is exactly what will be sent.
//!
//! Text templates use Jinja syntax (minijinja) with strict undefined variables: a variable the
//! body uses but the task does not give is an error at creation, never an empty string in a
//! customer's message. Provider templates (an approved WhatsApp template, say) map named
//! variables onto the provider's positional parameters "1", "2", ….

use std::collections::{BTreeMap, HashMap};

use herald_proto::v1 as pb;
use minijinja::value::{Rest, Value};
use minijinja::{Environment, UndefinedBehavior};

use deadpool_postgres::GenericClient;

use super::model::{TemplateKind, TemplateRecord};
use crate::error::Violations;
use crate::store::{Db, StoreError};

/// Largest rendered text, in bytes (the same bound as a task's own text).
const MAX_RENDERED_BYTES: usize = 64 * 1024;
/// Most work one render may do, in minijinja fuel: about that many instructions, or 64 bytes
/// of data each. Ample for a message (a 64 KiB text costs about a thousand); a nested loop or a
/// huge string repetition runs out and is refused as "cannot render" instead of holding a
/// runtime thread or gigabytes of memory.
pub const RENDER_FUEL: u64 = 200_000;

fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    // Messages are not HTML: never escape.
    env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
    // A template is client input: bound what one render may cost (found by fuzzing, #10).
    env.set_fuel(Some(RENDER_FUEL));
    env
}

/// Checks a text template's body and returns the variables it uses, sorted.
pub fn variables_of(body: &str) -> Result<Vec<String>, String> {
    let env = environment();
    let template = env
        .template_from_str(body)
        .map_err(|e| format!("does not parse: {e}"))?;
    // Globals (range, dict, namespace, …) are the environment's, not variables a task must give.
    let globals: std::collections::HashSet<&str> = env.globals().map(|(name, _)| name).collect();
    let mut vars: Vec<String> = template
        .undeclared_variables(false)
        .into_iter()
        .filter(|name| !globals.contains(name.as_str()))
        .collect();
    vars.sort();
    // A filter or test that does not exist parses and fails every render, the first one at a
    // task's creation or a schedule's run: render it once with a sample value for every
    // variable and refuse those (other errors of a sample render, such as arithmetic on text,
    // say nothing about real values).
    let mut sample: BTreeMap<&str, Value> = vars
        .iter()
        .map(|v| (v.as_str(), Value::from("x")))
        .collect();
    let mut called: Vec<&str> = Vec::new();
    // Each pass finds the next call that fails; at most one pass per variable.
    for _ in 0..=vars.len() {
        let Err(e) = template.render(&sample) else {
            break;
        };
        use minijinja::ErrorKind;
        if matches!(
            e.kind(),
            ErrorKind::UnknownFilter | ErrorKind::UnknownTest | ErrorKind::UnknownFunction
        ) {
            return Err(format!("does not render: {e}"));
        }
        // An unknown function reads as one more variable, and a task's variables are text,
        // which cannot be called: the failing expression (the error's range in the body) is a
        // call of one of them by name. Made callable, the next pass finds the next such call.
        let callee = (e.kind() == ErrorKind::InvalidOperation)
            .then(|| e.range().and_then(|r| body.get(r)))
            .flatten()
            .and_then(called_name)
            .and_then(|name| vars.iter().find(|v| v.as_str() == name));
        let Some(name) = callee.filter(|name| !called.contains(&name.as_str())) else {
            break;
        };
        called.push(name.as_str());
        sample.insert(name.as_str(), Value::from_function(|_: Rest<Value>| "x"));
    }
    if !called.is_empty() {
        return Err(format!(
            "does not render: unknown function {}",
            called.join(", ")
        ));
    }
    Ok(vars)
}

/// The name an expression such as `greet(name)` calls, when it is a plain name.
fn called_name(expression: &str) -> Option<&str> {
    let (name, _) = expression.trim_start().split_once('(')?;
    let name = name.trim_end();
    let mut chars = name.chars();
    let first = chars.next()?;
    ((first.is_ascii_alphabetic() || first == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_'))
    .then_some(name)
}

/// Renders contents against a set of stored templates.
pub struct Renderer {
    env: Environment<'static>,
    templates: HashMap<String, TemplateRecord>,
}

impl Renderer {
    /// Loads the stored templates among `ids` (ids that are not stored are simply absent:
    /// their contents pass through unchanged).
    pub async fn load<'a>(
        db: &impl GenericClient,
        namespace: &str,
        ids: impl IntoIterator<Item = &'a str>,
    ) -> Result<Self, StoreError> {
        let mut wanted: Vec<&str> = ids.into_iter().collect();
        wanted.sort_unstable();
        wanted.dedup();
        let records = if wanted.is_empty() {
            Vec::new()
        } else {
            db.templates().get_many(namespace, &wanted).await?
        };
        Ok(Self::from_records(records))
    }

    /// Builds a renderer from templates already read.
    pub fn from_records(records: Vec<TemplateRecord>) -> Self {
        let mut env = environment();
        let mut templates = HashMap::new();
        for r in records {
            if let TemplateKind::Text { body } = &r.kind {
                // Bodies were checked when stored; one that no longer parses renders as an
                // error at use (below) rather than being dropped silently.
                let _ = env.add_template_owned(r.id.clone(), body.clone());
            }
            templates.insert(r.id.clone(), r);
        }
        Renderer { env, templates }
    }

    /// The template ids `contents` refer to.
    pub fn template_ids<'c>(contents: impl IntoIterator<Item = &'c pb::Content>) -> Vec<&'c str> {
        contents
            .into_iter()
            .filter_map(|c| match &c.body {
                Some(pb::content::Body::Template(t)) => Some(t.template_id.as_str()),
                _ => None,
            })
            .collect()
    }

    /// The window-closed fallback of the stored template `content` names, if it names one that
    /// has a fallback (before rendering: the rendered content no longer names it).
    pub fn window_closed_fallback(&self, content: &pb::Content) -> Option<pb::TemplateContent> {
        let Some(pb::content::Body::Template(t)) = &content.body else {
            return None;
        };
        self.templates
            .get(&t.template_id)?
            .window_closed_fallback
            .clone()
    }

    /// Renders `content`: text passes through, a stored template becomes what it renders to, an
    /// unknown template passes through unchanged. Problems are recorded under `field` (the
    /// content's path, e.g. `tasks[3].content`).
    pub fn render(
        &self,
        content: &pb::Content,
        field: &str,
        v: &mut Violations,
    ) -> Option<pb::Content> {
        let Some(pb::content::Body::Template(t)) = &content.body else {
            return Some(content.clone());
        };
        let Some(record) = self.templates.get(&t.template_id) else {
            return Some(content.clone());
        };
        let missing: Vec<&str> = record
            .variables
            .iter()
            .filter(|name| !t.variables.contains_key(*name))
            .map(String::as_str)
            .collect();
        if !missing.is_empty() {
            v.add(
                format!("{field}.template.variables"),
                format!(
                    "template {} needs {}",
                    record.id,
                    missing
                        .iter()
                        .map(|m| format!("{m:?}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            );
            return None;
        }
        match &record.kind {
            TemplateKind::Text { .. } => {
                let rendered = self
                    .env
                    .get_template(&record.id)
                    .and_then(|tpl| tpl.render(&t.variables));
                match rendered {
                    Ok(text) if text.len() > MAX_RENDERED_BYTES => {
                        v.add(
                            format!("{field}.template"),
                            "renders to more than 65536 bytes",
                        );
                        None
                    }
                    Ok(text) if text.trim().is_empty() => {
                        v.add(format!("{field}.template"), "renders to empty text");
                        None
                    }
                    Ok(text) => Some(pb::Content {
                        body: Some(pb::content::Body::Text(text)),
                        ..Default::default()
                    }),
                    Err(e) => {
                        v.add(format!("{field}.template"), format!("cannot render: {e}"));
                        None
                    }
                }
            }
            TemplateKind::Provider {
                name,
                language,
                parameters,
                components,
            } => {
                let variables: BTreeMap<String, String> = parameters
                    .iter()
                    .enumerate()
                    .map(|(i, p)| {
                        (
                            (i + 1).to_string(),
                            t.variables.get(p).cloned().unwrap_or_default(),
                        )
                    })
                    .collect();
                Some(pb::Content {
                    body: Some(pb::content::Body::Template(pb::TemplateContent {
                        template_id: name.clone(),
                        language: if t.language.is_empty() {
                            language.clone()
                        } else {
                            t.language.clone()
                        },
                        variables,
                        // The task's own header and buttons win over the stored ones.
                        header: t.header.clone().or_else(|| components.header.clone()),
                        buttons: if t.buttons.is_empty() {
                            components.buttons.clone()
                        } else {
                            t.buttons.clone()
                        },
                    })),
                    ..Default::default()
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;

    fn record(id: &str, kind: TemplateKind) -> TemplateRecord {
        let variables = match &kind {
            TemplateKind::Text { body } => variables_of(body).unwrap(),
            TemplateKind::Provider { parameters, .. } => parameters.clone(),
        };
        TemplateRecord {
            id: id.into(),
            description: String::new(),
            kind,
            variables,
            created_at: Utc::now(),
            updated_at: Utc::now(),
            window_closed_fallback: None,
        }
    }

    fn template(id: &str, vars: &[(&str, &str)]) -> pb::Content {
        pb::Content {
            body: Some(pb::content::Body::Template(pb::TemplateContent {
                template_id: id.into(),
                language: String::new(),
                variables: vars
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                ..Default::default()
            })),
            ..Default::default()
        }
    }

    fn renderer() -> Renderer {
        Renderer::from_records(vec![
            record(
                "greet",
                TemplateKind::Text {
                    body: "Hello {{ name }}, your order {{ order }} ships {{ day }} <b>".into(),
                },
            ),
            record(
                "wa-order",
                TemplateKind::Provider {
                    name: "order_update".into(),
                    language: "en_US".into(),
                    parameters: vec!["name".into(), "order".into()],
                    components: Default::default(),
                },
            ),
        ])
    }

    #[test]
    fn lists_a_bodys_variables_and_rejects_bad_syntax() {
        assert_eq!(
            variables_of("Hi {{ b }} {{ a }} {% if c %}x{% endif %}").unwrap(),
            vec!["a", "b", "c"]
        );
        assert!(variables_of("Hi {{ name").is_err());
    }

    /// A filter, test or function that does not exist fails every render: refused when stored. A
    /// template that only fails on the sample value (arithmetic on text) is not.
    #[test]
    fn refuses_unknown_filters_tests_and_functions() {
        for body in [
            "Hi {{ name | nosuchfilter }}",
            "{% if name is nosuchtest %}x{% endif %}",
        ] {
            let refused = variables_of(body).expect_err(body);
            assert!(refused.contains("does not render"), "{body}: {refused}");
        }
        // A function that does not exist reads as a variable; it is refused by its name.
        for (body, name) in [
            ("Hi {{ greet(name) }}", "greet"),
            ("{% if fmt(x) %}y{% endif %}", "fmt"),
            ("{{ name() }}", "name"),
            ("a {{ f(x) }} {{ g(y) }}", "f, g"),
        ] {
            let refused = variables_of(body).expect_err(body);
            assert!(
                refused.contains(&format!("unknown function {name}")),
                "{body}: {refused}"
            );
        }
        assert_eq!(
            variables_of("{{ name | upper }} owes {{ amount * 2 }}").unwrap(),
            vec!["amount", "name"]
        );
        // Filters that fail on the sample's text are not calls: accepted.
        for body in [
            "Total: {{ amount | int * 2 }}",
            "{{ price | float | round(2) }} EUR",
            "{% if count | int > 1 %}many{% endif %}",
        ] {
            assert!(
                variables_of(body).is_ok(),
                "{body}: {:?}",
                variables_of(body)
            );
        }
    }

    #[test]
    fn renders_text_templates_without_escaping() {
        let mut v = Violations::default();
        let out = renderer()
            .render(
                &template(
                    "greet",
                    &[("name", "Ann & Bo"), ("order", "A-1"), ("day", "today")],
                ),
                "task.content",
                &mut v,
            )
            .unwrap();
        assert!(v.is_empty());
        assert_eq!(
            out.body,
            Some(pb::content::Body::Text(
                "Hello Ann & Bo, your order A-1 ships today <b>".into()
            ))
        );
    }

    #[test]
    fn a_missing_variable_names_it() {
        let mut v = Violations::default();
        let out = renderer().render(
            &template("greet", &[("name", "Ann")]),
            "task.content",
            &mut v,
        );
        assert!(out.is_none());
        assert_eq!(v.as_slice()[0].field, "task.content.template.variables");
        assert!(v.as_slice()[0].description.contains("\"day\""));
        assert!(v.as_slice()[0].description.contains("\"order\""));
    }

    #[test]
    fn maps_provider_templates_to_positional_parameters() {
        let mut v = Violations::default();
        let out = renderer()
            .render(
                &template(
                    "wa-order",
                    &[("order", "A-1"), ("name", "Ann"), ("extra", "x")],
                ),
                "task.content",
                &mut v,
            )
            .unwrap();
        let Some(pb::content::Body::Template(t)) = out.body else {
            panic!("not a template")
        };
        assert_eq!(t.template_id, "order_update");
        assert_eq!(t.language, "en_US");
        assert_eq!(
            t.variables.into_iter().collect::<Vec<_>>(),
            vec![("1".into(), "Ann".into()), ("2".into(), "A-1".into())]
        );
    }

    #[test]
    fn unknown_templates_and_text_pass_through() {
        let mut v = Violations::default();
        let raw = template("approved_elsewhere", &[("1", "x")]);
        assert_eq!(renderer().render(&raw, "c", &mut v), Some(raw.clone()));
        let text = pb::Content {
            body: Some(pb::content::Body::Text("hi".into())),
            ..Default::default()
        };
        assert_eq!(renderer().render(&text, "c", &mut v), Some(text.clone()));
        assert!(v.is_empty());
    }
}
