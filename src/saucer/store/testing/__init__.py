"""The contract every event store backend must pass, as a pytest test class.

saucer runs it against its backends (``tests/store/test_contract.py``, and
``tests/store/test_dict_backend.py`` for a backend written in the tests); a
third-party backend runs the very same tests. A backend implements the
:class:`~saucer.store.recorder.Recorder` methods of
:class:`~saucer.store.EventStore`. Subclass :class:`EventStoreContract` in a
test module, under a name pytest collects, and give it a ``store_factory``
fixture: a function that opens *another handle on the same store*, empty at
the start of each test::

    # tests/test_my_store.py
    import pytest
    from saucer.store.testing import EventStoreContract
    from my_package import MyStore

    class TestMyStore(EventStoreContract):
        @pytest.fixture
        def store_factory(self, tmp_path):
            return lambda: MyStore(tmp_path / "events.db")

That is all: a failing ``assert`` of the suite shows its values, because this
package has pytest rewrite the asserts of its parts when it is imported
(:func:`pytest.register_assert_rewrite`, before it imports them).

It needs pytest (``pip install 'saucer[test]'``). Everything goes through the
public :class:`~saucer.store.EventStore` API. Optional features (see
:class:`~saucer.store.Feature`) are held to their contract when the backend
declares them in ``EventStore.features``; an undeclared one must be refused
with :class:`~saucer.store.NotSupportedError` (or, for the caches
``prune_snapshots`` and ``quarantine_record``, do nothing harmful).

The parts: :mod:`~saucer.store.testing.sessions`,
:mod:`~saucer.store.testing.events`, :mod:`~saucer.store.testing.snapshots`
(with leases and watch), :mod:`~saucer.store.testing.features` (the optional
ones) and :mod:`~saucer.store.testing.listing` (the kept summaries).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

_PARTS = ("helpers", "sessions", "events", "snapshots", "features", "listing")
# Before the parts are imported: pytest rewrites their asserts (a no-op outside a pytest run).
pytest.register_assert_rewrite(*(f"{__name__}.{part}" for part in _PARTS))

from saucer.store.base import EventStore  # noqa: E402
from saucer.store.testing.events import EventContract  # noqa: E402
from saucer.store.testing.features import FeatureContract  # noqa: E402
from saucer.store.testing.listing import ListingContract  # noqa: E402
from saucer.store.testing.sessions import SessionContract  # noqa: E402
from saucer.store.testing.snapshots import SnapshotLeaseContract  # noqa: E402

__all__ = [
    "EventContract",
    "EventStoreContract",
    "FeatureContract",
    "ListingContract",
    "SessionContract",
    "SnapshotLeaseContract",
]


class EventStoreContract(SessionContract, EventContract, SnapshotLeaseContract, FeatureContract, ListingContract):
    """The tests every backend passes; subclass it and define the ``store_factory`` fixture."""

    @pytest.fixture
    def store_factory(self) -> Callable[[], EventStore]:
        """Opens another handle on the same store, empty at the start of each test (define it)."""
        pytest.fail(f"{type(self).__name__} must define the store_factory fixture (see saucer.store.testing)")

    @pytest.fixture
    def store(self, store_factory: Callable[[], EventStore]) -> Iterator[EventStore]:
        """A handle on the empty store of the test, closed afterwards."""
        s = store_factory()
        yield s
        s.close()
