"""Values as readable HTML: pretty, collapsible JSON with visible types, and a change highlighted.

Every text goes through :func:`markupsafe.escape` (what is shown is what is
stored, invariant 10). A string is shown as it is, quoted, its newlines kept;
one longer than :data:`FOLD` characters is folded behind "show all". ``""``,
``null``, ``true``/``false`` and numbers each carry a class of their type so
the page shows them distinctly (an empty string is never a blank cell).
Objects and lists are ``<details>`` (open unless large), so a big value
collapses. :func:`change_html` shows a before → after pair with what changed
*inside* them marked: items appended to or removed from a list, keys added,
removed or changed in an object.
"""

from __future__ import annotations

from typing import Any

from markupsafe import Markup, escape

__all__ = ["value_html", "change_html", "key_html", "FOLD"]

#: Characters of a string shown before it is folded behind "show all".
FOLD = 400
#: Objects and lists with more items than this start collapsed.
_OPEN_UP_TO = 30
#: Items of one list or object rendered at most (the event page shows a value whole as JSON).
_ITEMS = 500
_DEPTH = 40


def key_html(name: str) -> Markup:
    """A key name that wraps only after ``_``, ``.`` or ``/`` (never inside a word)."""
    text = str(escape(name))
    for sep in ("_", ".", "/"):
        text = text.replace(sep, sep + "<wbr>")
    return Markup(f'<span class="keyname">{text}</span>')


def _string(text: str, mark: str = "") -> str:
    cls = f"v-str{mark}" if text else f"v-str v-empty{mark}"
    if len(text) <= FOLD:
        return f'<span class="{cls}">"{escape(text)}"</span>'
    head = escape(text[:FOLD])
    return (
        f'<span class="{cls} v-long"><details class="fold"><summary>"{head}… '
        f'<span class="more">show all {len(text)} characters</span></summary>"{escape(text)}"</details></span>'
    )


def _scalar(value: Any, mark: str = "") -> str:
    if value is None:
        return f'<span class="v-null{mark}">null</span>'
    if value is True or value is False:
        return f'<span class="v-bool{mark}">{"true" if value else "false"}</span>'
    if isinstance(value, (int, float)):
        return f'<span class="v-num{mark}">{escape(repr(value) if isinstance(value, float) else str(value))}</span>'
    if isinstance(value, str):
        return _string(value, mark)
    return f'<span class="v-other{mark}">{escape(repr(value))}</span>'


def _container(
    value: Any,
    depth: int,
    marks: dict[Any, str] | None = None,
    mark: str = "",
    removed: list[tuple[Any, Any]] | None = None,
) -> str:
    """A list or object as a collapsible block; ``marks`` maps an index or key to a change class."""
    is_list = isinstance(value, list)
    items = list(enumerate(value)) if is_list else list(value.items())
    opener, closer = ("[", "]") if is_list else ("{", "}")
    if not items and not removed:
        return f'<span class="v-empty-c{mark}">{opener}{closer}</span>'
    rows = []
    for k, v in items[:_ITEMS]:
        cls = (marks or {}).get(k, "")
        label = "" if is_list else f'<span class="v-key">{key_html(str(k))}</span>: '
        inner = _value(v, depth + 1)
        rows.append(f'<li class="{cls.strip()}">{label}{inner}</li>' if cls else f"<li>{label}{inner}</li>")
    if len(items) > _ITEMS:
        rows.append(f'<li class="muted">… {len(items) - _ITEMS} more (the event page shows the value whole)</li>')
    for k, v in removed or []:
        label = "" if is_list else f'<span class="v-key">{key_html(str(k))}</span>: '
        rows.append(f'<li class="ch-removed">{label}{_value(v, depth + 1)}</li>')
    size = f"{len(items)} item{'' if len(items) == 1 else 's'}"
    opened = " open" if len(items) <= _OPEN_UP_TO or marks else ""
    kind = "v-list" if is_list else "v-obj"
    return (
        f'<details class="{kind}{mark}"{opened}><summary>{opener} <span class="muted">{size}</span></summary>'
        f"<ul>{''.join(rows)}</ul>{closer}</details>"
    )


