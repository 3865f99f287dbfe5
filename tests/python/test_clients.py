"""A Python client, built only from proto/ (stubs generated at test time by grpcio-tools), drives
every TaskService RPC and the LeaseService stream against the real scheduler binary.

It also creates a campaign and reads its progress through CampaignService.
"""

from __future__ import annotations

import queue
import threading
import uuid

import grpc
import pytest
from google.protobuf import duration_pb2

WAIT = 15.0


def spec(pb, queue_name, recipient="+15550001", text="hello", **kw):
    return pb.TaskSpec(queue=queue_name, recipient=recipient, content=pb.Content(text=text), **kw)


def later(pb, queue_name, **kw):
    """A task due in an hour: it stays SCHEDULED for the whole test."""
    return spec(pb, queue_name, delay=duration_pb2.Duration(seconds=3600), **kw)


class Executor:
    """The executor side of LeaseService.Lease: frames go out through a queue, frames coming
    back are read by a thread so the test can wait for them with a timeout."""

    def __init__(self, stubs, channel, executor_id, queues, initial_credit=0):
        self.pb = stubs.lease_pb2
        self._out: queue.Queue = queue.Queue()
        self._in: queue.Queue = queue.Queue()
        stub = stubs.lease_pb2_grpc.LeaseServiceStub(channel)
        self.send(hello=self.pb.Hello(
            executor_id=executor_id,
            protocol_version=1,
            queues=queues,
            initial_credit=initial_credit,
        ))
        self.call = stub.Lease(iter(self._out.get, None))
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        try:
            for frame in self.call:
                self._in.put(frame)
        except grpc.RpcError as e:
            self._in.put(e)
        self._in.put(None)

    def send(self, **frame):
        self._out.put(self.pb.ExecutorMessage(**frame))

    def next(self, kind, timeout=WAIT):
        """The next frame of `kind`, skipping heartbeats."""
        while True:
            frame = self._in.get(timeout=timeout)
            if frame is None or isinstance(frame, Exception):
                raise AssertionError(f"stream ended while waiting for {kind}: {frame!r}")
            got = frame.WhichOneof("kind")
            if got == "heartbeat":
                continue
            assert got == kind, f"expected {kind}, got {frame}"
            return getattr(frame, kind)

    def nothing_for(self, seconds):
        """Asserts that no frame other than a heartbeat arrives for `seconds`."""
        try:
            while True:
                frame = self._in.get(timeout=seconds)
                if frame is not None and not isinstance(frame, Exception) and frame.WhichOneof("kind") == "heartbeat":
                    continue
                raise AssertionError(f"unexpected frame: {frame}")
        except queue.Empty:
            pass

    def report(self, lease, outcome, **kw):
        self.send(report=self.pb.ReportBatch(results=[self.pb.AttemptResult(
            task_id=lease.task_id, attempt=lease.attempt, outcome=outcome, **kw)]))
        acks = self.next("report_acks")
        assert len(acks.acks) == 1
        return acks.acks[0]

    def close(self):
        self._out.put(None)
        self.call.cancel()


@pytest.fixture
def tasks(stubs, channel):
    return stubs.task_pb2_grpc.TaskServiceStub(channel)


