"""UI trees as JSON: element ids, the bounded breadth-first walk, and element selectors.

An element id is ``e`` + 10 base32 characters of a hash of the element's
AT-SPI address (its application's bus name and its object path). Toolkits
keep an object's path for the object's whole life (GTK 4: a UUID per widget),
so the same element has the same id in every tree this server reads, and a
tree saved before step 3 can be compared with the one saved before step 4.
An application that restarts gets a new bus name, hence new ids. The server
remembers which address each id it handed out stands for.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import re
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from saucer.tools.desktop import DesktopError
from saucer.tools.desktop.atspi import DETAILS, MANY_CHILDREN, AtspiBus, NodeInfo, Ref, read_details, read_node
from saucer.tools.linear import compile_linear

__all__ = [
    "ID_PATTERN",
    "element_id",
    "ElementRegistry",
    "TreeLimits",
    "Tree",
    "build_tree",
    "complete",
    "Selector",
    "find_matches",
]

ID_PATTERN = re.compile(r"^e[a-z2-7]{10}$")
_REGISTRY_SIZE = 200_000
_SEEN = frozenset({"showing", "visible"})
Offset = tuple[int, int]
#: For a top-level window: the offset to add to the bounds its toolkit reports (see targets.window_offset).
OffsetFor = Callable[[NodeInfo, int | None], Awaitable[Offset]]


def element_id(ref: Ref) -> str:
    """The stable id of the element at ``ref``: 50 bits of its hash, so ids of different elements practically
    never meet (a chance of one in 50,000 among the 200,000 ids a server remembers)."""
    digest = hashlib.blake2b(f"{ref[0]}\x00{ref[1]}".encode(), digest_size=8).digest()
    return "e" + base64.b32encode(digest).decode("ascii")[:10].lower()


@dataclass(frozen=True)
class Located:
    """Where an element id leads: the element, its top-level window and its application's process."""

    ref: Ref
    toplevel: Ref | None
    pid: int | None


class ElementRegistry:
    """The ids this server handed out and the elements they stand for (least recently seen dropped first)."""

    def __init__(self, size: int = _REGISTRY_SIZE) -> None:
        self._size = size
        self._known: OrderedDict[str, Located] = OrderedDict()

    def register(self, located: Located) -> str:
        key = element_id(located.ref)
        self._known[key] = located
        self._known.move_to_end(key)
        while len(self._known) > self._size:
            self._known.popitem(last=False)
        return key

    def resolve(self, key: str) -> Located:
        """The element behind ``key``; :class:`DesktopError` when it is malformed or unknown."""
        if not isinstance(key, str) or not ID_PATTERN.match(key):
            raise DesktopError(
                f"{key!r} is not an element id (ids look like 'e3kqx7mab2c' and come from ui_tree or find)"
            )
        located = self._known.get(key)
        if located is None:
            raise DesktopError(
                f"unknown element id {key!r}: ids come from the ui_tree and find results of this server; "
                "read the tree again (the element may belong to an application that was restarted)"
            )
        return located


@dataclass(frozen=True)
class TreeLimits:
    """How much of a tree to read."""

    max_depth: int
    max_nodes: int
    max_text: int
    only_visible: bool = True
    #: Also leave out elements placed entirely off the screen, with their children: GTK 3 lists the items of
    #: closed menus as visible, at (-2147483648, -2147483648). Elements of no size are kept (their content may show).
    on_screen: bool = False
    #: What to read of each node besides name, role, states and children (top-level windows always
    #: get their bounds, which place their descendants). A search reads less and completes its matches.
    parts: frozenset[str] = DETAILS


@dataclass
class Tree:
    """A walked tree: nested JSON nodes and what the limits cut off."""

    root: dict[str, Any] | None = None
    node_count: int = 0
    truncated: bool = False
    depth_limited: bool = False
    hidden: int = 0
    gone: int = 0
    infos: dict[str, NodeInfo] = field(default_factory=dict)
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    offsets: dict[str, Offset] = field(default_factory=dict)


