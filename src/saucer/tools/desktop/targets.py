"""Which tree a call is about: the applications on the bus, the focused window, and window positions.

The choice itself is pure (:func:`choose`, :func:`window_offset`): it works
on what the accessibility bus and X11 said, so it is tested without a display.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from saucer.tools.desktop import DesktopError
from saucer.tools.desktop.atspi import ACCESSIBLE, REGISTRY_ROOT, AtspiBus, NodeInfo, Ref, read_details, read_node
from saucer.tools.desktop.x11 import XWindow

__all__ = ["App", "Target", "pick", "list_apps", "active_windows", "choose", "window_offset"]

T = TypeVar("T")
# Largest client-side decoration margin taken as such (larger differences are not a margin).
_MAX_MARGIN = 200


@dataclass
class App:
    """An application on the accessibility bus and its top-level windows."""

    ref: Ref
    name: str
    pid: int | None
    windows: list[NodeInfo]


@dataclass
class Target:
    """The root of a tree: a top-level window (``window`` set) or a whole application."""

    ref: Ref
    app: str
    pid: int | None
    window: str | None

    @property
    def is_window(self) -> bool:
        return self.window is not None


def pick(items: Sequence[T], wanted: str, label: Callable[[T], str], what: str) -> list[T]:
    """Items whose label equals ``wanted`` ignoring case, else those containing it; an error names the choices."""
    folded = wanted.casefold()
    exact = [item for item in items if label(item).casefold() == folded]
    found = exact or [item for item in items if folded in label(item).casefold()]
    if not found:
        names = sorted({label(item) for item in items}) or ["none"]
        raise DesktopError(f"no {what} named {wanted!r}; there are: {', '.join(names)}")
    return found


async def list_apps(bus: AtspiBus) -> list[App]:
    """The applications registered on the bus (one that does not answer is left out)."""
    refs = await bus.call1(REGISTRY_ROOT, ACCESSIBLE, "GetChildren")

    async def one(ref: Ref) -> App:
        info, pid = await asyncio.gather(read_node(bus, ref), bus.pid_of(ref[0]))
        info = await read_details(bus, info, child_budget=64, parts=frozenset({"children"}))
        windows = await asyncio.gather(*(read_node(bus, child) for child in info.children), return_exceptions=True)
        return App(ref, info.name, pid, [w for w in windows if isinstance(w, NodeInfo)])

    apps = await asyncio.gather(*(one((str(b), str(p))) for b, p in refs), return_exceptions=True)
    return [app for app in apps if isinstance(app, App)]


def active_windows(apps: Sequence[App]) -> list[tuple[App, NodeInfo]]:
    """The top-level windows whose toolkit says they are active."""
    return [(a, w) for a in apps for w in a.windows if "active" in w.states]


def choose(apps: Sequence[App], app: str | None, window: str | None, focused: XWindow | None) -> Target:
    """The tree root for ``app`` and/or ``window``, or the focused window.

    Without either, the focused window is the one window in the "active"
    state; when there are none or several, the X11 input focus (``focused``)
    decides by process id and title, and a focused window that is on no
    application of the bus (or with none on the bus) is an error saying so
    (not some other application's tree, nor just "no application");
    without a focused window, the only application with a window showing.
    """
    if not apps:
        if focused is not None and not app and not window:
            raise _off_the_bus(focused)  # the more useful answer: what is focused, and what to use instead
        raise DesktopError("no application is on the accessibility bus; start one first (launch)")
    chosen = pick(apps, app, lambda a: a.name, "application") if app else list(apps)
    if window:
        pairs = [(a, w) for a in chosen for w in a.windows]
        found = pick(pairs, window, lambda pair: pair[1].name, "window")
        if len(found) > 1:
            found = [p for p in found if "active" in p[1].states] or found
        if len(found) > 1:
            listed = ", ".join(f"{w.name!r} of {a.name} (pid {a.pid})" for a, w in found)
            raise DesktopError(f"several windows match {window!r}: {listed}; name the application too")
        a, w = found[0]
        return Target(w.ref, a.name, a.pid, w.name)
    if app:
        if len(chosen) > 1:
            listed = ", ".join(f"{a.name} (pid {a.pid})" for a in chosen)
            raise DesktopError(f"several applications match {app!r}: {listed}; name a window instead")
        return Target(chosen[0].ref, chosen[0].name, chosen[0].pid, None)
    active = active_windows(apps)
    if len(active) != 1 and focused is not None:
        pool = active or [(a, w) for a in apps for w in a.windows]
        by_pid = [(a, w) for a, w in pool if focused.pid is not None and a.pid == focused.pid]
        by_title = [(a, w) for a, w in pool if w.name and w.name == focused.title]
        active = [p for p in by_pid if p[1].name == focused.title] or by_pid or by_title
        owner = [a for a in apps if focused.pid is not None and a.pid == focused.pid]
        if not active and len(owner) == 1:
            # On the bus, but no window listed (yet): the whole application.
            return Target(owner[0].ref, owner[0].name, owner[0].pid, None)
        if not active:
            raise _off_the_bus(focused)
    if not active:
        showing = [(a, w) for a in apps for w in a.windows if "showing" in w.states]
        if len({a.ref for a, _ in showing}) == 1:
            active = showing
    if not active:
        listed = ", ".join(f"{a.name} [{', '.join(repr(w.name) for w in a.windows) or 'no windows'}]" for a in apps)
        raise DesktopError(f"no window has the focus; name one with app= or window= (running: {listed})")
    a, w = active[0]
    return Target(w.ref, a.name, a.pid, w.name)


def _off_the_bus(focused: XWindow) -> DesktopError:
    """The error for a focused X11 window whose program is not on the accessibility bus."""
    return DesktopError(
        f"the focused window {focused.title!r} ({focused.app or 'no WM_CLASS'}, pid {focused.pid}) is not on "
        "the accessibility bus (its toolkit may not support AT-SPI, or it runs with NO_AT_BRIDGE=1): use "
        "screenshots, clicks at x, y and keys, or name another application with app="
    )


def window_offset(window: NodeInfo, pid: int | None, xwindows: Sequence[XWindow]) -> tuple[int, int]:
    """What to add to the bounds a top-level window's toolkit reports to get screen pixels.

    GTK 4 reports positions relative to its window (it cannot know where the
    window is), so its top-level windows say (0, 0). For such a window the
    X11 window of the same process (and title) gives the position; the
    client-side decoration margin is ``_GTK_FRAME_EXTENTS`` when set, else
    half the size difference (GTK 4 draws the same margin on every side).
    Toolkits that report screen positions (GTK 3, Qt) need nothing added.
    """
    if window.bounds is None or window.bounds[:2] != (0, 0) or pid is None:
        return (0, 0)
    candidates = [w for w in xwindows if w.pid == pid]
    if not candidates:
        return (0, 0)
    width, height = window.bounds[2:]
    best = min(candidates, key=lambda w: (w.title != window.name, abs(w.width - width) + abs(w.height - height)))
    if best.frame is not None:
        return (best.x + best.frame[0], best.y + best.frame[2])
    dw, dh = best.width - width, best.height - height
    if 0 <= dw <= _MAX_MARGIN and 0 <= dh <= _MAX_MARGIN:
        return (best.x + dw // 2, best.y + dh // 2)
    return (best.x, best.y)
