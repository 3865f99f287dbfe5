//! The front page ("why is it waiting", summarised) and the accounts pages: every account with
//! its live status; pause, resume and limit edits through `AccountService.UpdateAccount`.

use std::collections::HashMap;

use axum::extract::{Form, Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::Extension;
use herald_proto::v1::{self as pb, account_service_server::AccountService};
use serde_json::{json, Value};

use super::why::{self, Pending};
use super::{
    csv, done, grpc_request, page_context, param, render, require_admin, status_error, urlencode,
    violations_of, when, when_opt, Console, PageError, Params,
};
use crate::accounts::model::{AccountRecord, AccountState};
use crate::auth::Caller;
use crate::error::Error;
use crate::rules;
use crate::store::executors::Serving;
use crate::store::Db;

/// Accounts per page (and per export query).
const PAGE: i64 = 100;
/// The front page looks at this many of the oldest due tasks.
const PENDING_SAMPLE: i64 = 10_000;

fn account_json(a: &AccountRecord, now: chrono::DateTime<chrono::Utc>) -> Value {
    let l = &a.spec.limits;
    json!({
        "id": a.spec.id,
        "pool": a.spec.pool,
        "kind": a.spec.sender_kind,
        "state": a.spec.state.as_str(),
        "state_reason": a.state_reason,
        "offline_until": when_opt(a.offline_until),
        "health": format!("{:.0}%", a.health * 100.0),
        "quality": a.quality,
        "rate": format!("{:.2}/s", a.effective_rate),
        "configured_rate": l.rate_per_sec,
        "rate_reason": a.rate_reason,
        "today_count": a.today_count,
        "today_cap": a.today_cap,
        "ramp_day": a.ramp_day,
        "tier_used": a.tier_used,
        "tier_limit": l.tier_limit,
        "in_flight": a.in_flight,
        "max_in_flight": l.max_in_flight,
        // Why it is not sending as configured: its state's reason, else why its rate is lowered
        // (the provider throttled it). A healthy account's rate reason ("configured rate") is
        // no error, and the column read "Last error: configured rate" for every one of them.
        "last_error": if !a.state_reason.is_empty() {
            a.state_reason.clone()
        } else if a.effective_rate < l.rate_per_sec {
            a.rate_reason.clone()
        } else {
            String::new()
        },
        "hold": why::account_hold(a, now).map(|h| h.detail),
    })
}

/// The front page: what holds the namespace's pending tasks, by group.
pub(super) async fn overview(
    State(console): State<Console>,
    Extension(caller): Extension<Caller>,
    Query(params): Params,
    headers: HeaderMap,
) -> Result<Response, PageError> {
    let ns = caller.namespace.as_str();
    let db = console.store().conn().await?;
    let now = console.tasks.clock().now();
    let not_due = db.tasks().not_due_count(ns, PENDING_SAMPLE).await?;
    let groups = db.tasks().pending_groups(ns, PENDING_SAMPLE).await?;
    let mut pools: HashMap<String, Vec<AccountRecord>> = HashMap::new();
    let mut serving: HashMap<String, Serving> = HashMap::new();
    let mut rows = Vec::new();
    for g in &groups {
        let accounts = match (&g.account_id, &g.pool) {
            (Some(id), _) => db.accounts().get(ns, id).await?.into_iter().collect(),
            (None, Some(pool)) => {
                if !pools.contains_key(pool) {
                    // Every member: one with room past the first page would hold nothing.
                    let members = db.accounts().pool_members(ns, pool).await?;
                    pools.insert(pool.clone(), members);
                }
                pools.get(pool).cloned().unwrap_or_default()
            }
            (None, None) => Vec::new(),
        };
        if !serving.contains_key(&g.queue) {
            let who = db
                .executors()
                .serving(ns, &g.queue, crate::lease::presence::FRESH)
                .await?;
            serving.insert(g.queue.clone(), who);
        }
        let who = serving.get(&g.queue).cloned().unwrap_or(Serving::Nobody);
        let pending = Pending {
            run_at: g.oldest,
            parked: g.parked,
            queue: &g.queue,
            pool: g.pool.as_deref(),
            account: g.account_id.as_deref(),
            serving: &who,
            // Spacing is per recipient: the task's own page says, not a group's.
            recipient_blocked: &[],
        };
        let holds = why::holds(&pending, &accounts, now);
        rows.push(json!({
            "queue": g.queue,
            "target": g.account_id.as_ref().map(|a| format!("account {a}"))
                .or_else(|| g.pool.as_ref().map(|p| format!("pool {p}")))
                .unwrap_or_else(|| "queue".into()),
            "tasks": g.tasks,
            "oldest": when(g.oldest),
            "kinds": holds.iter().map(|h| h.kind.name()).collect::<Vec<_>>(),
            "details": holds.iter().map(|h| h.detail.clone()).collect::<Vec<_>>(),
        }));
    }
    Ok(render(
        &headers,
        StatusCode::OK,
        "overview.html",
        page_context(&caller, &params, "overview"),
        json!({
            "now": when(now),
            "not_due": not_due,
            "sample": PENDING_SAMPLE,
            "groups": rows,
        }),
    ))
}

/// Every account of the namespace, a page at a time.
pub(super) async fn list(
    State(console): State<Console>,
    Extension(caller): Extension<Caller>,
    Query(params): Params,
    headers: HeaderMap,
) -> Result<Response, PageError> {
    let ns = caller.namespace.as_str();
    let after = param(&params, "after");
    if let Some(a) = after {
        rules::name("after", a)?;
    }
    let db = console.store().conn().await?;
    let now = console.tasks.clock().now();
    let records = db.accounts().list(ns, None, after, PAGE + 1).await?;
    let (records, next) = crate::store::sql::page(records, PAGE, |last| urlencode(&last.spec.id));
    Ok(render(
        &headers,
        StatusCode::OK,
        "accounts.html",
        page_context(&caller, &params, "accounts"),
        json!({
            "accounts": records.iter().map(|a| account_json(a, now)).collect::<Vec<_>>(),
            "next": (!next.is_empty()).then_some(next),
        }),
    ))
}

const ACCOUNT_COLUMNS: &[&str] = &[
    "id",
    "pool",
    "sender_kind",
    "state",
    "state_reason",
    "health",
    "quality",
    "effective_rate",
    "rate_reason",
    "today_count",
    "today_cap",
    "ramp_day",
    "tier_used",
    "tier_limit",
    "in_flight",
    "max_in_flight",
];

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map(|v| v.to_string()).unwrap_or_default()
}