def _node(info: NodeInfo, key: str, offset: Offset) -> dict[str, Any]:
    node: dict[str, Any] = {"id": key, "role": info.role, "name": info.name}
    if info.name_length > len(info.name):
        node["name_length"] = info.name_length
    if info.description:
        node["description"] = info.description
        if info.description_length > len(info.description):
            node["description_length"] = info.description_length
    if info.text:
        node["text"] = info.text
        if info.text_length > len(info.text):
            node["text_length"] = info.text_length
    if info.value is not None:
        node["value"] = info.value
    node["states"] = sorted(info.states)
    if info.bounds is not None:
        x, y, w, h = info.bounds
        node["bounds"] = [x + offset[0], y + offset[1], w, h]
    if info.actions:
        node["actions"] = info.actions
    return node


@dataclass
class _Pending:
    ref: Ref
    parent: dict[str, Any] | None
    depth: int
    toplevel: Ref | None
    offset: Offset
    is_toplevel: bool


async def build_tree(
    bus: AtspiBus,
    root: Ref,
    limits: TreeLimits,
    registry: ElementRegistry,
    *,
    pid: int | None,
    root_is_toplevel: bool,
    offset_for: OffsetFor,
) -> Tree:
    """Walk the tree under ``root`` breadth first, level by level; all the calls about one node are chained
    and all the nodes of a level are in flight at once.

    Stops at ``max_depth`` below the root and after ``max_nodes`` nodes (the
    shallow part of a big tree is kept, the deep part is cut). With
    ``only_visible``, nodes with neither the ``showing`` nor the ``visible``
    state are left out with their subtrees (GTK 4.8 sets ``showing`` on
    windows only); the root is always kept. Nodes that vanish during the
    walk are skipped and counted in ``gone``.
    """
    tree = Tree()
    level = [_Pending(root, None, 0, root if root_is_toplevel else None, (0, 0), root_is_toplevel)]
    seen = {root}

    async def read(item: _Pending, child_budget: int) -> NodeInfo | None:
        parts = limits.parts | ({"children", "bounds"} if item.is_toplevel else {"children"})
        budget = child_budget if item.depth < limits.max_depth else 0
        known = bus.static.get(item.ref)
        if known is None:
            info = await read_node(bus, item.ref)
            if limits.only_visible and item.parent is not None and not info.states & _SEEN:
                return None
            info = await read_details(bus, info, max_text=limits.max_text, child_budget=budget, parts=parts)
        else:
            # Read before: its role and interfaces are known, so everything is asked at once (one round trip).
            role, interfaces, count = known
            guess = NodeInfo(item.ref, "", role, frozenset(), interfaces, count)
            info, details = await asyncio.gather(
                read_node(bus, item.ref),
                read_details(bus, guess, max_text=limits.max_text, child_budget=budget, parts=parts),
            )
            if limits.only_visible and item.parent is not None and not info.states & _SEEN:
                return None
            if info.child_count and (not count or info.child_count > MANY_CHILDREN and count <= MANY_CHILDREN):
                details.children = []  # the children were not asked for, or not as many: ask now
                details = (
                    await read_details(bus, info, child_budget=budget, parts=frozenset({"children"}))
                    if budget
                    else details
                )
            info.children = details.children[: max(budget, 0)] if info.child_count else []
            info.bounds, info.text, info.text_length = details.bounds, details.text, details.text_length
            info.value, info.actions = details.value, details.actions
        if limits.on_screen and item.parent is not None and info.bounds is not None and not item.is_toplevel:
            x, y, w, h = info.bounds
            if (x + w <= 0 or y + h <= 0) and w > 0 and h > 0:
                return None
        return info

    while level:
        room = limits.max_nodes - tree.node_count
        if len(level) > room:
            level, tree.truncated = level[:room], True
        budget = room - len(level)  # what the next level may hold at most
        infos = await asyncio.gather(*(read(item, budget) for item in level), return_exceptions=True)
        next_level: list[_Pending] = []
        for item, info in zip(level, infos, strict=False):
            if info is None:
                tree.hidden += 1
                continue
            if isinstance(info, BaseException):
                if item.parent is None:
                    raise info
                tree.gone += 1
                continue
            offset = await offset_for(info, pid) if item.is_toplevel else item.offset
            toplevel = info.ref if item.is_toplevel else item.toplevel
            key = registry.register(Located(info.ref, toplevel, pid))
            node = _node(info, key, offset)
            tree.node_count += 1
            tree.infos[key], tree.nodes[key], tree.offsets[key] = info, node, offset
            if item.parent is None:
                tree.root = node
            else:
                item.parent.setdefault("children", []).append(node)
            if item.depth >= limits.max_depth and info.child_count:
                node["child_count"] = info.child_count
                tree.depth_limited = True
                continue
            if len(info.children) < info.child_count:
                node["child_count"] = info.child_count
                tree.truncated = True
            children_are_toplevel = info.role == "application"
            for child in info.children:
                if child in seen:  # a toolkit bug can make a cycle, or list a child twice
                    continue
                seen.add(child)
                next_level.append(_Pending(child, node, item.depth + 1, toplevel, offset, children_are_toplevel))
        level = next_level
    return tree


