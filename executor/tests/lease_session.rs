//! The lease session against a scripted fake scheduler: handshake, unknown queues, revoke in
//! each phase, credit, extension, drain to another endpoint, resending unacknowledged results after a
//! broken stream, and shutdown (releasing leases not started).

// Test helpers: a failed expectation is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use herald_executor::{Config, Route, SendError, SendReceipt, SendRequest, SenderRoutes};
use herald_proto::v1 as pb;
use herald_proto::v1::lease_service_server::{LeaseService, LeaseServiceServer};
use pb::executor_message::Kind as Out;
use pb::scheduler_message::Kind as In;
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio_stream::wrappers::{TcpListenerStream, UnboundedReceiverStream};
use tonic::{Request, Response, Status, Streaming};

use common::text_lease;

/// One stream opened by the executor.
struct Session {
    inbound: Streaming<pb::ExecutorMessage>,
    out: mpsc::UnboundedSender<Result<pb::SchedulerMessage, Status>>,
}

impl Session {
    /// The next frame from the executor, skipping heartbeats.
    async fn next(&mut self) -> Out {
        loop {
            let frame = tokio::time::timeout(Duration::from_secs(10), self.inbound.message())
                .await
                .expect("no frame from the executor within 10 s")
                .expect("stream error")
                .expect("stream closed");
            match frame.kind.expect("empty frame") {
                Out::Heartbeat(_) => continue,
                kind => return kind,
            }
        }
    }

    fn send(&self, kind: In) {
        self.out
            .send(Ok(pb::SchedulerMessage { kind: Some(kind) }))
            .expect("executor stream gone");
    }

    async fn handshake(&mut self) -> pb::Hello {
        self.handshake_with_ttl(Duration::from_secs(30)).await
    }

    async fn handshake_with_ttl(&mut self, ttl: Duration) -> pb::Hello {
        let hello = self.hello().await;
        self.welcome(Duration::from_secs(10), ttl);
        hello
    }

    /// The executor's first frame, which must be its Hello.
    async fn hello(&mut self) -> pb::Hello {
        let Out::Hello(hello) = self.next().await else {
            panic!("first frame is not Hello")
        };
        hello
    }

    /// Answers the Hello.
    fn welcome(&self, heartbeat: Duration, ttl: Duration) {
        self.send(In::Welcome(pb::Welcome {
            protocol_version: 1,
            heartbeat_interval: Some(prost_duration(heartbeat)),
            lease_ttl: Some(prost_duration(ttl)),
            scheduler_id: "fake".into(),
        }));
    }
}

fn prost_duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration::try_from(d).unwrap()
}

struct Fake {
    sessions: mpsc::UnboundedSender<Session>,
}

#[tonic::async_trait]
impl LeaseService for Fake {
    type LeaseStream = UnboundedReceiverStream<Result<pb::SchedulerMessage, Status>>;

    async fn lease(
        &self,
        request: Request<Streaming<pb::ExecutorMessage>>,
    ) -> Result<Response<Self::LeaseStream>, Status> {
        let (out, rx) = mpsc::unbounded_channel();
        self.sessions
            .send(Session {
                inbound: request.into_inner(),
                out,
            })
            .map_err(|_| Status::unavailable("test over"))?;
        Ok(Response::new(UnboundedReceiverStream::new(rx)))
    }

    async fn record_provider_events(
        &self,
        _request: Request<pb::RecordProviderEventsRequest>,
    ) -> Result<Response<pb::RecordProviderEventsResponse>, Status> {
        Err(Status::unimplemented(
            "provider events are not part of this fake",
        ))
    }
}

async fn fake_scheduler() -> (String, mpsc::UnboundedReceiver<Session>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(LeaseServiceServer::new(Fake { sessions: tx }))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    (format!("http://{addr}"), rx)
}

async fn next_session(rx: &mut mpsc::UnboundedReceiver<Session>) -> Session {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("executor did not connect within 10 s")
        .expect("fake scheduler gone")
}

