//! The operator's console, served on the HTTP listener under `/console`: server-rendered pages
//! (minijinja templates built into the binary, no build step, nothing fetched from elsewhere)
//! for accounts, campaigns, schedules, tasks and the suppression list, with the actions
//! operators take on them.
//!
//! - Reads go through the same domains and repositories as the gRPC services (`accounts`,
//!   `campaigns`, `schedule`, `tasks`); an account's edit goes through `AccountService` itself,
//!   in process, so the console and the API validate exactly alike.
//! - Who may do what is checked in front of these routes ([`crate::auth::http_admin`]): an admin
//!   or viewer token reads, only admin acts; writes must come from the console's own origin.
//!   The namespace is the page's `ns` parameter (picked in the header's form).
//! - Every page answers with an `ETag` of its body; the page's script re-asks every few seconds
//!   with `If-None-Match` and swaps in the new `<main>` only when it changed (conditional
//!   polling: an unchanged page costs one 304).
//! - Every list has a CSV export, streamed a page at a time (`*.csv`).
//! - Every query is one of the repositories' bounded, indexed statements: a page holds one
//!   pooled connection for a few short reads and never takes a lock the scheduler waits on.

mod accounts;
mod bulk;
mod campaigns;
mod csv;
mod schedules;
mod suppressions;
mod tasks;
pub mod why;

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use axum::extract::Query;
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use minijinja::Environment;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::api::accounts::AccountApi;
use crate::api::suppressions::SuppressionApi;
use crate::auth::{Caller, Role};
use crate::campaigns::Campaigns;
use crate::error::{Error, FieldViolation};
use crate::schedule::Schedules;
use crate::store::{Store, StoreError};
use crate::tasks::Tasks;

/// What the console's handlers work with: the domains the gRPC services use, and the account
/// service itself for edits.
#[derive(Clone)]
pub struct Console {
    tasks: Tasks,
    campaigns: Campaigns,
    schedules: Schedules,
    accounts: Arc<AccountApi>,
    suppressions: Arc<SuppressionApi>,
}

impl Console {
    /// The console over these domains.
    pub fn new(tasks: Tasks, schedules: Schedules) -> Self {
        Console {
            accounts: Arc::new(AccountApi::new(tasks.store().clone())),
            suppressions: Arc::new(SuppressionApi::new(tasks.store().clone())),
            campaigns: Campaigns::new(tasks.clone()),
            schedules,
            tasks,
        }
    }

    fn store(&self) -> &Store {
        self.tasks.store()
    }
}

/// Routes of the console, to merge into the HTTP listener's router.
pub fn router(console: Console) -> Router {
    Router::new()
        .route(
            "/console",
            get(|| async { Redirect::permanent("/console/") }),
        )
        .route("/console/", get(accounts::overview))
        .route("/console/console.css", get(css))
        .route("/console/console.js", get(js))
        .route("/console/accounts", get(accounts::list))
        .route("/console/accounts.csv", get(accounts::export))
        .route(
            "/console/accounts/{id}",
            get(accounts::edit_form).post(accounts::edit),
        )
        .route("/console/accounts/{id}/state", post(accounts::set_state))
        .route("/console/campaigns", get(campaigns::list))
        .route("/console/campaigns.csv", get(campaigns::export))
        .route("/console/campaigns/{id}", get(campaigns::detail))
        .route(
            "/console/campaigns/{id}/failures.csv",
            get(campaigns::export_failures),
        )
        .route("/console/campaigns/{id}/state", post(campaigns::set_state))
        .route(
            "/console/campaigns/{id}/cancel",
            get(campaigns::cancel_confirm),
        )
        .route(
            "/console/campaigns/{id}/retry",
            get(campaigns::retry_confirm).post(campaigns::retry),
        )
        .route("/console/schedules", get(schedules::list))
        .route("/console/schedules.csv", get(schedules::export))
        .route("/console/schedules/{id}", get(schedules::detail))
        .route("/console/schedules/{id}/state", post(schedules::set_state))
        .route("/console/schedules/{id}/run", post(schedules::run_now))
        .route("/console/bulk/{id}", get(bulk::detail))
        .route(
            "/console/suppressions",
            get(suppressions::list).post(suppressions::add),
        )
        .route("/console/suppressions/remove", post(suppressions::remove))
        .route("/console/tasks", get(tasks::search))
        .route("/console/tasks.csv", get(tasks::export))
        .route("/console/tasks/{id}", get(tasks::detail))
        .route("/console/tasks/{id}/cancel", post(tasks::cancel))
        .route("/console/tasks/{id}/retry", post(tasks::retry))
        .with_state(console)
        .layer(axum::middleware::from_fn(in_callers_namespace))
}

tokio::task_local! {
    /// The namespace of the page being answered, for the error page: an error is rendered
    /// from a [`PageError`], which knows nothing of the request.
    static PAGE_NAMESPACE: String;
}

