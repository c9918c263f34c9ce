"""The desktop's elements: finding them in an application's tree, and the one a call acts on.

An element is named by an id from a tree or a search (``ElementRegistry``), by
a selector (name, role, text), or -- for a plan replayed in a later session --
by a :class:`~saucer.tools.desktop.locator.Locator` describing where it stood.
Searches poll until a match appears or their timeout passes; a click goes to
the element whose click/press action clicks it (itself, or a parent around it).
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from saucer.tools.desktop import DesktopError
from saucer.tools.desktop.atspi import (
    ACCESSIBLE,
    APP_ROOT_PATH,
    COMPONENT,
    DETAILS,
    NULL_PATH,
    NodeInfo,
    pair,
    read_details,
    read_node,
)
from saucer.tools.desktop.connection import Connection
from saucer.tools.desktop.locator import Locator, describe, same_path, selector_name
from saucer.tools.desktop.targets import Target
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

if TYPE_CHECKING:
    from saucer.tools.desktop.options import DesktopOptions

__all__ = ["Elements", "check_range", "tree_limits"]

_CLICK_ACTIONS = ("click", "press")
_POLL = 0.1
_SEARCH_TEXT = 1000
# Seconds a replayed step waits for the element its locator describes (the window may still be opening).
_LOCATE_WAIT = 10.0


def check_range(name: str, value: float, low: float, high: float, flag: str) -> None:
    """Refuse a value beyond the server's caps (an error, never silently lowered)."""
    if not low <= value <= high:
        raise DesktopError(f"{name} must be between {low:g} and {high:g} (the server's {flag}), got {value:g}")


def tree_limits(
    options: DesktopOptions, max_depth: int, max_nodes: int, max_text: int, only_visible: bool, on_screen: bool = False
) -> TreeLimits:
    """Validated limits of one tree read (a value beyond the server's caps is an error, not silently lowered)."""
    check_range("max_depth", max_depth, 0, options.max_depth, "--max-depth")
    check_range("max_nodes", max_nodes, 1, options.max_nodes, "--max-nodes")
    check_range("max_text", max_text, 0, options.max_text, "--max-text")
    return TreeLimits(max_depth, max_nodes, max_text, only_visible, on_screen)


def _holds(outer: tuple[int, int, int, int] | None, inner: tuple[int, int, int, int] | None) -> bool:
    """Whether the centre of ``inner`` lies in ``outer`` (both as the toolkit reports them)."""
    if outer is None or inner is None:
        return False
    cx, cy = inner[0] + inner[2] / 2, inner[1] + inner[3] / 2
    return outer[0] <= cx <= outer[0] + outer[2] and outer[1] <= cy <= outer[1] + outer[3]


def _summary(node: dict[str, Any]) -> dict[str, Any]:
    return {key: node[key] for key in ("id", "role", "name", "bounds") if key in node}


