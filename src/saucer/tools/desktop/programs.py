"""Which windows belong to a launched program, and closing programs the way a user closes them.

A program's windows are found three ways, as a user would recognise them:
its process (and its children) set ``_NET_WM_PID`` on them; or a window that
appeared after the launch carries the program's name in ``WM_CLASS`` or its
title (programs without ``_NET_WM_PID``, such as xmessage, and programs that
hand the window over to an instance already running); or the accessibility
bus lists an application of that process.

Closing (:func:`close_programs`) asks first: ``WM_DELETE_WINDOW`` to each
window, as its close button does; a "save changes?" question that follows is
answered with its discard button (the session is over, and a signal would
lose the text as well, and make editors such as Mousepad offer to restore
it next time); only a program still running after that gets SIGTERM, then
SIGKILL (:meth:`Launcher.stop_all`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from saucer.tools.desktop.apps import Launcher, descendants
from saucer.tools.desktop.x11 import X11, XWindow

__all__ = ["program_names", "launched_windows", "close_programs", "DISCARD_BUTTON", "CLOSE_GRACE"]

logger = logging.getLogger("saucer.tools.desktop")

#: Seconds programs get to close after WM_DELETE_WINDOW before they are sent SIGTERM.
CLOSE_GRACE = 3.0
#: The button of a "save changes?" dialog that closes without saving.
DISCARD_BUTTON = re.compile(
    r"(?i)^\s*(don[’']?t save|do not save|discard( changes)?|close without saving|quit without saving|"
    r"close without save|without saving)\s*$"
)
_POLL = 0.05
_ANSWER_AFTER = 0.5


def program_names(argv: Sequence[str]) -> set[str]:
    """The names a program's windows may carry: its executable's base name, case folded (``mousepad``)."""
    name = Path(argv[0]).name.casefold()
    return {name} if name else set()


def launched_windows(windows: Iterable[XWindow], pids: set[int], before: set[int], names: set[str]) -> list[XWindow]:
    """The windows of a launched program: those of its processes (``_NET_WM_PID``), and those that appeared
    after the launch (not in ``before``) whose ``WM_CLASS`` or title names the program."""

    def named(w: XWindow) -> bool:
        labels = {w.instance.casefold(), w.app.casefold()}
        return bool(labels & names) or any(n and n in w.title.casefold() for n in names)

    return [w for w in windows if (w.pid is not None and w.pid in pids) or (w.id not in before and named(w))]


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] not in ("Z", "X")
    except (OSError, IndexError):
        return False


async def _no_offset(_info: object, _pid: object) -> tuple[int, int]:
    return (0, 0)  # only names and actions are read: positions do not matter


async def _answer_discard(pids: set[int], timeout: float) -> int:
    """Press the discard button of the "save changes?" dialogs of these processes; the number pressed."""
    from saucer.tools.desktop.atspi import ACTION, AtspiBus, find_bus_address
    from saucer.tools.desktop.targets import list_apps
    from saucer.tools.desktop.tree import ElementRegistry, Selector, TreeLimits, build_tree, find_matches

    bus = await AtspiBus.connect(await find_bus_address(None, timeout), timeout)
    pressed = 0
    try:
        selector = Selector(name="re:" + DISCARD_BUTTON.pattern, role="push button")
        limits = TreeLimits(30, 400, 0, True, parts=frozenset({"actions"}))
        for app in await list_apps(bus):
            if app.pid not in pids:
                continue
            for window in app.windows:
                tree = await build_tree(
                    bus,
                    window.ref,
                    limits,
                    ElementRegistry(64),
                    pid=app.pid,
                    root_is_toplevel=True,
                    offset_for=_no_offset,
                )
                for node, _ in find_matches(tree, selector):
                    info = tree.infos[node["id"]]
                    names = [a.casefold() for a in info.actions]
                    if "click" in names or "press" in names:
                        position = names.index("click") if "click" in names else names.index("press")
                        await bus.call1(info.ref, ACTION, "DoAction", "i", (position,))
                        pressed += 1
                        break
    finally:
        await bus.close()
    return pressed


def close_programs(launcher: Launcher, display: str | None, grace: float = CLOSE_GRACE) -> None:
    """Close the programs ``launcher`` started as a user would (see the module docstring), then stop the rest."""
    running = [p for p in launcher.processes if p.poll() is None]
    if running or launcher.windows:
        try:
            _ask_to_close(launcher, display, running, grace)
        except Exception as exc:  # noqa: BLE001 - no display any more, or a window gone meanwhile: signals still stop them
            logger.debug("desktop: could not ask the programs to close: %s", exc)
    launcher.stop_all()


def _ask_to_close(launcher: Launcher, display: str | None, running: list[Any], grace: float) -> bool:
    """WM_DELETE_WINDOW to the programs' windows, the discard button of a save question, and a wait for them."""
    pids: set[int] = set()
    for proc in running:
        pids |= descendants(proc.pid)
    x = X11(display)
    try:
        windows = [w for w in x.windows() if (w.pid in pids) or w.id in launcher.windows]
        if not windows:
            return False
        for window in windows:
            with contextlib.suppress(Exception):
                x.request_close(window.id)
        pids |= {w.pid for w in windows if w.pid}
        deadline = time.monotonic() + grace
        answer_at = time.monotonic() + _ANSWER_AFTER
        answered = False
        while time.monotonic() < deadline:
            if not any(_alive(pid) for pid in pids):
                break
            bus_known = os.environ.get("DBUS_SESSION_BUS_ADDRESS") or os.environ.get("AT_SPI_BUS_ADDRESS")
            if not answered and time.monotonic() >= answer_at and bus_known:
                answered = True
                with contextlib.suppress(Exception):
                    if asyncio.run(_answer_discard({p for p in pids if _alive(p)}, 2.0)):
                        deadline = max(deadline, time.monotonic() + 1.0)
            time.sleep(_POLL)
        return True
    finally:
        x.close()