/// A sender that announces each send and finishes it only when the test adds a permit.
fn gated_sender(
    started: mpsc::UnboundedSender<String>,
    release: Arc<Semaphore>,
) -> herald_executor::BoxSender {
    tower::util::BoxCloneService::new(tower::service_fn(move |req: SendRequest| {
        let started = started.clone();
        let release = release.clone();
        async move {
            let _ = started.send(req.task_id.clone());
            release
                .acquire()
                .await
                .map_err(|_| SendError::transient("closed"))?
                .forget();
            Ok::<_, SendError>(SendReceipt {
                provider_message_id: Some(format!("pm-{}", req.task_id)),
                ..Default::default()
            })
        }
    }))
}

/// The scheduler's answer to the report of `task_id`'s first attempt.
fn ack(task_id: &str, accepted: bool) -> In {
    In::ReportAcks(pb::ReportAckBatch {
        acks: vec![pb::ReportAck {
            task_id: task_id.into(),
            attempt: 1,
            accepted,
            state: 0,
            ..Default::default()
        }],
    })
}

/// Waits for the executor's run to return, cleanly.
async fn stopped(done: tokio::task::JoinHandle<Result<(), herald_executor::ExecutorError>>) {
    tokio::time::timeout(Duration::from_secs(10), done)
        .await
        .expect("executor did not stop")
        .unwrap()
        .unwrap();
}

fn lease_ref(task_id: &str) -> pb::LeaseRef {
    pb::LeaseRef {
        task_id: task_id.into(),
        attempt: 1,
    }
}

struct Executor {
    shutdown: Option<oneshot::Sender<()>>,
    done: tokio::task::JoinHandle<Result<(), herald_executor::ExecutorError>>,
    started: mpsc::UnboundedReceiver<String>,
    release: Arc<Semaphore>,
}

async fn spawn_executor(endpoints: Vec<String>) -> Executor {
    // One send at a time, so a second lease stays Pending.
    spawn_executor_with_concurrency(endpoints, 1).await
}

async fn spawn_executor_with_concurrency(endpoints: Vec<String>, concurrency: usize) -> Executor {
    let (started_tx, started) = mpsc::unbounded_channel();
    let release = Arc::new(Semaphore::new(0));
    let routes = SenderRoutes::empty().with_route(
        "q",
        Route {
            sender: gated_sender(started_tx, release.clone()),
            timeout: None,
            concurrency: Some(concurrency),
        },
    );
    let mut config = Config::for_schedulers(endpoints);
    config.executor_id = "exec-test".into();
    config.max_in_flight = 4;
    config.shutdown_grace = Duration::from_secs(5);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (tx, rx) = oneshot::channel::<()>();
    let done = tokio::spawn(herald_executor::run(config, routes, listener, async move {
        let _ = rx.await;
    }));
    Executor {
        shutdown: Some(tx),
        done,
        started,
        release,
    }
}

