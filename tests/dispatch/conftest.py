"""Shared fixtures for the dispatcher tests (async tests run on anyio's pytest plugin, asyncio backend)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from tests.dispatch import dispatch_fixture_server

FIXTURE_SERVER = Path(dispatch_fixture_server.__file__)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def fixture_stdio() -> dict[str, object]:
    """Config table for the fixture server over stdio."""
    return {"command": sys.executable, "args": [str(FIXTURE_SERVER)], "stderr": "discard"}
