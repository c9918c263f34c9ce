"""Fixtures for service-mode tests: anyio backend, per-test processes, a shared cluster; all processes are killed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.service import Cluster, Processes, device_online, free_port, wait_until


@pytest.fixture
def anyio_backend() -> str:
    """Service mode is asyncio-only (uvicorn, websockets)."""
    return "asyncio"


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    """Per-test processes, killed at teardown."""
    procs = Processes(tmp_path)
    try:
        yield procs
    finally:
        procs.cleanup()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One server (heartbeat 0.5 s x 3, 64 KiB frames) and devices dev-a, dev-b on loopback."""
    workdir = tmp_path_factory.mktemp("cluster")
    procs = Processes(workdir)
    try:
        port = free_port()
        server = procs.server(port, workdir / "state")
        devices = {name: procs.device(port, name, wait=False) for name in ("dev-a", "dev-b")}
        for name, proc in devices.items():
            wait_until(lambda name=name: device_online(port, name), 20, f"device {name} to register", proc)
        yield Cluster(port=port, procs=procs, server=server, devices=devices, workdir=workdir)
    finally:
        procs.cleanup()