/// Shuts the executor down and waits for `run` to return, answering any fresh stream it opens
/// to report what is left (it must offer no credit) by acknowledging every report.
async fn finish_shutdown(
    mut exec: Executor,
    current: Session,
    sessions: &mut mpsc::UnboundedReceiver<Session>,
) {
    // Like the scheduler, end the current stream once the executor ends its side.
    tokio::spawn(async move {
        let mut current = current;
        while let Ok(Some(_)) = current.inbound.message().await {}
    });
    exec.shutdown.take().unwrap().send(()).unwrap();
    let mut done = exec.done;
    let finish = async {
        loop {
            tokio::select! {
                result = &mut done => return result.unwrap().unwrap(),
                Some(mut s) = sessions.recv() => {
                    let hello = s.handshake().await;
                    assert_eq!(hello.initial_credit, 0, "credit offered while shutting down");
                    tokio::spawn(async move {
                        while let Ok(Some(frame)) = s.inbound.message().await {
                            if let Some(Out::Report(batch)) = frame.kind {
                                let acks = batch.results.iter().map(|r| pb::ReportAck {
                                    task_id: r.task_id.clone(),
                                    attempt: r.attempt,
                                    accepted: true,
                                    state: 0,
                                    ..Default::default()
                                }).collect();
                                let _ = s.out.send(Ok(pb::SchedulerMessage {
                                    kind: Some(In::ReportAcks(pb::ReportAckBatch { acks })),
                                }));
                            }
                        }
                    });
                }
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), finish)
        .await
        .expect("executor did not stop");
}

fn expect_report(frame: Out) -> Vec<pb::AttemptResult> {
    match frame {
        Out::Report(batch) => batch.results,
        other => panic!("expected a report, got {other:?}"),
    }
}

fn expect_credit(frame: Out) -> u32 {
    match frame {
        Out::Credit(c) => c.additional,
        other => panic!("expected credit, got {other:?}"),
    }
}

#[tokio::test]
async fn a_paced_lease_waits_for_its_instant_and_a_revoke_stops_it_unsent() {
    let (endpoint, mut sessions) = fake_scheduler().await;
    let exec = spawn_executor_with_concurrency(vec![endpoint], 4).await;
    let mut exec = exec;
    let mut s = next_session(&mut sessions).await;
    s.handshake().await;

    // The route has room for both, but the paced one is held for its hour: the other starts.
    let mut paced = text_lease("paced", "q");
    paced.send_after = Some(prost_duration(Duration::from_secs(3600)));
    let mut soon = text_lease("soon", "q");
    soon.send_after = Some(prost_duration(Duration::from_millis(1)));
    s.send(In::Leases(pb::LeaseBatch {
        leases: vec![paced, text_lease("now", "q")],
    }));
    assert_eq!(exec.started.recv().await.unwrap(), "now");

    // Still waiting when revoked: stopped before sending, and never reported.
    s.send(In::Revoke(pb::Revoke {
        lease: Some(lease_ref("paced")),
    }));
    let mut frame = s.next().await;
    if let Out::Credit(c) = frame {
        assert_eq!(c.additional, 1);
        frame = s.next().await;
    }
    match frame {
        Out::RevokeAck(ack) => {
            assert_eq!(ack.result(), pb::RevokeResult::StoppedBeforeSend)
        }
        other => panic!("expected RevokeAck, got {other:?}"),
    }

    // A short wait ends in a send like any other.
    s.send(In::Leases(pb::LeaseBatch { leases: vec![soon] }));
    assert_eq!(exec.started.recv().await.unwrap(), "soon");
    exec.release.add_permits(2);
    let mut reported: Vec<String> = Vec::new();
    while reported.len() < 2 {
        if let Out::Report(batch) = s.next().await {
            reported.extend(batch.results.into_iter().map(|r| r.task_id));
        }
    }
    reported.sort();
    assert_eq!(reported, ["now", "soon"]);
    finish_shutdown(exec, s, &mut sessions).await;
}

/// A revoke can overtake its lease (the scheduler writes them from different tasks): the
/// executor answers NotHeld, then drops the lease when it comes, unsent, and says it stopped it.
#[tokio::test]
async fn a_lease_whose_revoke_came_first_is_never_sent() {
    let (endpoint, mut sessions) = fake_scheduler().await;
    let mut exec = spawn_executor_with_concurrency(vec![endpoint], 4).await;
    let mut s = next_session(&mut sessions).await;
    s.handshake().await;

    s.send(In::Revoke(pb::Revoke {
        lease: Some(lease_ref("early")),
    }));
    match s.next().await {
        Out::RevokeAck(ack) => assert_eq!(ack.result(), pb::RevokeResult::NotHeld),
        other => panic!("expected RevokeAck, got {other:?}"),
    }
    s.send(In::Leases(pb::LeaseBatch {
        leases: vec![text_lease("early", "q"), text_lease("now", "q")],
    }));
    let mut stopped = false;
    while !stopped {
        match s.next().await {
            Out::RevokeAck(ack) => {
                assert_eq!(ack.lease, Some(lease_ref("early")));
                assert_eq!(ack.result(), pb::RevokeResult::StoppedBeforeSend);
                stopped = true;
            }
            Out::Credit(c) => assert_eq!(c.additional, 1, "the dropped lease's slot"),
            other => panic!("expected RevokeAck, got {other:?}"),
        }
    }
    assert_eq!(exec.started.recv().await.unwrap(), "now");
    exec.release.add_permits(1);
    loop {
        if let Out::Report(batch) = s.next().await {
            let ids: Vec<_> = batch.results.iter().map(|r| r.task_id.as_str()).collect();
            assert_eq!(ids, ["now"]);
            break;
        }
    }
    assert!(
        exec.started.try_recv().is_err(),
        "the revoked lease was sent"
    );
    finish_shutdown(exec, s, &mut sessions).await;
}

#[tokio::test]
async fn leases_revokes_drain_and_resend() {
    let (first, mut first_sessions) = fake_scheduler().await;
    let (second, mut second_sessions) = fake_scheduler().await;
    let mut exec = spawn_executor(vec![first, second]).await;

    // Handshake: full credit, the routed queues.
    let mut s1 = next_session(&mut first_sessions).await;
    let hello = s1.handshake().await;
    assert_eq!(hello.executor_id, "exec-test");
    assert_eq!(hello.protocol_version, herald_proto::LEASE_PROTOCOL_VERSION);
    assert_eq!(hello.queues, vec!["q"]);
    assert_eq!(hello.initial_credit, 4);

    // A lease on a queue without a sender fails PERMANENT at once and frees its slot.
    s1.send(In::Leases(pb::LeaseBatch {
        leases: vec![text_lease("nowhere", "unknown")],
    }));
    let results = expect_report(s1.next().await);
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].outcome(), pb::OutcomeClass::Permanent);
    assert_eq!(results[0].error, "no sender configured for queue unknown");
    assert_eq!(expect_credit(s1.next().await), 1);
    // Its ack never comes on this stream.

    // Two leases on a route of concurrency 1: one sends, the other waits (Pending).
    s1.send(In::Leases(pb::LeaseBatch {
        leases: vec![text_lease("a", "q"), text_lease("b", "q")],
    }));
    let sending = exec.started.recv().await.unwrap();
    let pending = if sending == "a" { "b" } else { "a" };

    for (task, expected) in [
        (pending, pb::RevokeResult::StoppedBeforeSend),
        (sending.as_str(), pb::RevokeResult::SendInProgress),
        ("never-held", pb::RevokeResult::NotHeld),
    ] {
        s1.send(In::Revoke(pb::Revoke {
            lease: Some(lease_ref(task)),
        }));
        let mut frame = s1.next().await;
        // The stopped lease frees its slot: credit may come before the next answer.
        if let Out::Credit(c) = frame {
            assert_eq!(c.additional, 1);
            frame = s1.next().await;
        }
        match frame {
            Out::RevokeAck(ack) => {
                assert_eq!(ack.lease, Some(lease_ref(task)));
                assert_eq!(ack.result(), expected, "revoke of {task}");
            }
            other => panic!("expected RevokeAck, got {other:?}"),
        }
    }

    // Drain: the executor moves to the second endpoint while the send continues.
    s1.send(In::Drain(pb::Drain {
        reason: "test".into(),
    }));
    drop(s1); // Like the scheduler, end the drained stream.
    let mut s2 = next_session(&mut second_sessions).await;
    let hello = s2.handshake().await;
    assert_eq!(hello.initial_credit, 3, "one lease is still in flight");
    // The lease still being sent is extended at once on the new stream: its last extension
    // was on the old one, and waiting a third of the TTL for the first tick here could let it
    // lapse mid-send. Ahead of the result sent again, which the scheduler applies first.
    match s2.next().await {
        Out::Extend(extend) => assert_eq!(extend.leases, vec![lease_ref(&sending)]),
        other => panic!("expected Extend, got {other:?}"),
    }
    let unacknowledged = expect_report(s2.next().await);
    assert_eq!(unacknowledged[0].task_id, "nowhere");
    s2.send(ack("nowhere", true));

    // The send finishes: reported on the new stream, then its slot comes back as credit.
    exec.release.add_permits(1);
    let results = expect_report(s2.next().await);
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].task_id, sending);
    assert_eq!(results[0].outcome(), pb::OutcomeClass::Ok);
    assert_eq!(results[0].provider_message_id, format!("pm-{sending}"));
    assert!(results[0].started_at.is_some());
    assert_eq!(expect_credit(s2.next().await), 1);

    // The stream breaks before the ack: the result is sent again on the next stream.
    s2.out.send(Err(Status::unavailable("gone"))).unwrap();
    drop(s2);
    let mut s3 = next_session(&mut first_sessions).await;
    let hello = s3.handshake().await;
    assert_eq!(hello.initial_credit, 4);
    let mut resent = expect_report(s3.next().await);
    // The ack of `nowhere` may not have been read before the stream broke.
    resent.retain(|r| r.task_id != "nowhere");
    assert_eq!(resent, results);
    s3.send(ack(&sending, false));

    finish_shutdown(exec, s3, &mut first_sessions).await;
}

