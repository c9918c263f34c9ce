"""UFO's configuration files, read into saucer's settings (:mod:`saucer.config`).

UFO (microsoft/UFO) keeps its settings in YAML: the older ``ufo/config/config.yaml``
(with ``config_dev.yaml``) and the newer ``config/ufo/system.yaml`` beside
``agents.yaml``. Their keys are upper case (lower case is read too); the model of
each agent is a table (``HOST_AGENT``, ``APP_AGENT``, ``EVALUATION_AGENT``...)::

    settings = load_any_settings("config/ufo/")             # a folder: its UFO files, in UFO's order
    settings = load_any_settings("ufo/config/config.yaml")   # one file
    settings = load_any_settings("saucer.toml")              # saucer's own, where MAX_STEP is read too
    print(convert("config/ufo/"))                            # saucer config convert: the same, as TOML

Every key with a counterpart becomes that setting (:data:`TOP_LEVEL_KEYS`, the
agent tables); a key without one is listed once, in one warning, as ignored
(:data:`NO_COUNTERPART` says why for UFO's documented ones) -- in a UFO file
an unknown key is never an error, in saucer's own TOML it still is. A value
of the wrong type is a :class:`~saucer.config.ConfigError` naming the UFO key,
its file and saucer's setting.

This module imports nothing of saucer but :mod:`saucer.config`.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from saucer.config import DEFAULT_CONFIG_FILE, ConfigError, SettingsModel, load_settings

__all__ = [
    "UFO_FILES",
    "TOP_LEVEL_KEYS",
    "NO_COUNTERPART",
    "UfoSettings",
    "read_ufo",
    "is_yaml",
    "load_any_settings",
    "convert",
]

_log = logging.getLogger("saucer.config")

#: The files of a UFO configuration folder, read in this order (a later file wins, as in UFO).
UFO_FILES = ("config.yaml", "config_dev.yaml", "system.yaml", "agents.yaml")
_YAML_SUFFIXES = (".yaml", ".yml")


def _save_experience(value: Any) -> Any:
    return value.lower() if isinstance(value, str) else value


#: UFO's top-level keys that have a counterpart: UFO key -> (section, key, conversion).
TOP_LEVEL_KEYS: dict[str, tuple[str, str, Callable[[Any], Any] | None]] = {
    "MAX_STEP": ("system", "max_step", None),
    "MAX_ROUND": ("system", "max_round", None),
    "SLEEP_TIME": ("system", "sleep_time", None),
    "EVA_SESSION": ("system", "eva_session", None),
    "EVA_ROUND": ("system", "eva_round", None),
    "SAVE_EXPERIENCE": ("system", "save_experience", _save_experience),
    "LOG_TO_MARKDOWN": ("system", "log_to_markdown", None),
    "SAVE_UI_TREE": ("system", "save_ui_tree", None),
    "MAX_TOKENS": ("llm", "max_tokens", None),
    "MAX_RETRY": ("llm", "max_retries", None),
    "TEMPERATURE": ("llm", "temperature", None),
    "TIMEOUT": ("llm", "timeout", None),
    "ASK_QUESTION": ("llm", "ask_user", None),
}

#: Agent tables whose model is saucer's ``[llm]``: the first one present gives the endpoint and model.
_MODEL_TABLES = ("HOST_AGENT", "APP_AGENT")
_JUDGE_TABLE = "EVALUATION_AGENT"
#: ``API_TYPE`` values whose endpoint saucer's OpenAI-compatible client can call.
_API_TYPES = ("openai", "aoai", "ollama")

#: Why UFO's documented keys without a counterpart are left out (any other key: "no counterpart").
NO_COUNTERPART: dict[str, str] = {
    "TOP_P": "saucer sends no top_p",
    "CONTROL_BACKEND": "Windows UI Automation backends; saucer's desktop tool reads the AT-SPI tree",
    "SAFE_GUARD": "sensitive tools are per server (mcp.servers.NAME.sensitive_tools), always asked",
    "CONTROL_LIST": "Windows control types",
    "HISTORY_KEYS": "the step record keeps every field",
    "ANNOTATION_COLORS": "no screenshot annotation",
    "PRINT_LOG": "saucer show / saucer run print the steps",
    "LOG_LEVEL": "Python logging (saucer serve --log-level)",
    "REQUEST_TIMEOUT": "llm.timeout is the one model timeout",
    "MCP_TOOL_TIMEOUT": "per server: mcp.servers.NAME.timeout",
    "USE_MCP": "saucer's tools are always MCP servers (or their in-process tables)",
    "MCP_SERVERS_CONFIG": "MCP servers are [mcp.servers.NAME] tables",
    "EXPERIENCE_SAVED_PATH": "UFO's experience is a vector database; saucer's is a plan file (system.experience_dir)",
    "TASK_STATUS": "batch status lives in the store (saucer sessions)",
    "BACKUP_AGENT": "no backup model: llm.max_retries retries the one model",
    "OPERATOR": "the operator modes use [llm]",
    "OMNIPARSER": "no screen parsing model",
    "API_VERSION": "only Azure's dated APIs take it; saucer calls Azure's v1 endpoint",
    "API_DEPLOYMENT_ID": "used as the model of an aoai agent (API_MODEL otherwise)",
    "VISUAL_MODE": "the operator modes always send screenshots; normal mode sends none",
    "REASONING_MODEL": "saucer sends the same request to every model",
    "PROMPT": "saucer's prompts are llm.system_prompt",
    "EXAMPLE_PROMPT": "saucer's prompts are llm.system_prompt",
}
_SECRET = re.compile(r"KEY|SECRET|TOKEN|PASSWORD", re.IGNORECASE)


@dataclass
class UfoSettings:
    """What UFO's files say, as saucer's settings: ``data`` (nested, for :func:`saucer.config.load_settings`),
    ``origin`` (saucer's ``section.key`` -> the UFO key it came from, with its file) and ``ignored``
    (the UFO keys without a counterpart -> why)."""

    files: list[Path] = field(default_factory=list)
    data: dict[str, dict[str, Any]] = field(default_factory=dict)
    origin: dict[str, str] = field(default_factory=dict)
    ignored: dict[str, tuple[str, Any]] = field(default_factory=dict)

    def put(self, section: str, key: str, value: Any, where: str) -> None:
        self.data.setdefault(section, {})[key] = value
        self.origin[f"{section}.{key}"] = where

    def ignore(self, where: str, why: str, value: Any) -> None:
        self.ignored[where] = (why, value)

    def warning(self) -> str | None:
        """The one line that lists the ignored keys (None when there are none)."""
        if not self.ignored:
            return None
        names = ", ".join(self.ignored)
        files = ", ".join(str(f) for f in self.files)
        return (
            f"{files}: {len(self.ignored)} UFO key(s) without a counterpart in saucer, ignored: {names} "
            "(saucer config convert shows why)"
        )


def is_yaml(path: Path) -> bool:
    """Whether ``path`` is read as UFO's YAML: a ``.yaml``/``.yml`` file or a folder."""
    return path.suffix.lower() in _YAML_SUFFIXES or path.is_dir()


def _ufo_files(path: Path) -> list[Path]:
    if path.is_dir():
        found = [path / name for name in UFO_FILES if (path / name).is_file()]
        if not found:
            raise ConfigError(f"config folder {path} has none of UFO's files ({', '.join(UFO_FILES)})")
        return found
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    return [path]


def _load_yaml(path: Path) -> dict[str, Any]:
    import yaml  # only for UFO's files

    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path} is not UTF-8 text") from None
    except OSError as exc:
        raise ConfigError(f"config file {path} cannot be read: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        # A parser's error (MarkedYAMLError) says where and what; any other says what in its first line.
        marked = exc if isinstance(exc, yaml.MarkedYAMLError) else None
        mark = marked.problem_mark if marked is not None else None
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = (marked.problem if marked is not None else None) or str(exc).splitlines()[0]
        raise ConfigError(f"config file {path} is not valid YAML{where}: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of UFO keys, not a {type(data).__name__}")
    return data


def read_ufo(path: str | Path) -> UfoSettings:
    """UFO's settings in ``path`` (a YAML file, or a folder of :data:`UFO_FILES`) as saucer's."""
    out = UfoSettings(files=_ufo_files(Path(path)))
    for file in out.files:
        _map_table(_load_yaml(file), file, out)
    return out


def _map_table(table: Mapping[Any, Any], file: Path, out: UfoSettings) -> None:
    """Map the top level of one UFO file into ``out``."""
    agents: dict[str, tuple[str, Mapping[Any, Any]]] = {}
    for raw_key, value in table.items():
        key = str(raw_key)
        name = key.upper()
        where = f"{file}: {key}"
        if name in TOP_LEVEL_KEYS and value is None:
            if name == "MAX_ROUND":
                out.put("system", "max_round", 0, where)  # empty: no limit, which TOML writes as 0
            else:
                out.ignore(key, "empty: saucer's default applies", value)
        elif name in TOP_LEVEL_KEYS:
            section, setting, conversion = TOP_LEVEL_KEYS[name]
            out.put(section, setting, conversion(value) if conversion else value, where)
        elif name.endswith("_AGENT") and isinstance(value, Mapping):
            agents[name] = (key, value)
        else:
            out.ignore(key, NO_COUNTERPART.get(name, "no counterpart in saucer"), value)
    _map_agents(agents, file, out)


def _endpoint(agent: str, table: Mapping[str, Any], out: UfoSettings) -> dict[str, Any] | None:
    """An agent table's endpoint, key and model, as ``[llm]`` values; None when saucer cannot call it."""
    api_type = str(table.get("API_TYPE", "openai")).lower()
    if api_type not in _API_TYPES:
        out.ignore(
            f"{agent}.API_TYPE",
            f"{api_type!r} is not an OpenAI-compatible endpoint saucer can call "
            f"({', '.join(_API_TYPES)}); this agent's API_* keys are ignored",
            api_type,
        )
        return None
    found: dict[str, Any] = {}
    base = table.get("API_BASE")
    if isinstance(base, str) and base.strip():
        base = base.strip().rstrip("/")
        base = base.removesuffix("/chat/completions")  # UFO gives the whole endpoint; the client adds it
        if api_type == "aoai" and not base.endswith("/openai/v1"):
            base += "/openai/v1"  # Azure's OpenAI-compatible v1 API
        elif api_type == "ollama" and not base.endswith("/v1"):
            base += "/v1"  # Ollama's OpenAI-compatible API
        found["base_url"] = base
    if table.get("API_KEY") not in (None, ""):
        found["api_key"] = table["API_KEY"]
    model = (
        table.get("API_DEPLOYMENT_ID")
        if api_type == "aoai" and table.get("API_DEPLOYMENT_ID")
        else table.get("API_MODEL")
    )
    if model not in (None, ""):
        found["model"] = model
    return found


def _map_agents(agents: dict[str, tuple[str, Mapping[Any, Any]]], file: Path, out: UfoSettings) -> None:
    main: dict[str, Any] | None = None
    main_name = ""
    for name in (*_MODEL_TABLES, _JUDGE_TABLE, *sorted(set(agents) - {*_MODEL_TABLES, _JUDGE_TABLE})):
        if name not in agents:
            continue
        written, raw = agents[name]
        table = {str(k).upper(): v for k, v in raw.items()}
        used = {"API_TYPE", "API_BASE", "API_KEY", "API_MODEL"}
        if str(table.get("API_TYPE", "openai")).lower() == "aoai":
            used.add("API_DEPLOYMENT_ID")  # an Azure agent's model
        if name not in (*_MODEL_TABLES, _JUDGE_TABLE):
            out.ignore(written, NO_COUNTERPART.get(name, "no counterpart in saucer"), raw)
            continue
        endpoint = _endpoint(written, table, out)
        if endpoint is not None and name in _MODEL_TABLES and main is None:
            main, main_name = endpoint, written
            for setting, value in endpoint.items():
                out.put("llm", setting, value, f"{file}: {written}.{_UFO_NAME[setting]}")
        elif endpoint is not None and name in _MODEL_TABLES and main is not None:
            for setting, value in endpoint.items():
                if main.get(setting) != value:
                    out.ignore(
                        f"{written}.{_UFO_NAME[setting]}",
                        f"saucer's agents share one model and endpoint ([llm], from {main_name})",
                        value,
                    )
        elif endpoint is not None:  # the evaluation agent: its model judges, on the same endpoint
            same = main is None or all(main.get(k) == endpoint.get(k) for k in ("base_url", "api_key"))
            if same and "model" in endpoint:
                out.put("llm", "judge_model", endpoint["model"], f"{file}: {written}.API_MODEL")
            elif not same:
                out.ignore(written, f"the judge uses [llm]'s endpoint (from {main_name}); this one differs", raw)
        for key, value in raw.items():
            if str(key).upper() not in used:
                out.ignore(f"{written}.{key}", NO_COUNTERPART.get(str(key).upper(), "no counterpart in saucer"), value)
            elif endpoint is None and str(key).upper() != "API_TYPE":
                out.ignore(f"{written}.{key}", "its API_TYPE cannot be called", value)


_UFO_NAME = {"base_url": "API_BASE", "api_key": "API_KEY", "model": "API_MODEL"}


#: Each section of saucer's settings ([llm], [shell], ...) and its model.
_SECTIONS: dict[str, type[BaseModel]] = {
    name: field.annotation
    for name, field in SettingsModel.model_fields.items()
    if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)
}


