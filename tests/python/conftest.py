"""Fixtures of the Python tests (see harness.py)."""

from __future__ import annotations

import os

import grpc
import pytest

import harness


def pytest_configure(config):
    config.addinivalue_line("markers", "chart: chart tests that need no binaries or database")


@pytest.fixture(scope="session")
def admin_url() -> str:
    url = os.environ.get("HERALD_TEST_PG_URL")
    if not url:
        pytest.skip("HERALD_TEST_PG_URL is not set: run these tests through script/test")
    return url


@pytest.fixture
def database(admin_url):
    db = harness.Database(admin_url)
    yield db
    db.close()


@pytest.fixture(scope="session")
def stubs(tmp_path_factory):
    return harness.generate_stubs(tmp_path_factory.mktemp("stubs"))


@pytest.fixture
def scheduler(database, tmp_path):
    proc = harness.start_scheduler(database.url, tmp_path)
    yield proc
    proc.stop()


@pytest.fixture
def channel(scheduler):
    ch = grpc.insecure_channel(scheduler.ready["grpc"])
    grpc.channel_ready_future(ch).result(timeout=10)
    yield ch
    ch.close()
