"""HTML of the viewer: one Jinja2 environment with autoescaping, and the filters its templates use.

Every stored value reaches the page through autoescaping (never ``|safe``);
a long value is cut with :func:`clip` and the page links to where it is shown
whole. Times are ``<time>`` elements in UTC that the page's script rewrites in
the viewer's local zone.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any
from urllib.parse import urlencode

import orjson
from jinja2 import ChainableUndefined, Environment, PackageLoader, select_autoescape
from markupsafe import Markup, escape

from saucer.store.summary import cost_text
from saucer.ui.steps import SEPARATORS
from saucer.ui.values import change_html, key_html, value_html

__all__ = ["templates", "render", "text_of", "clip", "CLIP"]

#: Characters of a value shown before it is cut (the full value is a link away).
CLIP = 300


def text_of(value: Any) -> str:
    """A value as text: a string as it is, anything else as compact JSON."""
    if isinstance(value, str):
        return value
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()
    except TypeError:
        return repr(value)


def pretty(value: Any) -> str:
    """A value as indented JSON (a string as it is)."""
    if isinstance(value, str):
        return value
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS | orjson.OPT_INDENT_2).decode()
    except TypeError:
        return repr(value)


def clip(value: Any, limit: int = CLIP) -> dict[str, Any]:
    """``{"text", "cut", "size"}``: the value as text, its first ``limit`` characters when ``cut``."""
    text = text_of(value)
    if len(text) <= limit:
        return {"text": text, "cut": False, "size": len(text)}
    return {"text": text[:limit], "cut": True, "size": len(text)}


def timestamp(ts: Any, relative: bool = False) -> Markup:
    """A ``<time>`` element: UTC in the markup, the viewer's local zone once the script ran
    (``relative``: "5 min ago", the local time as its tooltip)."""
    if not isinstance(ts, (int, float)) or isinstance(ts, bool) or not ts:
        return Markup("-")
    try:
        moment = _dt.datetime.fromtimestamp(ts, _dt.UTC)
    except (OverflowError, ValueError, OSError):  # a stored time no calendar can show: the number it is
        return Markup("{} (not a valid time)").format(repr(ts))
    iso = moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    flag = Markup(' data-relative="1"') if relative else Markup("")
    return Markup('<time datetime="{}"{}>{}</time>').format(iso, flag, moment.strftime("%Y-%m-%d %H:%M:%S UTC"))


def query(params: dict[str, Any]) -> str:
    """``?a=1&b=2`` (empty when there is nothing)."""
    return "?" + urlencode(params) if params else ""


def _number(value: Any, digits: int = 4) -> str:
    if value is None:
        return "unknown"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


templates = Environment(
    loader=PackageLoader("saucer.ui", "templates"),
    autoescape=select_autoescape(default=True, default_for_string=True),
    undefined=ChainableUndefined,  # a field an older record lacks renders as nothing
    trim_blocks=True,
    lstrip_blocks=True,
)


def seconds(value: Any) -> str:
    """A duration: ``850 ms``, ``12.3 s``, ``4 min 05 s``, ``2 h 03 min``."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return "-"
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 60:
        return f"{value:.1f} s"
    if value < 3600:
        return f"{int(value // 60)} min {int(value % 60):02d} s"
    return f"{int(value // 3600)} h {int(value % 3600 // 60):02d} min"


def _cost(row: Any) -> str:
    return cost_text(row["cost"], row["status"])


templates.filters.update(
    clip=clip,
    pretty=pretty,
    text=text_of,
    ts=timestamp,
    query=query,
    number=_number,
    value=value_html,
    keyname=key_html,
    seconds=seconds,
    cost=_cost,
)
templates.globals.update(escape=escape, change_html=change_html, separators=SEPARATORS)


def render(name: str, **values: Any) -> str:
    """Render the template ``name`` with ``values``."""
    return templates.get_template(name).render(**values)