def test_create_get_list_cancel(stubs, tasks):
    pb = stubs.task_pb2
    q = f"py-{uuid.uuid4().hex[:8]}"

    created = tasks.CreateTask(pb.CreateTaskRequest(task=later(pb, q, idempotency_key="order-1", labels={"order": "1"})))
    task = created.task
    assert not created.existing
    assert task.state == pb.TASK_STATE_SCHEDULED
    assert task.queue == q and task.content.text == "hello"
    assert task.priority == 5 and task.max_attempts == 10
    assert task.labels["order"] == "1"

    # The same idempotency key and request: the same task.
    again = tasks.CreateTask(pb.CreateTaskRequest(task=later(pb, q, idempotency_key="order-1", labels={"order": "1"})))
    assert again.existing and again.task.id == task.id
    # The same key with another request: ALREADY_EXISTS.
    with pytest.raises(grpc.RpcError) as err:
        tasks.CreateTask(pb.CreateTaskRequest(task=later(pb, q, text="other", idempotency_key="order-1")))
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS

    batch = tasks.CreateTasks(pb.CreateTasksRequest(tasks=[later(pb, q, recipient=f"+1555000{i}") for i in range(2, 5)]))
    assert len(batch.results) == 3
    ids = {task.id} | {r.task.id for r in batch.results}
    assert len(ids) == 4

    got = tasks.GetTask(pb.GetTaskRequest(id=task.id))
    assert got.id == task.id and got.recipient == "+15550001"

    # ListTasks pages through the queue's tasks, newest first.
    seen, token, pages = [], "", 0
    while True:
        page = tasks.ListTasks(pb.ListTasksRequest(queue=q, states=[pb.TASK_STATE_SCHEDULED], page_size=3, page_token=token))
        seen += [t.id for t in page.tasks]
        pages += 1
        token = page.next_page_token
        if not token:
            break
    assert set(seen) == ids and len(seen) == 4 and pages == 2
    assert tasks.ListTasks(pb.ListTasksRequest(queue=q, states=[pb.TASK_STATE_SUCCEEDED])).tasks == []

    cancelled = tasks.CancelTask(pb.CancelTaskRequest(id=task.id))
    assert cancelled.outcome == pb.CANCEL_OUTCOME_NOT_STARTED
    assert cancelled.task.state == pb.TASK_STATE_CANCELLED
    listed = tasks.ListTasks(pb.ListTasksRequest(queue=q, states=[pb.TASK_STATE_CANCELLED]))
    assert [t.id for t in listed.tasks] == [task.id]

    # A terminal task cannot be cancelled again or retried.
    with pytest.raises(grpc.RpcError) as err:
        tasks.RetryTask(pb.RetryTaskRequest(id=task.id))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_errors_carry_the_right_codes(stubs, tasks):
    pb = stubs.task_pb2
    with pytest.raises(grpc.RpcError) as err:
        tasks.GetTask(pb.GetTaskRequest(id=str(uuid.uuid4())))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as err:
        tasks.CreateTask(pb.CreateTaskRequest(task=spec(pb, "", text="no queue")))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "queue" in err.value.details()


