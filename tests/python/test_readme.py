"""README.md's grpcurl walkthrough, run as written against script/server.

Every `console` block of README.md is a sequence of `$ grpcurl ...` commands, each followed by
the answer the README shows. The test starts the stack the way a reader does, with
`script/server` itself (on a fresh database of the test cluster and free ports), runs each
command verbatim through bash with the venv's grpcurl, substituting only the address
(127.0.0.1:7070) and the ids that earlier answers returned, and compares each answer with the
README's: the same lines for `list`; for JSON, the same fields at every level and the same
values, except that ids (UUIDs) and timestamps may differ. A read (Get*/List*) whose answer
depends on the executor having sent the task by then is asked again until it matches or
WAIT runs out; nothing else is repeated.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

import pytest

import harness

README = harness.REPO / "README.md"
README_ADDR = "127.0.0.1:7070"
# How long a read may take to show what the README shows (the task sent, counters updated).
WAIT = 30.0
POLL = 0.2

UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")
CONSOLE = re.compile(r"^```console\n(.*?)^```", re.S | re.M)


@dataclass
class Step:
    line: int  # README.md line of the `$ ` command
    command: str  # the command after `$ `, continuation lines included
    shown: str  # the answer the README shows


def walkthrough(text: str) -> list[Step]:
    """The commands of every console block with the answers shown after them."""
    steps: list[Step] = []
    for block in CONSOLE.finditer(text):
        first = text[: block.start(1)].count("\n") + 1
        lines = block.group(1).splitlines()
        i = 0
        while i < len(lines):
            if not lines[i].startswith("$ "):
                assert not lines[i].strip(), f"README.md:{first + i}: output before any command: {lines[i]!r}"
                i += 1
                continue
            start = i
            command = lines[i][2:]
            # A command goes on while it ends in `\` or has an open quote (the JSON of -d may
            # span lines inside its single quotes).
            while not complete(command):
                i += 1
                assert i < len(lines), f"README.md:{first + start}: the command never ends"
                command += "\n" + lines[i]
            i += 1
            out = []
            while i < len(lines) and not lines[i].startswith("$ "):
                out.append(lines[i])
                i += 1
            steps.append(Step(first + start, command, "\n".join(out).strip()))
    return steps


def complete(command: str) -> bool:
    if command.endswith("\\"):
        return False
    try:
        shlex.split(command)
    except ValueError:
        return False
    return True


def compare(shown, actual, ids: dict[str, str], path: str = "") -> list[str]:
    """How `actual` differs from `shown`, ignoring the values of ids and timestamps. Records
    which actual id stands for each id the README shows in `ids`."""
    where = path or "the answer"
    if isinstance(shown, dict):
        if not isinstance(actual, dict):
            return [f"{where}: expected an object, got {actual!r}"]
        problems = []
        for key in shown.keys() - actual.keys():
            problems.append(f"{path}.{key}: shown in the README, missing from the answer")
        for key in actual.keys() - shown.keys():
            problems.append(f"{path}.{key}: in the answer ({actual[key]!r}), not shown in the README")
        for key in shown.keys() & actual.keys():
            problems += compare(shown[key], actual[key], ids, f"{path}.{key}")
        return problems
    if isinstance(shown, list):
        if not isinstance(actual, list) or len(actual) != len(shown):
            return [f"{where}: expected {shown!r}, got {actual!r}"]
        return [p for i, (s, a) in enumerate(zip(shown, actual)) for p in compare(s, a, ids, f"{path}[{i}]")]
    if isinstance(shown, str) and UUID.match(shown):
        if not (isinstance(actual, str) and UUID.match(actual)):
            return [f"{where}: expected an id, got {actual!r}"]
        if ids.setdefault(shown, actual) != actual:
            return [f"{where}: expected the id returned earlier ({ids[shown]}), got {actual}"]
        return []
    if isinstance(shown, str) and TIMESTAMP.match(shown):
        if not (isinstance(actual, str) and TIMESTAMP.match(actual)):
            return [f"{where}: expected a timestamp, got {actual!r}"]
        return []
    if shown != actual:
        return [f"{where}: expected {shown!r}, got {actual!r}"]
    return []


def check(step: Step, stdout: str, ids: dict[str, str]) -> list[str]:
    try:
        shown = json.loads(step.shown)
    except json.JSONDecodeError:
        if stdout.strip().splitlines() == step.shown.splitlines():
            return []
        return ["the lines differ"]
    try:
        actual = json.loads(stdout)
    except json.JSONDecodeError:
        return [f"the answer is not JSON: {stdout!r}"]
    return compare(shown, actual, ids)


def free_addrs(n: int) -> list[str]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [f"127.0.0.1:{s.getsockname()[1]}" for s in socks]
    finally:
        for s in socks:
            s.close()


@pytest.fixture
def server(database, tmp_path):
    """script/server on `database`, off the default ports, until both services are READY."""
    grpc_addr, http_addr, executor_http_addr = free_addrs(3)
    # With a password (the test cluster trusts every login, so it is not checked): script/server
    # must not print it.
    parts = urllib.parse.urlsplit(database.url)
    user, _, host = parts.netloc.rpartition("@")
    url = urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:{PASSWORD}@{host}"))
    proc = harness.Process(
        [str(harness.REPO / "script" / "server")],
        harness.base_env(
            DATABASE_URL=url,
            SCHEDULER_GRPC_ADDR=grpc_addr,
            SCHEDULER_HTTP_ADDR=http_addr,
            EXECUTOR_HTTP_ADDR=executor_http_addr,
            NO_COLOR="1",
            # The binaries under test, as they are: script/test builds them with the tests'
            # features, and a build for the binaries alone would compile the stack again.
            HERALD_BIN_DIR=str(harness.binary("herald-scheduler").parent),
        ),
        tmp_path / "script-server.log",
        ready_lines=2,
        ready_timeout=900.0,
    )
    assert any(r.get("grpc") == grpc_addr for r in proc.ready_all), proc.ready_all
    yield proc, grpc_addr
    proc.stop()


PASSWORD = "not-for-the-log"


def test_steps_are_found_in_the_readme():
    steps = walkthrough(README.read_text())
    assert len(steps) >= 8, steps
    for step in steps:
        assert step.command.startswith("grpcurl "), f"README.md:{step.line}: {step.command}"
        assert step.shown, f"README.md:{step.line}: the README shows no answer to {step.command}"
        assert README_ADDR in step.command, f"README.md:{step.line}: {step.command}"


def test_the_readme_walkthrough_runs_as_written(server):
    proc, grpc_addr = server
    env = dict(os.environ, PATH=f"{harness.grpcurl_binary().parent}{os.pathsep}{os.environ.get('PATH', '')}")
    ids: dict[str, str] = {}
    for step in walkthrough(README.read_text()):
        command = step.command.replace(README_ADDR, grpc_addr)
        for shown_id, actual_id in ids.items():
            command = command.replace(shown_id, actual_id)
        method = command.split()[-1].rsplit("/", 1)[-1]
        retry = method.startswith(("Get", "List"))
        deadline = time.monotonic() + WAIT
        while True:
            out = subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True, timeout=60)
            seen = dict(ids)
            problems = (
                [f"exit status {out.returncode}: {out.stderr.strip()}"]
                if out.returncode != 0
                else check(step, out.stdout, seen)
            )
            if not problems:
                ids = seen
                break
            if not retry or time.monotonic() > deadline:
                pytest.fail(
                    f"README.md:{step.line}: the answer differs from the README's\n"
                    f"$ {command}\n--- README shows:\n{step.shown}\n--- got:\n{out.stdout}{out.stderr}\n"
                    + "\n".join(problems)
                    + f"\n--- script/server log:\n{proc.log_tail()}"
                )
            time.sleep(POLL)
    # script/server said where its database is (long before the walkthrough ended), with the
    # password masked.
    log = proc.log_tail(lines=100_000)
    assert "DATABASE_URL" in log and ":***@" in log, proc.log_tail()
    assert PASSWORD not in log, proc.log_tail()
