"""Fixtures of the viewer's tests: the service tests' process helpers (for ``saucer serve``), a viewer server thread."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.service import Processes
from tests.support.ui import ViewerServer


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    """Per-test processes, killed at teardown."""
    procs = Processes(tmp_path)
    try:
        yield procs
    finally:
        procs.cleanup()


@pytest.fixture
def viewer_server() -> type[ViewerServer]:
    return ViewerServer
