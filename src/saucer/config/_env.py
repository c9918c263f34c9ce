"""pydantic-settings' reading of the settings (:class:`Settings`): imported only when a file or a variable is read."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from saucer.config._explain import _ENV_ALIASES, ENV_PREFIX
from saucer.config._model import _CONFIG_FILE, DEFAULT_CONFIG_FILE, SettingsModel, _read_toml


class _TomlSource(PydanticBaseSettingsSource):
    """The settings file: ``saucer.toml`` in the working directory, or the one given."""

    def __init__(self, settings_cls: type[BaseSettings]) -> None:
        super().__init__(settings_cls)
        explicit, given = _CONFIG_FILE.get()
        self.path = explicit if explicit is not None else Path(DEFAULT_CONFIG_FILE)
        self.data = given if given is not None else _read_toml(self.path, required=explicit is not None)

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:  # pragma: no cover - unused
        return self.data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return self.data


class _AliasEnvSource(PydanticBaseSettingsSource):
    """The short environment forms (``SAUCER_LLM_MODEL``...)."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:  # pragma: no cover - unused
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for var, (section, key) in _ENV_ALIASES.items():
            value = os.environ.get(var)
            if value is not None and value != "":
                out.setdefault(section, {})[key] = value
        return out


class Settings(BaseSettings, SettingsModel):
    """All of saucer's settings, read from the file, the ``SAUCER_*`` environment and flags.

    Build it with :func:`saucer.config.load_settings` (which returns a plain :class:`SettingsModel` when
    nothing but defaults and flags is to be read); a direct ``Settings()`` reads the environment and the file.
    """

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        extra="forbid",
        validate_assignment=True,
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # First wins: flags, then SAUCER_A__B variables, then short aliases, then the file.
        return (init_settings, env_settings, _AliasEnvSource(settings_cls), _TomlSource(settings_cls))
