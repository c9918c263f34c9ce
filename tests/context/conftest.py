"""Fixtures for the Context tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.context import CountingStore

from saucer.store import open_store


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    """Where the test's SQLite store lives."""
    return tmp_path / "ctx.db"


@pytest.fixture
def db_url(db_path: Path) -> str:
    """A fresh SQLite store URL in the test's directory."""
    return f"sqlite:///{db_path}"


@pytest.fixture
def counting(db_url: str) -> Iterator[CountingStore]:
    """An SQLite store that counts the events and snapshots it reads."""
    store = CountingStore(open_store(db_url))
    yield store
    store.close()