/// Every account as CSV, streamed a page at a time.
pub(super) async fn export(
    State(console): State<Console>,
    Extension(caller): Extension<Caller>,
) -> Response {
    let ns = caller.namespace.clone();
    csv::stream(
        "accounts.csv",
        ACCOUNT_COLUMNS,
        None::<String>,
        move |after: Option<String>| {
            let (console, ns) = (console.clone(), ns.clone());
            async move {
                let db = console.store().conn().await.map_err(Error::from)?;
                let records = db
                    .accounts()
                    .list(&ns, None, after.as_deref(), PAGE + 1)
                    .await
                    .map_err(Error::from)?;
                let (records, next) =
                    crate::store::sql::page(records, PAGE, |last| last.spec.id.clone());
                let rows = records
                    .iter()
                    .map(|a| {
                        vec![
                            a.spec.id.clone(),
                            a.spec.pool.clone(),
                            a.spec.sender_kind.clone(),
                            a.spec.state.as_str().to_owned(),
                            a.state_reason.clone(),
                            a.health.to_string(),
                            a.quality.clone(),
                            a.effective_rate.to_string(),
                            a.rate_reason.clone(),
                            a.today_count.to_string(),
                            opt(a.today_cap),
                            opt(a.ramp_day),
                            a.tier_used.to_string(),
                            opt(a.spec.limits.tier_limit),
                            a.in_flight.to_string(),
                            opt(a.spec.limits.max_in_flight),
                        ]
                    })
                    .collect();
                Ok((rows, (!next.is_empty()).then_some(Some(next))))
            }
        },
    )
}

/// The limits the edit form changes: form field, update-mask path, label, hint.
const EDITABLE: &[(&str, &str, &str, &str)] = &[
    (
        "rate_per_second",
        "limits.rate_per_second",
        "Rate (sends per second)",
        "Sustained rate, above 0 and at most 10,000.",
    ),
    (
        "burst",
        "limits.burst",
        "Burst",
        "Sends allowed at once above the rate.",
    ),
    (
        "daily_cap",
        "limits.daily_cap",
        "Daily cap",
        "Sends per local day; empty for none.",
    ),
    (
        "max_in_flight",
        "limits.max_in_flight",
        "Max in flight",
        "Leases held at once; empty for none.",
    ),
    (
        "recipient_interval_seconds",
        "limits.recipient_interval",
        "Recipient interval (seconds)",
        "Least time between two sends to one recipient; empty for none.",
    ),
    (
        "quiet_start",
        "limits.quiet_hours",
        "Quiet hours start (HH:MM)",
        "Local time the account stops sending; empty for none.",
    ),
    (
        "quiet_end",
        "limits.quiet_hours",
        "Quiet hours end (HH:MM)",
        "Local time it starts again.",
    ),
];