#[tokio::test]
async fn shutdown_finishes_sends_and_drops_pending_leases() {
    let (endpoint, mut sessions) = fake_scheduler().await;
    let mut exec = spawn_executor(vec![endpoint]).await;
    let mut s = next_session(&mut sessions).await;
    s.handshake().await;

    s.send(In::Leases(pb::LeaseBatch {
        leases: vec![text_lease("a", "q"), text_lease("b", "q")],
    }));
    let sending = exec.started.recv().await.unwrap();

    // Shutdown with a send in flight: the lease still waiting is handed back, and the stream
    // that was granted credit is closed at once...
    exec.shutdown.take().unwrap().send(()).unwrap();
    let pending = if sending == "a" { "b" } else { "a" };
    match s.next().await {
        Out::Release(release) => assert_eq!(release.leases, vec![lease_ref(pending)]),
        other => panic!("expected Release, got {other:?}"),
    }
    loop {
        match tokio::time::timeout(Duration::from_secs(10), s.inbound.message()).await {
            Ok(Ok(None)) | Ok(Err(_)) => break,
            Ok(Ok(Some(pb::ExecutorMessage {
                kind: Some(Out::Heartbeat(_)),
            }))) => continue,
            Ok(Ok(Some(frame))) => panic!("unexpected frame after shutdown: {frame:?}"),
            Err(_) => panic!("stream not closed"),
        }
    }
    drop(s);
    // ...and a fresh one offering no credit carries the report of the send, once it ends. The
    // released lease gets no report.
    let mut s2 = next_session(&mut sessions).await;
    assert_eq!(s2.handshake().await.initial_credit, 0);
    // The send still running keeps its lease alive on the new stream.
    match s2.next().await {
        Out::Extend(extend) => assert_eq!(extend.leases, vec![lease_ref(&sending)]),
        other => panic!("expected Extend, got {other:?}"),
    }
    exec.release.add_permits(1);
    let results = expect_report(s2.next().await);
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].task_id, sending);
    assert_eq!(results[0].outcome(), pb::OutcomeClass::Ok);
    s2.send(ack(&sending, true));
    // Nothing but the end of the stream follows, then the run ends.
    match tokio::time::timeout(Duration::from_secs(10), s2.inbound.message()).await {
        Ok(Ok(None)) | Ok(Err(_)) => {}
        Ok(Ok(Some(frame))) => panic!("unexpected frame after shutdown: {frame:?}"),
        Err(_) => panic!("stream not closed"),
    }
    drop(s2);
    stopped(exec.done).await;
}