async def complete(bus: AtspiBus, tree: Tree, keys: list[str], max_text: int) -> None:
    """Read the details of the nodes ``keys`` of a tree walked with fewer ``parts`` (their nodes are updated)."""
    infos = await asyncio.gather(
        *(read_details(bus, tree.infos[key], max_text=max_text, parts=DETAILS) for key in keys), return_exceptions=True
    )
    for key, info in zip(keys, infos, strict=False):
        if isinstance(info, NodeInfo):
            tree.nodes[key].update(_node(info, key, tree.offsets[key]))


def _pattern(text: str | None, what: str) -> Callable[[str], bool] | None:
    """``re:REGEX`` searches; anything else is equal ignoring case and runs of white space."""
    if text is None:
        return None
    if text.startswith("re:"):
        try:  # in linear time: a model's pattern must not freeze the host (see saucer.tools.linear)
            compiled = compile_linear(text[3:])
        except ValueError as exc:
            raise DesktopError(f"{what} {text!r} is not a valid regular expression: {exc}") from None
        return compiled.search
    wanted = " ".join(text.split()).casefold()
    return lambda value: " ".join(value.split()).casefold() == wanted


@dataclass(frozen=True)
class Selector:
    """Elements by name, role and/or text (exact ignoring case and spacing, or ``re:REGEX``)."""

    name: str | None = None
    role: str | None = None
    text: str | None = None

    def __post_init__(self) -> None:
        if self.name is None and self.role is None and self.text is None:
            raise DesktopError("give at least one of name, role or text to select an element")
        for what in ("name", "role", "text"):
            _pattern(getattr(self, what), what)  # a bad regular expression is refused before any search

    def describe(self) -> str:
        parts = [
            f"{key}={value!r}"
            for key, value in (("name", self.name), ("role", self.role), ("text", self.text))
            if value is not None
        ]
        return ", ".join(parts)


def find_matches(tree: Tree, selector: Selector) -> list[tuple[dict[str, Any], list[str]]]:
    """The nodes of ``tree`` that ``selector`` matches, flat: each without children but with its ``path``
    (role and name of its ancestors), and beside it the ids of those ancestors, nearest last."""
    name, role, text = (
        _pattern(selector.name, "name"),
        _pattern(selector.role, "role"),
        _pattern(selector.text, "text"),
    )
    found: list[tuple[dict[str, Any], list[str]]] = []

    def visit(node: dict[str, Any], trail: list[str], ids: list[str]) -> None:
        if (
            (name is None or name(node.get("name", "")))
            and (role is None or role(node.get("role", "")))
            and (text is None or text(node.get("text", "")))
        ):
            found.append(({**{k: v for k, v in node.items() if k != "children"}, "path": list(trail)}, list(ids)))
        label = f"{node.get('role', '')} {node.get('name', '')!r}".strip()
        for child in node.get("children", ()):
            visit(child, [*trail, label], [*ids, node["id"]])

    if tree.root is not None:
        visit(tree.root, [], [])
    return found