/// The form's values for an account as stored.
fn form_values(a: &AccountRecord) -> HashMap<String, String> {
    let l = &a.spec.limits;
    let mut v = HashMap::new();
    v.insert("rate_per_second".into(), l.rate_per_sec.to_string());
    v.insert("burst".into(), l.burst.to_string());
    v.insert("daily_cap".into(), opt(l.daily_cap));
    v.insert("max_in_flight".into(), opt(l.max_in_flight));
    v.insert(
        "recipient_interval_seconds".into(),
        opt(l.recipient_interval_ms.map(|ms| ms as f64 / 1000.0)),
    );
    let (start, end) = l
        .quiet_hours()
        .map(|(s, e)| (s.format("%H:%M").to_string(), e.format("%H:%M").to_string()))
        .unwrap_or_default();
    v.insert("quiet_start".into(), start);
    v.insert("quiet_end".into(), end);
    v
}

async fn account_page(
    console: &Console,
    caller: &Caller,
    id: &str,
    params: &HashMap<String, String>,
    headers: &HeaderMap,
    form: Option<(HashMap<String, String>, HashMap<String, String>)>,
) -> Result<Response, PageError> {
    rules::name("id", id)?;
    let ns = caller.namespace.as_str();
    let db = console.store().conn().await?;
    let now = console.tasks.clock().now();
    let record = db
        .accounts()
        .get(ns, id)
        .await?
        .ok_or_else(|| Error::NotFound(format!("account {id}")))?;
    let (values, errors, status) = match form {
        Some((values, errors)) => (values, errors, StatusCode::BAD_REQUEST),
        None => (form_values(&record), HashMap::new(), StatusCode::OK),
    };
    Ok(render(
        headers,
        status,
        "account.html",
        page_context(caller, params, "accounts"),
        json!({
            "account": account_json(&record, now),
            "values": values,
            "errors": errors,
            "fields": EDITABLE.iter().map(|(name, _, label, hint)| json!({
                "name": name, "label": label, "hint": hint,
            })).collect::<Vec<_>>(),
        }),
    ))
}

/// One account with its limits form.
pub(super) async fn edit_form(
    State(console): State<Console>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    Query(params): Params,
    headers: HeaderMap,
) -> Result<Response, PageError> {
    account_page(&console, &caller, &id, &params, &headers, None).await
}

/// A number field of the form: None when empty, a violation when not a number.
fn number<T: std::str::FromStr>(
    form: &HashMap<String, String>,
    name: &str,
    errors: &mut HashMap<String, String>,
) -> Option<T> {
    let text = form.get(name).map(|s| s.trim()).unwrap_or("");
    if text.is_empty() {
        return None;
    }
    // "NaN" and "inf" parse as floats; NaN then became a 0 s interval, clearing it.
    let finite = !matches!(
        text.to_ascii_lowercase().trim_start_matches(['+', '-']),
        "nan" | "inf" | "infinity"
    );
    match text.parse() {
        Ok(n) if finite => Some(n),
        _ => {
            errors.insert(name.to_owned(), "must be a number".into());
            None
        }
    }
}