#[tokio::test]
async fn extends_old_leases_and_drops_lost_pending_ones() {
    let (endpoint, mut sessions) = fake_scheduler().await;
    let mut exec = spawn_executor(vec![endpoint]).await;
    let mut s = next_session(&mut sessions).await;
    // Extensions every 100 ms for leases held at least that long.
    s.handshake_with_ttl(Duration::from_millis(300)).await;

    s.send(In::Leases(pb::LeaseBatch {
        leases: vec![text_lease("a", "q"), text_lease("b", "q")],
    }));
    let sending = exec.started.recv().await.unwrap();
    let pending = if sending == "a" { "b" } else { "a" };

    let Out::Extend(extend) = s.next().await else {
        panic!("expected Extend")
    };
    let mut ids: Vec<_> = extend.leases.iter().map(|l| l.task_id.as_str()).collect();
    ids.sort_unstable();
    assert_eq!(ids, vec!["a", "b"]);

    // The scheduler says both were lost: the pending one is dropped (its slot comes back as
    // credit, no report); the one already sending finishes and is reported as usual.
    s.send(In::ExtendAck(pb::ExtendAck {
        extended: vec![],
        lost: vec![lease_ref("a"), lease_ref("b")],
        expires_at: None,
    }));
    loop {
        match s.next().await {
            Out::Extend(_) => continue,
            Out::Credit(c) => {
                assert_eq!(c.additional, 1);
                break;
            }
            other => panic!("expected credit for the dropped lease, got {other:?}"),
        }
    }
    exec.release.add_permits(1);
    let results = loop {
        match s.next().await {
            Out::Extend(e) => {
                // Only the lease still sending is worth extending now.
                assert!(e.leases.iter().all(|l| l.task_id != pending), "{e:?}");
            }
            Out::Report(r) => break r.results,
            other => panic!("expected a report, got {other:?}"),
        }
    };
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].task_id, sending);

    s.send(ack(&sending, false));
    finish_shutdown(exec, s, &mut sessions).await;
}

