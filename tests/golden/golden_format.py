"""The expected-state files of the golden stores: how a state is written down and compared.

Shared by ``make_golden.py`` (which writes ``expected.json`` beside each store)
and ``test_golden_stores.py`` (which reads it). It depends on nothing of saucer
but the public ``Context``, so that it keeps working while the formats change.

A session's state at a version is *flat*: ``names.<NAME>`` for every entry of
``Context.to_dict()`` and ``vars.<KEY>`` for every context variable, each value
in a typed JSON form (:func:`encode`) that keeps what plain JSON would lose:

- a dict whose keys are not all strings (the per-round ledgers and
  ``STRUCTURAL_LOGS`` have int keys), or that has a key starting with ``$``,
  is ``{"$items": [[key, value], ...]}`` (sorted by key);
- an enum member is ``{"$enum": "WeavingMode.EDITING"}``;
- ints and floats stay apart (``1`` is not ``1.0``), and so do ``0.0`` and
  ``-0.0``: :func:`difference` compares types and float reprs.

States at successive versions are stored as deltas (``{"set": {...}, "unset":
[...]}``, the first against an empty state), because an engine session repeats
a ~12 KB ``TOOL_INFO`` at every version; :func:`expand` gives them back whole.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from enum import Enum
from pathlib import Path
from typing import Any

#: The version of this file layout (not of saucer's formats).
EXPECTED_FORMAT = 1
EXPECTED_FILE = "expected.json"


def encode(value: Any) -> Any:
    """The typed JSON form of a state value (see the module docs)."""
    if value is None or value.__class__ is bool:
        return value
    if isinstance(value, Enum):
        return {"$enum": f"{type(value).__name__}.{value.name}"}
    if value.__class__ in (int, float, str):
        return value
    if value.__class__ is list:
        return [encode(v) for v in value]
    if value.__class__ is dict:
        if all(k.__class__ is str and not k.startswith("$") for k in value):
            return {k: encode(v) for k, v in value.items()}
        items = [[encode(k), encode(v)] for k, v in value.items()]
        return {"$items": sorted(items, key=lambda kv: json.dumps(kv[0]))}
    raise TypeError(f"unexpected {type(value).__name__} in a Context state: {value!r:.80}")


def flat_state(ctx: Any) -> dict[str, Any]:
    """``names.*`` (every entry of ``ctx.to_dict()``) and ``vars.*`` of a Context, encoded."""
    data = ctx.to_dict()
    data.pop("_vars", None)
    flat = {f"names.{k}": encode(v) for k, v in data.items()}
    flat.update({f"vars.{k}": encode(v) for k, v in ctx.vars.items()})
    return flat


def difference(actual: Any, expected: Any, path: str = "") -> str | None:
    """Where two encoded values differ (types included), or None when they are the same."""
    if type(actual) is not type(expected):
        return f"{path or 'value'}: {type(actual).__name__} {_short(actual)} != expected {type(expected).__name__} {_short(expected)}"
    if isinstance(actual, float):
        return None if repr(actual) == repr(expected) else f"{path or 'value'}: {actual!r} != expected {expected!r}"
    if isinstance(actual, dict):
        if actual.keys() != expected.keys():
            extra = sorted(actual.keys() - expected.keys())
            missing = sorted(expected.keys() - actual.keys())
            return f"{path or 'value'}: keys differ (unexpected {extra}, missing {missing})"
        for key in expected:
            found = difference(actual[key], expected[key], f"{path}[{key!r}]")
            if found:
                return found
        return None
    if isinstance(actual, list):
        if len(actual) != len(expected):
            return f"{path or 'value'}: {len(actual)} items != expected {len(expected)}: {_short(actual)} vs {_short(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected, strict=False)):
            found = difference(a, e, f"{path}[{i}]")
            if found:
                return found
        return None
    return None if actual == expected else f"{path or 'value'}: {_short(actual)} != expected {_short(expected)}"


def _short(value: Any, width: int = 160) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= width else text[: width - 1] + "…"


def delta(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """What turns flat state ``before`` into ``after``."""
    changed = {k: v for k, v in after.items() if k not in before or difference(v, before[k]) is not None}
    return {"set": changed, "unset": sorted(k for k in before if k not in after)}


def expand(deltas: Mapping[str, Any]) -> Iterator[tuple[int, dict[str, Any] | None]]:
    """``(version, flat state)`` for each entry of a session's ``states`` (None: not checked)."""
    state: dict[str, Any] = {}
    for key, step in sorted(deltas.items(), key=lambda kv: int(kv[0])):
        if step is None:
            yield int(key), None
            continue
        state = {k: v for k, v in state.items() if k not in step["unset"]}
        state.update(step["set"])
        yield int(key), dict(state)


def compress(states: Mapping[int, dict[str, Any] | None]) -> dict[str, Any]:
    """The ``states`` entry of a session: deltas between successive versions."""
    out: dict[str, Any] = {}
    previous: dict[str, Any] = {}
    for version in sorted(states):
        state = states[version]
        if state is None:
            out[str(version)] = None
            continue
        out[str(version)] = delta(previous, state)
        previous = state
    return out


def dump(data: Any, path: Path) -> None:
    """Write an expected file: UTF-8, sorted keys, one line per session."""
    head = {k: v for k, v in data.items() if k != "sessions"}
    lines = [json.dumps(s, ensure_ascii=False, sort_keys=True) for s in data["sessions"]]
    text = json.dumps(head, ensure_ascii=False, sort_keys=True, indent=1)[:-2]
    path.write_text(text + ',\n "sessions": [\n' + ",\n".join(lines) + "\n ]\n}\n", encoding="utf-8")


def load(path: Path) -> dict[str, Any]:
    """Read an expected file, refusing a layout this reader does not know."""
    data = json.loads(path.read_text(encoding="utf-8"))
    if data.get("expected_format") != EXPECTED_FORMAT:
        raise ValueError(
            f"{path}: expected_format {data.get('expected_format')!r}, this reader knows {EXPECTED_FORMAT}"
        )
    return data


def json_roundtrip(value: Any) -> Any:
    """``value`` as it reads back from JSON (int dict keys become strings)."""
    return json.loads(json.dumps(value))


# ------------------------------------------------------------ PostgreSQL


def with_schema(url: str, schema: str) -> str:
    """A PostgreSQL store URL for ``schema``."""
    return f"{url}{'&' if '?' in url else '?'}schema={schema}"


def restore_dump(url: str, dump: str, dump_schema: str, schema: str) -> None:
    """Run a golden ``dump.sql`` (made from schema ``dump_schema``) into the new schema ``schema``, in one transaction."""
    import psycopg

    quoted = '"' + schema.replace('"', '""') + '"'
    text = dump.replace(f"{dump_schema}.", f"{quoted}.").replace(f"SCHEMA {dump_schema};", f"SCHEMA {quoted};")
    if dump_schema in text:
        at = text.index(dump_schema)
        raise ValueError(
            f"the dump names schema {dump_schema} where it cannot be renamed safely: {text[at - 80 : at + 80]!r}"
        )
    with psycopg.connect(url) as conn:
        conn.execute(text)  # no parameters: PostgreSQL runs the statements one after the other
