"""saucer's settings: one typed model, read from a file, the environment and flags.

Precedence, lowest to highest::

    defaults  <  saucer.toml (or --config FILE)  <  SAUCER_* variables  <  explicit overrides (flags)

Environment variables use ``SAUCER_`` and ``__`` between levels, e.g.
``SAUCER_SYSTEM__MAX_STEP=20`` or ``SAUCER_STORE__URL=memory://``. A few
short forms are accepted too (lower precedence than the ``__`` form):
``SAUCER_STORE_URL``, ``SAUCER_LLM_BASE_URL``, ``SAUCER_LLM_API_KEY`` and
``SAUCER_LLM_MODEL``. Other ``SAUCER_*`` variables without ``__`` (such as
the test switches ``SAUCER_TEST_*``) are not settings and are ignored.

Unknown keys and values of the wrong type are a :class:`ConfigError` whose
message names the key and where it came from (the file, the variable or the
override). Example ``saucer.toml``: ``[system]`` ``max_step = 30``, ``[store]``
``url = "sqlite:///.saucer/saucer.db"``; every key is in the README's Configuration table.
"""

from __future__ import annotations

import os
import types
from collections.abc import Mapping
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, SecretStr, ValidationError

from saucer.config._explain import _ENV_ALIASES, ENV_PREFIX, ConfigError, _describe, _nest
from saucer.config._model import (
    _CONFIG_FILE,
    DEFAULT_CONFIG_FILE,
    DEFAULT_MCP_TIMEOUT,
    AgentsSettings,
    ApprovalSettings,
    DesktopSettings,
    LLMSettings,
    LogsSettings,
    MCPServerConfig,
    MCPSettings,
    MCPTransport,
    QueueSettings,
    SaveExperience,
    ServiceDeviceSettings,
    ServiceSettings,
    SettingsModel,
    StoreSettings,
    SystemSettings,
    _read_toml,
)
from saucer.config.shell import ShellSettings

if TYPE_CHECKING:
    from saucer.config._env import Settings

__all__ = [
    "ConfigError",
    "Settings",
    "SettingsModel",
    "DEFAULT_MCP_TIMEOUT",
    "MCPTransport",
    "SystemSettings",
    "StoreSettings",
    "MCPSettings",
    "MCPServerConfig",
    "AgentsSettings",
    "LogsSettings",
    "LLMSettings",
    "ServiceSettings",
    "QueueSettings",
    "DesktopSettings",
    "ServiceDeviceSettings",
    "ShellSettings",
    "ApprovalSettings",
    "SaveExperience",
    "load_settings",
    "DEFAULT_CONFIG_FILE",
    "ENV_PREFIX",
]


def __getattr__(name: str) -> Any:
    # Settings (pydantic-settings) is imported only by who asks for it: a run with nothing to read builds the
    # plain SettingsModel instead (see load_settings), and pydantic-settings costs ~75 M instructions to import.
    if name == "Settings":
        from saucer.config._env import Settings

        return Settings
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_SCALARS = (str, int, float, bool, Path, Enum, SecretStr)


def _plain(annotation: Any) -> bool:
    """Whether pydantic-settings passes a variable for this field on as its string (no JSON decoding)."""
    origin = get_origin(annotation)
    if origin is Literal:
        return True
    if origin is Union or origin is types.UnionType:
        return all(arg is type(None) or _plain(arg) for arg in get_args(annotation))
    return isinstance(annotation, type) and issubclass(annotation, _SCALARS)


