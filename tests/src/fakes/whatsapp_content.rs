//! The fake WhatsApp API's checks of a message's content object, by `type`, as Meta answers
//! malformed ones (providers-media.md §1.1–§1.4): a missing required field is 131008, a wrong
//! value or an unknown key 100, an unknown type 131051.

use serde_json::{Map, Value};

/// An error answer: HTTP status, Graph error code, message.
pub type Refusal = (u16, i64, String);

fn missing(what: &str) -> Refusal {
    (400, 131008, format!("The parameter {what} is required"))
}

fn invalid(what: impl Into<String>) -> Refusal {
    (400, 100, format!("Param {}", what.into()))
}

/// Message types the fake accepts, each the name of the body's content object.
pub const TYPES: &[&str] = &[
    "text",
    "template",
    "image",
    "document",
    "video",
    "audio",
    "sticker",
    "location",
    "interactive",
];

fn only_keys(o: &Map<String, Value>, allowed: &[&str], what: &str) -> Result<(), Refusal> {
    match o.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(k) => Err(invalid(format!("{what}['{k}'] is not a valid parameter"))),
        None => Ok(()),
    }
}

fn string<'a>(o: &'a Value, key: &str, what: &str) -> Result<&'a str, Refusal> {
    o.get(key)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| missing(&format!("{what}['{key}']")))
}

fn at_most(s: &str, max: usize, what: &str) -> Result<(), Refusal> {
    if s.chars().count() > max {
        return Err(invalid(format!("{what} must be at most {max} characters")));
    }
    Ok(())
}

/// Checks the content object of a message of type `kind` (the body's `kind` member).
pub fn check(kind: &str, body: &Map<String, Value>) -> Result<(), Refusal> {
    let Some(object) = body.get(kind) else {
        return Err(missing(kind));
    };
    match kind {
        "image" | "document" | "video" | "audio" | "sticker" => media(kind, object),
        "location" => location(object),
        "interactive" => interactive(object),
        _ => Ok(()),
    }
}

/// A media object (also a template header's): `id` or `link`, never both; caption on image,
/// video and document; filename on document.
pub fn media(kind: &str, object: &Value) -> Result<(), Refusal> {
    let Some(o) = object.as_object() else {
        return Err(invalid(format!("{kind} must be an object")));
    };
    let mut allowed = vec!["id", "link"];
    if matches!(kind, "image" | "video" | "document") {
        allowed.push("caption");
    }
    if kind == "document" {
        allowed.push("filename");
    }
    only_keys(o, &allowed, kind)?;
    match (o.get("id"), o.get("link")) {
        (Some(_), Some(_)) => return Err(invalid(format!("{kind} takes id or link, not both"))),
        (None, None) => return Err(missing(&format!("{kind}['id'] or {kind}['link']"))),
        (Some(id), None) if id.as_str().is_none_or(str::is_empty) => {
            return Err(invalid(format!("{kind}['id'] must be a media id")))
        }
        (None, Some(link))
            if !link
                .as_str()
                .is_some_and(|l| l.starts_with("https://") || l.starts_with("http://")) =>
        {
            return Err(invalid(format!(
                "{kind}['link'] must be an HTTP or HTTPS URL"
            )))
        }
        _ => {}
    }
    if let Some(c) = o.get("caption") {
        at_most(
            c.as_str().unwrap_or_default(),
            1024,
            &format!("{kind}['caption']"),
        )?;
    }
    Ok(())
}

fn location(object: &Value) -> Result<(), Refusal> {
    let Some(o) = object.as_object() else {
        return Err(invalid("location must be an object"));
    };
    only_keys(o, &["latitude", "longitude", "name", "address"], "location")?;
    for (key, max) in [("latitude", 90.0), ("longitude", 180.0)] {
        let value = o
            .get(key)
            .ok_or_else(|| missing(&format!("location['{key}']")))?;
        // The spec types them as strings; numbers are accepted too.
        let n = value
            .as_f64()
            .or_else(|| value.as_str().and_then(|s| s.parse().ok()))
            .ok_or_else(|| invalid(format!("location['{key}'] must be a number")))?;
        if !(-max..=max).contains(&n) {
            return Err(invalid(format!("location['{key}'] is out of range")));
        }
    }
    Ok(())
}