def _check(ufo: UfoSettings) -> None:
    """A :class:`ConfigError` naming the UFO key, its file and saucer's setting for a value of the wrong type."""
    for section, values in ufo.data.items():
        model = _SECTIONS[section]
        for key, value in values.items():
            try:
                model.model_validate({key: value})
            except ValidationError as exc:
                error = exc.errors()[0]
                shown = "**********" if _SECRET.search(key) else repr(value)
                message = error["msg"][0].lower() + error["msg"][1:]
                raise ConfigError(
                    f"{ufo.origin[f'{section}.{key}']} (saucer's {section}.{key}): {message} (got {shown})"
                ) from None


_REPORTED: set[str] = set()


def _reported_once(ufo: UfoSettings) -> None:
    """Warn once per process about the keys a file set leaves out (a command may load settings twice)."""
    line = ufo.warning()
    if line is not None and line not in _REPORTED:
        _REPORTED.add(line)
        _log.warning("%s", line)


def _toml_with_ufo_keys(path: Path) -> dict[str, Any] | None:
    """saucer's TOML where UFO's key names are read too (``MAX_STEP`` at the top, ``[system] MAX_STEP``);
    None when the file has none (then :func:`saucer.config.load_settings` reads it as it is)."""
    import tomllib

    try:
        data = tomllib.loads(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None  # load_settings reports it, in its words
    sections = _SECTIONS
    ufo = UfoSettings(files=[path])
    out: dict[str, Any] = {}
    ufo_keys: dict[str, Any] = {}
    changed = False
    for key, value in data.items():
        lower = key.lower()
        if lower in sections and isinstance(value, dict):
            fields = sections[lower].model_fields
            renamed = {(k.lower() if k.lower() in fields else k): v for k, v in value.items()}
            changed |= lower != key or renamed.keys() != value.keys()
            out.setdefault(lower, {}).update(renamed)
        elif key.upper() in TOP_LEVEL_KEYS or key.upper().endswith("_AGENT") or key.upper() in NO_COUNTERPART:
            ufo_keys[key] = value
        else:
            out[key] = value  # load_settings says it is unknown
    if not changed and not ufo_keys:
        return None
    _map_table(ufo_keys, path, ufo)
    for section, values in ufo.data.items():
        for key, value in values.items():
            if key in out.get(section, {}):
                raise ConfigError(f"{ufo.origin[f'{section}.{key}']}: also set as {section}.{key}; keep one")
            out.setdefault(section, {})[key] = value
    _check(ufo)
    _reported_once(ufo)
    return out


def load_any_settings(
    config_file: str | Path | None = None, overrides: Mapping[str, Any] | None = None
) -> SettingsModel:
    """:func:`saucer.config.load_settings`, where ``config_file`` may also be UFO's YAML (a file or a
    folder of :data:`UFO_FILES`) and saucer's TOML may use UFO's key names. Ignored UFO keys are
    listed once, as one warning."""
    path = Path(config_file) if config_file is not None else None
    if path is not None and is_yaml(path):
        ufo = read_ufo(path)
        _check(ufo)
        _reported_once(ufo)
        return load_settings(path, overrides, file_data=ufo.data)
    toml = path if path is not None else Path(DEFAULT_CONFIG_FILE)
    data = _toml_with_ufo_keys(toml) if toml.is_file() else None
    return load_settings(path, overrides, file_data=data)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a JSON string is a TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{json.dumps(str(k))} = {_toml_value(v)}" for k, v in value.items()) + " }"
    return json.dumps(str(value))