/// What the scheduler says between its Drain and the end of the stream still counts: an ack
/// there spares the result a resend to the next replica (which would refuse it as already
/// reported), and a Revoke there stops a lease not yet sending.
#[tokio::test]
async fn acks_and_revokes_after_a_drain_still_count() {
    let (first, mut first_sessions) = fake_scheduler().await;
    let (second, mut second_sessions) = fake_scheduler().await;
    let mut exec = spawn_executor(vec![first, second]).await;
    let mut s1 = next_session(&mut first_sessions).await;
    s1.handshake().await;

    // One send reported on the first stream; another lease waits behind it (concurrency 1).
    s1.send(In::Leases(pb::LeaseBatch {
        leases: vec![text_lease("done", "q")],
    }));
    assert_eq!(exec.started.recv().await.unwrap(), "done");
    exec.release.add_permits(1);
    let reported = expect_report(s1.next().await);
    assert_eq!(reported[0].task_id, "done");
    assert_eq!(expect_credit(s1.next().await), 1);
    s1.send(In::Leases(pb::LeaseBatch {
        leases: vec![text_lease("busy", "q"), text_lease("waiting", "q")],
    }));
    assert_eq!(exec.started.recv().await.unwrap(), "busy");

    // Drain, then the ack and a Revoke of the waiting lease, then the end of the stream.
    s1.send(In::Drain(pb::Drain {
        reason: "test".into(),
    }));
    s1.send(ack("done", true));
    s1.send(In::Revoke(pb::Revoke {
        lease: Some(lease_ref("waiting")),
    }));
    drop(s1);

    // On the next stream: the busy lease is extended, the acked result is not sent again, and
    // when the busy send ends, the waiting one never starts.
    let mut s2 = next_session(&mut second_sessions).await;
    s2.handshake().await;
    match s2.next().await {
        Out::Extend(extend) => assert_eq!(extend.leases, vec![lease_ref("busy")]),
        other => panic!("expected Extend, got {other:?}"),
    }
    exec.release.add_permits(1);
    // The revoke answered on this stream (it came while the last one closed, so the cancel is
    // confirmed), and the revoked lease's slot comes back as credit, before or after the
    // report.
    let mut answered = Vec::new();
    let results = loop {
        match s2.next().await {
            Out::Credit(_) => continue,
            Out::RevokeAck(ack) => answered.push(ack),
            other => break expect_report(other),
        }
    };
    let ids: Vec<&str> = results.iter().map(|r| r.task_id.as_str()).collect();
    assert_eq!(ids, ["busy"]);
    assert_eq!(
        answered,
        vec![pb::RevokeAck {
            lease: Some(lease_ref("waiting")),
            result: pb::RevokeResult::StoppedBeforeSend as i32,
        }]
    );
    assert!(
        exec.started.try_recv().is_err(),
        "the revoked lease was sent"
    );
    finish_shutdown(exec, s2, &mut second_sessions).await;
}

