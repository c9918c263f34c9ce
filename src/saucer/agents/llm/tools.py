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
from dataclasses import dataclass, field
from typing import Any, Mapping

__all__ = ["ToolSpec", "ToolSet", "to_function_name"]

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
    ) -> "ToolSet":
        """Tools from ``TOOL_INFO`` (``"server.tool" -> {description, input schema, ...}``).

        A tool is sensitive when its info says ``"sensitive": true`` or its
        name is in ``sensitive``.
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
            description = info.get("description") or info.get("title") or name
            specs.append(
                ToolSpec(
                    name=name,
                    function_name=fn,
                    description=str(description),
                    parameters=_schema_of(info),
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

    def names(self) -> list[str]:
        """The saucer names of the tools, sorted."""
        return [s.name for s in self.specs]

    def __len__(self) -> int:
        return len(self.specs)

    def __bool__(self) -> bool:
        return bool(self.specs)
