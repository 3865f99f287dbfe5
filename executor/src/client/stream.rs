//! The stream to one scheduler: opening it (connect, Hello, Welcome) and writing frames to it,
//! each bounded in time so a scheduler that stopped answering or reading ends the session.

use std::time::Duration;

use herald_proto::v1 as pb;
use herald_proto::v1::lease_service_client::LeaseServiceClient;
use pb::executor_message::Kind as Out;
use pb::scheduler_message::Kind as In;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;

use super::SessionError;

/// How long connecting to an endpoint may take.
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the scheduler has to answer Hello.
pub(super) const WELCOME_TIMEOUT: Duration = Duration::from_secs(10);
/// The current stream's writer.
pub(super) struct Stream {
    pub(super) tx: mpsc::Sender<pb::ExecutorMessage>,
    pub(super) last_sent: Instant,
    /// False after Drain or once shutting down: no more Credit on this stream.
    pub(super) granting: bool,
    /// How long one frame may wait for room on the stream. A scheduler that stopped reading
    /// (frozen, or a link that drops packets) fills the outgoing queue; without a bound the
    /// session would wait there for good, deaf to its silence check and to the shutdown
    /// deadline, and never move to another replica.
    pub(super) send_timeout: Duration,
}

impl Stream {
    /// Sends one frame, waiting at most `send_timeout` for room on the stream.
    pub(super) async fn send(&mut self, kind: Out) -> Result<(), SessionError> {
        self.last_sent = Instant::now();
        match tokio::time::timeout(
            self.send_timeout,
            self.tx.send(pb::ExecutorMessage { kind: Some(kind) }),
        )
        .await
        {
            Ok(sent) => sent.map_err(|_| SessionError::OutgoingClosed),
            Err(_) => Err(SessionError::Stalled(self.send_timeout)),
        }
    }
}

/// Connects, sends Hello and waits for Welcome.
pub(super) async fn open(
    endpoint: &str,
    connection: &crate::connection::Connection,
    hello: pb::Hello,
) -> Result<(Stream, tonic::Streaming<pb::SchedulerMessage>, pb::Welcome), SessionError> {
    if !connection.allows(endpoint) {
        return Err(SessionError::Plaintext(endpoint.to_owned()));
    }
    let bad_endpoint = |source| SessionError::Endpoint {
        endpoint: endpoint.to_owned(),
        source,
    };
    let channel = tonic::transport::Endpoint::from_shared(endpoint.to_owned())
        .and_then(|e| connection.configure(e))
        .map_err(bad_endpoint)?
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true)
        .connect()
        .await
        .map_err(|source| SessionError::Connect {
            endpoint: endpoint.to_owned(),
            source,
        })?;
    let mut client = LeaseServiceClient::new(channel);
    let (tx, rx) = mpsc::channel(256);
    let mut stream = Stream {
        tx,
        last_sent: Instant::now(),
        granting: false,
        // Until Welcome says the heartbeat: as long as Welcome may take.
        send_timeout: WELCOME_TIMEOUT,
    };
    stream.send(Out::Hello(hello)).await?;
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    connection.authorize(&mut request);
    let mut inbound = client
        .lease(request)
        .await
        .map_err(SessionError::Refused)?
        .into_inner();
    let welcome = match tokio::time::timeout(WELCOME_TIMEOUT, inbound.message()).await {
        Err(_) => return Err(SessionError::WelcomeTimeout(WELCOME_TIMEOUT)),
        Ok(Err(status)) => return Err(SessionError::Refused(status)),
        Ok(Ok(None)) => return Err(SessionError::Closed),
        Ok(Ok(Some(pb::SchedulerMessage {
            kind: Some(In::Welcome(w)),
        }))) => w,
        Ok(Ok(Some(_))) => return Err(SessionError::NoWelcome),
    };
    Ok((stream, inbound, welcome))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scheduler that stopped reading: once the outgoing queue is full, a frame waits at most
    /// the stream's send timeout, and the session ends instead of waiting for good.
    #[tokio::test(start_paused = true)]
    async fn a_frame_the_scheduler_never_takes_ends_the_session() {
        let (tx, _unread) = mpsc::channel(1);
        let mut stream = Stream {
            tx,
            last_sent: Instant::now(),
            granting: true,
            send_timeout: Duration::from_secs(30),
        };
        let beat = || Out::Heartbeat(pb::Heartbeat::default());
        assert!(stream.send(beat()).await.is_ok(), "the queue had room");
        match stream.send(beat()).await {
            Err(SessionError::Stalled(waited)) => assert_eq!(waited, Duration::from_secs(30)),
            other => panic!("expected Stalled, got {other:?}"),
        }
    }
}
