"""Optional features are declared, never guessed: a backend that declares none
still passes the contract, and refuses what it lacks with one clear error."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest

from saucer.context import Context, prune
from saucer.store import EventStore, Feature, NotSupportedError, StoreError, open_store
from saucer.store.memory import MemoryStore
from saucer.store.testing import EventStoreContract


class BareStore(MemoryStore):
    """The memory store declaring no optional feature, as a minimal third-party backend would."""

    features: frozenset[Feature] = frozenset()


class TestABackendWithoutOptionalFeatures(EventStoreContract):
    @pytest.fixture
    def store_factory(self) -> Callable[[], EventStore]:
        name = f"bare-{uuid.uuid4().hex}"
        return lambda: BareStore(name)


def test_what_is_not_declared_is_refused_in_one_sentence() -> None:
    store = BareStore()
    ctx = Context.open(store, "s")
    for _i in range(5):
        ctx.incr("n")
        ctx.commit()
    with pytest.raises(NotSupportedError, match="BareStore cannot replace history .* 'replace_history'") as refused:
        prune(store, "s", keep_last=2)
    assert isinstance(refused.value, StoreError) and "\n" not in str(refused.value)
    assert store.first_version("s") == 0 and [e.version for e in store.read("s")] == [1, 2, 3, 4, 5]
    ctx.close()


def test_the_backends_declare_what_they_have(store_url: str) -> None:
    with open_store(store_url) as store:
        durable = {Feature.QUARANTINE, Feature.GROUP_COMMIT} if not store_url.startswith("memory") else set()
        assert (
            store.features
            == {Feature.REPLACE_HISTORY, Feature.IMPORT, Feature.SNAPSHOT_PRUNING, Feature.REWRITE} | durable
        )
        assert (Feature.GROUP_COMMIT in store.features) == hasattr(store, "_group_committer")
