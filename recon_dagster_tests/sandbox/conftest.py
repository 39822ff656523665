"""Fixtures of the sandbox tests: one sandbox per module, reset before each test, and a client."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from recon_dagster.sandbox import SandboxServer
from recon_dagster_tests.support.sandbox_api import KEY


@pytest.fixture(scope="module")
def server() -> Iterator[SandboxServer]:
    with SandboxServer(api_key=KEY) as sb:
        yield sb


@pytest.fixture
def sb(server: SandboxServer) -> Iterator[SandboxServer]:
    server.reset()
    yield server


@pytest.fixture
def client(sb: SandboxServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=sb.base_url, timeout=30) as c:
        yield c
