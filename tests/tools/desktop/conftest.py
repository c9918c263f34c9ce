"""Fixtures for the desktop server tests (helpers in tests/support/desktop.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from tests.support.desktop import DesktopTools, require_packages, use_environment

from saucer.tools.desktop.virtual import VirtualDesktop


@pytest.fixture(scope="module")
def virtual_desktop() -> Iterator[VirtualDesktop]:
    """A virtual desktop (Xvfb, D-Bus, AT-SPI) for the whole test module."""
    require_packages()
    with VirtualDesktop() as desktop:
        yield desktop


@pytest.fixture(scope="module")
def desktop_env(virtual_desktop: VirtualDesktop) -> Iterator[dict[str, str]]:
    """This process's environment pointed at the virtual desktop (for in-process servers)."""
    with use_environment(virtual_desktop.env):
        yield virtual_desktop.env


@pytest.fixture
async def tools(tmp_path: Path) -> AsyncIterator[DesktopTools]:
    """A fresh in-process desktop server (no display needed to create it)."""
    made = DesktopTools(tmp_path / "artifacts")
    try:
        yield made
    finally:
        await made.aclose()
