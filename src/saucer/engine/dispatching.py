"""A session's dispatcher: made by its factory on first use, entered, listed, closed with the session.

A dispatcher passed to the session as it is (``dispatcher=``) belongs to the
caller, who closes it; one made by ``dispatcher_factory(session)`` belongs to
the session, which enters it (``async with``) when it opens it and exits it
when the session closes, or when :meth:`DispatcherHolder.close` is called for a
session that will never run.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

import orjson
from pydantic import BaseModel

from saucer.engine.conformance import conforms

__all__ = ["DispatcherHolder"]

_log = logging.getLogger("saucer.engine")


@runtime_checkable
class _ListsTools(Protocol):
    """A dispatcher that lists the tools it offers (optional)."""

    def list_tools(self) -> Any: ...


@runtime_checkable
class _ReportsDevice(Protocol):
    """A dispatcher whose device(s) report about themselves (optional)."""

    def device_info(self) -> Any: ...


class DispatcherHolder:
    """Holds one session's dispatcher and knows whether the session owns it."""

    def __init__(self, dispatcher: Any = None, factory: Callable[[Any], Any] | None = None) -> None:
        self.dispatcher = dispatcher
        self._factory = factory
        self._owned = False
        self._entered: Any = None
        self._opened = False

    async def open(self, session: Any) -> Any:
        """The dispatcher, made by the factory (called with ``session``) and entered on the first call."""
        if self._opened:
            return self.dispatcher
        dispatcher = self.dispatcher
        if dispatcher is None and self._factory is not None:
            dispatcher = self._factory(session)
            if inspect.isawaitable(dispatcher):
                dispatcher = await dispatcher
            self._owned = True
        if self._owned and isinstance(dispatcher, contextlib.AbstractAsyncContextManager):
            entered = await dispatcher.__aenter__()
            self._entered = dispatcher
            if entered is not None:
                dispatcher = entered
        self.dispatcher = dispatcher
        self._opened = True
        return dispatcher

    async def tool_info(self, session_id: str) -> dict[str, Any]:
        """The tools the dispatcher offers, keyed ``server.tool``, as JSON data ({} when it cannot list them)."""
        dispatcher = self.dispatcher
        if not conforms(dispatcher, _ListsTools):
            return {}
        fn = dispatcher.list_tools
        try:
            tools = fn()
            if inspect.isawaitable(tools):
                tools = await tools
        except Exception as exc:  # noqa: BLE001 - a session can run without the tool list
            _log.warning("session %s: could not list tools: %s", session_id, exc)
            return {}
        if isinstance(tools, Mapping):
            return {str(k): _jsonable(v) for k, v in tools.items()}
        out: dict[str, Any] = {}
        for tool in tools or []:
            data = _jsonable(tool)
            name = data.get("name") if isinstance(data, dict) else None
            if name:
                out[str(name)] = data
        return out

    async def device_info(self, session_id: str) -> list[dict[str, Any]]:
        """What the dispatcher's device(s) reported about themselves (``device_info()``), as JSON data; [] if nothing."""
        dispatcher = self.dispatcher
        if not conforms(dispatcher, _ReportsDevice):
            return []
        fn = dispatcher.device_info
        try:
            info = fn()
            if inspect.isawaitable(info):
                info = await info
        except Exception as exc:  # noqa: BLE001 - a session can run without it
            _log.warning("session %s: could not read the device's info: %s", session_id, exc)
            return []
        if isinstance(info, Mapping):
            info = [info]
        return [_jsonable(entry) for entry in info or [] if isinstance(entry, Mapping)]

    async def close(self, session_id: str) -> None:
        """Exit a dispatcher the session made (a warning, never an error, when that fails)."""
        if self._entered is not None:
            try:
                await self._entered.__aexit__(None, None, None)
            except Exception as exc:  # noqa: BLE001
                _log.warning("session %s: closing the dispatcher failed: %s", session_id, exc)
            self._entered = None


def _jsonable(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    return orjson.loads(orjson.dumps(value, default=str, option=orjson.OPT_NON_STR_KEYS))
