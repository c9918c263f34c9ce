"""The desktop itself: one method per tool, over its connections and its elements.

:class:`Desktop` holds a :class:`~saucer.tools.desktop.connection.Connection`
(X11 and the accessibility bus) and the
:class:`~saucer.tools.desktop.elements.Elements` found through it. It connects on first use (so the server starts, and lists its
tools, even where there is no display) and reconnects after the display or
the bus went away. Its methods run one at a time (one lock): a click must
not land in the middle of a tree read. X11 calls block, so they run in a
worker thread; AT-SPI calls are asyncio. Every failure is a
:class:`~saucer.tools.desktop.DesktopError` whose message says what to do.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import io
import json
import os
import time
from pathlib import Path
from typing import Any, TypeVar

from saucer.tools.desktop import DesktopError
from saucer.tools.desktop.apps import Launcher, descendants, split_command
from saucer.tools.desktop.artifacts import Artifacts
from saucer.tools.desktop.atspi import (
    ACTION,
    COMPONENT,
)
from saucer.tools.desktop.connection import Connection
from saucer.tools.desktop.elements import Elements, check_range, tree_limits
from saucer.tools.desktop.locator import Locator
from saucer.tools.desktop.models import (
    ClickResult,
    FindResult,
    KeysResult,
    LaunchResult,
    Screenshot,
    ScrollResult,
    TypeResult,
    UITree,
    WindowInfo,
    WindowsResult,
)
from saucer.tools.desktop.options import DesktopOptions
from saucer.tools.desktop.programs import close_programs, launched_windows, program_names
from saucer.tools.desktop.targets import pick
from saucer.tools.desktop.tree import (
    Selector,
    TreeLimits,
)
from saucer.tools.desktop.x11 import XWindow, parse_keys

__all__ = ["DesktopOptions", "Desktop"]

T = TypeVar("T")
_POLL = 0.1
# Largest scaled screenshot (8K UHD); scaling up a whole large screen would take gigabytes.
_MAX_PIXELS = 7680 * 4320
# Seconds a program whose window X11 shows may take to appear on the accessibility bus before launch calls it
# ready anyway (a toolkit without accessibility never does). GTK 4 registers within a second on an idle machine,
# but took more than one on a loaded one: a plan's next ui_tree(app=...) then found no such application.
_X11_ONLY_GRACE = 5.0


class Desktop:
    """One X11 display and its accessibility bus, as used by the tools."""

    def __init__(self, options: DesktopOptions) -> None:
        self.options = options
        self.connection = Connection(options.display, options.call_timeout)
        self.elements = Elements(self.connection, options)
        self.registry = self.elements.registry
        self.launcher = Launcher(options.confinement())
        self.artifacts = Artifacts(options.artifacts)
        self._lock = asyncio.Lock()

    @property
    def stale_bus_property(self) -> str | None:
        """The X root window's ``AT_SPI_BUS`` when it named a bus that is gone (see :class:`Connection`)."""
        return self.connection.stale_bus_property

    async def aclose(self) -> None:
        """Close the connections and stop the programs ``launch`` started (unless ``keep_apps``)."""
        if not self.options.keep_apps:
            await asyncio.to_thread(self.stop_programs)
        await self.connection.close()

    # -- trees ------------------------------------------------------------------------------------
    def limits(
        self, max_depth: int, max_nodes: int, max_text: int, only_visible: bool, on_screen: bool = False
    ) -> TreeLimits:
        """Validated limits (a value beyond the server's caps is an error, not silently lowered)."""
        return tree_limits(self.options, max_depth, max_nodes, max_text, only_visible, on_screen)

    async def ui_tree(
        self, app: str | None, window: str | None, limits: TreeLimits, save_as: str | None, include_tree: bool
    ) -> UITree:
        async with self._lock:
            started = time.perf_counter()
            target = await self.connection.target(app, window)
            tree = await self.elements.walk(target, limits)
            result = UITree(
                app=target.app,
                pid=target.pid,
                window=target.window,
                node_count=tree.node_count,
                truncated=tree.truncated,
                depth_limited=tree.depth_limited,
                hidden=tree.hidden,
                gone=tree.gone,
                seconds=round(time.perf_counter() - started, 4),
                tree=tree.root,
            )
            if save_as is not None:
                path, artifact = self.artifacts.path(save_as, "tree", ".json")
                result.path, result.artifact = str(path), artifact
                self.artifacts.write(
                    path, json.dumps(result.model_dump(mode="json"), ensure_ascii=False, indent=1).encode()
                )
            if not include_tree:
                result.tree = None
            return result

    async def find(
        self, selector: Selector, app: str | None, window: str | None, timeout: float, max_nodes: int
    ) -> FindResult:
        async with self._lock:
            started = time.perf_counter()
            matches, tree, _ = await self.elements.search(selector, app, window, timeout, max_nodes)
            return FindResult(
                matches=[node for node, _ in matches],
                node_count=tree.node_count,
                truncated=tree.truncated,
                seconds=round(time.perf_counter() - started, 4),
            )

    async def click(
        self,
        *,
        element_id: str | None,
        selector: Selector | None,
        app: str | None,
        window: str | None,
        index: int | None,
        x: int | None,
        y: int | None,
        button: str,
        double: bool,
        method: str,
        locator: Locator | None = None,
    ) -> ClickResult:
        count = 2 if double else 1
        async with self._lock:
            if x is not None and y is not None:
                if method == "action":
                    raise DesktopError("a point has no action to do; use method 'auto' or 'pointer' with x and y")
                await self.connection.xcall(lambda d: d.click(x, y, button, count))
                return ClickResult(method="pointer", x=x, y=y, button=button, count=count)
            info, node = await self.elements.chosen(element_id, selector, app, window, index, locator)
            where = await self.elements.locator(info)
            if method != "pointer" and button == "left" and not double:
                owner = await self.elements.action_owner(info)
                if owner is not None:
                    actor, position = owner
                    bus = await self.connection.atspi()
                    done = await bus.call1(actor.ref, ACTION, "DoAction", "i", (position,))
                    if done:
                        via = None if actor is info else {"role": actor.role, "name": actor.name}
                        return ClickResult(
                            method="action", action=actor.actions[position], element=node, via=via, locator=where
                        )
                if method == "action":
                    raise DesktopError(
                        f"element {node['id']} has no click or press action (actions: {info.actions or 'none'})"
                    )
            elif method == "action":
                raise DesktopError("method 'action' does only single left clicks; use method 'pointer'")
            px, py = self.elements.centre(node)
            await self.connection.xcall(lambda d: d.click(px, py, button, count))
            return ClickResult(method="pointer", x=px, y=py, button=button, count=count, element=node, locator=where)

    async def type_text(
        self, text: str, element_id: str | None, delay: float, locator: Locator | None = None
    ) -> TypeResult:
        if len(text) > self.options.max_type:
            raise DesktopError(f"text is {len(text)} characters; at most {self.options.max_type} per call")
        async with self._lock:
            node = where = None
            if element_id is not None:
                info, node = await self.elements.element(element_id, locator)
                where = await self.elements.locator(info)
                await self.elements.focus_window_of(info)
                focused = False
                if "Component" in info.interfaces:
                    bus = await self.connection.atspi()
                    with contextlib.suppress(DesktopError):
                        focused = await bus.call1(info.ref, COMPONENT, "GrabFocus")
                if not focused:
                    px, py = self.elements.centre(node)
                    await self.connection.xcall(lambda d: d.click(px, py))
            await self.connection.xcall(lambda d: d.type_text(text, delay))
            return TypeResult(characters=len(text), element=node, locator=where)

    async def press_keys(self, keys: str, delay: float) -> KeysResult:
        if len(keys) > self.options.max_type:
            raise DesktopError(f"keys is {len(keys)} characters; at most {self.options.max_type} per call")
        combos = parse_keys(keys)
        async with self._lock:
            await self.connection.xcall(lambda d: d.press(combos, delay))
            return KeysResult(keys=keys, combinations=len(combos))

    async def scroll(
        self,
        direction: str,
        amount: int,
        element_id: str | None,
        x: int | None,
        y: int | None,
        locator: Locator | None = None,
    ) -> ScrollResult:
        async with self._lock:
            where = None
            if element_id is not None:
                info, node = await self.elements.element(element_id, locator)
                where = await self.elements.locator(info)
                px, py = self.elements.centre(node)
            elif x is None or y is None:
                px, py = await self.connection.xcall(lambda d: d.pointer())
            else:
                px, py = x, y
            await self.connection.xcall(lambda d: d.scroll(px, py, direction, amount))
            return ScrollResult(direction=direction, amount=amount, x=px, y=py, locator=where)

    async def screenshot(self, region: list[int] | None, scale: float | None, name: str | None) -> Screenshot:
        async with self._lock:
            width, height = await self.connection.xcall(lambda d: d.screen_size())
            if region is None:
                box = (0, 0, width, height)
            else:
                if len(region) != 4 or region[2] <= 0 or region[3] <= 0:
                    raise DesktopError(f"region must be [x, y, width, height] with a positive size, got {region}")
                left, top = max(region[0], 0), max(region[1], 0)
                right, bottom = min(region[0] + region[2], width), min(region[1] + region[3], height)
                if right <= left or bottom <= top:
                    raise DesktopError(f"region {region} lies outside the screen ({width}x{height})")
                box = (left, top, right - left, bottom - top)
            size = (box[2], box[3]) if scale is None else (max(1, round(box[2] * scale)), max(1, round(box[3] * scale)))
            if size[0] * size[1] > _MAX_PIXELS:
                raise DesktopError(
                    f"a {size[0]}x{size[1]} image is too large (at most {_MAX_PIXELS:,} pixels); "
                    "use a smaller scale or region"
                )
            image = await self.connection.xcall(lambda d: d.capture(*box))
            if size != image.size:
                image = await asyncio.to_thread(image.resize, size)
            path, artifact = self.artifacts.path(name, "screenshot", ".png")
            data = await asyncio.to_thread(_png, image)
            self.artifacts.write(path, data)
            return Screenshot(
                path=str(path),
                artifact=artifact,
                width=image.width,
                height=image.height,
                region=list(box),
                screen=[width, height],
            )

    async def windows(self, focus: str | None) -> WindowsResult:
        async with self._lock:
            found = await self.connection.xcall(lambda d: d.windows())
            chosen = None
            if focus is not None:
                by_id = [w for w in found if focus.lower() in (f"{w.id:#x}", str(w.id))]
                matches = by_id or pick(found, focus, lambda w: w.title, "window")
                if len(matches) > 1:
                    listed = ", ".join(f"{w.id:#x} {w.title!r}" for w in matches)
                    raise DesktopError(f"several windows match {focus!r}: {listed}; give the window id")
                target = matches[0]
                await self.connection.xcall(lambda d: d.focus(target))
                found = await self.connection.xcall(lambda d: d.windows())
                chosen = next((_window(w) for w in found if w.id == target.id), None)
            return WindowsResult(windows=[_window(w) for w in found], focused=chosen)

    async def launch(self, command: str | list[str], wait: float, env: dict[str, str] | None) -> LaunchResult:
        argv = split_command(command)
        check_range("wait", wait, 0, self.options.max_wait, "--max-wait")
        child_env = dict(os.environ)
        if self.options.display:
            child_env["DISPLAY"] = self.options.display
        # Qt exposes its accessibility tree only when asked.
        child_env.setdefault("QT_ACCESSIBILITY", "1")
        child_env.update(env or {})
        # A program told to stay off the accessibility bus never appears there: its X11 window is all there is.
        off_bus = child_env.get("NO_AT_BRIDGE") == "1" or child_env.get("GTK_A11Y") == "none"  # GTK 3, GTK 4
        grace = 0.0 if off_bus else _X11_ONLY_GRACE
        async with self._lock:
            if not child_env.get("DISPLAY"):
                await self.connection.xcall(lambda d: None)  # raises the no-display error with its advice
            await self.connection.bus_for_programs(child_env)
            before: set[int] = set()
            with contextlib.suppress(DesktopError):
                before = {w.id for w in await self.connection.xcall(lambda d: d.windows())}
            log, _ = self.artifacts.path(None, f"launch-{Path(argv[0]).name}", ".log")
            opener = functools.partial(self.artifacts.open_log, log)
            proc = await asyncio.to_thread(self.launcher.start, argv, cwd=Path.cwd(), env=child_env, log=opener)
            result = LaunchResult(pid=proc.pid, command=argv, running=True, ready=False, log=str(log))
            deadline = time.monotonic() + wait
            x_only_since: float | None = None
            bus_only_since: float | None = None
            mine: list[XWindow] = []
            while True:
                found, mine = await self._look_for_windows(result, before, program_names(argv))
                if found == "atspi" and not mine:
                    # Showing on the accessibility bus before X11 maps it: wait a moment for its X11 window
                    # (giving it the keyboard below, and closing it like a user later, need its id).
                    now = time.monotonic()
                    bus_only_since = bus_only_since or now
                    result.ready = now - bus_only_since >= _X11_ONLY_GRACE or now >= deadline
                if found == "x11":
                    # A window that X11 knows of, but no accessible application (yet): give the
                    # toolkit a moment to register on the bus before calling it ready.
                    now = time.monotonic()
                    x_only_since = x_only_since or now
                    result.ready = now - x_only_since >= grace or now >= deadline
                code = proc.poll()
                if result.ready or code is not None or time.monotonic() >= deadline:
                    break
                await asyncio.sleep(_POLL)
            self.launcher.windows.update(w.id for w in mine)
            if result.ready and mine and not any(w.focused for w in mine):
                # What a window manager does with a new window; a bare X server leaves the keyboard elsewhere.
                with contextlib.suppress(DesktopError):
                    await self.connection.xcall(lambda d: d.focus(mine[-1]))
            if code is not None:
                result.running, result.exit_code = False, code
                tail = self.launcher.log_tail(log)
                if code != 0:
                    raise DesktopError(
                        f"{argv[0]} exited with status {code}" + (f"; its output ends with:\n{tail}" if tail else "")
                    )
                if not result.ready:
                    result.note = (
                        "it exited at once with status 0; it may have handed over to an instance that "
                        "was already running (see windows and ui_tree)"
                    )
            elif not result.ready:
                result.note = f"no window of the program appeared within {wait:g} s"
            elif x_only_since is not None and result.app is None:
                result.note = (
                    "its window is shown, but the program is not on the accessibility bus (its toolkit may "
                    "not support AT-SPI, or NO_AT_BRIDGE=1 is set): use screenshots, clicks at x, y and keys"
                )
            return result

    async def _look_for_windows(
        self, result: LaunchResult, before: set[int], names: set[str]
    ) -> tuple[str | None, list[XWindow]]:
        """Fill in the program's application and windows: 'atspi' when it has an accessible window, 'x11' when
        only X11 shows one (see :func:`~saucer.tools.desktop.programs.launched_windows`); and its X11 windows."""
        pids = await asyncio.to_thread(descendants, result.pid)
        mine: list[XWindow] = []
        with contextlib.suppress(DesktopError):
            mine = launched_windows(await self.connection.xcall(lambda d: d.windows()), pids, before, names)
        owners = pids | {w.pid for w in mine if w.pid is not None}
        with contextlib.suppress(DesktopError):
            for app in await self.connection.apps():
                if app.pid in owners:
                    result.app = app.name
                    titles = [w.name for w in app.windows if "showing" in w.states]
                    if titles:
                        result.windows, result.ready = titles, True
                        return "atspi", mine
        if mine:
            result.windows = [w.title for w in mine]
            return "x11", mine
        return None, mine

    def stop_programs(self) -> None:
        """Close the programs ``launch`` started like a user (blocking; see :func:`~saucer.tools.desktop.programs.close_programs`)."""
        close_programs(self.launcher, self.options.display)


def _png(image: Any) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "PNG", compress_level=3)
    return buffer.getvalue()


def _window(w: XWindow) -> WindowInfo:
    return WindowInfo(
        id=f"{w.id:#x}", title=w.title, app=w.app, pid=w.pid, bounds=[w.x, w.y, w.width, w.height], focused=w.focused
    )
