"""Fixtures of the viewer's tests: the service tests' process helpers (for ``saucer serve``), a viewer server thread."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "service"))

from service_support import Processes  # noqa: E402


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    """Per-test processes, killed at teardown."""
    procs = Processes(tmp_path)
    try:
        yield procs
    finally:
        procs.cleanup()


class ViewerServer:
    """A uvicorn server of an ASGI app on a free loopback port, in a thread."""

    def __init__(self, app: object) -> None:
        import uvicorn

        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, name="viewer", daemon=True)

    def __enter__(self) -> ViewerServer:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "the viewer did not start"
            time.sleep(0.02)
        return self

    @property
    def url(self) -> str:
        [sock] = [s for server in self.server.servers for s in server.sockets]
        host, port = sock.getsockname()[:2]
        return f"http://{host}:{port}"

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=20)


@pytest.fixture
def viewer_server() -> type[ViewerServer]:
    return ViewerServer
