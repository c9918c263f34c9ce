"""The desktop itself: connections to X11 and AT-SPI, and one method per tool.

:class:`Desktop` connects on first use (so the server starts, and lists its
tools, even where there is no display) and reconnects after the display or
the bus went away. Its methods run one at a time (one lock): a click must
not land in the middle of a tree read. X11 calls block, so they run in a
worker thread; AT-SPI calls are asyncio. Every failure is a
:class:`~saucer.tools.desktop.DesktopError` whose message says what to do.
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import functools
import io
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from saucer.tools.confine import Policy
from saucer.tools.desktop import DesktopError
from saucer.tools.desktop.apps import Launcher, descendants, split_command
from saucer.tools.desktop.artifacts import Artifacts
from saucer.tools.desktop.atspi import (
    ACCESSIBLE,
    ACTION,
    APP_ROOT_PATH,
    COMPONENT,
    DETAILS,
    NULL_PATH,
    AtspiBus,
    NodeInfo,
    find_bus_address,
    pair,
    read_details,
    read_node,
)
from saucer.tools.desktop.locator import Locator, describe, same_path, selector_name
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
from saucer.tools.desktop.programs import close_programs, launched_windows, program_names
from saucer.tools.desktop.targets import App, Target, active_windows, choose, list_apps, pick, window_offset
from saucer.tools.desktop.tree import (
    ElementRegistry,
    Located,
    Selector,
    Tree,
    TreeLimits,
    build_tree,
    complete,
    find_matches,
)
from saucer.tools.desktop.x11 import X11, X_LOST, X_REFUSED, XWindow, parse_keys

__all__ = ["DesktopOptions", "Desktop"]

T = TypeVar("T")
_CLICK_ACTIONS = ("click", "press")
_POLL = 0.1
_SEARCH_TEXT = 1000
# Largest scaled screenshot (8K UHD); scaling up a whole large screen would take gigabytes.
_MAX_PIXELS = 7680 * 4320
# Seconds a program whose window X11 shows may take to appear on the accessibility bus before launch calls it
# ready anyway (a toolkit without accessibility never does). GTK 4 registers within a second on an idle machine,
# but took more than one on a loaded one: a plan's next ui_tree(app=...) then found no such application.
_X11_ONLY_GRACE = 5.0
# Seconds a replayed step waits for the element its locator describes (the window may still be opening).
_LOCATE_WAIT = 10.0


@dataclass(frozen=True)
class DesktopOptions:
    """Where artifacts go, which display to use, and the limits of one call."""

    artifacts: Path
    display: str | None = None
    max_nodes: int = 5000
    max_depth: int = 100
    max_text: int = 10_000
    call_timeout: float = 5.0
    max_wait: float = 120.0
    max_type: int = 10_000
    keep_apps: bool = False
    #: How launched programs are confined (None: the default policy, writing to the working directory,
    #: the artifacts and a private temporary folder).
    policy: Policy | None = None

    def confinement(self) -> Policy:
        """:attr:`policy`, or the default one for this working directory and artifacts folder."""
        return self.policy or Policy.create("auto", (Path.cwd(), self.artifacts), scoped=False)


def _check_range(name: str, value: float, low: float, high: float, flag: str) -> None:
    if not low <= value <= high:
        raise DesktopError(f"{name} must be between {low:g} and {high:g} (the server's {flag}), got {value:g}")


def _holds(outer: tuple[int, int, int, int] | None, inner: tuple[int, int, int, int] | None) -> bool:
    """Whether the centre of ``inner`` lies in ``outer`` (both as the toolkit reports them)."""
    if outer is None or inner is None:
        return False
    cx, cy = inner[0] + inner[2] / 2, inner[1] + inner[3] / 2
    return outer[0] <= cx <= outer[0] + outer[2] and outer[1] <= cy <= outer[1] + outer[3]


def _summary(node: dict[str, Any]) -> dict[str, Any]:
    return {key: node[key] for key in ("id", "role", "name", "bounds") if key in node}


class Desktop:
    """One X11 display and its accessibility bus, as used by the tools."""

    def __init__(self, options: DesktopOptions) -> None:
        self.options = options
        self.registry = ElementRegistry()
        self.launcher = Launcher(options.confinement())
        self._x: X11 | None = None
        self._bus: AtspiBus | None = None
        self.artifacts = Artifacts(options.artifacts)
        self._lock = asyncio.Lock()
        #: The X root window's ``AT_SPI_BUS`` when it named a bus that is gone (programs are then told the live one).
        self.stale_bus_property: str | None = None

    # -- connections ------------------------------------------------------------------------------
    async def _xcall(self, fn: Callable[[X11], T]) -> T:
        if self._x is None:
            self._x = await asyncio.to_thread(X11, self.options.display)
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
        return await self._xcall(lambda x: x.bus_address_property())

    async def _atspi(self) -> AtspiBus:
        if self._bus is not None and self._bus.closed:
            await self._bus.close()
            self._bus = None
        if self._bus is None:
            timeout = self.options.call_timeout
            display = self.options.display or os.environ.get("DISPLAY")
            stale: list[str] = []
            address = await find_bus_address(self._x_bus_property if display else None, timeout, stale)
            self._bus = await AtspiBus.connect(address, timeout)
            self.stale_bus_property = stale[-1] if stale else None
        return self._bus

    async def _bus_for_programs(self, env: dict[str, str]) -> None:
        """Point a program at the live accessibility bus when the X root window names a stale one (a toolkit
        reads that property before it asks the session bus, and would stay off the bus)."""
        if env.get("AT_SPI_BUS_ADDRESS") or env.get("NO_AT_BRIDGE") == "1" or env.get("GTK_A11Y") == "none":
            return
        with contextlib.suppress(DesktopError):
            bus = await self._atspi()
            if self.stale_bus_property is not None:
                env["AT_SPI_BUS_ADDRESS"] = bus.address

    async def aclose(self) -> None:
        """Close the connections and stop the programs ``launch`` started (unless ``keep_apps``)."""
        if not self.options.keep_apps:
            await asyncio.to_thread(self.stop_programs)
        if self._bus is not None:
            await self._bus.close()
            self._bus = None
        if self._x is not None:
            self._x.close()
            self._x = None

    # -- applications and windows -----------------------------------------------------------------
    async def _apps(self) -> list[App]:
        return await list_apps(await self._atspi())

    async def _target(self, app: str | None, window: str | None) -> Target:
        apps = await self._apps()
        focused = None
        if not app and not window and len(active_windows(apps)) != 1:
            with contextlib.suppress(DesktopError):
                focused = next((w for w in await self._xcall(lambda x: x.windows()) if w.focused), None)
        return choose(apps, app, window, focused)

    async def _window_offset(self, window: NodeInfo, pid: int | None) -> tuple[int, int]:
        if window.bounds is None or window.bounds[:2] != (0, 0) or pid is None:
            return (0, 0)  # nothing to ask X11 (see targets.window_offset)
        try:
            xwindows = await self._xcall(lambda x: x.windows())
        except DesktopError:
            return (0, 0)
        return window_offset(window, pid, xwindows)

    # -- trees ------------------------------------------------------------------------------------
    def limits(
        self, max_depth: int, max_nodes: int, max_text: int, only_visible: bool, on_screen: bool = False
    ) -> TreeLimits:
        """Validated limits (a value beyond the server's caps is an error, not silently lowered)."""
        o = self.options
        _check_range("max_depth", max_depth, 0, o.max_depth, "--max-depth")
        _check_range("max_nodes", max_nodes, 1, o.max_nodes, "--max-nodes")
        _check_range("max_text", max_text, 0, o.max_text, "--max-text")
        return TreeLimits(max_depth, max_nodes, max_text, only_visible, on_screen)

    async def _walk(self, target: Target, limits: TreeLimits) -> Tree:
        bus = await self._atspi()
        return await build_tree(
            bus,
            target.ref,
            limits,
            self.registry,
            pid=target.pid,
            root_is_toplevel=target.is_window,
            offset_for=self._window_offset,
        )

    async def ui_tree(
        self, app: str | None, window: str | None, limits: TreeLimits, save_as: str | None, include_tree: bool
    ) -> UITree:
        async with self._lock:
            started = time.perf_counter()
            target = await self._target(app, window)
            tree = await self._walk(target, limits)
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

    async def _search(
        self, selector: Selector, app: str | None, window: str | None, timeout: float, max_nodes: int
    ) -> tuple[list[tuple[dict[str, Any], list[str]]], Tree, Target]:
        """Matches of ``selector``, polling until one appears or ``timeout`` passes."""
        _check_range("timeout", timeout, 0, self.options.max_wait, "--max-wait")
        limits = self.limits(self.options.max_depth, max_nodes, _SEARCH_TEXT, True)
        # Names and roles are all a search needs of most nodes; the matches are completed afterwards.
        limits = replace(limits, parts=frozenset({"text"}) if selector.text is not None else frozenset())
        deadline = time.monotonic() + timeout
        while True:
            target = await self._target(app, window)
            tree = await self._walk(target, limits)
            matches = find_matches(tree, selector)
            if matches or time.monotonic() >= deadline:
                break
            await asyncio.sleep(_POLL)
        if matches:
            await complete(await self._atspi(), tree, [node["id"] for node, _ in matches], _SEARCH_TEXT)
            matches = find_matches(tree, selector)  # again: a text may have changed meanwhile
        if not matches:
            names = sorted({info.name for info in tree.infos.values() if info.name})
            close = difflib.get_close_matches(selector.name or selector.text or "", names, n=5) if names else []
            where = f"window {target.window!r}" if target.window else f"application {target.app!r}"
            raise DesktopError(
                f"no element with {selector.describe()} in {where}"
                + (f" after {timeout:g} s" if timeout else "")
                + f" ({tree.node_count} elements read{', cut at max_nodes' if tree.truncated else ''})"
                + (f"; similar names: {', '.join(repr(n) for n in close)}" if close else "")
            )
        return matches, tree, target

    async def find(
        self, selector: Selector, app: str | None, window: str | None, timeout: float, max_nodes: int
    ) -> FindResult:
        async with self._lock:
            started = time.perf_counter()
            matches, tree, _ = await self._search(selector, app, window, timeout, max_nodes)
            return FindResult(
                matches=[node for node, _ in matches],
                node_count=tree.node_count,
                truncated=tree.truncated,
                seconds=round(time.perf_counter() - started, 4),
            )

    async def _element(self, key: str, locator: Locator | None = None) -> tuple[NodeInfo, dict[str, Any]]:
        """The current state of the element behind an id, as a node with corrected bounds; by ``locator``
        when the id does not resolve (a plan saved in an earlier session) or its element is gone."""
        try:
            located: Located = self.registry.resolve(key)
            bus = await self._atspi()
            info = await read_details(bus, await read_node(bus, located.ref), max_text=200, parts=DETAILS)
        except DesktopError:
            if locator is None:
                raise
            return await self._locate(locator)
        offset = (0, 0)
        if located.toplevel is not None and located.toplevel != located.ref:
            top = await read_node(bus, located.toplevel)
            if "Component" in top.interfaces:
                extents = await bus.call1(top.ref, COMPONENT, "GetExtents", "u", (0,))
                left, top_y, width, height = (int(v) for v in extents)
                top.bounds = (left, top_y, width, height)
            offset = await self._window_offset(top, located.pid)
        elif located.toplevel == located.ref:
            offset = await self._window_offset(info, located.pid)
        node: dict[str, Any] = {"id": key, "role": info.role, "name": info.name}
        if info.bounds is not None:
            x, y, w, h = info.bounds
            node["bounds"] = [x + offset[0], y + offset[1], w, h]
        return info, node

    async def _locate(self, locator: Locator) -> tuple[NodeInfo, dict[str, Any]]:
        """The element ``locator`` describes (see :mod:`~saucer.tools.desktop.locator`), waiting a little for it."""
        selector = Selector(name=selector_name(locator.name), role=locator.role)
        try:
            matches, tree, target = await self._search(
                selector, locator.app, locator.window, _LOCATE_WAIT, self.options.max_nodes
            )
        except DesktopError:  # a title that changed: any window of the application
            matches, tree, target = await self._search(
                selector, locator.app, None, _LOCATE_WAIT, self.options.max_nodes
            )
        chosen = same_path(locator, matches, tree.nodes, not target.is_window)
        if len(chosen) > 1 and locator.indexes:
            bus = await self._atspi()
            places = await asyncio.gather(
                *(describe(bus, tree.infos[n["id"]].ref) for n, _ in chosen), return_exceptions=True
            )
            chosen = [
                m
                for m, d in zip(chosen, places, strict=False)
                if isinstance(d, Locator) and d.indexes == locator.indexes
            ] or chosen
        node = chosen[0][0]
        return tree.infos[node["id"]], _summary(node)

    async def _focus_window_of(self, info: NodeInfo) -> None:
        """Give the keyboard to the X11 window of the element's application unless it has it (a bare X server
        gives it to the window below the pointer)."""
        with contextlib.suppress(DesktopError):
            pid = await (await self._atspi()).pid_of(info.ref[0])
            mine = [w for w in await self._xcall(lambda d: d.windows()) if pid is not None and w.pid == pid]
            if mine and not any(w.focused for w in mine):
                await self._xcall(lambda d: d.focus(mine[-1]))

    async def _locator(self, info: NodeInfo | None) -> dict[str, Any] | None:
        """The stable description of an element acted on, for plans replayed later (None when unreadable)."""
        if info is None:
            return None
        with contextlib.suppress(DesktopError):
            return (await describe(await self._atspi(), info.ref)).model_dump()
        return None

    async def _chosen(
        self,
        element_id: str | None,
        selector: Selector | None,
        app: str | None,
        window: str | None,
        index: int | None,
        locator: Locator | None = None,
    ) -> tuple[NodeInfo, dict[str, Any]]:
        """The element to act on: by id, or the one match of a selector.

        When several elements match, the only one that can be clicked (it, or
        a parent around it, has a click/press action) is taken: a label
        "=" inside the "=" button wins over a label "=" in a history list.
        """
        if element_id is not None:
            return await self._element(element_id, locator)
        assert selector is not None
        matches, tree, _ = await self._search(selector, app, window, 0, self.options.max_nodes)
        if index is not None:
            if not 0 <= index < len(matches):
                raise DesktopError(
                    f"index {index} is out of range: {len(matches)} elements match {selector.describe()}"
                )
            chosen = [matches[index]]
        elif len(matches) > 1:
            owners = await asyncio.gather(*(self._action_owner(tree.infos[node["id"]]) for node, _ in matches))
            chosen = [match for match, owner in zip(matches, owners, strict=False) if owner is not None]
        else:
            chosen = matches
        if len(chosen) != 1:
            listed = "; ".join(f"{m['id']} {m['role']} {m['name']!r} at {m.get('bounds')}" for m, _ in matches[:10])
            raise DesktopError(
                f"{len(matches)} elements match {selector.describe()}: {listed}; pass index (0-based), a role or an element id"
            )
        node = chosen[0][0]
        return tree.infos[node["id"]], _summary(node)

    async def _action_owner(self, info: NodeInfo) -> tuple[NodeInfo, int] | None:
        """The element whose click/press action clicks ``info``: itself, or a parent (two levels up at most)
        whose bounds hold the centre of ``info``, as a pointer click there would."""
        bus = await self._atspi()
        current = info
        for _ in range(3):
            names = [a.casefold() for a in current.actions]
            position = next((names.index(n) for n in _CLICK_ACTIONS if n in names), None)
            if position is not None and (current is info or _holds(current.bounds, info.bounds)):
                return current, position
            try:
                parent = pair(await bus.get(current.ref, ACCESSIBLE, "Parent"))
                if parent is None:
                    return None
                parent_ref = (str(parent[0]), str(parent[1]))
                if not parent_ref[0] or parent_ref[1] in (NULL_PATH, APP_ROOT_PATH):
                    return None  # the application itself is not a widget to click
                current = await read_details(
                    bus, await read_node(bus, parent_ref), parts=frozenset({"bounds", "actions"})
                )
            except DesktopError:
                return None
        return None

    @staticmethod
    def _centre(node: dict[str, Any]) -> tuple[int, int]:
        bounds = node.get("bounds")
        if not bounds or bounds[2] <= 0 or bounds[3] <= 0:
            raise DesktopError(
                f"element {node['id']} ({node['role']} {node['name']!r}) has no size on the screen to click"
            )
        return bounds[0] + bounds[2] // 2, bounds[1] + bounds[3] // 2

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
                await self._xcall(lambda d: d.click(x, y, button, count))
                return ClickResult(method="pointer", x=x, y=y, button=button, count=count)
            info, node = await self._chosen(element_id, selector, app, window, index, locator)
            where = await self._locator(info)
            if method != "pointer" and button == "left" and not double:
                owner = await self._action_owner(info)
                if owner is not None:
                    actor, position = owner
                    bus = await self._atspi()
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
            px, py = self._centre(node)
            await self._xcall(lambda d: d.click(px, py, button, count))
            return ClickResult(method="pointer", x=px, y=py, button=button, count=count, element=node, locator=where)

    async def type_text(
        self, text: str, element_id: str | None, delay: float, locator: Locator | None = None
    ) -> TypeResult:
        if len(text) > self.options.max_type:
            raise DesktopError(f"text is {len(text)} characters; at most {self.options.max_type} per call")
        async with self._lock:
            node = where = None
            if element_id is not None:
                info, node = await self._element(element_id, locator)
                where = await self._locator(info)
                await self._focus_window_of(info)
                focused = False
                if "Component" in info.interfaces:
                    bus = await self._atspi()
                    with contextlib.suppress(DesktopError):
                        focused = await bus.call1(info.ref, COMPONENT, "GrabFocus")
                if not focused:
                    px, py = self._centre(node)
                    await self._xcall(lambda d: d.click(px, py))
            await self._xcall(lambda d: d.type_text(text, delay))
            return TypeResult(characters=len(text), element=node, locator=where)

    async def press_keys(self, keys: str, delay: float) -> KeysResult:
        if len(keys) > self.options.max_type:
            raise DesktopError(f"keys is {len(keys)} characters; at most {self.options.max_type} per call")
        combos = parse_keys(keys)
        async with self._lock:
            await self._xcall(lambda d: d.press(combos, delay))
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
                info, node = await self._element(element_id, locator)
                where = await self._locator(info)
                px, py = self._centre(node)
            elif x is None or y is None:
                px, py = await self._xcall(lambda d: d.pointer())
            else:
                px, py = x, y
            await self._xcall(lambda d: d.scroll(px, py, direction, amount))
            return ScrollResult(direction=direction, amount=amount, x=px, y=py, locator=where)

    async def screenshot(self, region: list[int] | None, scale: float | None, name: str | None) -> Screenshot:
        async with self._lock:
            width, height = await self._xcall(lambda d: d.screen_size())
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
            image = await self._xcall(lambda d: d.capture(*box))
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
            found = await self._xcall(lambda d: d.windows())
            chosen = None
            if focus is not None:
                by_id = [w for w in found if focus.lower() in (f"{w.id:#x}", str(w.id))]
                matches = by_id or pick(found, focus, lambda w: w.title, "window")
                if len(matches) > 1:
                    listed = ", ".join(f"{w.id:#x} {w.title!r}" for w in matches)
                    raise DesktopError(f"several windows match {focus!r}: {listed}; give the window id")
                target = matches[0]
                await self._xcall(lambda d: d.focus(target))
                found = await self._xcall(lambda d: d.windows())
                chosen = next((_window(w) for w in found if w.id == target.id), None)
            return WindowsResult(windows=[_window(w) for w in found], focused=chosen)

    async def launch(self, command: str | list[str], wait: float, env: dict[str, str] | None) -> LaunchResult:
        argv = split_command(command)
        _check_range("wait", wait, 0, self.options.max_wait, "--max-wait")
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
                await self._xcall(lambda d: None)  # raises the no-display error with its advice
            await self._bus_for_programs(child_env)
            before: set[int] = set()
            with contextlib.suppress(DesktopError):
                before = {w.id for w in await self._xcall(lambda d: d.windows())}
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
                    await self._xcall(lambda d: d.focus(mine[-1]))
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
            mine = launched_windows(await self._xcall(lambda d: d.windows()), pids, before, names)
        owners = pids | {w.pid for w in mine if w.pid is not None}
        with contextlib.suppress(DesktopError):
            for app in await self._apps():
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