class Elements:
    """Trees, searches and the element a call acts on, over one :class:`Connection`."""

    def __init__(self, connection: Connection, options: DesktopOptions) -> None:
        self.connection = connection
        self.options = options
        self.registry = ElementRegistry()

    async def walk(self, target: Target, limits: TreeLimits) -> Tree:
        """The tree of ``target`` within ``limits`` (its elements registered under ids)."""
        bus = await self.connection.atspi()
        return await build_tree(
            bus,
            target.ref,
            limits,
            self.registry,
            pid=target.pid,
            root_is_toplevel=target.is_window,
            offset_for=self.connection.window_offset,
        )

    async def search(
        self, selector: Selector, app: str | None, window: str | None, timeout: float, max_nodes: int
    ) -> tuple[list[tuple[dict[str, Any], list[str]]], Tree, Target]:
        """Matches of ``selector``, polling until one appears or ``timeout`` passes."""
        check_range("timeout", timeout, 0, self.options.max_wait, "--max-wait")
        limits = tree_limits(self.options, self.options.max_depth, max_nodes, _SEARCH_TEXT, True)
        # Names and roles are all a search needs of most nodes; the matches are completed afterwards.
        limits = replace(limits, parts=frozenset({"text"}) if selector.text is not None else frozenset())
        deadline = time.monotonic() + timeout
        while True:
            target = await self.connection.target(app, window)
            tree = await self.walk(target, limits)
            matches = find_matches(tree, selector)
            if matches or time.monotonic() >= deadline:
                break
            await asyncio.sleep(_POLL)
        if matches:
            await complete(await self.connection.atspi(), tree, [node["id"] for node, _ in matches], _SEARCH_TEXT)
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

    async def element(self, key: str, locator: Locator | None = None) -> tuple[NodeInfo, dict[str, Any]]:
        """The current state of the element behind an id, as a node with corrected bounds; by ``locator``
        when the id does not resolve (a plan saved in an earlier session) or its element is gone."""
        try:
            located: Located = self.registry.resolve(key)
            bus = await self.connection.atspi()
            info = await read_details(bus, await read_node(bus, located.ref), max_text=200, parts=DETAILS)
        except DesktopError:
            if locator is None:
                raise
            return await self.locate(locator)
        offset = (0, 0)
        if located.toplevel is not None and located.toplevel != located.ref:
            top = await read_node(bus, located.toplevel)
            if "Component" in top.interfaces:
                extents = await bus.call1(top.ref, COMPONENT, "GetExtents", "u", (0,))
                top.bounds = tuple(int(v) for v in extents)  # type: ignore[assignment]
            offset = await self.connection.window_offset(top, located.pid)
        elif located.toplevel == located.ref:
            offset = await self.connection.window_offset(info, located.pid)
        node: dict[str, Any] = {"id": key, "role": info.role, "name": info.name}
        if info.bounds is not None:
            x, y, w, h = info.bounds
            node["bounds"] = [x + offset[0], y + offset[1], w, h]
        return info, node

    async def locate(self, locator: Locator) -> tuple[NodeInfo, dict[str, Any]]:
        """The element ``locator`` describes (see :mod:`~saucer.tools.desktop.locator`), waiting a little for it."""
        selector = Selector(name=selector_name(locator.name), role=locator.role)
        try:
            matches, tree, target = await self.search(
                selector, locator.app, locator.window, _LOCATE_WAIT, self.options.max_nodes
            )
        except DesktopError:  # a title that changed: any window of the application
            matches, tree, target = await self.search(selector, locator.app, None, _LOCATE_WAIT, self.options.max_nodes)
        chosen = same_path(locator, matches, tree.nodes, not target.is_window)
        if len(chosen) > 1 and locator.indexes:
            bus = await self.connection.atspi()
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

    async def focus_window_of(self, info: NodeInfo) -> None:
        """Give the keyboard to the X11 window of the element's application unless it has it (a bare X server
        gives it to the window below the pointer)."""
        with contextlib.suppress(DesktopError):
            pid = await (await self.connection.atspi()).pid_of(info.ref[0])
            mine = [w for w in await self.connection.xcall(lambda d: d.windows()) if pid is not None and w.pid == pid]
            if mine and not any(w.focused for w in mine):
                await self.connection.xcall(lambda d: d.focus(mine[-1]))

    async def locator(self, info: NodeInfo | None) -> dict[str, Any] | None:
        """The stable description of an element acted on, for plans replayed later (None when unreadable)."""
        if info is None:
            return None
        with contextlib.suppress(DesktopError):
            return (await describe(await self.connection.atspi(), info.ref)).model_dump()
        return None

    async def chosen(
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
            return await self.element(element_id, locator)
        assert selector is not None
        matches, tree, _ = await self.search(selector, app, window, 0, self.options.max_nodes)
        if index is not None:
            if not 0 <= index < len(matches):
                raise DesktopError(
                    f"index {index} is out of range: {len(matches)} elements match {selector.describe()}"
                )
            chosen = [matches[index]]
        elif len(matches) > 1:
            owners = await asyncio.gather(*(self.action_owner(tree.infos[node["id"]]) for node, _ in matches))
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

    async def action_owner(self, info: NodeInfo) -> tuple[NodeInfo, int] | None:
        """The element whose click/press action clicks ``info``: itself, or a parent (two levels up at most)
        whose bounds hold the centre of ``info``, as a pointer click there would."""
        bus = await self.connection.atspi()
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
    def centre(node: dict[str, Any]) -> tuple[int, int]:
        bounds = node.get("bounds")
        if not bounds or bounds[2] <= 0 or bounds[3] <= 0:
            raise DesktopError(
                f"element {node['id']} ({node['role']} {node['name']!r}) has no size on the screen to click"
            )
        return bounds[0] + bounds[2] // 2, bounds[1] + bounds[3] // 2