def _value(value: Any, depth: int = 0, mark: str = "") -> str:
    if depth > _DEPTH:
        return '<span class="muted">…</span>'
    if isinstance(value, (list, dict)):
        return _container(value, depth, mark=mark)
    return _scalar(value, mark)


def value_html(value: Any) -> Markup:
    """``value`` as readable HTML (see the module docs)."""
    return Markup(f'<div class="val">{_value(value)}</div>')


def _list_change(before: list[Any], after: list[Any]) -> tuple[dict[Any, str], list[tuple[Any, Any]], str]:
    """Marks for the items of ``after``, the items of ``before`` no longer there, and a one-line summary."""
    n, m = len(before), len(after)
    if m >= n and after[:n] == before:
        return {i: " ch-added" for i in range(n, m)}, [], f"{m - n} appended"
    if m < n and before[:m] == after:
        return {}, [(i, before[i]) for i in range(m, n)], f"{n - m} removed from the end"
    if m < n and before[n - m :] == after:
        return {}, [(i, before[i]) for i in range(n - m)], f"{n - m} removed from the start"
    if m > n and after[m - n :] == before:
        return {i: " ch-added" for i in range(m - n)}, [], f"{m - n} inserted at the start"
    marks = {i: " ch-changed" for i in range(min(n, m)) if before[i] != after[i]}
    marks.update({i: " ch-added" for i in range(n, m)})
    removed = [(i, before[i]) for i in range(m, n)]
    parts = [f"{len([1 for v in marks.values() if v == ' ch-changed'])} changed"]
    if m > n:
        parts.append(f"{m - n} added")
    if removed:
        parts.append(f"{len(removed)} removed")
    return marks, removed, ", ".join(parts)


def _dict_change(before: dict[str, Any], after: dict[str, Any]) -> tuple[dict[Any, str], list[tuple[Any, Any]], str]:
    marks = {k: " ch-added" for k in after if k not in before}
    marks.update({k: " ch-changed" for k in after if k in before and before[k] != after[k]})
    removed = [(k, v) for k, v in before.items() if k not in after]
    added = sum(1 for v in marks.values() if v == " ch-added")
    parts = [f"{added} key{'' if added == 1 else 's'} added"] if added else []
    changed = len(marks) - added
    if changed:
        parts.append(f"{changed} changed")
    if removed:
        parts.append(f"{len(removed)} removed")
    return marks, removed, ", ".join(parts) or "no change"


def change_html(before: Any, after: Any, *, missing_before: bool = False, missing_after: bool = False) -> Markup:
    """A before → after pair; inside a list or an object, the parts that changed are marked
    (``ch-added``, ``ch-removed``, ``ch-changed``) in the after value, with a summary line."""
    left = '<span class="muted">(not set)</span>' if missing_before else _value(before)
    if missing_after:
        return Markup(
            f'<div class="change"><div class="before val ch-removed">{left}</div><div class="arrow">→</div>'
            f'<div class="after val"><span class="muted">(deleted)</span></div></div>'
        )
    summary = ""
    if not missing_before and isinstance(before, list) and isinstance(after, list):
        marks, removed, summary = _list_change(before, after)
        right = _container(after, 0, marks, removed=removed)
    elif not missing_before and isinstance(before, dict) and isinstance(after, dict):
        marks, removed, summary = _dict_change(before, after)
        right = _container(after, 0, marks, removed=removed)
    else:
        right = _value(after, mark=" ch-changed" if not missing_before else " ch-added")
    note = f'<div class="change-summary muted">{escape(summary)}</div>' if summary else ""
    return Markup(
        f'<div class="change">{note}<div class="before val">{left}</div><div class="arrow">→</div>'
        f'<div class="after val">{right}</div></div>'
    )