/// Saves the limits form through UpdateAccount; its violations are shown next to their fields.
pub(super) async fn edit(
    State(console): State<Console>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    Query(params): Params,
    headers: HeaderMap,
    Form(form): Form<HashMap<String, String>>,
) -> Result<Response, PageError> {
    require_admin(&caller)?;
    let mut errors = HashMap::new();
    let rate: Option<f64> = number(&form, "rate_per_second", &mut errors);
    let burst: Option<i32> = number(&form, "burst", &mut errors);
    let daily_cap: Option<i32> = number(&form, "daily_cap", &mut errors);
    let max_in_flight: Option<i32> = number(&form, "max_in_flight", &mut errors);
    let interval: Option<f64> = number(&form, "recipient_interval_seconds", &mut errors);
    if rate.is_none() && !errors.contains_key("rate_per_second") {
        errors.insert("rate_per_second".into(), "is required".into());
    }
    let quiet_start = param(&form, "quiet_start").unwrap_or("");
    let quiet_end = param(&form, "quiet_end").unwrap_or("");
    if quiet_start.is_empty() != quiet_end.is_empty() {
        errors.insert(
            "quiet_end".into(),
            "set both ends of the quiet hours, or neither".into(),
        );
    }
    if !errors.is_empty() {
        return account_page(
            &console,
            &caller,
            &id,
            &params,
            &headers,
            Some((form, errors)),
        )
        .await;
    }
    let patch = pb::Account {
        id: id.clone(),
        limits: Some(pb::AccountLimits {
            rate_per_second: rate.unwrap_or_default(),
            burst,
            daily_cap,
            max_in_flight,
            // Whole milliseconds, rounded: 4.1 s is 4,100 ms, where the float's own fraction
            // (4.0999…) truncated to 4,099 and every save of the form took another off.
            recipient_interval: interval.map(|s| {
                let ms = (s * 1000.0).round() as i64;
                prost_types::Duration {
                    seconds: ms.div_euclid(1000),
                    nanos: (ms.rem_euclid(1000) * 1_000_000) as i32,
                }
            }),
            quiet_hours: (!quiet_start.is_empty()).then(|| pb::QuietHours {
                start: quiet_start.to_owned(),
                end: quiet_end.to_owned(),
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut paths: Vec<String> = EDITABLE.iter().map(|(_, p, ..)| (*p).to_owned()).collect();
    paths.dedup();
    let request = pb::UpdateAccountRequest {
        account: Some(patch),
        update_mask: Some(prost_types::FieldMask { paths }),
    };
    match console
        .accounts
        .update_account(grpc_request(&caller, request))
        .await
    {
        Ok(_) => Ok(done(
            &caller,
            &format!("/console/accounts/{}", urlencode(&id)),
            &format!("account {id}: limits saved"),
        )),
        Err(status) if status.code() == tonic::Code::InvalidArgument => {
            let mut errors = HashMap::new();
            for v in violations_of(&status) {
                // `account.limits.daily_cap` (or `.quiet_hours.start`) → the form's field.
                let field = EDITABLE
                    .iter()
                    .find(|(_, path, ..)| v.field.starts_with(&format!("account.{path}")))
                    .map(|(name, ..)| *name)
                    .map(|name| {
                        if name == "quiet_start" {
                            "quiet_end"
                        } else {
                            name
                        }
                    })
                    .unwrap_or("rate_per_second");
                errors
                    .entry(field.to_owned())
                    .and_modify(|e: &mut String| {
                        e.push_str("; ");
                        e.push_str(&v.description);
                    })
                    .or_insert(v.description);
            }
            account_page(
                &console,
                &caller,
                &id,
                &params,
                &headers,
                Some((form, errors)),
            )
            .await
        }
        Err(status) => Err(status_error(status)),
    }
}

/// Pauses or resumes an account (`state=paused|active`) through UpdateAccount.
pub(super) async fn set_state(
    State(console): State<Console>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    Form(form): Form<HashMap<String, String>>,
) -> Result<Response, PageError> {
    require_admin(&caller)?;
    let state = match param(&form, "state").and_then(AccountState::parse) {
        Some(AccountState::Paused) => pb::AccountState::Paused,
        Some(AccountState::Active) => pb::AccountState::Active,
        _ => return Err(PageError::bad("state", "must be paused or active")),
    };
    let request = pb::UpdateAccountRequest {
        account: Some(pb::Account {
            id: id.clone(),
            state: state as i32,
            ..Default::default()
        }),
        update_mask: Some(prost_types::FieldMask {
            paths: vec!["state".into()],
        }),
    };
    console
        .accounts
        .update_account(grpc_request(&caller, request))
        .await
        .map_err(status_error)?;
    let word = if state == pb::AccountState::Paused {
        "paused"
    } else {
        "resumed"
    };
    let back = param(&form, "back").unwrap_or("/console/accounts");
    // Only the console's own pages, and nothing a Location header cannot hold: a line break
    // in it failed the redirect (a 500) after the change was made.
    let back = if back.starts_with("/console/") && !back.chars().any(char::is_control) {
        back
    } else {
        "/console/accounts"
    };
    Ok(done(&caller, back, &format!("account {id} {word}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// "Last error" says why an account is not sending as configured, and nothing for a
    /// healthy one (it read "configured rate" for every account).
    #[test]
    fn last_error_is_empty_for_a_healthy_account() {
        use super::super::why::tests::{account, now};
        let last = |a: &AccountRecord| account_json(a, now())["last_error"].clone();
        let mut a = account("a");
        a.rate_reason = "configured rate".into();
        assert_eq!(last(&a), "");
        a.effective_rate = 0.5;
        a.rate_reason = "halved to 0.5/s after the provider answered RATE_LIMITED".into();
        assert_eq!(last(&a), a.rate_reason.as_str());
        a.state_reason = "paused by an operator".into();
        assert_eq!(last(&a), "paused by an operator");
    }

    /// "NaN" parses as a float, and `NaN as i64` is 0: the interval was cleared, "saved".
    #[test]
    fn numbers_must_be_finite() {
        for text in ["NaN", "nan", "inf", "-Infinity", "+inf", "abc"] {
            let form = HashMap::from([("n".to_string(), text.to_string())]);
            let mut errors = HashMap::new();
            assert_eq!(number::<f64>(&form, "n", &mut errors), None, "{text}");
            assert!(errors.contains_key("n"), "{text}");
        }
        let form = HashMap::from([("n".to_string(), " 2.5 ".to_string())]);
        let mut errors = HashMap::new();
        assert_eq!(number::<f64>(&form, "n", &mut errors), Some(2.5));
        assert!(errors.is_empty());
    }
}