fn interactive(object: &Value) -> Result<(), Refusal> {
    let Some(o) = object.as_object() else {
        return Err(invalid("interactive must be an object"));
    };
    only_keys(
        o,
        &["type", "header", "body", "footer", "action"],
        "interactive",
    )?;
    let body = o
        .get("body")
        .ok_or_else(|| missing("interactive['body']"))?;
    at_most(
        string(body, "text", "interactive['body']")?,
        1024,
        "interactive['body']['text']",
    )?;
    if let Some(h) = o.get("header") {
        if h["type"].as_str() != Some("text") {
            return Err(invalid("interactive['header']['type'] must be text here"));
        }
        at_most(
            string(h, "text", "interactive['header']")?,
            60,
            "interactive['header']['text']",
        )?;
    }
    if let Some(f) = o.get("footer") {
        at_most(
            string(f, "text", "interactive['footer']")?,
            60,
            "interactive['footer']['text']",
        )?;
    }
    let action = o
        .get("action")
        .ok_or_else(|| missing("interactive['action']"))?;
    match o.get("type").and_then(Value::as_str) {
        Some("button") => {
            let buttons = action["buttons"]
                .as_array()
                .ok_or_else(|| missing("interactive['action']['buttons']"))?;
            if buttons.is_empty() || buttons.len() > 3 {
                return Err(invalid(
                    "interactive['action']['buttons'] must hold 1 to 3 buttons",
                ));
            }
            let mut seen = Vec::new();
            for b in buttons {
                if b["type"].as_str() != Some("reply") {
                    return Err(invalid(
                        "interactive['action']['buttons'][]['type'] must be reply",
                    ));
                }
                let id = string(&b["reply"], "id", "reply")?;
                let title = string(&b["reply"], "title", "reply")?;
                at_most(id, 256, "reply['id']")?;
                at_most(title, 20, "reply['title']")?;
                if seen.contains(&id) || seen.contains(&title) {
                    return Err(invalid("reply ids and titles must be unique"));
                }
                seen.extend([id, title]);
            }
        }
        Some("list") => {
            at_most(
                string(action, "button", "interactive['action']")?,
                20,
                "action['button']",
            )?;
            let sections = action["sections"]
                .as_array()
                .ok_or_else(|| missing("interactive['action']['sections']"))?;
            if sections.is_empty() || sections.len() > 10 {
                return Err(invalid("action['sections'] must hold 1 to 10 sections"));
            }
            let mut rows = 0;
            for s in sections {
                if sections.len() > 1 && s["title"].as_str().is_none_or(str::is_empty) {
                    return Err(missing("section['title']"));
                }
                for r in s["rows"].as_array().into_iter().flatten() {
                    rows += 1;
                    at_most(string(r, "id", "row")?, 200, "row['id']")?;
                    at_most(string(r, "title", "row")?, 24, "row['title']")?;
                }
            }
            if rows == 0 || rows > 10 {
                return Err(invalid("a list must hold 1 to 10 rows"));
            }
        }
        _ => return Err(invalid("interactive['type'] must be button or list here")),
    }
    Ok(())
}

/// A template's components: header parameters of type text, image, video or document (a
/// media object each), body parameters, buttons with `sub_type` quick_reply (a `payload`
/// parameter) or url (a `text` parameter) and a string `index`.
pub fn template_components(components: &[Value]) -> Result<(), Refusal> {
    for c in components {
        let parameters = c["parameters"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default();
        match c["type"].as_str() {
            Some("header") => {
                if parameters.is_empty() {
                    return Err(missing("template['components'][]['parameters']"));
                }
                for p in parameters {
                    match p["type"].as_str() {
                        Some("text") => {}
                        Some(kind @ ("image" | "video" | "document")) => media(kind, &p[kind])?,
                        _ => return Err(invalid("header parameter type is invalid")),
                    }
                }
            }
            Some("body") => {}
            Some("button") => {
                let index = c["index"].as_str().and_then(|i| i.parse::<u32>().ok());
                if index.is_none() {
                    return Err(invalid(
                        "button ['index'] must be a string holding a number",
                    ));
                }
                let want = match c["sub_type"].as_str() {
                    Some("quick_reply") => "payload",
                    Some("url") => "text",
                    _ => return Err(invalid("button ['sub_type'] is invalid")),
                };
                if parameters.len() != 1
                    || parameters[0]["type"].as_str() != Some(want)
                    || parameters[0][want].as_str().is_none_or(str::is_empty)
                {
                    return Err(invalid(format!(
                        "a {want} button takes one {want} parameter"
                    )));
                }
            }
            _ => return Err(invalid("template['components'][]['type'] is invalid")),
        }
        for p in parameters {
            if p["type"].as_str() == Some("text") && p["text"].as_str().is_none_or(str::is_empty) {
                return Err(invalid("text of a text parameter must not be empty"));
            }
        }
    }
    Ok(())
}
