//! LeaseService: the lease stream's framing. Reads the executor's frames, checks them and
//! hands them to the lease engine (`lease/session.rs`) as domain frames; turns the engine's
//! frames back into wire frames. A frame that breaks the protocol ends the stream with a status
//! (after every frame before it was answered); problems with one lease travel in-band.

use std::time::Duration;

use futures::StreamExt as _;
use herald_proto::framing;
use herald_proto::v1::{
    self as pb, executor_message, lease_service_server::LeaseService, scheduler_message,
    ExecutorMessage, SchedulerMessage,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::convert::{self, tasks as wire};
use crate::auth::namespace_of;
use crate::error::Error;
use crate::lease::reports::{AttemptReport, ReportEntry};
use crate::lease::session::{self, SessionContext};
use crate::lease::{FromExecutor, Hello, LeaseRef, ToExecutor, MAX_CREDIT, PROTOCOL_VERSION};
use crate::rules;
use crate::tasks::model::{GrantedLease, Outcome};

/// How long an executor has to send Hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest error text kept per attempt.
const MAX_ERROR_BYTES: usize = 4096;
/// Longest retry-after honoured from a report (a retry policy's own delays are capped alike).
pub const MAX_RETRY_AFTER_MS: i64 = 7 * 24 * 3_600_000;

/// The LeaseService implementation.
pub struct LeaseApi {
    ctx: SessionContext,
}

impl LeaseApi {
    /// Serves lease streams with the replica's shared session context.
    pub fn new(ctx: SessionContext) -> Self {
        LeaseApi { ctx }
    }
}

/// The wire messages of one domain frame: one, or several for a large batch of leases.
type WireFrames = futures::stream::Iter<std::vec::IntoIter<Result<SchedulerMessage, Status>>>;

/// The scheduler's frames of one stream.
type Outgoing =
    futures::stream::FlatMap<ReceiverStream<ToExecutor>, WireFrames, fn(ToExecutor) -> WireFrames>;

#[tonic::async_trait]
impl LeaseService for LeaseApi {
    type LeaseStream = Outgoing;

    async fn lease(
        &self,
        request: Request<Streaming<ExecutorMessage>>,
    ) -> Result<Response<Self::LeaseStream>, Status> {
        let namespace = namespace_of(&request)?;
        // Refused rather than held open: the executor tries its other endpoints at once.
        self.ctx.admit()?;
        let mut inbound = request.into_inner();
        let first = tokio::time::timeout(HELLO_TIMEOUT, inbound.message())
            .await
            .map_err(|_| Error::DeadlineExceeded("no Hello within 10s".into()))??;
        let hello = match first.and_then(|m| m.kind) {
            Some(executor_message::Kind::Hello(h)) => hello(&h)?,
            _ => return Err(Error::invalid("hello", "the first frame must be Hello").into()),
        };
        let (frames_tx, frames_rx) = mpsc::channel(64);
        let (out_tx, out_rx) = mpsc::channel(256);
        session::start(self.ctx.clone(), namespace, hello, frames_rx, out_tx);
        tokio::spawn(read_frames(inbound, frames_tx));
        let outgoing: Outgoing = ReceiverStream::new(out_rx).flat_map(wire_frames);
        Ok(Response::new(outgoing))
    }

    async fn record_provider_events(
        &self,
        request: Request<pb::RecordProviderEventsRequest>,
    ) -> Result<Response<pb::RecordProviderEventsResponse>, Status> {
        let namespace = namespace_of(&request)?;
        let events = convert::callbacks::events(request.get_ref())?;
        let applied = crate::callbacks::record(
            &self.ctx.store,
            &namespace,
            &events,
            &self.ctx.settings.opt_out_keywords,
        )
        .await?;
        crate::telemetry::metrics::provider_events(events.iter().map(|e| e.kind()), applied);
        tracing::debug!(events = events.len(), applied, "provider events recorded");
        Ok(Response::new(pb::RecordProviderEventsResponse { applied }))
    }
}

/// Forwards the executor's frames to its session until the stream ends or breaks the
/// protocol.
async fn read_frames(mut inbound: Streaming<ExecutorMessage>, session: mpsc::Sender<FromExecutor>) {
    loop {
        let frame = match inbound.message().await {
            Ok(Some(m)) => from_wire(m),
            Ok(None) => return,
            Err(status) => {
                tracing::debug!(%status, "lease stream ended");
                return;
            }
        };
        let last = matches!(frame, FromExecutor::Violation(_));
        if session.send(frame).await.is_err() || last {
            return;
        }
    }
}

/// Checks an executor's Hello; the error names the field.
pub fn hello(h: &pb::Hello) -> Result<Hello, Error> {
    // No control characters: the id is stored with every lease (and PostgreSQL refuses NUL).
    if h.executor_id.is_empty()
        || h.executor_id.chars().count() > 128
        || h.executor_id.chars().any(char::is_control)
    {
        return Err(Error::invalid(
            "hello.executor_id",
            "must be 1 to 128 printable characters",
        ));
    }
    if h.protocol_version == 0 {
        return Err(Error::FailedPrecondition(format!(
            "hello.protocol_version: 0 is not a protocol version; this scheduler speaks \
             {PROTOCOL_VERSION}"
        )));
    }
    if h.initial_credit > MAX_CREDIT {
        return Err(Error::invalid(
            "hello.initial_credit",
            format!("at most {MAX_CREDIT}"),
        ));
    }
    for (i, q) in h.queues.iter().enumerate() {
        if let Some(problem) = rules::name_problem(q) {
            return Err(Error::invalid(format!("hello.queues[{i}]"), problem));
        }
    }
    for (i, c) in h.credentials_refs.iter().enumerate() {
        if c.is_empty() || c.len() > 128 || c.chars().any(char::is_control) {
            return Err(Error::invalid(
                format!("hello.credentials_refs[{i}]"),
                "must be 1 to 128 printable characters",
            ));
        }
    }
    Ok(Hello {
        executor_id: h.executor_id.clone(),
        protocol_version: h.protocol_version,
        queues: h.queues.clone(),
        initial_credit: h.initial_credit,
        credentials_refs: h.credentials_refs.clone(),
    })
}

fn lease_ref(l: &pb::LeaseRef) -> LeaseRef {
    LeaseRef {
        task_ref: l.task_id.clone(),
        attempt: l.attempt,
    }
}

fn lease_ref_to_wire(l: &LeaseRef) -> pb::LeaseRef {
    pb::LeaseRef {
        task_id: l.task_ref.clone(),
        attempt: l.attempt,
    }
}

/// An executor frame after the Hello as a domain frame.
pub fn from_wire(m: ExecutorMessage) -> FromExecutor {
    match m.kind {
        Some(executor_message::Kind::Credit(c)) => FromExecutor::Credit(c.additional),
        Some(executor_message::Kind::Report(batch)) => {
            FromExecutor::Reports(batch.results.iter().map(report).collect())
        }
        Some(executor_message::Kind::Extend(e)) => {
            FromExecutor::Extend(e.leases.iter().map(lease_ref).collect())
        }
        Some(executor_message::Kind::RevokeAck(ack)) => match ack.lease {
            Some(lease) => FromExecutor::RevokeAck {
                lease: lease_ref(&lease),
                stopped_before_send: ack.result == pb::RevokeResult::StoppedBeforeSend as i32,
            },
            // Nothing to apply: an empty release is answered by nothing, as the ack was.
            None => FromExecutor::Release(Vec::new()),
        },
        Some(executor_message::Kind::Release(r)) => {
            FromExecutor::Release(r.leases.iter().map(lease_ref).collect())
        }
        Some(executor_message::Kind::Heartbeat(_)) => FromExecutor::Heartbeat,
        Some(executor_message::Kind::Hello(_)) => {
            FromExecutor::Violation(Error::invalid("hello", "Hello may only be the first frame"))
        }
        None => FromExecutor::Violation(Error::invalid("kind", "empty frame")),
    }
}

/// A wire report as a report entry; one whose outcome or task id a report cannot carry has no
/// report and is refused.
pub fn report(r: &pb::AttemptResult) -> ReportEntry {
    ReportEntry {
        lease: LeaseRef {
            task_ref: r.task_id.clone(),
            attempt: r.attempt,
        },
        report: attempt_report(r),
    }
}

fn attempt_report(r: &pb::AttemptResult) -> Result<AttemptReport, &'static str> {
    let outcome: Outcome = wire::outcome_from_wire(r.outcome).ok_or(
        "its outcome is not one a result may carry (UNSPECIFIED, LEASE_EXPIRED or unknown)",
    )?;
    let task_id = r
        .task_id
        .parse()
        .map_err(|_| "its task_id is not a task id (a UUID)")?;
    let retry_after_ms = r
        .retry_after
        .as_ref()
        .filter(|d| d.seconds >= 0 && d.nanos >= 0)
        // Saturating, then capped: a provider's absurd Retry-After must neither overflow (a panic
        // in the session) nor push the due time out of the database's range (a batch that fails
        // on every reconnect). Found by fuzzing, #10.
        .map(|d| {
            d.seconds
                .saturating_mul(1000)
                .saturating_add(i64::from(d.nanos / 1_000_000))
                .min(MAX_RETRY_AFTER_MS)
        });
    Ok(AttemptReport {
        task_id,
        attempt: r.attempt,
        outcome,
        error: (!r.error.is_empty()).then(|| truncate(&r.error, MAX_ERROR_BYTES)),
        provider_message_id: (!r.provider_message_id.is_empty())
            .then(|| truncate(&r.provider_message_id, 512)),
        retry_after_ms,
        started_at: r.started_at.as_ref().and_then(convert::from_timestamp),
        recipient_scoped: r.rate_limit_scope == pb::RateLimitScope::Recipient as i32,
        error_code: (r.error_code != 0).then_some(r.error_code),
        window_closed_fallback: r.window_closed_fallback,
        outcome_unknown: r.outcome_unknown,
    })
}

