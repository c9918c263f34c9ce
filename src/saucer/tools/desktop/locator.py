"""Stable descriptions of elements, for plans replayed in a later session.

An element id names one element of one running application instance (its
bus name is part of it), so a plan that clicks ``e3kqx7mab2c`` cannot be
replayed once the application restarted. With every action on an element
the server therefore returns a *locator*::

    {"app": "mousepad", "window": "Untitled 1 - Mousepad", "role": "text", "name": "",
     "path": ["frame", "filler", "page tab list", "page tab", "scroll pane"], "indexes": [0, 0, 4, 0, 0, 0]}

(``path``: the roles from the top-level window down to the element's parent;
``indexes``: each one's position among its siblings, the element's last).
A plan saved as experience keeps it beside the id, and when the id does not
resolve the server finds the element again by it: the
same role and name in the application's window of that title (or any of its
windows: titles change, e.g. "*Untitled 1" once edited), preferring the same
path of roles, then the same positions.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, Field

from saucer.tools.desktop import DesktopError
from saucer.tools.desktop.atspi import ACCESSIBLE, APP_ROOT_PATH, NULL_PATH, AtspiBus, Ref, pair

__all__ = ["Locator", "describe", "same_path", "selector_name"]

_MAX_LEVELS = 64


class Locator(BaseModel):
    """Where an element is, in words that outlive the application instance (see the module docstring)."""

    app: str = Field(description="Application name on the accessibility bus.")
    window: str | None = Field(None, description="Title of its top-level window.")
    role: str
    name: str = ""
    path: list[str] = Field(default_factory=list, description="Roles from the top-level window down to its parent.")
    indexes: list[int] = Field(
        default_factory=list, description="Position of each among its siblings, the element's last."
    )


async def _step(bus: AtspiBus, ref: Ref) -> tuple[str, str, int, Ref | None]:
    """Role, name, index in parent and parent of ``ref``."""
    role = str(await bus.call1(ref, ACCESSIBLE, "GetRoleName"))
    name = str(await bus.get(ref, ACCESSIBLE, "Name") or "")
    index = int(await bus.call1(ref, ACCESSIBLE, "GetIndexInParent"))
    parent = pair(await bus.get(ref, ACCESSIBLE, "Parent"))
    if parent is None or not parent[0] or str(parent[1]) == NULL_PATH:
        return role, name, index, None
    return role, name, index, (str(parent[0]), str(parent[1]))


async def describe(bus: AtspiBus, ref: Ref) -> Locator:
    """The locator of the element at ``ref``, read by walking up to its application."""
    role, name, index, parent = await _step(bus, ref)
    roles: list[str] = []
    indexes = [index]
    window: str | None = None
    app = ""
    current = parent
    for _ in range(_MAX_LEVELS):
        if current is None:
            break
        if current[1] == APP_ROOT_PATH:
            app = str(await bus.get(current, ACCESSIBLE, "Name") or "")
            break
        r, n, i, up = await _step(bus, current)
        roles.insert(0, r)
        indexes.insert(0, i)
        window = n
        current = up
    if current is None or current[1] != APP_ROOT_PATH:
        raise DesktopError(f"the element {ref[1]} of {ref[0]} is not inside an application's window")
    if not roles:  # the element is a top-level window itself
        window = name
    return Locator(app=app, window=window, role=role, name=name, path=roles, indexes=indexes)


def same_path(
    locator: Locator,
    matches: list[tuple[dict[str, Any], list[str]]],
    nodes: dict[str, dict[str, Any]],
    root_is_app: bool,
) -> list[tuple[dict[str, Any], list[str]]]:
    """The matches (from :func:`~saucer.tools.desktop.tree.find_matches`: node and ancestor ids) whose path of
    roles is the locator's; all of them when none is."""

    def roles(ids: list[str]) -> list[str]:
        found = [str(nodes[i].get("role", "")) for i in ids if i in nodes]
        return found[1:] if root_is_app else found  # the application is not part of the path

    return [(node, ids) for node, ids in matches if roles(ids) == locator.path] or matches


def selector_name(name: str) -> str:
    """A selector name that matches ``name`` exactly (a name that starts with ``re:`` is escaped)."""
    return "re:^" + re.escape(name) + "$" if name.startswith("re:") else name