def _plain_environment() -> dict[str, Any] | None:
    """The settings the ``SAUCER_*`` environment gives, when every one is a ``SAUCER_SECTION__KEY`` of a plain
    value (or a short alias); None when pydantic-settings must read it (whole sections, deeper keys, JSON values,
    unknown keys, names differing only in case)."""
    fields = SettingsModel.model_fields
    prefix = ENV_PREFIX.lower()
    out: dict[str, dict[str, Any]] = {}
    seen: set[str] = set()
    for name, value in os.environ.items():
        low = name.lower()
        if not low.startswith(prefix):
            continue
        if low in seen:
            return None
        seen.add(low)
        section, nested, key = low[len(prefix) :].partition("__")
        if section not in fields:
            continue  # not a setting (SAUCER_TEST_*...), or a short alias (read below)
        model = fields[section].annotation
        if not nested or not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None
        field = model.model_fields.get(key)
        if field is None or not _plain(field.annotation):
            return None
        out.setdefault(section, {})[key] = value
    for var, (section, key) in _ENV_ALIASES.items():  # lower precedence than the __ form
        alias = os.environ.get(var)
        if alias is not None and alias != "":
            out.setdefault(section, {}).setdefault(key, alias)
    return out


def _deep_update(base: dict[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``update`` merged in, dictionaries key by key (as pydantic-settings merges its sources)."""
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_update(merged[key], value)
        else:
            merged[key] = value
    return merged


def _without_sources(
    path: Path | None, file_data: dict[str, Any] | None, nested: dict[str, Any]
) -> SettingsModel | None:
    """The settings built without pydantic-settings, when there is no file to read and the environment is plain."""
    if path is not None or file_data is not None or os.path.lexists(DEFAULT_CONFIG_FILE):
        return None
    env = _plain_environment()
    if env is None:
        return None
    return _assembled(_deep_update(env, nested))


def _assembled(values: dict[str, Any]) -> SettingsModel:
    """``SettingsModel(**values)``, validating only the sections ``values`` gives.

    The models are built on first use (``defer_build``), and building them all is most of what reading
    the settings costs (~120 M instructions, for a run that reads two sections): a section not given is
    its defaults, made without validation (a test keeps them equal to the validated ones). Anything but
    sections of keys, or a value a section refuses, goes through the whole model (whose error names the
    section).
    """
    fields = SettingsModel.model_fields
    if not all(name in fields and isinstance(value, dict) for name, value in values.items()):
        return SettingsModel(**values)
    sections: dict[str, Any] = {}
    try:
        for name, info in fields.items():
            model = info.annotation
            assert isinstance(model, type) and issubclass(model, BaseModel)
            sections[name] = model(**values[name]) if name in values else model.model_construct()
    except ValidationError:
        return SettingsModel(**values)
    return SettingsModel.model_construct(_fields_set=set(values), **sections)


def load_settings(
    config_file: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    *,
    file_data: dict[str, Any] | None = None,
) -> SettingsModel:
    """Read the settings: defaults < ``config_file`` (default ``./saucer.toml``) < ``SAUCER_*`` < ``overrides``.

    ``overrides`` holds flag values, nested (``{"system": {"max_step": 3}}``) or
    dotted (``{"system.max_step": 3}``); None values are ignored, so unset flags
    can be passed as they are. ``file_data``: the file's settings, already read (by a reader of
    another format, e.g. UFO's YAML in :mod:`saucer.ufo_config`). Raises :class:`ConfigError` naming the key and its source.

    With no file and no ``SAUCER_*`` variable that needs pydantic-settings, the result is a plain
    :class:`SettingsModel` equal to what :class:`Settings` would read (pydantic-settings is not imported).
    """
    path = Path(config_file) if config_file is not None else None
    nested = _nest(overrides or {})
    token = _CONFIG_FILE.set((path, file_data))
    try:
        try:
            settings = _without_sources(path, file_data, nested)
            if settings is None:
                from saucer.config._env import Settings

                settings = Settings(**nested)
        except ValidationError as exc:
            file_path = path if path is not None else Path(DEFAULT_CONFIG_FILE)
            file_data = file_data if file_data is not None else _read_toml(file_path, required=False)
            raise ConfigError(_describe(exc, nested, file_path, file_data)) from None
    finally:
        _CONFIG_FILE.reset(token)
    used = path if path is not None else (Path(DEFAULT_CONFIG_FILE) if Path(DEFAULT_CONFIG_FILE).is_file() else None)
    settings._config_file = used
    return settings
