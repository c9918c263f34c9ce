"""Who may commit to a session: its declared participants, those added since, and its runner.

A session that declares participants (:attr:`saucer.store.SessionInfo.participants`,
and those added since in the context variable :data:`PARTICIPANTS_VAR`) refuses a
commit by any other author with :class:`~saucer.store.NotParticipantError`
before anything is sent. The check is made against the committed state the
commit is based on, so the store's version check makes it hold under races on
every backend: a commit based on a version that a later change of the
participants follows is a conflict, and is checked again once re-based. A
commit carrying the session's lease token (its runner: the engine's own
agents) is always allowed; a session that declares none is open to every writer.
"""

from __future__ import annotations

from saucer.context.events import State, apply_ops, copy_json
from saucer.context.types import Json, Op
from saucer.store.base import EventStore
from saucer.store.model import NotParticipantError

__all__ = ["ParticipantGate", "PARTICIPANTS_VAR"]

#: The context variable listing the participants added to a session since it was made
#: (:meth:`~saucer.context.Context.add_participants`); those it was made with are
#: :attr:`saucer.store.SessionInfo.participants`.
PARTICIPANTS_VAR = "saucer.participants"


class ParticipantGate:
    """Refuses the commit of a non-participant, judged on the committed state it is based on."""

    def __init__(self) -> None:
        # Those the session was made with (read once, on the first commit that needs
        # them; None: it declared none) and, as committed, those added since.
        self._declared: frozenset[str] | None = None
        self._declared_read = False
        self._added: Json = None

    def loaded(self, state: State) -> None:
        """The committed state was loaded: take the added participants from it."""
        self._added = copy_json(state.vars.get(PARTICIPANTS_VAR))

    def check(self, store: EventStore, session_id: str, author: str, fence: int | None) -> None:
        """Raise :class:`NotParticipantError` unless ``author`` may commit to ``session_id``."""
        if fence is not None:
            return  # the session's runner (its lease token is checked by the store)
        if not self._declared_read:  # fixed when the session was made: read once
            info, _ = store.session_info_without_plan(session_id)
            self._declared, self._declared_read = info.participants, True
        declared = self._declared
        if declared is None or author in declared:
            return
        added = self._added
        if isinstance(added, list) and author in added:
            return
        raise NotParticipantError(session_id, author)

    def track(self, ops: list[Op]) -> None:
        """Keep the committed list of added participants up to date with ``ops`` (just committed)."""
        for op in ops:  # (most commits change none: found without a list made)
            if op.get("var") == PARTICIPANTS_VAR:
                break
        else:
            return
        mine = [op for op in ops if op.get("var") == PARTICIPANTS_VAR]
        if mine:
            state = State(vars={} if self._added is None else {PARTICIPANTS_VAR: copy_json(self._added)})
            self._added = apply_ops(state, mine).vars.get(PARTICIPANTS_VAR)
