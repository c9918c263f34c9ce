"""The desktop's connections: the X11 display and the accessibility (AT-SPI) bus, reconnected when lost.

X11 calls block, so they run in a worker thread; a lost display is closed and
connected again on the next call. The bus is found as a toolkit finds it (the
X root window's ``AT_SPI_BUS``, else the session bus), skipping an address a
killed session left behind. Applications and windows are read through both.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from typing import TypeVar

from saucer.tools.desktop import DesktopError
from saucer.tools.desktop.atspi import AtspiBus, NodeInfo, find_bus_address
from saucer.tools.desktop.targets import App, Target, active_windows, choose, list_apps, window_offset
from saucer.tools.desktop.x11 import X11, X_LOST, X_REFUSED

__all__ = ["Connection"]

T = TypeVar("T")


class Connection:
    """One X11 display and its accessibility bus, each connected on first use."""

    def __init__(self, display: str | None, call_timeout: float) -> None:
        self.display = display
        self.call_timeout = call_timeout
        self._x: X11 | None = None
        self._bus: AtspiBus | None = None
        #: The X root window's ``AT_SPI_BUS`` when it named a bus that is gone (programs are then told the live one).
        self.stale_bus_property: str | None = None

    async def xcall(self, fn: Callable[[X11], T]) -> T:
        """``fn(x11)`` in a worker thread; a lost display becomes a DesktopError (and a reconnection next time)."""
        if self._x is None:
            self._x = await asyncio.to_thread(X11, self.display)
        x = self._x
        try:
            return await asyncio.to_thread(fn, x)
        except X_LOST as exc:
            self._x = None  # the next call connects again
            await asyncio.to_thread(x.close)
            raise DesktopError(
                f"the X display {x.name!r} failed ({type(exc).__name__}: {exc}); is it still running?"
            ) from None
        except X_REFUSED as exc:
            raise DesktopError(f"the X server refused a request ({exc})") from None

    async def _x_bus_property(self) -> str | None:
        return await self.xcall(lambda x: x.bus_address_property())

    async def atspi(self) -> AtspiBus:
        """The accessibility bus, connected (again) when needed."""
        if self._bus is not None and self._bus.closed:
            await self._bus.close()
            self._bus = None
        if self._bus is None:
            timeout = self.call_timeout
            display = self.display or os.environ.get("DISPLAY")
            stale: list[str] = []
            address = await find_bus_address(self._x_bus_property if display else None, timeout, stale)
            self._bus = await AtspiBus.connect(address, timeout)
            self.stale_bus_property = stale[-1] if stale else None
        return self._bus

    async def bus_for_programs(self, env: dict[str, str]) -> None:
        """Point a program at the live accessibility bus when the X root window names a stale one (a toolkit
        reads that property before it asks the session bus, and would stay off the bus)."""
        if env.get("AT_SPI_BUS_ADDRESS") or env.get("NO_AT_BRIDGE") == "1" or env.get("GTK_A11Y") == "none":
            return
        with contextlib.suppress(DesktopError):
            bus = await self.atspi()
            if self.stale_bus_property is not None:
                env["AT_SPI_BUS_ADDRESS"] = bus.address

    async def close(self) -> None:
        """Close the bus and the display (the next call connects again)."""
        if self._bus is not None:
            await self._bus.close()
            self._bus = None
        if self._x is not None:
            self._x.close()
            self._x = None

    async def apps(self) -> list[App]:
        """The applications on the bus, with their windows."""
        return await list_apps(await self.atspi())

    async def target(self, app: str | None, window: str | None) -> Target:
        """The application or window a call names (or the focused one when it names none)."""
        apps = await self.apps()
        focused = None
        if not app and not window and len(active_windows(apps)) != 1:
            with contextlib.suppress(DesktopError):
                focused = next((w for w in await self.xcall(lambda x: x.windows()) if w.focused), None)
        return choose(apps, app, window, focused)

    async def window_offset(self, window: NodeInfo, pid: int | None) -> tuple[int, int]:
        """Where a toolkit reporting window-relative positions put ``window`` on the screen (X11 tells)."""
        if window.bounds is None or window.bounds[:2] != (0, 0) or pid is None:
            return (0, 0)  # nothing to ask X11 (see targets.window_offset)
        try:
            xwindows = await self.xcall(lambda x: x.windows())
        except DesktopError:
            return (0, 0)
        return window_offset(window, pid, xwindows)