/// A domain frame as wire messages.
fn wire_frames(frame: ToExecutor) -> WireFrames {
    futures::stream::iter(to_wire(frame))
}

/// Leases as `LeaseBatch` messages under the lease stream's size limit
/// ([`herald_proto::framing`]), in their order. A claim of large tasks (up to 64 KB of content
/// each) can be tens of megabytes: sent as one message, the executor refused it, broke its
/// stream at every claim, and the leases ran out unsent.
fn lease_batches(leases: Vec<GrantedLease>) -> Vec<pb::LeaseBatch> {
    let sized = leases.into_iter().map(|l| {
        let task_id = l.task_id;
        let size = wire_size_bound(&l);
        let (lease, unread) = wire::lease(l);
        if let Some(e) = unread {
            tracing::error!(task_id = %task_id, error = %e,
                "the task's stored content cannot be read; leased without it, so the executor fails it");
        }
        (size, lease)
    });
    framing::batches(sized, usize::MAX)
        .into_iter()
        .map(|leases| pb::LeaseBatch { leases })
        .collect()
}

/// At least the bytes `l` takes in a `LeaseBatch`, from its stored fields: cheaper than
/// encoding it, which the drain would pay per lease. The content and the fallback are stored
/// as their encoded messages; the rest is its strings, each with a tag and a length, and a
/// fixed allowance for the numbers, timestamps and the lease's own tag and length.
fn wire_size_bound(l: &GrantedLease) -> usize {
    const FIELD: usize = 6;
    const FIXED: usize = 160;
    let strings = [
        l.queue.len(),
        l.recipient.len(),
        l.idempotency_key.len(),
        l.account_id.as_ref().map_or(0, String::len),
        l.credentials_ref.as_ref().map_or(0, String::len),
        l.trace_parent.as_ref().map_or(0, String::len),
        l.content.len(),
        l.window_closed_fallback.as_ref().map_or(0, Vec::len),
    ];
    let labels: usize = l
        .labels
        .iter()
        .map(|(k, v)| k.len() + v.len() + 3 * FIELD)
        .sum();
    strings.iter().map(|n| n + FIELD).sum::<usize>() + labels + FIXED
}

