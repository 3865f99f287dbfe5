//! Fuzzing template checking and rendering (issue #10): arbitrary template bodies and variable
//! maps never panic; a body either parses (and lists its variables) or is refused with an
//! error, and rendering either yields bounded, non-empty text or records a violation under the
//! content's field. Case counts: `PROPTEST_CASES` (docs/fuzzing.md).

mod fuzz_support;

use std::collections::BTreeMap;

use chrono::Utc;
use herald_proto::v1 as pb;
use herald_scheduler::error::Violations;
use herald_scheduler::templates::model::{TemplateKind, TemplateRecord};
use herald_scheduler::templates::render::{variables_of, Renderer};
use proptest::prelude::*;

use fuzz_support::*;

/// Jinja fragments; bodies are random concatenations of them (mostly broken, sometimes valid).
fn fragment() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(vec![
            "{{ ", " }}", "{% ", " %}", "{# ", " #}", "{{- ", " -}}", "{%- ", " -%}",
            "if ", "elif ", "else", "endif", "for ", " in ", "endfor", "set ", " = ", "with ",
            "endwith", "macro m(a) ", "endmacro", "call m(1) ", "endcall", "filter upper",
            "endfilter", "raw", "endraw", "include 'x'", "extends 'y'", "block b", "endblock",
            "import 'z' as z", "from 'z' import q", "autoescape true", "endautoescape",
            "name", "order", "day", "loop.index", "x.y", "x[0]", "x['k']", "range(3)",
            "range(-5, 5, 2)", "range(0, 10, 0)", "|upper", "|default('d')", "|length", "|join(',')",
            "|int", "|float", "|round(2)", "|tojson", "|safe", "|replace('a', 'b')", "|title",
            "|first", "|last", "|reverse", "|list", "|sort", "|unique", "|batch(2)",
            "|indent(2)", "|format(1)", "|abs", "|attr('a')", "|map('upper')",
            "|select('odd')", "|items", "|dictsort", "|trim", "|wordcount", "|pprint",
            " ~ ", " + ", " * ", " / ", " // ", " % ", " ** ", " and ", " or ", " not ",
            " == ", " is defined", " is none", "(", ")", "[", "]", "{", "}", ",", ":",
            "1", "0", "-1", "9223372036854775807", "1e308", "'s'", "\"t\"", "true", "none",
            "'x' * 3", "[1, 2, 3]", "{'a': 1}", "super()", "self", "caller()", "namespace()",
            "debug()", "dict(a=1)", "lipsum()", "cycler(1, 2)", "joiner()", "\n", " ", "Hi ",
            "\u{0}", "é", "🦀", "}}}}", "{{{{", "{%%}", "{{}}",
        ]).prop_map(str::to_string),
        1 => short_text(),
    ]
}

fn body() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => prop::collection::vec(fragment(), 0..24).prop_map(|f| f.concat()),
        1 => prop::sample::select(vec![
            "Hi {{ name }}, order {{ order }} ships {{ day }}.",
            "{% for c in name %}{{ c }}{% endfor %}",
            "{{ name * 3 }}",
            "{% if name %}{{ name|upper }}{% else %}x{% endif %}",
            "{% macro m(a) %}{{ a }}{{ m(a) }}{% endmacro %}{{ m(name) }}",
            "{{ name[0:2] }}{{ order|int + 1 }}",
            "{% set x = namespace(n=0) %}{% for i in range(5) %}{% set x.n = x.n + i %}{% endfor %}{{ x.n }}",
        ]).prop_map(str::to_string),
        1 => text(),
    ]
}

fn variables() -> impl Strategy<Value = BTreeMap<String, String>> {
    let key = prop_oneof![
        4 => prop::sample::select(vec!["name", "order", "day", "x", "a", "loop", "self"]).prop_map(str::to_string),
        1 => short_text(),
    ];
    let value = prop_oneof![
        4 => prop::sample::select(vec!["Ann", "A-17", "", " ", "{{ name }}", "0", "-1"]).prop_map(str::to_string),
        1 => text(),
    ];
    prop::collection::btree_map(key, value, 0..6)
}

fn record(id: &str, body: &str, variables: Vec<String>) -> TemplateRecord {
    TemplateRecord {
        id: id.into(),
        description: String::new(),
        kind: TemplateKind::Text { body: body.into() },
        variables,
        created_at: Utc::now(),
        updated_at: Utc::now(),
        window_closed_fallback: None,
    }
}

fn template_content(id: &str, variables: BTreeMap<String, String>) -> pb::Content {
    pb::Content {
        body: Some(pb::content::Body::Template(pb::TemplateContent {
            template_id: id.into(),
            language: String::new(),
            variables,
            ..Default::default()
        })),
        ..Default::default()
    }
}

