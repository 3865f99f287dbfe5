//! A scripted executor: the test plays the executor's side of the lease stream frame by frame,
//! to check the scheduler's half of the protocol (credit, fencing, revokes, extension).

use std::time::Duration;

use anyhow::{bail, Context, Result};
use herald_proto::v1::{
    executor_message, scheduler_message, AttemptResult, Credit, ExecutorMessage, Extend, ExtendAck,
    Hello, Lease, LeaseRef, OutcomeClass, ReportAck, ReportBatch, RevokeAck, RevokeResult,
    SchedulerMessage, Welcome,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

use crate::connect_lease;

/// How long [`ScriptedExecutor::next`] waits for a frame before failing the test.
pub const FRAME_TIMEOUT: Duration = Duration::from_secs(20);

/// How long opening a stream keeps asking a replica that answers `UNAVAILABLE`, as an executor
/// would: its database check can fail for a moment when the machine is busy.
pub const PATIENCE: Duration = Duration::from_secs(15);

/// One open lease stream driven by the test.
pub struct ScriptedExecutor {
    outbound: mpsc::Sender<ExecutorMessage>,
    inbound: Streaming<SchedulerMessage>,
    /// The scheduler's Welcome.
    pub welcome: Welcome,
}

impl ScriptedExecutor {
    /// Connects to `url`, sends Hello with `credit` and `queues` (empty: all), awaits Welcome.
    pub async fn connect(
        url: &str,
        executor_id: &str,
        queues: &[&str],
        credit: u32,
    ) -> Result<Self> {
        let client = connect_lease(url).await?;
        Self::connect_with(client, &[], executor_id, queues, credit).await
    }

    /// Like [`ScriptedExecutor::connect`], asking once: for tests of the refusal itself.
    pub async fn connect_once(
        url: &str,
        executor_id: &str,
        queues: &[&str],
        credit: u32,
    ) -> Result<Self> {
        let client = connect_lease(url).await?;
        Self::open(
            client,
            &[],
            executor_id,
            queues,
            &[],
            credit,
            Duration::ZERO,
        )
        .await
    }

    /// Like [`ScriptedExecutor::connect`], declaring that it holds only the credentials
    /// `credentials` (the accounts' `credentials_ref`s it can send for).
    pub async fn connect_holding(
        url: &str,
        executor_id: &str,
        queues: &[&str],
        credentials: &[&str],
        credit: u32,
    ) -> Result<Self> {
        let client = connect_lease(url).await?;
        Self::open(
            client,
            &[],
            executor_id,
            queues,
            credentials,
            credit,
            PATIENCE,
        )
        .await
    }

    /// Like [`ScriptedExecutor::connect`] over an existing client (TLS, for instance), with
    /// extra request metadata such as `authorization` and `x-herald-namespace`.
    pub async fn connect_with(
        client: herald_proto::v1::lease_service_client::LeaseServiceClient<
            tonic::transport::Channel,
        >,
        metadata: &[(&'static str, &str)],
        executor_id: &str,
        queues: &[&str],
        credit: u32,
    ) -> Result<Self> {
        Self::open(client, metadata, executor_id, queues, &[], credit, PATIENCE).await
    }

    async fn open(
        mut client: herald_proto::v1::lease_service_client::LeaseServiceClient<
            tonic::transport::Channel,
        >,
        metadata: &[(&'static str, &str)],
        executor_id: &str,
        queues: &[&str],
        credentials: &[&str],
        credit: u32,
        patience: Duration,
    ) -> Result<Self> {
        let hello = Hello {
            executor_id: executor_id.to_owned(),
            protocol_version: herald_proto::LEASE_PROTOCOL_VERSION,
            queues: queues.iter().map(|q| (*q).to_owned()).collect(),
            initial_credit: credit,
            credentials_refs: credentials.iter().map(|c| (*c).to_owned()).collect(),
        };
        let give_up_at = tokio::time::Instant::now() + patience;
        let mut backoff = Duration::from_millis(50);
        let (outbound, mut inbound) = loop {
            let (outbound, rx) = mpsc::channel(64);
            outbound
                .send(frame(executor_message::Kind::Hello(hello.clone())))
                .await
                .context("sending Hello")?;
            let mut request = tonic::Request::new(ReceiverStream::new(rx));
            for (key, value) in metadata {
                request
                    .metadata_mut()
                    .insert(*key, value.parse().context("metadata value")?);
            }
            match client.lease(request).await {
                Ok(response) => break (outbound, response.into_inner()),
                // What a real executor does too: a replica that says it cannot reach its
                // database right now (a slow check on a busy machine) is asked again later.
                Err(status)
                    if status.code() == tonic::Code::Unavailable
                        && tokio::time::Instant::now() + backoff < give_up_at =>
                {
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
                Err(status) => return Err(status).context("opening the lease stream"),
            }
        };
        let welcome = match next_kind(&mut inbound, FRAME_TIMEOUT).await? {
            scheduler_message::Kind::Welcome(w) => w,
            other => bail!("expected Welcome, got {other:?}"),
        };
        Ok(ScriptedExecutor {
            outbound,
            inbound,
            welcome,
        })
    }

    /// Sends one frame.
    pub async fn send(&self, kind: executor_message::Kind) -> Result<()> {
        self.outbound
            .send(frame(kind))
            .await
            .context("the lease stream is closed")
    }

    /// Grants `n` more credit.
    pub async fn credit(&self, n: u32) -> Result<()> {
        self.send(executor_message::Kind::Credit(Credit { additional: n }))
            .await
    }

    /// The next frame from the scheduler, failing after `timeout`.
    pub async fn next_within(&mut self, timeout: Duration) -> Result<scheduler_message::Kind> {
        next_kind(&mut self.inbound, timeout).await
    }

    /// The next frame, failing after [`FRAME_TIMEOUT`].
    pub async fn next(&mut self) -> Result<scheduler_message::Kind> {
        self.next_within(FRAME_TIMEOUT).await
    }

    /// Collects leases until `n` have arrived (other frames are an error).
    pub async fn leases(&mut self, n: usize) -> Result<Vec<Lease>> {
        let mut out = Vec::new();
        while out.len() < n {
            match self.next().await? {
                scheduler_message::Kind::Leases(batch) => out.extend(batch.leases),
                other => bail!("expected leases, got {other:?}"),
            }
        }
        Ok(out)
    }

    /// Reports results and returns the scheduler's acks.
    pub async fn report(&mut self, results: Vec<AttemptResult>) -> Result<Vec<ReportAck>> {
        self.send(executor_message::Kind::Report(ReportBatch { results }))
            .await?;
        match self.next().await? {
            scheduler_message::Kind::ReportAcks(batch) => Ok(batch.acks),
            other => bail!("expected report acks, got {other:?}"),
        }
    }

    /// Reports every one of `leases` with `outcome` and returns the scheduler's acks.
    pub async fn report_each(
        &mut self,
        leases: &[Lease],
        outcome: OutcomeClass,
    ) -> Result<Vec<ReportAck>> {
        self.report(leases.iter().map(|l| result(l, outcome)).collect())
            .await
    }

    /// Extends leases and returns the ack.
    pub async fn extend(&mut self, leases: &[&Lease]) -> Result<ExtendAck> {
        self.send(executor_message::Kind::Extend(Extend {
            leases: leases.iter().map(|l| lease_ref(l)).collect(),
        }))
        .await?;
        match self.next().await? {
            scheduler_message::Kind::ExtendAck(ack) => Ok(ack),
            other => bail!("expected ExtendAck, got {other:?}"),
        }
    }

    /// Answers a revoke.
    pub async fn revoke_ack(&self, lease: LeaseRef, result: RevokeResult) -> Result<()> {
        self.send(executor_message::Kind::RevokeAck(RevokeAck {
            lease: Some(lease),
            result: result as i32,
        }))
        .await
    }

    /// Closes the executor's half of the stream.
    pub fn close(self) {
        drop(self.outbound);
    }

    /// Closes the executor's half of the stream at once; the future returns every frame the
    /// scheduler sends until it ends its half (each within [`FRAME_TIMEOUT`]).
    pub fn finish(self) -> impl std::future::Future<Output = Result<Vec<scheduler_message::Kind>>> {
        let ScriptedExecutor {
            outbound,
            mut inbound,
            ..
        } = self;
        drop(outbound);
        async move {
            let mut frames = Vec::new();
            loop {
                let message = tokio::time::timeout(FRAME_TIMEOUT, inbound.message())
                    .await
                    .with_context(|| {
                        format!("the scheduler did not end the stream within {FRAME_TIMEOUT:?}")
                    })?
                    .context("the lease stream failed")?;
                match message {
                    Some(message) => {
                        frames.push(message.kind.context("empty frame from the scheduler")?)
                    }
                    None => return Ok(frames),
                }
            }
        }
    }
}

/// The fencing token of a lease.
pub fn lease_ref(lease: &Lease) -> LeaseRef {
    LeaseRef {
        task_id: lease.task_id.clone(),
        attempt: lease.attempt,
    }
}

/// A result for `lease` with `outcome`.
pub fn result(lease: &Lease, outcome: OutcomeClass) -> AttemptResult {
    AttemptResult {
        task_id: lease.task_id.clone(),
        attempt: lease.attempt,
        outcome: outcome as i32,
        error: if outcome == OutcomeClass::Ok {
            String::new()
        } else {
            format!("scripted {}", outcome.as_str_name())
        },
        ..AttemptResult::default()
    }
}

fn frame(kind: executor_message::Kind) -> ExecutorMessage {
    ExecutorMessage { kind: Some(kind) }
}

async fn next_kind(
    inbound: &mut Streaming<SchedulerMessage>,
    timeout: Duration,
) -> Result<scheduler_message::Kind> {
    let message = tokio::time::timeout(timeout, inbound.message())
        .await
        .with_context(|| format!("no frame from the scheduler within {timeout:?}"))?
        .context("the lease stream failed")?
        .context("the scheduler closed the lease stream")?;
    message.kind.context("empty frame from the scheduler")
}
