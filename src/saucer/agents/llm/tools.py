"""Tool schemas for the model, built from ``TOOL_INFO``.

saucer names tools ``server.tool``; OpenAI function names must match
``^[a-zA-Z0-9_-]{1,64}$``. :class:`ToolSet` maps each saucer name to a safe
function name (``server.tool`` → ``server__tool``; other characters become
``_``; collisions and over-long names get a short hash suffix) and keeps the
table, so the mapping is reversible for every tool it offered.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "ToolSpec",
    "ToolSet",
    "FlagsSensitiveTools",
    "GatesSensitiveCommands",
    "to_function_name",
    "short_description",
    "compact_schema",
]


@runtime_checkable
class FlagsSensitiveTools(Protocol):
    """A dispatcher that names tools as sensitive besides ``TOOL_INFO``'s flags (optional)."""

    sensitive_tools: Iterable[str]


@runtime_checkable
class GatesSensitiveCommands(Protocol):
    """A dispatcher that asks about sensitive commands itself (it says why a command is sensitive);
    the agent then does not ask again (:class:`~saucer.dispatch.local.LocalCommandDispatcher`)."""

    async def sensitive_reason(self, command: Any) -> str | None: ...


_INVALID = re.compile(r"[^a-zA-Z0-9_-]")
_MAX_NAME = 64
_SCHEMA_KEYS = ("input_schema", "inputSchema", "parameters", "schema", "input")
_EMPTY_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}


def to_function_name(name: str) -> str:
    """The OpenAI-safe form of a saucer tool name (not yet de-duplicated)."""
    safe = _INVALID.sub("_", name.replace(".", "__")) or "tool"
    if len(safe) > _MAX_NAME:
        safe = safe[: _MAX_NAME - 9] + "_" + hashlib.sha1(name.encode()).hexdigest()[:8]
    return safe


@dataclass(frozen=True)
class ToolSpec:
    """One tool as offered to the model."""

    name: str
    function_name: str
    description: str
    parameters: dict[str, Any]
    sensitive: bool = False
    tool_type: str = "action"

    def schema(self) -> dict[str, Any]:
        """The OpenAI ``tools`` entry."""
        return {
            "type": "function",
            "function": {"name": self.function_name, "description": self.description, "parameters": self.parameters},
        }