/// Answers the request with [`PAGE_NAMESPACE`] set to the caller's namespace, so an error page
/// keeps the operator in it (its links used to lead to the default namespace).
async fn in_callers_namespace(request: axum::extract::Request, next: Next) -> Response {
    let namespace = request
        .extensions()
        .get::<Caller>()
        .map(|c| c.namespace.clone())
        .unwrap_or_default();
    PAGE_NAMESPACE.scope(namespace, next.run(request)).await
}

const CSS: &str = include_str!("assets/console.css");
const JS: &str = include_str!("assets/console.js");

async fn css() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        CSS,
    )
        .into_response()
}

async fn js() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        JS,
    )
        .into_response()
}

/// The templates, parsed once; `.html` names are auto-escaped.
static TEMPLATES: LazyLock<Environment<'static>> = LazyLock::new(|| {
    let mut env = Environment::new();
    for (name, source) in [
        ("layout.html", include_str!("assets/layout.html")),
        ("overview.html", include_str!("assets/overview.html")),
        ("accounts.html", include_str!("assets/accounts.html")),
        ("account.html", include_str!("assets/account.html")),
        ("campaigns.html", include_str!("assets/campaigns.html")),
        ("campaign.html", include_str!("assets/campaign.html")),
        (
            "campaign_retry.html",
            include_str!("assets/campaign_retry.html"),
        ),
        (
            "campaign_cancel.html",
            include_str!("assets/campaign_cancel.html"),
        ),
        ("schedules.html", include_str!("assets/schedules.html")),
        ("schedule.html", include_str!("assets/schedule.html")),
        ("tasks.html", include_str!("assets/tasks.html")),
        ("task.html", include_str!("assets/task.html")),
        ("bulk.html", include_str!("assets/bulk.html")),
        (
            "suppressions.html",
            include_str!("assets/suppressions.html"),
        ),
        ("error.html", include_str!("assets/error.html")),
    ] {
        // The sources are part of the binary and covered by every page test; a template that
        // does not parse shows as an error page naming it.
        if let Err(e) = env.add_template(name, source) {
            tracing::error!(template = name, error = %e, "console template does not parse");
        }
    }
    env
});

/// The query string of a page, as names to values.
pub(super) type Params = Query<HashMap<String, String>>;

/// A parameter, trimmed, when present and not empty.
fn param<'a>(params: &'a HashMap<String, String>, name: &str) -> Option<&'a str> {
    params.get(name).map(|s| s.trim()).filter(|s| !s.is_empty())
}

/// What every page shows in its header: the namespace, whether the caller may act, and the
/// outcome of the action that led here.
fn page_context(caller: &Caller, params: &HashMap<String, String>, section: &str) -> Value {
    json!({
        "ns": caller.namespace,
        "who": caller.principal.name,
        "can_act": caller.principal.roles.contains(Role::Admin),
        "section": section,
        "done": done_message(params),
    })
}

/// The page's title, by its template.
fn title(template: &str) -> &'static str {
    match template {
        "overview.html" => "Why is it waiting",
        "accounts.html" => "Accounts",
        "account.html" => "Account",
        "campaigns.html" => "Campaigns",
        "campaign.html" => "Campaign",
        "campaign_retry.html" => "Retry failed tasks",
        "campaign_cancel.html" => "Cancel campaign",
        "schedules.html" => "Schedules",
        "schedule.html" => "Schedule",
        "tasks.html" => "Tasks",
        "suppressions.html" => "Suppression list",
        "task.html" => "Task",
        "bulk.html" => "Bulk operation",
        _ => "Error",
    }
}

/// The page `template` renders for `ctx`, inside the layout (which holds the header, the
/// namespace form and the script).
fn page_html(template: &str, ctx: &Value) -> Result<String, minijinja::Error> {
    let ctx = minijinja::Value::from(minijinja::value::Serde(ctx));
    let main = TEMPLATES.get_template(template)?.render(&ctx)?;
    TEMPLATES
        .get_template("layout.html")?
        .render(minijinja::context! {
            main => minijinja::Value::from_safe_string(main),
            title => title(template),
            ..ctx
        })
}

/// Renders `template` with the page context and `data`, answering 304 when the browser's copy
/// (`If-None-Match`) is the same page.
fn render(
    headers: &HeaderMap,
    status: StatusCode,
    template: &str,
    page: Value,
    data: Value,
) -> Response {
    let mut ctx = page;
    if let (Some(ctx), Value::Object(data)) = (ctx.as_object_mut(), data) {
        ctx.extend(data);
    }
    let body = match page_html(template, &ctx) {
        Ok(body) => body,
        Err(e) => {
            tracing::error!(template, error = %e, "console page failed to render");
            return (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("the page {template} failed to render"),
            )
                .into_response();
        }
    };
    let etag = format!(
        "\"{}\"",
        hex::encode(&Sha256::digest(body.as_bytes())[..12])
    );
    let fresh = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v == etag);
    if fresh && status == StatusCode::OK {
        return (StatusCode::NOT_MODIFIED, [(header::ETAG, etag)]).into_response();
    }
    (
        status,
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8".to_owned()),
            (header::CACHE_CONTROL, "no-cache".to_owned()),
            (header::ETAG, etag),
        ],
        body,
    )
        .into_response()
}

