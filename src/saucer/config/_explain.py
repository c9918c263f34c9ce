"""How a bad setting is explained: one sentence per problem, naming the key and where it came from.

Split from :mod:`saucer.config` (the settings model) so each stays one concern: this module turns
flags into nested overrides and a ``ValidationError`` into the sentence of a :class:`ConfigError`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import SecretStr, ValidationError

ENV_PREFIX = "SAUCER_"

#: Short environment variable forms -> settings path.
_ENV_ALIASES: dict[str, tuple[str, str]] = {
    "SAUCER_STORE_URL": ("store", "url"),
    "SAUCER_LLM_BASE_URL": ("llm", "base_url"),
    "SAUCER_LLM_API_KEY": ("llm", "api_key"),
    "SAUCER_LLM_MODEL": ("llm", "model"),
}


class ConfigError(ValueError):
    """Settings could not be loaded; the message is one sentence naming the key and its source."""


def _nest(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``{"system.max_step": 3}`` or ``{"system": {"max_step": 3}}`` -> nested dict; None values are skipped."""
    out: dict[str, Any] = {}
    for key, value in overrides.items():
        if value is None:
            continue
        if isinstance(value, Mapping) and "." not in key:
            inner = _nest(value)
            if inner:
                out.setdefault(key, {}).update(inner)
            continue
        parts = key.split(".")
        node = out
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {key!r} conflicts with another override")
        node[parts[-1]] = value
    return out


def _has_path(data: Any, loc: tuple[Any, ...]) -> bool:
    for part in loc:
        if not isinstance(data, Mapping) or part not in data:
            return False
        data = data[part]
    return True


def _env_var_for(loc: tuple[Any, ...]) -> str | None:
    nested = ENV_PREFIX + "__".join(str(p).upper() for p in loc)
    for var in os.environ:
        if var.upper() == nested:
            return var
    if len(loc) >= 2:
        for var, path in _ENV_ALIASES.items():
            if path == tuple(loc[:2]) and os.environ.get(var):
                return var
    return None


def _describe(exc: ValidationError, overrides: dict[str, Any], file_path: Path, file_data: dict[str, Any]) -> str:
    """One sentence per problem, each naming the key and its source."""
    sentences = []
    for error in exc.errors():
        loc = tuple(error["loc"])
        dotted = ".".join(str(p) for p in loc) or "(settings)"
        if error["type"] == "extra_forbidden":
            problem = "unknown key"
        else:
            problem = error["msg"][0].lower() + error["msg"][1:]
            if "input" in error and not isinstance(error["input"], (dict, list)):
                value = error["input"]
                if isinstance(value, SecretStr):
                    value = "**********"
                problem += f" (got {value!r})"
        if _has_path(overrides, loc):
            source, where = "overrides", f"override {dotted}"
        elif (var := _env_var_for(loc)) is not None:
            source = where = f"environment variable {var}"
        elif _has_path(file_data, loc):
            source, where = str(file_path), f"{file_path}: {dotted}"
        else:
            source, where = "settings", f"setting {dotted}"
        if error["type"] == "extra_forbidden":
            sentences.append(f"{source}: unknown key {dotted!r}")
        else:
            sentences.append(f"{where}: {problem}")
    return "; ".join(sentences)
