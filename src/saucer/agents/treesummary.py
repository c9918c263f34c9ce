"""The UI tree as a model reads it: what is on the screen, the most useful elements first, in a small budget.

:func:`summarize_tree` turns a ``desktop.ui_tree`` answer into one line per
element (id, role, "name", text=..., [x,y,w,h], states). It keeps what is
*showing* and on the screen: a node the toolkit marks as not showing (GTK 3
lists every item of a closed menu as visible, at ``[-2147483648, ...]``) is
left out with its subtree, and a node of no size or outside the screen is
not listed (its children still may be). The lines are then spent by
importance, not in the tree's breadth-first order:

0. the window itself, the focused element and editable text (with its text,
   so what the model typed is in its next observation);
1. what can be acted on: buttons, entries, check boxes, menus, tabs, list
   items, table cells, links, sliders;
2. labels, headings and other named elements;
3. the rest (unnamed elements with an action, named containers).

Within a rank the focused window comes first, then the tree's order. A
button whose only content is a label is one line, named by the label (GTK 4
names the button "2 2" or "GtkButton" and its label "2").
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["summarize_tree", "SUMMARY_LINES", "SUMMARY_CHARS"]

#: Default budget of a summary: lines and characters.
SUMMARY_LINES = 60
SUMMARY_CHARS = 3000
_EDIT_TEXT = 600
_CONTAINERS = frozenset(
    {
        "group",
        "filler",
        "panel",
        "widget",
        "section",
        "scroll pane",
        "viewport",
        "layered pane",
        "split pane",
        "page tab list",
        "tool bar",
        "menu bar",
        "directory pane",
        "grouping",
    }
)
_ACTIONABLE = frozenset(
    {
        "push button",
        "button",
        "toggle button",
        "check box",
        "radio button",
        "combo box",
        "menu",
        "menu item",
        "check menu item",
        "radio menu item",
        "page tab",
        "list item",
        "table cell",
        "tree item",
        "link",
        "entry",
        "password text",
        "spin button",
        "slider",
        "text",
        "text box",
        "icon",
        "toggle",
        "switch",
        "cell",
    }
)
_LABELS = frozenset(
    {"label", "static", "heading", "paragraph", "statusbar", "caption", "title bar", "alert", "info bar"}
)
_BUTTONS = frozenset({"push button", "button", "toggle button"})
_WINDOWS = frozenset({"frame", "window", "dialog", "alert", "file chooser", "application"})
_CLASS_NAME = re.compile(r"^(Gtk|Adw|Gdk|Gizmo|AdwGizmo)[A-Z]?[A-Za-z]*$")
_SHOWN_STATES = ("focused", "checked", "selected", "pressed", "expanded", "editable", "read_only")


@dataclass
class _Entry:
    rank: int
    window: int
    order: int
    line: str


def _on_screen(bounds: Any, screen: Sequence[int] | None) -> bool:
    if not (isinstance(bounds, list) and len(bounds) == 4):
        return True  # no bounds: nothing says it is off the screen
    x, y, w, h = bounds
    if w <= 1 or h <= 1 or x + w <= 0 or y + h <= 0:
        return False
    return not (screen and (x >= screen[0] or y >= screen[1]))


def _name(node: Mapping[str, Any]) -> str:
    """The node's name, empty when it is only a toolkit class name (GTK 4 names unnamed widgets so: 'GtkButton')."""
    name = str(node.get("name") or "")
    return "" if _CLASS_NAME.match(name) else name


def _button_label(node: Mapping[str, Any]) -> str | None:
    """The name of the one label inside a button, when the button's own name says nothing more."""
    if node.get("role") not in _BUTTONS:
        return None
    children = [c for c, _ in _walk(node) if c is not node and c.get("name")]
    if len(children) != 1 or children[0].get("role") != "label":
        return None
    label, own = str(children[0].get("name") or ""), _name(node)
    if label and (not own or own in (label, f"{label} {label}")):
        return label
    return None