/// An error shown as the console's error page.
pub(super) struct PageError {
    status: StatusCode,
    message: String,
}

impl PageError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        PageError {
            status,
            message: message.into(),
        }
    }

    fn bad(field: &str, message: impl std::fmt::Display) -> Self {
        PageError::new(StatusCode::BAD_REQUEST, format!("{field}: {message}"))
    }
}

impl From<StoreError> for PageError {
    fn from(e: StoreError) -> Self {
        Error::Store(e).into()
    }
}

impl From<Error> for PageError {
    fn from(e: Error) -> Self {
        match e {
            Error::Store(e) if e.is_unavailable() => {
                tracing::warn!(error = %e, "console: database unavailable");
                PageError::new(StatusCode::SERVICE_UNAVAILABLE, "database unavailable")
            }
            Error::Store(e) => {
                tracing::error!(error = %e, "console: store failure");
                PageError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal error")
            }
            Error::NotFound(what) => {
                PageError::new(StatusCode::NOT_FOUND, format!("{what} not found"))
            }
            Error::FailedPrecondition(m) => PageError::new(StatusCode::CONFLICT, m),
            Error::InvalidArgument(v) => {
                PageError::new(StatusCode::BAD_REQUEST, crate::error::describe(&v))
            }
            other => PageError::new(StatusCode::INTERNAL_SERVER_ERROR, other.to_string()),
        }
    }
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        let ns = PAGE_NAMESPACE.try_with(Clone::clone).unwrap_or_default();
        let page = json!({ "ns": ns, "section": "", "can_act": false });
        render(
            &HeaderMap::new(),
            self.status,
            "error.html",
            page,
            json!({ "status": self.status.as_u16(), "message": self.message }),
        )
    }
}

/// The field violations of a status an in-process service answered, by field path.
fn violations_of(status: &tonic::Status) -> Vec<FieldViolation> {
    use tonic_types::StatusExt;
    status
        .get_details_bad_request()
        .map(|b| {
            b.field_violations
                .into_iter()
                .map(|v| FieldViolation {
                    field: v.field,
                    description: v.description,
                })
                .collect()
        })
        .unwrap_or_default()
}

/// A status an in-process service answered, as a page error.
fn status_error(status: tonic::Status) -> PageError {
    let code = match status.code() {
        tonic::Code::InvalidArgument => StatusCode::BAD_REQUEST,
        tonic::Code::NotFound => StatusCode::NOT_FOUND,
        tonic::Code::FailedPrecondition | tonic::Code::AlreadyExists => StatusCode::CONFLICT,
        tonic::Code::PermissionDenied => StatusCode::FORBIDDEN,
        tonic::Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    PageError::new(code, status.message().to_owned())
}

/// A request for an in-process service, carrying the caller the auth middleware vetted.
fn grpc_request<T>(caller: &Caller, message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.extensions_mut().insert(caller.clone());
    request
}

/// Back to `path` in the caller's namespace, telling the page what was done.
fn done(caller: &Caller, path: &str, message: &str) -> Response {
    let sep = if path.contains('?') { '&' } else { '?' };
    let mut url = format!("{path}{sep}ns={}", caller.namespace);
    url.push_str("&done=");
    url.push_str(&urlencode(message));
    if let Some(mac) = done_mac(message) {
        url.push_str("&done_tag=");
        url.push_str(&hex::encode(mac.finalize().into_bytes()));
    }
    Redirect::to(&url).into_response()
}

/// The key that tags the messages [`done`] sends a page. Random per process: a link someone
/// else made (say, "account closed, call this number") shows no banner, since only this
/// scheduler's own redirects carry a valid tag. A redirect followed to another replica shows
/// none either; the action's effect is on the page all the same.
static DONE_KEY: LazyLock<[u8; 32]> = LazyLock::new(rand::random);

/// The tag of a done message, under [`DONE_KEY`] (HMAC takes a key of any length: never None).
fn done_mac(message: &str) -> Option<Hmac<Sha256>> {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(DONE_KEY.as_slice()).ok()?;
    mac.update(message.as_bytes());
    Some(mac)
}

/// The page's done message, when it came from one of this scheduler's own redirects.
fn done_message(params: &HashMap<String, String>) -> Option<&str> {
    let message = param(params, "done")?;
    let tag = hex::decode(param(params, "done_tag")?).ok()?;
    done_mac(message)?.verify_slice(&tag).ok()?;
    Some(message)
}

/// Percent-encodes a query value (everything but unreserved characters).
pub(super) fn urlencode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A time for people: UTC to the second.
fn when(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

fn when_opt(t: Option<DateTime<Utc>>) -> Value {
    t.map_or(Value::Null, |t| Value::String(when(t)))
}

/// Refuses an action from a token that may only look (the middleware refuses them too; this
/// keeps a handler safe if it is ever mounted elsewhere).
fn require_admin(caller: &Caller) -> Result<(), PageError> {
    if caller.principal.roles.contains(Role::Admin) {
        Ok(())
    } else {
        Err(PageError::new(
            StatusCode::FORBIDDEN,
            format!("token {:?} lacks the admin role", caller.principal.name),
        ))
    }
}