/// An idle executor told to stop closes its stream, but a claim already under way can still
/// grant it a lease there. That lease is handed back on a fresh stream offering no credit,
/// instead of lapsing after its TTL and costing the task an attempt it never made.
#[tokio::test]
async fn a_lease_granted_while_an_idle_executor_closes_is_handed_back() {
    let (endpoint, mut sessions) = fake_scheduler().await;
    let mut exec = spawn_executor(vec![endpoint]).await;
    let mut s = next_session(&mut sessions).await;
    s.hello().await;
    s.welcome(Duration::from_millis(100), Duration::from_secs(30));
    // Its first heartbeat: the session is serving, with nothing in flight.
    loop {
        let frame = s.inbound.message().await.unwrap().unwrap();
        if matches!(frame.kind, Some(Out::Heartbeat(_))) {
            break;
        }
    }
    exec.shutdown.take().unwrap().send(()).unwrap();
    // The executor ends its side; the scheduler's claim lands after that.
    while let Ok(Some(_)) = s.inbound.message().await {}
    s.send(In::Leases(pb::LeaseBatch {
        leases: vec![text_lease("late", "q")],
    }));
    drop(s);
    let mut s2 = next_session(&mut sessions).await;
    let hello = s2.handshake().await;
    assert_eq!(
        hello.initial_credit, 0,
        "credit offered while shutting down"
    );
    match s2.next().await {
        Out::Release(release) => assert_eq!(release.leases, vec![lease_ref("late")]),
        other => panic!("expected the late lease released, got {other:?}"),
    }
    drop(s2);
    stopped(exec.done).await;
    assert!(exec.started.try_recv().is_err(), "the late lease was sent");
}

/// A shutdown while a stream is opening does not drop it: its Hello offered credit, and a lease
/// the scheduler grants on it before seeing the executor go is answered for, sent and
/// reported, or handed back on a stream without credit, instead of lapsing unheard.
#[tokio::test]
async fn a_lease_granted_on_a_stream_opening_at_shutdown_is_answered_for() {
    let (endpoint, mut sessions) = fake_scheduler().await;
    let mut exec = spawn_executor(vec![endpoint]).await;
    let mut s = next_session(&mut sessions).await;
    assert_eq!(s.hello().await.initial_credit, 4);
    exec.shutdown.take().unwrap().send(()).unwrap();
    s.welcome(Duration::from_secs(10), Duration::from_secs(30));
    s.send(In::Leases(pb::LeaseBatch {
        leases: vec![text_lease("granted", "q")],
    }));
    // Sent before the shutdown was seen, or handed back after: either way it is answered, on
    // this stream or on one the executor opens without credit to finish.
    exec.release.add_permits(1);
    let mut answered = answers(&mut s, "granted").await;
    drop(s);
    let mut done = exec.done;
    loop {
        tokio::select! {
            result = &mut done => {
                result.unwrap().unwrap();
                break;
            }
            Some(mut next) = sessions.recv() => {
                let hello = next.handshake().await;
                assert_eq!(hello.initial_credit, 0, "credit offered while shutting down");
                answered |= answers(&mut next, "granted").await;
            }
        }
    }
    assert!(
        answered,
        "the lease granted at shutdown was neither reported nor released"
    );
}

/// Reads `s` to its end, acknowledging reports; whether `task` was reported or released on it.
async fn answers(s: &mut Session, task: &str) -> bool {
    let mut answered = false;
    while let Ok(Some(frame)) = s.inbound.message().await {
        match frame.kind {
            Some(Out::Report(batch)) => {
                answered |= batch.results.iter().any(|r| r.task_id == task);
                for r in &batch.results {
                    // The executor may be gone already; the ack then does not matter.
                    let _ = s.out.send(Ok(pb::SchedulerMessage {
                        kind: Some(ack(&r.task_id, true)),
                    }));
                }
            }
            Some(Out::Release(release)) => {
                answered |= release.leases.iter().any(|l| l.task_id == task);
            }
            _ => {}
        }
    }
    answered
}
