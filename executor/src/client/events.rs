//! Forwarding provider events (the WhatsApp webhook's) to the scheduler:
//! `LeaseService.RecordProviderEvents`, a unary call over the lease stream's TLS and token.
//!
//! Unary rather than a frame on the lease stream: the answer is exactly "the scheduler has
//! recorded this batch", which is what the provider's HTTP request waits for, and the call
//! works whether or not a stream is open at that moment (one may be reconnecting).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use herald_proto::v1 as pb;
use herald_proto::v1::lease_service_client::LeaseServiceClient;
use tonic::transport::Channel;
use tracing::debug;

use crate::connection::Connection;

/// Most events in one call (the scheduler's limit).
const MAX_EVENTS: usize = 1000;
/// How long connecting to an endpoint may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one call may take; the provider waits for the answer.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a batch was not recorded.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ForwardError {
    /// No endpoint could be used.
    #[error("no usable scheduler endpoint")]
    NoEndpoint,
    /// Every endpoint failed; the last error.
    #[error("scheduler did not record the events: {0}")]
    Failed(#[source] tonic::Status),
}

impl ForwardError {
    /// Whether the scheduler refused the events themselves (INVALID_ARGUMENT): sending them
    /// again, now or later, gets the same answer.
    pub(crate) fn is_refused(&self) -> bool {
        matches!(self, ForwardError::Failed(status) if status.code() == tonic::Code::InvalidArgument)
    }
}

/// Sends provider events to the schedulers, trying each endpoint in turn.
#[derive(Clone)]
pub(crate) struct EventForwarder {
    channels: Vec<(String, Channel)>,
    connection: Connection,
    next: std::sync::Arc<AtomicUsize>,
}

impl EventForwarder {
    /// A forwarder over `endpoints`, connecting lazily; endpoints that cannot be used (already
    /// refused at start-up by the lease client's checks) are left out.
    pub(crate) fn new(endpoints: &[String], connection: Connection) -> Self {
        let channels = endpoints
            .iter()
            .filter(|e| connection.allows(e))
            .filter_map(|e| {
                let endpoint = tonic::transport::Endpoint::from_shared(e.clone())
                    .and_then(|ep| connection.configure(ep))
                    .ok()?
                    .connect_timeout(CONNECT_TIMEOUT)
                    .timeout(CALL_TIMEOUT)
                    .tcp_nodelay(true);
                Some((e.clone(), endpoint.connect_lazy()))
            })
            .collect();
        EventForwarder {
            channels,
            connection,
            next: Default::default(),
        }
    }

    /// Records `events` (in calls of at most 1,000); Ok with how many changed something once
    /// every call succeeded.
    pub(crate) async fn record(&self, events: Vec<pb::ProviderEvent>) -> Result<u32, ForwardError> {
        let mut applied = 0u32;
        for chunk in events.chunks(MAX_EVENTS) {
            applied = applied.saturating_add(self.record_chunk(chunk).await?);
        }
        Ok(applied)
    }

    async fn record_chunk(&self, events: &[pb::ProviderEvent]) -> Result<u32, ForwardError> {
        if self.channels.is_empty() {
            return Err(ForwardError::NoEndpoint);
        }
        let start = self.next.load(Ordering::Relaxed);
        let mut last = None;
        // Each endpoint twice: a channel whose connection broke (the scheduler restarted)
        // may fail one call before it dials again.
        for i in 0..self.channels.len() * 2 {
            let (endpoint, channel) = &self.channels[(start + i / 2) % self.channels.len()];
            let mut request = tonic::Request::new(pb::RecordProviderEventsRequest {
                events: events.to_vec(),
            });
            self.connection.authorize(&mut request);
            match LeaseServiceClient::new(channel.clone())
                .record_provider_events(request)
                .await
            {
                Ok(answer) => {
                    self.next
                        .store((start + i / 2) % self.channels.len(), Ordering::Relaxed);
                    return Ok(answer.into_inner().applied);
                }
                // The events themselves are refused: another replica would refuse them too.
                Err(status) if status.code() == tonic::Code::InvalidArgument => {
                    return Err(ForwardError::Failed(status))
                }
                Err(status) => {
                    debug!(%endpoint, %status, "recording provider events failed; trying the next endpoint");
                    last = Some(status);
                }
            }
        }
        self.next.store(start.wrapping_add(1), Ordering::Relaxed);
        Err(ForwardError::Failed(last.unwrap_or_else(|| {
            tonic::Status::unavailable("no scheduler endpoint answered")
        })))
    }
}
