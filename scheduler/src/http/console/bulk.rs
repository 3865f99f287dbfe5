//! A bulk operation's progress page: what it selected, how far its batches have got, and
//! whether it is done. The page refreshes itself (it is live), so a retry of thousands of
//! tasks started from a campaign shows its progress until it finishes.

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::Extension;
use serde_json::json;
use uuid::Uuid;

use super::{page_context, render, when, when_opt, Console, PageError, Params};
use crate::auth::Caller;

/// One bulk operation's progress.
pub(super) async fn detail(
    State(console): State<Console>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    Query(params): Params,
    headers: HeaderMap,
) -> Result<Response, PageError> {
    let id: Uuid = id
        .parse()
        .map_err(|_| PageError::bad("id", "is not a bulk operation id (a UUID)"))?;
    let op = console.tasks.bulk_operation(&caller.namespace, id).await?;
    let filter = op.decode_filter().map_err(crate::error::Error::Store)?;
    let pct = if op.matched > 0 {
        (op.processed.min(op.matched) * 100 / op.matched) as f64
    } else {
        100.0
    };
    Ok(render(
        &headers,
        StatusCode::OK,
        "bulk.html",
        page_context(&caller, &params, "tasks"),
        json!({
            "op": {
                "id": op.id.to_string(),
                "action": op.action,
                "state": op.state,
                "matched": op.matched,
                "processed": op.processed,
                "changed": op.changed,
                "pct": pct,
                "campaign": (!filter.campaign_id.is_empty()).then_some(filter.campaign_id),
                "started": when(op.created_at),
                "finished": when_opt(op.finished_at),
            },
        }),
    ))
}
