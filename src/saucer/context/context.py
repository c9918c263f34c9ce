"""The Context: one typed, shared, event-sourced state per session.

``Context()`` is a detached, in-memory Context with UFO's API.
``Context.open(store_or_url, session_id)`` binds it to an event store: every
change becomes an operation; :meth:`Context.commit` writes the pending
operations as one event; opening again replays the latest snapshot plus the
events after it through the same fold that live writes use.

Durability modes:

- ``step`` (default): the engine calls :meth:`Context.commit_step` at each step
  boundary, so a step's changes land together or not at all.
- ``strict``: every change is committed before the call that made it returns.
- ``exit``: changes are committed when the Context is closed.

The class is assembled from one module per concern, each building on
:class:`~saucer.context.core.ContextCore` (the shared fields, opening and
loading):

- :mod:`~saucer.context.access`: ``get``/``set``, context variables, atomic operations;
- :mod:`~saucer.context.commit`: commits and their retry core, steps, rollback;
- :mod:`~saucer.context.snapshots`: when snapshots are taken;
- :mod:`~saucer.context.compat`: the rest of UFO's API;
- :mod:`~saucer.context.queries`: history, state at a version, diff, fork, watch.

This module adds closing: the last commit, the last snapshot, and the store.
"""

from __future__ import annotations

from typing import Any

from saucer.context.compat import UfoCompat
from saucer.context.core import Durability
from saucer.context.queries import HistoryQueries

__all__ = ["Context", "Durability"]


class Context(UfoCompat, HistoryQueries):
    """Typed, shared state of one session, with UFO's Context API and AG2's context vars.

    Read with :meth:`get`, write with :meth:`set` (both take a
    :class:`ContextNames` member or its name). Free-form variables live in
    :attr:`vars` and change through :meth:`update_vars`, :meth:`incr`,
    :meth:`append` and :meth:`compare_and_set`.
    """

    def close(self) -> None:
        """Commit what is pending, snapshot if there is new history (every packed value whole), release the store if owned."""
        if self._closed:
            return
        try:
            if self._store is not None and not self._read_only:
                self.commit()
                # A closed session is read more often than it is extended: its last
                # snapshot holds each packed value whole, so reading it folds no tails.
                if self._version > self._snapshot_version or self._snapshot_tails:
                    self._auto_snapshot(whole=True)
        finally:
            self._closed = True
            handle, self._handle = self._handle, None
            if handle is not None:
                handle.release()

    def __enter__(self) -> Context:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None:
            self.abort()
        else:
            self.close()

    def abort(self) -> None:
        """Discard the unfinished step, then :meth:`close` (with ``exit``, the steps finished before
        it are still committed). What leaving a ``with`` block on an exception does."""
        if self._store is not None and not self._read_only and not self._closed:
            try:
                self._discard_after(self._step_mark)
            except Exception:
                # The committed state could not be reloaded: write nothing
                # (neither the half step nor a snapshot of it).
                self._pending = []
                self._snapshot_version = self._version
        self.close()

    def __repr__(self) -> str:
        where = f"{self._session_id!r}@{self._version}" if self._session_id else "detached"
        return f"<Context {where} pending={len(self._pending)} durability={self._durability}>"
