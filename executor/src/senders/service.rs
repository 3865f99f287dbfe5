//! The one tower adapter every sender goes through: a sender kind implements [`Sender`] (one
//! `send`), [`Sender::boxed`] turns it into a [`BoxSender`], and [`layered`] wraps that in the
//! executor's layers once per route.

use std::cell::Cell;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use tower::util::BoxCloneService;
use tower::{BoxError, ServiceBuilder, ServiceExt};

use super::{SendError, SendReceipt, SendRequest};

/// A sender as the executor stores it: any cloneable service from request to receipt.
pub type BoxSender = BoxCloneService<SendRequest, SendReceipt, SendError>;

/// What a sender kind implements: one attempt at sending one message, answered with the
/// provider's receipt or a classified error. Readiness, timeouts and concurrency are not its
/// business: the adapter is always ready and [`layered`] adds the limits.
pub trait Sender: Send + Sync + Sized + 'static {
    /// Sends `req`.
    fn send(&self, req: SendRequest)
        -> impl Future<Output = Result<SendReceipt, SendError>> + Send;

    /// This sender as a [`BoxSender`], shared (not copied) by the clones tower makes.
    fn boxed(self) -> BoxSender {
        BoxCloneService::new(Adapter(Arc::new(self)))
    }
}

/// The `tower::Service` of a [`Sender`].
struct Adapter<S>(Arc<S>);

impl<S> Clone for Adapter<S> {
    fn clone(&self) -> Self {
        Adapter(self.0.clone())
    }
}

impl<S: Sender> tower::Service<SendRequest> for Adapter<S> {
    type Response = SendReceipt;
    type Error = SendError;
    type Future = BoxFuture<'static, Result<SendReceipt, SendError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), SendError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: SendRequest) -> Self::Future {
        let sender = self.0.clone();
        Box::pin(async move { sender.send(req).await })
    }
}

/// Limits applied around one route's sender.
#[derive(Clone, Copy, Debug)]
pub struct RouteLimits {
    /// How long one send may take.
    pub timeout: Duration,
    /// How many sends may run at once on this route.
    pub concurrency: usize,
}

tokio::task_local! {
    /// Whether the send running in this task has posted a window-closed fallback: the
    /// timeout below drops the sender's future, and with it the flag the sender would have
    /// put on its error, so the sender marks it here first ([`fallback_posted`]).
    static FALLBACK_POSTED: Cell<bool>;
}

/// Called by a sender just before it posts a window-closed fallback, so that a send the
/// route's timeout cuts short from then on still says the fallback may have gone: the
/// scheduler then marks it used, and no later attempt posts it again (it was posted on every
/// attempt). Outside [`layered`] (a sender called directly) it does nothing.
pub fn fallback_posted() {
    let _ = FALLBACK_POSTED.try_with(|posted| posted.set(true));
}

/// Wraps a sender in the executor's layers. Every route goes through here once at start-up.
pub fn layered(sender: BoxSender, limits: RouteLimits) -> BoxSender {
    let timeout = limits.timeout;
    let stack = ServiceBuilder::new()
        // Bound the sends running at once on this route; waiting for a permit is the lease's
        // Pending state, so a Revoke can still stop it before anything is sent.
        .concurrency_limit(limits.concurrency.max(1))
        // Bound each send (not the wait for a permit) so a hung provider cannot hold a slot
        // forever; an elapsed send is TRANSIENT because the provider may never have seen it,
        // and of unknown outcome because it may have.
        .map_future(move |fut| {
            FALLBACK_POSTED.scope(Cell::new(false), async move {
                match tokio::time::timeout(timeout, fut).await {
                    Ok(result) => result,
                    // The provider may have taken the message and not answered yet.
                    Err(_) => Err(SendError {
                        window_closed_fallback: FALLBACK_POSTED.with(Cell::get),
                        ..SendError::transient(format!(
                            "send timed out after {}",
                            humantime::format_duration(timeout)
                        ))
                        .with_outcome_unknown()
                    }),
                }
            })
        })
        .service(sender);
    BoxCloneService::new(stack)
}

/// Turns any service whose error converts to [`BoxError`] into a [`BoxSender`], classifying
/// unknown errors as TRANSIENT. Useful for test senders built from `tower::service_fn`.
pub fn boxed<S>(service: S) -> BoxSender
where
    S: tower::Service<SendRequest, Response = SendReceipt> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    BoxCloneService::new(service.map_err(|e: S::Error| {
        let e: BoxError = e.into();
        match e.downcast::<SendError>() {
            Ok(send_error) => *send_error,
            Err(other) => SendError::transient(other.to_string()),
        }
    }))
}

#[cfg(test)]
mod tests {
    use tower::Service;

    use super::*;
    use crate::senders::Content;

    fn request() -> SendRequest {
        SendRequest {
            task_id: "t".into(),
            attempt: 1,
            queue: "q".into(),
            recipient: "16505551234".into(),
            content: Content::Text("hi".into()),
            idempotency_key: "k".into(),
            labels: Default::default(),
            run_at: None,
            leased_at: None,
            attempts_before: 0,
            max_attempts: 3,
            account_id: String::new(),
            credentials_ref: String::new(),
            window_closed_fallback: None,
        }
    }

    /// A send cut short by the route's timeout after posting a window-closed fallback says so,
    /// as the sender's own error would have; one cut short before does not.
    #[tokio::test(start_paused = true)]
    async fn a_timeout_after_the_fallback_was_posted_says_so() -> Result<(), BoxError> {
        for posts in [true, false] {
            let slow = boxed(tower::service_fn(move |_req: SendRequest| async move {
                if posts {
                    fallback_posted();
                }
                // A provider that never answers: only the route's timeout ends the send.
                std::future::pending::<Result<SendReceipt, SendError>>().await
            }));
            let mut route = layered(
                slow,
                RouteLimits {
                    timeout: Duration::from_secs(1),
                    concurrency: 1,
                },
            );
            let answer = route.ready().await?.call(request()).await;
            let error = answer.err().ok_or("the slow send did not time out")?;
            assert_eq!(error.class, crate::senders::OutcomeClass::Transient);
            assert!(error.outcome_unknown, "{}", error.message);
            assert_eq!(error.window_closed_fallback, posts, "{error:?}");
        }
        Ok(())
    }
}
