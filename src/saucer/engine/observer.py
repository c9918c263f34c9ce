"""Live progress: the :class:`SessionObserver` protocol the CLI (and pools) render from.

Every method is optional and may be plain or ``async``; an observer that
raises is reported once through ``warnings`` and never stops a session.
Calls happen on the session's event loop, after the event they describe is
committed: ``on_step`` receives the committed :class:`~saucer.engine.logs.StepRecord`.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from saucer.engine.logs import StepRecord
    from saucer.engine.round import Round, RoundResult
    from saucer.engine.session import Session, SessionResult

__all__ = ["SessionObserver", "NullObserver", "CompositeObserver", "ObserverCaller"]

_log = logging.getLogger("saucer.engine")

_METHODS = ("on_session_start", "on_round_start", "on_step", "on_round_end", "on_session_end")


@runtime_checkable
class SessionObserver(Protocol):
    """Hooks for live progress; all optional, plain or async."""

    def on_session_start(self, session: Session) -> Any: ...

    def on_round_start(self, session: Session, round: Round) -> Any: ...

    def on_step(self, session: Session, record: StepRecord) -> Any: ...

    def on_round_end(self, session: Session, round: Round, result: RoundResult) -> Any: ...

    def on_session_end(self, session: Session, result: SessionResult) -> Any: ...


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


class CompositeObserver:
    """Forwards every call to several observers, in order."""

    def __init__(self, observers: Sequence[Any]) -> None:
        self.observers = [o for o in observers if o is not None]


for _name in _METHODS:

    def _make(name: str) -> Any:
        async def forward(self: CompositeObserver, *args: Any) -> None:
            for observer in self.observers:
                fn = getattr(observer, name, None)
                if fn is None:
                    continue
                result = fn(*args)
                if inspect.isawaitable(result):
                    await result

        forward.__name__ = name
        return forward

    setattr(CompositeObserver, _name, _make(_name))


class ObserverCaller:
    """Calls an observer's hooks for the engine, resolving each method once."""

    __slots__ = ("_fns", "_async", "_failed")

    def __init__(self, observer: Any) -> None:
        self._fns: dict[str, Any] = {}
        self._async: dict[str, bool] = {}
        self._failed: set[str] = set()
        if observer is None:
            return
        for name in _METHODS:
            fn = getattr(observer, name, None)
            if fn is not None:
                self._fns[name] = fn
                self._async[name] = inspect.iscoroutinefunction(fn)

    async def __call__(self, name: str, *args: Any) -> None:
        fn = self._fns.get(name)
        if fn is None:
            return
        try:
            result = fn(*args)
            if self._async[name] or inspect.isawaitable(result):
                await result
        except Exception as exc:  # noqa: BLE001 - an observer bug must not stop the session
            if name not in self._failed:
                self._failed.add(name)
                _log.warning(
                    "session observer %s.%s failed: %s: %s", type(fn).__qualname__, name, type(exc).__name__, exc
                )

    def has(self, name: str) -> bool:
        return name in self._fns
