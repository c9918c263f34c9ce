"""Telling observers: the engine's side of :mod:`saucer.engine.observer`.

An observer's hooks are all optional. :class:`ObserverCaller` checks once,
when it is made, which hooks an observer has (one ``runtime_checkable``
Protocol per hook) and keeps them as bound callables; the engine then calls
them through its typed methods, awaiting async ones, and a hook that raises
is logged once and never stops the session. :class:`CompositeObserver`
forwards to several observers. Neither knows the session's type (the session
imports this module; :mod:`saucer.engine.observer` types the hooks for users).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from saucer.engine.conformance import conforms

__all__ = ["ObserverCaller", "CompositeObserver", "HOOKS"]

_log = logging.getLogger("saucer.engine")

HOOKS = ("on_session_start", "on_round_start", "on_step", "on_round_end", "on_session_end")
"""The observer hooks, in the order a session calls them."""


@runtime_checkable
class _OnSessionStart(Protocol):
    def on_session_start(self, session: Any) -> object: ...


@runtime_checkable
class _OnRoundStart(Protocol):
    def on_round_start(self, session: Any, round: Any) -> object: ...


@runtime_checkable
class _OnStep(Protocol):
    def on_step(self, session: Any, record: Any) -> object: ...


@runtime_checkable
class _OnRoundEnd(Protocol):
    def on_round_end(self, session: Any, round: Any, result: Any) -> object: ...


@runtime_checkable
class _OnSessionEnd(Protocol):
    def on_session_end(self, session: Any, result: Any) -> object: ...


def _hooks(observer: object) -> dict[str, Callable[..., object]]:
    """The hooks ``observer`` has, by name, bound (checked once, by protocol)."""
    found: dict[str, Callable[..., object]] = {}
    if conforms(observer, _OnSessionStart):
        found["on_session_start"] = observer.on_session_start
    if conforms(observer, _OnRoundStart):
        found["on_round_start"] = observer.on_round_start
    if conforms(observer, _OnStep):
        found["on_step"] = observer.on_step
    if conforms(observer, _OnRoundEnd):
        found["on_round_end"] = observer.on_round_end
    if conforms(observer, _OnSessionEnd):
        found["on_session_end"] = observer.on_session_end
    return found


class CompositeObserver:
    """Forwards every call to several observers, in order (each one's hooks resolved once, here)."""

    def __init__(self, observers: Sequence[object | None]) -> None:
        self.observers = [o for o in observers if o is not None]
        self._hooks = [_hooks(o) for o in self.observers]

    async def _forward(self, name: str, *args: Any) -> None:
        for hooks in self._hooks:
            fn = hooks.get(name)
            if fn is None:
                continue
            result = fn(*args)
            if inspect.isawaitable(result):
                await result

    async def on_session_start(self, session: Any) -> None:
        await self._forward("on_session_start", session)

    async def on_round_start(self, session: Any, round: Any) -> None:
        await self._forward("on_round_start", session, round)

    async def on_step(self, session: Any, record: Any) -> None:
        await self._forward("on_step", session, record)

    async def on_round_end(self, session: Any, round: Any, result: Any) -> None:
        await self._forward("on_round_end", session, round, result)

    async def on_session_end(self, session: Any, result: Any) -> None:
        await self._forward("on_session_end", session, result)


class ObserverCaller:
    """Calls an observer's hooks for the engine; which hooks it has is resolved once, when it is made."""

    __slots__ = ("_fns", "_failed")

    def __init__(self, observer: object | None) -> None:
        self._fns = _hooks(observer) if observer is not None else {}
        self._failed: set[str] = set()

    async def __call__(self, name: str, *args: Any) -> None:
        """Call hook ``name`` (one of :data:`HOOKS`) if the observer has it; a failure is logged once."""
        fn = self._fns.get(name)
        if fn is None:
            return
        try:
            result = fn(*args)
            if inspect.isawaitable(result):
                await result
        except Exception as exc:  # noqa: BLE001 - an observer bug must not stop the session
            if name not in self._failed:
                self._failed.add(name)
                _log.warning(
                    "session observer %s.%s failed: %s: %s", type(fn).__qualname__, name, type(exc).__name__, exc
                )

    def has(self, name: str) -> bool:
        """Whether the observer has hook ``name``."""
        return name in self._fns

    async def session_start(self, session: Any) -> None:
        """``on_session_start(session)``."""
        await self("on_session_start", session)

    async def round_start(self, session: Any, round: Any) -> None:
        """``on_round_start(session, round)``."""
        await self("on_round_start", session, round)

    async def step(self, session: Any, record: Any) -> None:
        """``on_step(session, record)``: the committed step."""
        await self("on_step", session, record)

    async def round_end(self, session: Any, round: Any, result: Any) -> None:
        """``on_round_end(session, round, result)``."""
        await self("on_round_end", session, round, result)

    async def session_end(self, session: Any, result: Any) -> None:
        """``on_session_end(session, result)``."""
        await self("on_session_end", session, result)
