"""The contract every event store backend passes (memory, SQLite, PostgreSQL).

The tests are :mod:`saucer.store.testing`, the suite a third-party backend
runs too; here they run over the three backends of ``store_url`` (see
``conftest.py``). The Context on top of each backend is tested in
``test_contract_context.py``.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from saucer.store import EventStore, open_store
from saucer.store.testing import EventStoreContract


class TestEventStoreContract(EventStoreContract):
    @pytest.fixture
    def store_factory(self, store_url: str) -> Callable[[], EventStore]:
        return lambda: open_store(store_url)
