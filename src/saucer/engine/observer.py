"""Live progress: the :class:`SessionObserver` protocol the CLI (and pools) render from.

The protocol is defined with :class:`~saucer.engine.session.Session` (its hooks name
the session, and the session names it), and is importable from here with
:class:`NullObserver`, :class:`~saucer.engine.notify.CompositeObserver` and
:class:`~saucer.engine.notify.ObserverCaller`.

Every method is optional and may be plain or ``async``; which ones an
observer has is checked once, when the session is given it
(:class:`~saucer.engine.notify.ObserverCaller`); an observer that raises is
logged once and never stops a session.
Calls happen on the session's event loop, after the event they describe is
committed: ``on_step`` receives the committed :class:`~saucer.engine.logs.StepRecord`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from saucer.engine.notify import CompositeObserver, ObserverCaller
from saucer.engine.session import SessionObserver

if TYPE_CHECKING:
    from saucer.engine.logs import StepRecord
    from saucer.engine.round import Round, RoundResult
    from saucer.engine.session import Session, SessionResult

__all__ = ["SessionObserver", "NullObserver", "CompositeObserver", "ObserverCaller"]


class NullObserver:
    """Does nothing (subclass it and override what you need)."""

    def on_session_start(self, session: Session) -> None:
        pass

    def on_round_start(self, session: Session, round: Round) -> None:
        pass

    def on_step(self, session: Session, record: StepRecord) -> None:
        pass

    def on_round_end(self, session: Session, round: Round, result: RoundResult) -> None:
        pass

    def on_session_end(self, session: Session, result: SessionResult) -> None:
        pass
