"""Checking a command against a tool list before it runs: its tool name and its parameters.

The tool list is the one dispatchers publish (``list_tools()``, and what a
device sends when it registers): ``{"server.tool": {"input_schema": {...}, ...}}``.
A plan is checked with it before its session starts, so a typo in a tool
name is one clear error instead of a session that fails half-way::

    problem = command_problem("files.frobnicate", {}, tools)
    # "unknown tool 'files.frobnicate' (closest: files.read, files.write)"

Name resolution follows the local dispatcher: ``server.tool``, or a bare
``tool`` when exactly one server has it.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

__all__ = ["command_problem", "resolve_tool", "schema_validator", "parameter_problem", "close_names"]


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
        raise LookupError(f"ambiguous tool name {name!r}: it exists on several servers ({', '.join(owners)}); use server.tool")
    bare = {q.partition(".")[2]: q for q in tools}
    guesses = close_names(name, sorted(tools))
    guesses += [bare[b] for b in close_names(name.rpartition(".")[2], sorted(bare)) if bare[b] not in guesses]
    hint = f"closest: {', '.join(guesses[:3])}" if guesses else f"known tools: {', '.join(sorted(tools)[:10]) or 'none'}"
    raise LookupError(f"unknown tool {name!r} ({hint})")


def schema_validator(schema: Any) -> Any:
    """A JSON Schema validator for ``schema``; None when the schema itself is invalid (nothing to check)."""
    if not isinstance(schema, Mapping):
        return None
    import jsonschema  # here: it takes a third of a second to import, and listing sessions needs none of it

    try:
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        cls.check_schema(schema)
    except jsonschema.SchemaError:
        return None
    return cls(schema)


def parameter_problem(validator: Any, parameters: Mapping[str, Any]) -> str | None:
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
    problem = parameter_problem(schema_validator(schema), parameters)
    if problem is not None:
        return f"invalid parameters for tool {qualified!r}: {problem}"
    return None
