//! The suppression list's page: who is never messaged in the namespace and why (an opt-out
//! reply, a recipient that cannot receive, added by hand), a check of one recipient, adding one
//! by hand and removing one. Every change goes through SuppressionService in process, so the
//! console checks and revokes exactly as the API does.

use std::collections::HashMap;

use axum::extract::{Form, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::Extension;
use herald_proto::v1::{self as pb, suppression_service_server::SuppressionService};
use serde_json::{json, Value};

use super::{
    done, grpc_request, page_context, param, render, require_admin, status_error, urlencode, when,
    Console, PageError, Params,
};
use crate::auth::Caller;

/// Entries per page.
const PAGE: i32 = 50;

fn entry_json(s: &pb::Suppression) -> Value {
    let reason = match s.reason() {
        pb::SuppressionReason::OptOut => "opted out",
        pb::SuppressionReason::InvalidRecipient => "cannot receive",
        _ => "added by hand",
    };
    json!({
        "recipient": s.recipient,
        "reason": reason,
        "note": s.note,
        "created_at": s
            .created_at
            .as_ref()
            .and_then(|t| chrono::DateTime::from_timestamp(t.seconds, 0))
            .map(when),
    })
}

/// The list a page at a time, by recipient; with `q`, whether that recipient is listed.
pub(super) async fn list(
    State(console): State<Console>,
    Extension(caller): Extension<Caller>,
    Query(params): Params,
    headers: HeaderMap,
) -> Result<Response, PageError> {
    let checked = match param(&params, "q") {
        None => None,
        Some(q) => {
            let found = console
                .suppressions
                .check_suppressions(grpc_request(
                    &caller,
                    pb::CheckSuppressionsRequest {
                        recipients: vec![q.to_owned()],
                    },
                ))
                .await
                .map_err(status_error)?
                .into_inner()
                .suppressions;
            Some(json!({
                "recipient": q,
                "entry": found.first().map(entry_json),
            }))
        }
    };
    let page = console
        .suppressions
        .list_suppressions(grpc_request(
            &caller,
            pb::ListSuppressionsRequest {
                page_size: PAGE,
                page_token: param(&params, "after").unwrap_or("").to_owned(),
                reason: 0,
            },
        ))
        .await
        .map_err(status_error)?
        .into_inner();
    Ok(render(
        &headers,
        StatusCode::OK,
        "suppressions.html",
        page_context(&caller, &params, "suppressions"),
        json!({
            "entries": page.suppressions.iter().map(entry_json).collect::<Vec<_>>(),
            "next": (!page.next_page_token.is_empty()).then(|| urlencode(&page.next_page_token)),
            "checked": checked,
        }),
    ))
}

/// The form's recipient, for an admin's change.
fn recipient_to_change<'a>(
    caller: &Caller,
    form: &'a HashMap<String, String>,
) -> Result<&'a str, PageError> {
    require_admin(caller)?;
    param(form, "recipient").ok_or_else(|| PageError::bad("recipient", "is required"))
}

/// Lists one recipient by hand, with a note; whatever is leased to them is revoked.
pub(super) async fn add(
    State(console): State<Console>,
    Extension(caller): Extension<Caller>,
    Form(form): Form<HashMap<String, String>>,
) -> Result<Response, PageError> {
    let recipient = recipient_to_change(&caller, &form)?;
    let added = console
        .suppressions
        .add_suppressions(grpc_request(
            &caller,
            pb::AddSuppressionsRequest {
                recipients: vec![recipient.to_owned()],
                reason: pb::SuppressionReason::Manual as i32,
                note: param(&form, "note").unwrap_or("").to_owned(),
            },
        ))
        .await
        .map_err(status_error)?
        .into_inner();
    tracing::info!(%recipient, added = added.added, "console: recipient suppressed");
    let message = if added.added > 0 {
        format!("{recipient} is suppressed: nothing more is sent to them")
    } else {
        format!("{recipient} was already suppressed")
    };
    Ok(done(&caller, "/console/suppressions", &message))
}

/// Removes a recipient from the list: they can be messaged again.
pub(super) async fn remove(
    State(console): State<Console>,
    Extension(caller): Extension<Caller>,
    Form(form): Form<HashMap<String, String>>,
) -> Result<Response, PageError> {
    let recipient = recipient_to_change(&caller, &form)?;
    console
        .suppressions
        .remove_suppression(grpc_request(
            &caller,
            pb::RemoveSuppressionRequest {
                recipient: recipient.to_owned(),
            },
        ))
        .await
        .map_err(status_error)?;
    tracing::info!(%recipient, "console: suppression removed");
    Ok(done(
        &caller,
        "/console/suppressions",
        &format!("{recipient} removed from the list: they can be messaged again"),
    ))
}
