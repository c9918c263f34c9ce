"""Checking a command against a tool list before it runs: its tool name and its parameters.

The tool list is the one dispatchers publish (``list_tools()``, and what a
device sends when it registers): ``{"server.tool": {"input_schema": {...}, ...}}``.
A plan is checked with it before its session starts, so a typo in a tool
name is one clear error instead of a session that fails half-way::

    problem = command_problem("files.frobnicate", {}, tools)
    # "unknown tool 'files.frobnicate' (closest: files.read, files.write)"

Name resolution follows the local dispatcher: ``server.tool``, or a bare
``tool`` when exactly one server has it.

Parameters are checked with ``jsonschema``, which takes a tenth of a second
to import. Most commands are valid, and a valid command has no message to
word, so :class:`ParameterCheck` first tries a small checker of the schema
keywords tool schemas use (``type``, ``properties``, ``required``,
``additionalProperties``, ``items``, ``anyOf``): when it finds the parameters
valid they are, and ``jsonschema`` is never imported; anything else (a
problem, a keyword it does not know, a value it is unsure of) goes to
``jsonschema``, so every message is jsonschema's.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jsonschema.protocols import Validator

__all__ = [
    "command_problem",
    "resolve_tool",
    "schema_validator",
    "parameter_problem",
    "ParameterCheck",
    "close_names",
]

_Check = Callable[[Any], bool]

# JSON types as jsonschema's default type checker sees them, restricted to the values it surely accepts.
_TYPES: dict[str, _Check] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
}
_ANNOTATIONS = {"title": str, "description": str}
_KEYWORDS = {"type", "properties", "required", "additionalProperties", "items", "anyOf", "default", *_ANNOTATIONS}
_MAX_DEPTH = 32


def _always(value: Any) -> bool:
    return True


def _quick_check(schema: Any, depth: int = 0) -> _Check | None:
    """A check that is True only for values valid under ``schema``; None when the schema uses anything else.

    Only well-formed uses of the keywords above are taken (a schema taken here is
    valid for the 2020-12 metaschema); False means "not sure", never "invalid".
    """
    if schema is True:
        return _always
    if not isinstance(schema, dict) or depth > _MAX_DEPTH or not set(schema) <= _KEYWORDS:
        return None
    if any(key in schema and not isinstance(schema[key], kind) for key, kind in _ANNOTATIONS.items()):
        return None
    checks: list[_Check] = []
    if "type" in schema:
        names = [schema["type"]] if isinstance(schema["type"], str) else schema["type"]
        if not isinstance(names, list) or not names or len(set(map(str, names))) != len(names):
            return None
        if not all(isinstance(name, str) and name in _TYPES for name in names):
            return None
        kinds = [_TYPES[name] for name in names]
        checks.append(lambda v: any(kind(v) for kind in kinds))
    properties: dict[str, _Check] = {}
    if "properties" in schema:
        if not isinstance(schema["properties"], dict) or not all(isinstance(k, str) for k in schema["properties"]):
            return None
        for key, sub in schema["properties"].items():
            check = _quick_check(sub, depth + 1)
            if check is None:
                return None
            properties[key] = check
        checks.append(lambda v: not isinstance(v, dict) or all(c(v[k]) for k, c in properties.items() if k in v))
    if "required" in schema:
        required = schema["required"]
        if (
            not isinstance(required, list)
            or not all(isinstance(k, str) for k in required)
            or len(set(required)) != len(required)
        ):
            return None
        checks.append(lambda v: not isinstance(v, dict) or all(k in v for k in required))
    if "additionalProperties" in schema:
        extra = _quick_check(schema["additionalProperties"], depth + 1)
        if extra is None:
            return None
        checks.append(lambda v: not isinstance(v, dict) or all(extra(x) for k, x in v.items() if k not in properties))
    if "items" in schema:
        item = _quick_check(schema["items"], depth + 1)
        if item is None:
            return None
        checks.append(lambda v: not isinstance(v, list) or all(item(x) for x in v))
    if "anyOf" in schema:
        if not isinstance(schema["anyOf"], list) or not schema["anyOf"]:
            return None
        found = [_quick_check(sub, depth + 1) for sub in schema["anyOf"]]
        arms = [arm for arm in found if arm is not None]
        if len(arms) != len(found):
            return None
        checks.append(lambda v: any(arm(v) for arm in arms))
    return lambda v: all(check(v) for check in checks)


class ParameterCheck:
    """Checks parameters against one input schema; jsonschema is imported only when it has something to say."""

    def __init__(self, schema: Any) -> None:
        self.schema = schema
        self._quick = _quick_check(schema) if isinstance(schema, Mapping) else None
        self._validator: Validator | None = None
        self._loaded = False

    @property
    def validator(self) -> Validator | None:
        """The jsonschema validator (None when the schema itself is invalid), made on first use."""
        if not self._loaded:
            self._validator, self._loaded = schema_validator(self.schema), True
        return self._validator

    @property
    def schema_is_valid(self) -> bool:
        """Whether the schema is a valid JSON Schema (an invalid one checks nothing)."""
        return self._quick is not None or self.validator is not None

    def problem(self, parameters: Mapping[str, Any]) -> str | None:
        """What is wrong with ``parameters`` (jsonschema's message), or None."""
        if self._quick is not None:
            try:
                if self._quick(dict(parameters)):
                    return None
            except RecursionError:
                pass  # not sure: jsonschema says what it makes of it
        return parameter_problem(self.validator, parameters)


def close_names(word: str, candidates: list[str], n: int = 3) -> list[str]:
    """Up to ``n`` of ``candidates`` that look like ``word`` (case-insensitive), best first."""
    lowered = {c.lower(): c for c in candidates}
    found = difflib.get_close_matches(word.lower(), list(lowered), n=n, cutoff=0.6)
    return [lowered[f] for f in found]


def resolve_tool(name: str, tools: Mapping[str, Any]) -> str:
    """The qualified name ``name`` stands for; :class:`LookupError` saying why there is none."""
    if name in tools:
        return name
    owners = sorted(q for q in tools if q.partition(".")[2] == name)
    if len(owners) == 1:
        return owners[0]
    if len(owners) > 1:
        raise LookupError(
            f"ambiguous tool name {name!r}: it exists on several servers ({', '.join(owners)}); use server.tool"
        )
    bare = {q.partition(".")[2]: q for q in tools}
    guesses = close_names(name, sorted(tools))
    guesses += [bare[b] for b in close_names(name.rpartition(".")[2], sorted(bare)) if bare[b] not in guesses]
    hint = (
        f"closest: {', '.join(guesses[:3])}" if guesses else f"known tools: {', '.join(sorted(tools)[:10]) or 'none'}"
    )
    raise LookupError(f"unknown tool {name!r} ({hint})")


def schema_validator(schema: Any) -> Validator | None:
    """A JSON Schema validator for ``schema``; None when the schema itself is invalid (nothing to check)."""
    if not isinstance(schema, Mapping):
        return None
    schema = dict(schema)  # jsonschema's validators take a dict
    import jsonschema  # here: it takes a third of a second to import, and listing sessions needs none of it

    try:
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        cls.check_schema(schema)
    except jsonschema.SchemaError:
        return None
    return cls(schema)


def parameter_problem(validator: Validator | None, parameters: Mapping[str, Any]) -> str | None:
    """What is wrong with ``parameters`` according to ``validator`` (None: nothing, or no validator)."""
    if validator is None:
        return None
    from jsonschema.exceptions import best_match

    error = best_match(validator.iter_errors(dict(parameters)))
    if error is None:
        return None
    where = "/".join(str(part) for part in error.absolute_path)
    return f"{error.message}" + (f" (at {where!r})" if where else "")


def command_problem(tool_name: str, parameters: Mapping[str, Any], tools: Mapping[str, Any]) -> str | None:
    """Why a command for ``tool_name`` with ``parameters`` cannot run on ``tools``, or None."""
    try:
        qualified = resolve_tool(tool_name, tools)
    except LookupError as exc:
        return str(exc)
    info = tools[qualified]
    schema = info.get("input_schema") if isinstance(info, Mapping) else None
    problem = ParameterCheck(schema).problem(parameters)
    if problem is not None:
        return f"invalid parameters for tool {qualified!r}: {problem}"
    return None