def _comment_value(key: str, value: Any) -> str:
    if _SECRET.search(key) or (isinstance(value, Mapping) and any(_SECRET.search(str(k)) for k in value)):
        return "(secret, not copied)" if not isinstance(value, Mapping) else "(a table, not copied)"
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


def convert(path: str | Path) -> str:
    """saucer's TOML for UFO's YAML ``path`` (file or folder): every mapped key, and a comment for each
    key without a counterpart saying why. Loading it gives the same settings as loading ``path``."""
    if not is_yaml(Path(path)):
        raise ConfigError(
            f"{path} is not UFO's YAML: give a .yaml file (config.yaml, system.yaml, agents.yaml) or their folder"
        )
    ufo = read_ufo(path)
    _check(ufo)
    lines = [f"# saucer settings converted from UFO's {', '.join(str(f) for f in ufo.files)} (saucer config convert)"]
    for section in SettingsModel.model_fields:
        values = ufo.data.get(section)
        if not values:
            continue
        lines += ["", f"[{section}]"]
        for key, value in values.items():
            lines.append(f"{key} = {_toml_value(value)}  # {ufo.origin[f'{section}.{key}'].split(': ', 1)[-1]}")
    if ufo.ignored:
        lines += ["", "# UFO keys without a counterpart in saucer (ignored):"]
        for key, (why, value) in ufo.ignored.items():
            lines.append(f"# {key} = {_comment_value(key, value)}  -- {why}")
    return "\n".join(lines) + "\n"
