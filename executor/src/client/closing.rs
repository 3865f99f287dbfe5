//! Ending a lease stream gracefully, and what the scheduler still says while it ends: leases
//! it granted meanwhile are handed back on the next stream, acks and revokes still count.

use std::time::Duration;

use herald_proto::v1 as pb;
use pb::scheduler_message::Kind as In;
use tokio::time::Instant;
use tracing::debug;

use super::inflight::LeaseKey;
use super::stream::Stream;
use super::LeaseClient;

/// How long a gracefully closed stream waits for the scheduler to end its side.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);

impl LeaseClient {
    /// Ends a stream gracefully: half-close our side, then wait (briefly) for the scheduler to
    /// end its side. Dropping the stream outright could cancel it before the last frames (a
    /// Release, a report) reach the wire.
    pub(super) async fn close(
        &mut self,
        stream: Stream,
        mut inbound: tonic::Streaming<pb::SchedulerMessage>,
    ) {
        drop(stream);
        let limit = match self.shutdown_deadline {
            Some(deadline) => deadline.min(Instant::now() + CLOSE_TIMEOUT),
            None => Instant::now() + CLOSE_TIMEOUT,
        };
        loop {
            match tokio::time::timeout_at(limit, inbound.message()).await {
                Ok(Ok(Some(pb::SchedulerMessage {
                    kind: Some(In::Leases(batch)),
                }))) => {
                    // Granted after we stopped asking on this stream: hand them back on the
                    // next one (run opens one even while shutting down), or say on it that
                    // they were stopped unsent if their revoke came first.
                    for lease in &batch.leases {
                        let key = LeaseKey {
                            task_id: lease.task_id.clone(),
                            attempt: lease.attempt,
                        };
                        if self.inflight.revoked_before_received(&key) {
                            self.stopped_early.push(key.to_ref());
                        } else {
                            self.to_release.push(key.to_ref());
                        }
                    }
                }
                // What the scheduler still says about earlier frames counts: an ack spares the
                // result a resend (and a refusal on the next replica), a lost extension or a
                // Revoke stops a lease not yet sending. A Revoke cannot be answered here: a
                // lease it stopped unsent (or one that came during the close, now never to be
                // sent) is answered on the next stream, so its cancel is confirmed.
                Ok(Ok(Some(pb::SchedulerMessage {
                    kind: Some(In::ReportAcks(batch)),
                }))) => self.on_report_acks(batch),
                Ok(Ok(Some(pb::SchedulerMessage {
                    kind: Some(In::ExtendAck(ack)),
                }))) => self.on_extend_ack(&ack),
                Ok(Ok(Some(pb::SchedulerMessage {
                    kind: Some(In::Revoke(pb::Revoke { lease: Some(lease) })),
                }))) => {
                    let unstarted = self
                        .to_release
                        .iter()
                        .position(|l| l.task_id == lease.task_id && l.attempt == lease.attempt);
                    if let Some(at) = unstarted {
                        self.to_release.swap_remove(at);
                        self.stopped_early.push(lease);
                    } else if self.on_revoke(&lease) == pb::RevokeResult::StoppedBeforeSend {
                        self.stopped_early.push(lease);
                    }
                }
                Ok(Ok(Some(_))) => {}
                Ok(Ok(None)) | Ok(Err(_)) => return,
                Err(_) => {
                    debug!("scheduler did not end the closed stream in time");
                    return;
                }
            }
        }
    }
}
