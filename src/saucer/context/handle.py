"""A store opened for Contexts, shared by a Context and the forks made from it.

``Context.open(url, ...)`` opens the store itself; the Contexts forked from
that one use the same store. A :class:`StoreHandle` owns such a store and
counts the Contexts using it: the last one to let go closes it. (A store
passed to ``Context.open`` as an object belongs to the caller and is never
closed by a Context.)
"""

from __future__ import annotations

import threading

from saucer.store import open_store
from saucer.store.base import EventStore

__all__ = ["StoreHandle"]


class StoreHandle:
    """An open store and how many Contexts use it; :meth:`release` by the last one closes it."""

    def __init__(self, store: EventStore) -> None:
        self.store = store
        self._users = 1
        self._lock = threading.Lock()

    @classmethod
    def open(cls, url: str) -> StoreHandle:
        """Open the store at ``url`` for one user."""
        return cls(open_store(url))

    @property
    def users(self) -> int:
        """How many Contexts hold this handle."""
        return self._users

    def retain(self) -> StoreHandle:
        """One more user (a fork of a Context holding it); returns the handle."""
        with self._lock:
            if self._users <= 0:
                raise RuntimeError(f"the store {self.store.url!r} was closed by its last Context")
            self._users += 1
        return self

    def release(self) -> None:
        """One user fewer; the last one closes the store."""
        with self._lock:
            self._users -= 1
            last = self._users == 0
        if last:
            self.store.close()