/// Renders `body` as stored template "t" with `vars`; checks the outcome's shape.
fn check_render(body: &str, vars: BTreeMap<String, String>) -> Result<(), TestCaseError> {
    let Ok(names) = variables_of(body) else {
        return Ok(());
    };
    let renderer = Renderer::from_records(vec![record("t", body, names.clone())]);
    let mut v = Violations::default();
    let missing = names.iter().any(|n| !vars.contains_key(n));
    let out = renderer.render(&template_content("t", vars), "task.content", &mut v);
    prop_assert_eq!(out.is_some(), v.is_empty());
    if missing {
        prop_assert!(out.is_none(), "rendered although a variable was missing");
    }
    for f in v.as_slice() {
        prop_assert!(f.field.starts_with("task.content."), "violation {:?}", f);
    }
    if let Some(content) = out {
        match content.body {
            Some(pb::content::Body::Text(text)) => {
                prop_assert!(!text.trim().is_empty());
                prop_assert!(text.len() <= 64 * 1024);
            }
            other => prop_assert!(false, "a text template rendered to {:?}", other),
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(1024))]

    #[test]
    fn bodies_parse_or_are_refused(body in body()) {
        if let Ok(vars) = variables_of(&body) {
            let mut sorted = vars.clone();
            sorted.sort();
            sorted.dedup();
            prop_assert_eq!(vars, sorted);
        }
    }

    #[test]
    fn rendering_yields_text_or_a_violation(body in body(), vars in variables()) {
        check_render(&body, vars)?;
    }

    #[test]
    fn rendering_with_every_variable_given(body in body(), value in prop_oneof![Just("v".to_string()), short_text()]) {
        let Ok(names) = variables_of(&body) else {
            return Ok(());
        };
        let vars = names.into_iter().map(|n| (n, value.clone())).collect();
        check_render(&body, vars)?;
    }

    #[test]
    fn stored_bodies_that_no_longer_parse_render_as_errors(body in body(), vars in variables()) {
        // A record whose body never went through variables_of (say, stored by an older
        // release): rendering must still answer, never panic.
        let renderer = Renderer::from_records(vec![record("t", &body, Vec::new())]);
        let mut v = Violations::default();
        let out = renderer.render(&template_content("t", vars), "task.content", &mut v);
        prop_assert_eq!(out.is_some(), v.is_empty());
    }
}

/// Renders `body` with `name` set to `name_len` letters; returns the violation, if any.
#[allow(clippy::expect_used)] // test helper: a body that does not parse is the test's bug
fn render_once(body: &str, name_len: usize) -> Option<String> {
    let names = variables_of(body).expect("parses");
    let renderer = Renderer::from_records(vec![record("t", body, names)]);
    let mut v = Violations::default();
    let vars = [("name".to_string(), "x".repeat(name_len))].into();
    renderer.render(&template_content("t", vars), "task.content", &mut v);
    v.as_slice()
        .iter()
        .next()
        .map(|f| format!("{}: {}", f.field, f.description))
}

/// Regression (found while fuzzing, #10): a stored template is client input, and rendering
/// had no bound; nested loops ran for hours on a runtime thread and a string repetition
/// allocated gigabytes. Renders now run on fuel and such templates are refused quickly.
#[test]
fn runaway_templates_run_out_of_fuel() {
    let started = std::time::Instant::now();
    for body in [
        "{% for a in name %}{% for b in name %}{% for c in name %}{% endfor %}{% endfor %}{% endfor %}",
        "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
        "{{ 'x' * 100000000 }}",
        "{% for a in range(100000) %}{{ 'y' * 1000000 }}{% endfor %}",
    ] {
        let problem = render_once(body, 10_000).expect("refused");
        assert!(problem.starts_with("task.content.template: "), "{problem}");
    }
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "took {:?}",
        started.elapsed()
    );
}

/// The fuel bound leaves room for real messages: a loop filling most of the 64 KiB a text may
/// hold still renders.
#[test]
fn ordinary_templates_have_fuel_to_spare() {
    assert_eq!(
        render_once("{% for i in range(1000) %}{{ name }}{% endfor %}", 60),
        None
    );
    assert_eq!(
        render_once("Hi {{ name|upper }}, {{ name|length }} chars", 60),
        None
    );
}

/// Regression (found while fuzzing, #10): global functions such as `range` were listed as
/// variables a task must give, so a template using them could never render.
#[test]
fn globals_are_not_variables() {
    assert_eq!(
        variables_of("{% for i in range(3) %}{{ name }}{% endfor %}{{ dict(a=1) }}").unwrap(),
        vec!["name".to_string()]
    );
}