/// A domain frame on the wire: one message, or as many as a batch of leases needs.
fn to_wire(frame: ToExecutor) -> Vec<Result<SchedulerMessage, Status>> {
    use scheduler_message::Kind;
    let kind = match frame {
        ToExecutor::Welcome {
            protocol_version,
            heartbeat_interval,
            lease_ttl,
            scheduler_id,
        } => Kind::Welcome(pb::Welcome {
            protocol_version,
            heartbeat_interval: Some(convert::duration(heartbeat_interval)),
            lease_ttl: Some(convert::duration(lease_ttl)),
            scheduler_id,
        }),
        ToExecutor::Leases(leases) => {
            return lease_batches(leases)
                .into_iter()
                .map(|batch| {
                    Ok(SchedulerMessage {
                        kind: Some(Kind::Leases(batch)),
                    })
                })
                .collect()
        }
        ToExecutor::Acks(acks) => Kind::ReportAcks(pb::ReportAckBatch {
            acks: acks
                .into_iter()
                .map(|a| pb::ReportAck {
                    task_id: a.lease.task_ref,
                    attempt: a.lease.attempt,
                    accepted: a.verdict.accepted,
                    state: a
                        .verdict
                        .state
                        .map(|s| wire::state(s) as i32)
                        .unwrap_or_default(),
                    reason: a
                        .verdict
                        .refusal
                        .map(|r| r.reason().to_string())
                        .unwrap_or_default(),
                })
                .collect(),
        }),
        ToExecutor::ExtendAck {
            extended,
            lost,
            expires_at,
        } => Kind::ExtendAck(pb::ExtendAck {
            extended: extended.iter().map(lease_ref_to_wire).collect(),
            lost: lost.iter().map(lease_ref_to_wire).collect(),
            expires_at: expires_at.map(convert::timestamp),
        }),
        ToExecutor::Revoke(lease) => Kind::Revoke(pb::Revoke {
            lease: Some(lease_ref_to_wire(&lease)),
        }),
        ToExecutor::Drain(reason) => Kind::Drain(pb::Drain { reason }),
        ToExecutor::Heartbeat(at) => Kind::Heartbeat(pb::Heartbeat {
            sent_at: Some(convert::timestamp(at)),
        }),
        ToExecutor::End(e) => return vec![Err(e.into())],
    };
    vec![Ok(SchedulerMessage { kind: Some(kind) })]
}