def _line(node: Mapping[str, Any], name: str, max_text: int) -> str:
    parts = [f"{node.get('id', '?')} {node.get('role', '?')}"]
    if name:
        parts.append(repr(name[:max_text]))
    editable = "editable" in (node.get("states") or ())
    for key in ("text", "value"):
        value = node.get(key)
        if value in (None, "") or value == name:
            continue
        limit = _EDIT_TEXT if editable and key == "text" else max_text
        shown = str(value)[:limit]
        parts.append(f"{key}={shown!r}")
        full = node.get("text_length") if key == "text" else None
        if isinstance(full, int) and full > len(shown) or len(str(value)) > limit:
            parts.append(f"({full or len(str(value))} characters)")
    bounds = node.get("bounds")
    if isinstance(bounds, list) and len(bounds) == 4:
        parts.append("[" + ",".join(str(v) for v in bounds) + "]")
    states = [s for s in _SHOWN_STATES if s in (node.get("states") or ())]
    if states:
        parts.append(" ".join(states))
    return " ".join(parts)


def _rank(node: Mapping[str, Any], name: str, is_root: bool) -> int | None:
    """The importance of a node (0 first), or None when it is not worth a line."""
    states = node.get("states") or ()
    role = str(node.get("role") or "")
    if is_root or "focused" in states or "editable" in states or role in _WINDOWS:
        return 0
    has_content = bool(name) or node.get("text") or node.get("value") not in (None, "")
    if role in _ACTIONABLE and has_content:
        return 1
    if has_content and role not in _CONTAINERS:
        return 1 if node.get("actions") else 2
    if node.get("actions") or (name and role in _CONTAINERS and role not in ("filler", "panel")):
        return 3
    return None


def summarize_tree(
    tree: Mapping[str, Any] | None,
    *,
    screen: Sequence[int] | None = None,
    max_lines: int = SUMMARY_LINES,
    max_chars: int = SUMMARY_CHARS,
    max_text: int = 80,
) -> str:
    """A UI tree (the ``tree`` of a ``desktop.ui_tree`` answer) as at most ``max_lines`` lines and about
    ``max_chars`` characters a model can act on (see the module docstring); ``screen`` is [width, height].
    A last line says how many elements were left out."""
    if not tree:
        return "(no tree)"
    nodes = list(_walk(tree))
    showing_aware = any("showing" in (n.get("states") or ()) for n, _ in nodes[1:])
    entries: list[_Entry] = []
    hidden = 0
    order = 0
    window_rank = 0
    stack: list[tuple[Mapping[str, Any], int, bool]] = [(tree, 0, True)]
    while stack:
        node, window, is_root = stack.pop()
        states = node.get("states") or ()
        if not is_root and showing_aware and "showing" not in states:
            hidden += 1
            continue  # a closed menu, a hidden page: with everything in it
        children = [c for c in node.get("children") or () if isinstance(c, Mapping)]
        label = _button_label(node)
        name = label if label is not None else _name(node)
        if is_root or _on_screen(node.get("bounds"), screen):
            rank = _rank(node, name, is_root)
            if rank is not None:
                entries.append(_Entry(rank, window, order, _line(node, name, max_text)))
                order += 1
        elif node.get("bounds") is not None:
            hidden += 1
        if label is not None:
            children = []
        if is_root and node.get("role") == "application":
            # The windows of an application: the active one first.
            ranked = sorted(range(len(children)), key=lambda i: "active" not in (children[i].get("states") or ()))
            window_of = {i: r for r, i in enumerate(ranked)}
            stack.extend((children[i], window_of[i], False) for i in reversed(range(len(children))))
            window_rank = max(window_rank, len(children))
        else:
            stack.extend((child, window, False) for child in reversed(children))
    entries.sort(key=lambda e: (e.rank, e.window, e.order))
    lines: list[str] = []
    size = 0
    for entry in entries:
        if len(lines) >= max_lines or size + len(entry.line) + 1 > max_chars:
            break
        lines.append(entry.line)
        size += len(entry.line) + 1
    left_out = len(entries) - len(lines)
    if left_out or hidden:
        lines.append(f"(... {left_out} more elements not listed; {hidden} hidden or off the screen)")
    return "\n".join(lines)


def _walk(node: Mapping[str, Any]) -> Any:
    stack = [(node, 0)]
    while stack:
        current, depth = stack.pop()
        yield current, depth
        stack.extend((c, depth + 1) for c in reversed(current.get("children") or ()) if isinstance(c, Mapping))
