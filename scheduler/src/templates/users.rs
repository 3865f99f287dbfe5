//! Who still renders a stored template: the schedules and the unfinished campaigns whose
//! content names it. A task holds its content rendered, so tasks never need the template again;
//! a schedule's runs and a campaign's later recipients do, and without it their content would
//! pass through unrendered, as a provider template of that name (a WhatsApp send of the wrong
//! message, or a refusal), so a template in use is not deleted.

use deadpool_postgres::GenericClient;
use herald_proto::v1 as pb;
use prost::Message;

use crate::store::{Db, StoreError};

/// Schedules or campaigns read per statement while looking.
const PAGE: i64 = 500;

/// Names (`schedule <id>`, `campaign <id>`) of what in `namespace` renders template `id`: every
/// schedule, and every campaign still ACTIVE or PAUSED (a finished or cancelled one adds no
/// recipient).
pub async fn users(
    db: &impl GenericClient,
    namespace: &str,
    id: &str,
) -> Result<Vec<String>, StoreError> {
    let mut found = Vec::new();
    let mut after = String::new();
    loop {
        let page = db.schedules().list(namespace, &after, PAGE).await?;
        for s in &page {
            let spec = pb::ScheduleSpec::decode(s.spec.as_slice())
                .map_err(|e| StoreError::Corrupt(format!("schedule {}: {e}", s.id)))?;
            if names(spec.content.as_ref(), id) {
                found.push(format!("schedule {}", s.id));
            }
        }
        match page.last() {
            Some(last) if page.len() as i64 == PAGE => after.clone_from(&last.id),
            _ => break,
        }
    }
    let live: [&str; 2] = ["active", "paused"];
    let mut before = None;
    loop {
        let page = db
            .campaigns()
            .list(namespace, Some(&live), before, PAGE)
            .await?;
        for c in &page {
            let spec = pb::CampaignSpec::decode(c.spec.as_slice())
                .map_err(|e| StoreError::Corrupt(format!("campaign {}: {e}", c.id)))?;
            if names(spec.content.as_ref(), id) {
                found.push(format!("campaign {}", c.id));
            }
        }
        match page.last() {
            Some(last) if page.len() as i64 == PAGE => before = Some(last.id),
            _ => break,
        }
    }
    Ok(found)
}

/// Whether `content` is a template reference to `id`.
fn names(content: Option<&pb::Content>, id: &str) -> bool {
    matches!(
        content.and_then(|c| c.body.as_ref()),
        Some(pb::content::Body::Template(t)) if t.template_id == id
    )
}