/// `s` cut to at most `max` bytes, without NUL characters: a provider's response excerpt may
/// hold them and PostgreSQL text cannot, which failed the whole report batch on every
/// reconnect (found by fuzzing, #10).
fn truncate(s: &str, max: usize) -> String {
    if s.contains('\0') {
        return truncate(&s.replace('\0', ""), max);
    }
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message as _;

    fn lease_of(bytes: usize) -> GrantedLease {
        GrantedLease {
            task_id: uuid::Uuid::new_v4(),
            idempotency_key: "k".repeat(bytes),
            ..GrantedLease::default()
        }
    }

    #[test]
    fn a_large_claim_is_split_into_batches_under_the_limit_in_order() {
        let leases: Vec<GrantedLease> = (0..40).map(|_| lease_of(100_000)).collect();
        let ids: Vec<String> = leases.iter().map(|l| l.task_id.to_string()).collect();
        let batches = lease_batches(leases);
        assert!(
            batches.len() >= 4,
            "40 leases of 100 KB need at least four batches"
        );
        for batch in &batches {
            assert!(batch.encoded_len() <= framing::MAX_FRAME_BYTES);
        }
        let sent: Vec<String> = batches
            .iter()
            .flat_map(|b| b.leases.iter().map(|l| l.task_id.clone()))
            .collect();
        assert_eq!(sent, ids);
    }

    #[test]
    fn the_size_bound_is_never_below_the_encoded_size() {
        let mut lease = lease_of(1000);
        lease.queue = "orders".into();
        lease.recipient = "+4915112345678".into();
        lease.account_id = Some("wa-1".into());
        lease.credentials_ref = Some("meta/wa-1".into());
        lease.trace_parent = Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into());
        lease.labels = [("campaign".to_owned(), "winter".to_owned())].into();
        lease.attempt = i32::MAX;
        lease.max_attempts = i32::MAX;
        lease.attempts_before = i32::MAX;
        lease.send_after = std::time::Duration::from_millis(999);
        let content = pb::Content {
            body: Some(pb::content::Body::Text("b".repeat(5000))),
            ..pb::Content::default()
        };
        lease.content = content.encode_to_vec();
        let template = pb::Content {
            body: Some(pb::content::Body::Template(pb::TemplateContent {
                template_id: "t".repeat(200),
                language: "en_US".into(),
                ..pb::TemplateContent::default()
            })),
            ..pb::Content::default()
        };
        lease.window_closed_fallback = Some(template.encode_to_vec());
        let bound = wire_size_bound(&lease);
        let (wire_lease, unread) = wire::lease(lease);
        assert!(unread.is_none(), "a lease that converts");
        let len = wire_lease.encoded_len();
        assert!(
            bound >= len + 1 + prost::length_delimiter_len(len),
            "{bound} < {len}"
        );
    }

    #[test]
    fn a_lease_whose_content_cannot_be_read_goes_without_it() {
        let mut unreadable = lease_of(10);
        unreadable.content = vec![0xff; 10];
        let batches = lease_batches(vec![lease_of(10), unreadable, lease_of(10)]);
        let leases: Vec<&pb::Lease> = batches.iter().flat_map(|b| &b.leases).collect();
        assert_eq!(leases.len(), 3, "no lease is dropped");
        let with_content: Vec<bool> = leases.iter().map(|l| l.content.is_some()).collect();
        assert_eq!(with_content, vec![true, false, true]);
    }

    #[test]
    fn a_small_claim_stays_one_batch() {
        let batches = lease_batches((0..1024).map(|_| lease_of(100)).collect());
        assert_eq!(batches.len(), 1);
        assert_eq!(batches[0].leases.len(), 1024);
    }
}
