//! Helpers shared by the executor's integration tests: requests, senders built from config
//! text, sending, and leases as a scripted scheduler hands them out.

#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashMap};

use herald_executor::{BoxSender, Content, SendError, SendReceipt, SendRequest, SenderRoutes};
use tower::{Service, ServiceExt};

/// A request for `recipient` with `content`, first attempt.
pub fn request(task_id: &str, recipient: &str, content: Content) -> SendRequest {
    SendRequest {
        task_id: task_id.into(),
        attempt: 1,
        queue: "q".into(),
        recipient: recipient.into(),
        content,
        idempotency_key: format!("idem-{task_id}"),
        labels: BTreeMap::new(),
        run_at: None,
        leased_at: None,
        attempts_before: 0,
        max_attempts: 5,
        account_id: "acc-1".into(),
        credentials_ref: "acc".into(),
        window_closed_fallback: None,
    }
}

/// A first-attempt lease of task `task_id` on `queue`, carrying the text "hi" (the scheduler's
/// side of the stream, as the lease-protocol tests script it).
pub fn text_lease(task_id: &str, queue: &str) -> herald_proto::v1::Lease {
    use herald_proto::v1 as pb;
    pb::Lease {
        task_id: task_id.into(),
        attempt: 1,
        queue: queue.into(),
        recipient: "someone".into(),
        content: Some(Box::new(pb::Content {
            body: Some(pb::content::Body::Text("hi".into())),
            ..Default::default()
        })),
        idempotency_key: format!("idem-{task_id}"),
        ..Default::default()
    }
}

/// Text content.
pub fn text(s: &str) -> Content {
    Content::Text(s.into())
}

/// The routes of a config file, with `env` as the environment.
pub fn routes(
    toml: &str,
    env: &[(&str, &str)],
) -> Result<SenderRoutes, herald_executor::ConfigError> {
    let map: HashMap<String, String> = env
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    SenderRoutes::from_toml(toml, "executor.toml", &move |name| map.get(name).cloned())
}

/// The sender of account `name` in the config file `toml`.
pub fn account_sender(toml: &str, env: &[(&str, &str)], name: &str) -> BoxSender {
    let routes = routes(toml, env).expect("config parses");
    routes
        .account(name)
        .expect("account configured")
        .sender
        .clone()
}

/// Sends one request (the future owns a clone of the sender, so it can be spawned).
pub fn send(
    sender: &BoxSender,
    req: SendRequest,
) -> impl std::future::Future<Output = Result<SendReceipt, SendError>> + Send {
    let mut s = sender.clone();
    async move { s.ready().await?.call(req).await }
}
