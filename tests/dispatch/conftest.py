"""Shared fixtures for the dispatcher tests (async tests run on anyio's pytest plugin, asyncio backend)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
# The in-process tests load the fixture server by import path ("dispatch_fixture_server:app").
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

FIXTURE_SERVER = HERE / "dispatch_fixture_server.py"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def fixture_stdio() -> dict[str, object]:
    """Config table for the fixture server over stdio."""
    return {"command": sys.executable, "args": [str(FIXTURE_SERVER)], "stderr": "discard"}