def test_lease_stream_as_an_executor(stubs, channel, tasks):
    pb, lpb = stubs.task_pb2, stubs.lease_pb2
    q = f"py-{uuid.uuid4().hex[:8]}"
    first = tasks.CreateTask(pb.CreateTaskRequest(task=spec(pb, q, recipient="+15550010", priority=9))).task
    second = tasks.CreateTask(pb.CreateTaskRequest(task=spec(pb, q, recipient="+15550011", priority=1))).task

    ex = Executor(stubs, channel, "py-executor-1", [q], initial_credit=0)
    try:
        welcome = ex.next("welcome")
        assert welcome.protocol_version == 1
        assert welcome.lease_ttl.seconds > 0

        # No credit, no leases. One credit, one lease: the higher priority first.
        ex.nothing_for(0.5)
        ex.send(credit=lpb.Credit(additional=1))
        lease = ex.next("leases").leases
        assert len(lease) == 1
        lease = lease[0]
        assert lease.task_id == first.id and lease.queue == q and lease.recipient == "+15550010"
        assert lease.content.text == "hello" and lease.attempt >= 1 and lease.idempotency_key
        ex.nothing_for(0.5)
        assert tasks.GetTask(pb.GetTaskRequest(id=first.id)).state == pb.TASK_STATE_LEASED

        # A long send extends its lease.
        ex.send(extend=lpb.Extend(leases=[lpb.LeaseRef(task_id=lease.task_id, attempt=lease.attempt)]))
        ext = ex.next("extend_ack")
        assert [r.task_id for r in ext.extended] == [first.id] and not ext.lost

        ack = ex.report(lease, pb.OUTCOME_CLASS_OK, provider_message_id="wamid.PY1")
        assert ack.accepted and ack.state == pb.TASK_STATE_SUCCEEDED
        # A second report with the same fencing token changes nothing.
        stale = ex.report(lease, pb.OUTCOME_CLASS_PERMANENT, error="late")
        assert not stale.accepted and stale.state == pb.TASK_STATE_SUCCEEDED

        attempts = tasks.ListAttempts(pb.ListAttemptsRequest(task_id=first.id)).attempts
        assert len(attempts) == 1
        assert attempts[0].outcome == pb.OUTCOME_CLASS_OK
        assert attempts[0].executor_id == "py-executor-1"
        assert attempts[0].provider_message_id == "wamid.PY1"

        # The second task fails permanently, then RetryTask re-drives it.
        ex.send(credit=lpb.Credit(additional=1))
        lease2 = ex.next("leases").leases[0]
        assert lease2.task_id == second.id
        ack = ex.report(lease2, pb.OUTCOME_CLASS_PERMANENT, error="invalid recipient")
        assert ack.accepted and ack.state == pb.TASK_STATE_FAILED
        failed = tasks.GetTask(pb.GetTaskRequest(id=second.id))
        assert failed.state == pb.TASK_STATE_FAILED and "invalid recipient" in failed.last_error
        retried = tasks.RetryTask(pb.RetryTaskRequest(id=second.id))
        assert retried.state == pb.TASK_STATE_SCHEDULED

        # The retried task is leased again; cancelling it sends a Revoke to this executor,
        # whose answer becomes CancelTask's outcome.
        ex.send(credit=lpb.Credit(additional=1))
        lease3 = ex.next("leases").leases[0]
        assert lease3.task_id == second.id and lease3.attempt > lease2.attempt
        pending = tasks.CancelTask.future(pb.CancelTaskRequest(id=second.id))
        revoke = ex.next("revoke")
        assert revoke.lease.task_id == second.id and revoke.lease.attempt == lease3.attempt
        ex.send(revoke_ack=lpb.RevokeAck(lease=revoke.lease, result=lpb.REVOKE_RESULT_STOPPED_BEFORE_SEND))
        cancelled = pending.result(timeout=WAIT)
        assert cancelled.outcome == pb.CANCEL_OUTCOME_STOPPED_BEFORE_SEND
        assert cancelled.task.state == pb.TASK_STATE_CANCELLED
    finally:
        ex.close()


def test_campaign_progress(stubs, channel):
    """A campaign created from Python: recipients added in chunks (duplicates dropped), its
    progress read back, then cancelled."""
    pb = stubs.campaign_pb2
    tpb = stubs.task_pb2
    campaigns = stubs.campaign_pb2_grpc.CampaignServiceStub(channel)
    spec = pb.CampaignSpec(
        name="spring sale",
        queue=f"py-{uuid.uuid4().hex[:8]}",
        content=tpb.Content(text="20% off today"),
        # Far enough ahead that nothing is sent while the test reads the progress.
        window=duration_pb2.Duration(seconds=600),
    )
    from google.protobuf import timestamp_pb2
    start = timestamp_pb2.Timestamp()
    start.GetCurrentTime()
    start.seconds += 3600
    spec.start_at.CopyFrom(start)
    created = campaigns.CreateCampaign(pb.CreateCampaignRequest(
        campaign=spec,
        recipients=[pb.CampaignRecipient(recipient=f"+1555000{i}") for i in range(3)],
    ), timeout=WAIT)
    added = campaigns.AddRecipients(pb.AddRecipientsRequest(
        campaign_id=created.id,
        recipients=[pb.CampaignRecipient(recipient=r) for r in ("+15550002", "+15550100")],
    ), timeout=WAIT)
    assert (added.added, added.duplicates, added.total) == (1, 1, 4)

    got = campaigns.GetCampaign(pb.GetCampaignRequest(id=created.id), timeout=WAIT)
    assert got.state == pb.CAMPAIGN_STATE_ACTIVE
    assert (got.progress.total, got.progress.scheduled, got.progress.sent) == (4, 4, 0)

    cancelled = campaigns.CancelCampaign(pb.CancelCampaignRequest(id=created.id), timeout=WAIT)
    assert cancelled.cancelled_scheduled == 4
    got = campaigns.GetCampaign(pb.GetCampaignRequest(id=created.id), timeout=WAIT)
    assert got.state == pb.CAMPAIGN_STATE_CANCELLED
    assert (got.progress.total, got.progress.cancelled) == (4, 4)