def short_description(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, at the end of a sentence when one fits (``limit`` 0: whole).

    Tool descriptions are sent with every call: the built-in tools' full
    descriptions made most of a ~2,000-token first prompt.
    """
    text = " ".join(text.split())
    if limit <= 0 or len(text) <= limit:
        return text
    window = text[: limit + 1]
    end = max(window.rfind(". "), window.rfind(".\n"), window.rfind("; "))
    if end >= limit // 3:
        return text[: end + 1].rstrip(";") if text[end] == "." else text[:end] + "."
    cut = window.rfind(" ", 0, limit - 1)
    return text[: cut if cut > 0 else limit - 1].rstrip(",;:") + "…"


def compact_schema(schema: Any, limit: int) -> Any:
    """A JSON schema as the model needs it: no ``title``, short descriptions, ``X or null`` as ``X``.

    The dispatcher still validates arguments against the tool's own schema;
    this is only what the model reads. ``limit`` 0 keeps descriptions whole.
    """
    if isinstance(schema, list):
        return [compact_schema(item, limit) for item in schema]
    if not isinstance(schema, Mapping):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "title" and isinstance(value, str):
            continue
        if key == "description" and isinstance(value, str):
            out[key] = short_description(value, max(limit // 2, 60) if limit else 0)
        elif key == "properties" and isinstance(value, Mapping):
            out[key] = {name: compact_schema(prop, limit) for name, prop in value.items()}
        else:
            out[key] = compact_schema(value, limit)
    options = out.get("anyOf")
    if isinstance(options, list) and len(options) == 2 and {"type": "null"} in options:
        # An optional parameter (pydantic's ``X | None = None``): the model may simply leave it out.
        other = options[0] if options[1] == {"type": "null"} else options[1]
        del out["anyOf"]
        if out.get("default", 0) is None:
            del out["default"]
        if isinstance(other, Mapping):
            out = {**other, **out}
    return out


def _schema_of(info: Mapping[str, Any]) -> dict[str, Any]:
    for key in _SCHEMA_KEYS:
        value = info.get(key)
        if isinstance(value, Mapping):
            schema = dict(value)
            schema.setdefault("type", "object")
            if schema.get("type") == "object":
                schema.setdefault("properties", {})
            return schema
    return dict(_EMPTY_SCHEMA)


@dataclass
class ToolSet:
    """The tools offered to the model and the reversible name table."""

    specs: list[ToolSpec] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._by_function = {s.function_name: s for s in self.specs}
        self._by_name = {s.name: s for s in self.specs}

    @classmethod
    def from_tool_info(
        cls,
        tool_info: Mapping[str, Any] | None,
        *,
        sensitive: set[str] | frozenset[str] | None = None,
        description_chars: int = 0,
    ) -> ToolSet:
        """Tools from ``TOOL_INFO`` (``"server.tool" -> {description, input schema, ...}``).

        A tool is sensitive when its info says ``"sensitive": true`` or its
        name is in ``sensitive``. ``description_chars`` > 0 sends short
        descriptions and compact schemas (:func:`short_description`,
        :func:`compact_schema`).
        """
        specs: list[ToolSpec] = []
        used: set[str] = set()
        for name in sorted(tool_info or {}):
            info = (tool_info or {})[name]
            info = info if isinstance(info, Mapping) else {"description": str(info)}
            fn = to_function_name(name)
            if fn in used:
                fn = fn[: _MAX_NAME - 9] + "_" + hashlib.sha1(name.encode()).hexdigest()[:8]
            used.add(fn)
            description = str(info.get("description") or info.get("title") or name)
            parameters = _schema_of(info)
            if description_chars:
                description = short_description(description, description_chars)
                parameters = compact_schema(parameters, description_chars)
            specs.append(
                ToolSpec(
                    name=name,
                    function_name=fn,
                    description=description,
                    parameters=parameters,
                    sensitive=bool(info.get("sensitive")) or name in (sensitive or ()),
                    tool_type="data_collection" if info.get("tool_type") == "data_collection" else "action",
                )
            )
        return cls(specs)

    def schemas(self) -> list[dict[str, Any]]:
        """The ``tools`` parameter of a chat completion request."""
        return [s.schema() for s in self.specs]

    def resolve(self, function_name: str) -> ToolSpec | None:
        """The tool behind a function name the model called (None when it was never offered)."""
        return self._by_function.get(function_name) or self._by_name.get(function_name)

    def saucer_name(self, function_name: str) -> str:
        """The ``server.tool`` name for a function name (best guess for one never offered)."""
        spec = self.resolve(function_name)
        if spec is not None:
            return spec.name
        return function_name.replace("__", ".")

    def get(self, name: str) -> ToolSpec | None:
        """The tool called ``name`` (a saucer name)."""
        return self._by_name.get(name)

    def with_tools(self, *extra: ToolSpec) -> ToolSet:
        """This set plus ``extra`` (a function name already offered is not added twice)."""
        return ToolSet(self.specs + [spec for spec in extra if self.resolve(spec.function_name) is None])

    def without(self, *function_names: str) -> ToolSet:
        """This set less the tools of these function names."""
        return ToolSet([spec for spec in self.specs if spec.function_name not in function_names])

    def names(self) -> list[str]:
        """The saucer names of the tools, sorted."""
        return [s.name for s in self.specs]

    def __len__(self) -> int:
        return len(self.specs)

    def __bool__(self) -> bool:
        return bool(self.specs)
