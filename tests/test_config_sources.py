"""load_settings without pydantic-settings: with no file and a plain SAUCER_* environment it builds the plain
SettingsModel, equal to what Settings (BaseSettings) reads; anything else still goes through Settings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.support.cli import cli_env

from saucer.config import ConfigError, Settings, SettingsModel, load_settings
from saucer.config._explain import _nest

PLAN = {
    "task": "one",
    "steps": [
        {"subtask": "s", "commands": [{"tool_name": "files.write", "parameters": {"path": "a", "content": "x"}}]}
    ],
}


@pytest.fixture(autouse=True)
def clean_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for var in list(os.environ):
        if var.upper().startswith("SAUCER_"):
            monkeypatch.delenv(var)


PLAIN_ENVIRONMENTS = [
    {},
    {"SAUCER_SYSTEM__SAVE_EXPERIENCE": "always_not", "SAUCER_TEST_SOMETHING": "1"},
    {"SAUCER_SYSTEM__MAX_STEP": "7", "saucer_store__durability": "strict", "SAUCER_Logs__Root": "runs"},
    {"SAUCER_STORE_URL": "memory://alias", "SAUCER_LLM_MODEL": "m", "SAUCER_LLM__API_KEY": "k"},
    {"SAUCER_STORE_URL": "memory://alias", "SAUCER_STORE__URL": "memory://nested"},  # the __ form wins
    {"SAUCER_SYSTEM__EVA_ROUND": "true", "SAUCER_LLM__TEMPERATURE": "0.5", "SAUCER_DESKTOP__DISPLAY": ":9"},
]


@pytest.mark.parametrize("env", PLAIN_ENVIRONMENTS)
@pytest.mark.parametrize("overrides", [{}, {"system.max_step": 3, "store": {"url": "memory://flag"}}])
def test_plain_environment_gives_what_settings_reads(
    env: dict[str, str], overrides: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    fast = load_settings(overrides=overrides)
    assert type(fast) is SettingsModel
    full = Settings(**_nest(overrides))
    assert fast.model_dump() == full.model_dump()
    assert fast.config_file is None


@pytest.mark.parametrize(
    ("var", "value", "check"),
    [
        ("SAUCER_SYSTEM", '{"max_step": 4}', lambda s: s.system.max_step == 4),  # a whole section, JSON
        ("SAUCER_QUEUE__LIMITS", '{"q": 2}', lambda s: s.queue.limits == {"q": 2}),  # a JSON value
        ("SAUCER_MCP__SERVERS__X__COMMAND", "x", lambda s: s.mcp.servers["x"].command == "x"),  # deeper
    ],
)
def test_what_needs_pydantic_settings_is_read_by_it(
    var: str, value: str, check: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(var, value)
    settings = load_settings()
    assert isinstance(settings, Settings) and check(settings)


def test_a_file_is_read_by_settings(tmp_path: Path) -> None:
    (tmp_path / "saucer.toml").write_text("[system]\nmax_step = 12\n")
    settings = load_settings()
    assert isinstance(settings, Settings) and settings.system.max_step == 12
    assert settings.config_file == Path("saucer.toml")


def test_errors_of_the_plain_path_name_their_source(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAUCER_SYSTEM__MAX_STEP", "many")
    with pytest.raises(ConfigError, match="SAUCER_SYSTEM__MAX_STEP"):
        load_settings()
    monkeypatch.delenv("SAUCER_SYSTEM__MAX_STEP")
    with pytest.raises(ConfigError, match="system.max_step"):
        load_settings(overrides={"system.max_step": "many"})
    monkeypatch.setenv("SAUCER_SYSTEM__NO_SUCH_KEY", "1")  # unknown: Settings says which variable
    with pytest.raises(ConfigError, match="SAUCER_SYSTEM__NO_SUCH_KEY"):
        load_settings()


def _run(tmp_path: Path, extra: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    (tmp_path / "plan.json").write_text(json.dumps(PLAN))
    code = (
        "import runpy, sys; sys.argv = ['saucer', 'run', '--plan', 'plan.json', '--store', 'sqlite:///s.db'];"
        "import atexit; atexit.register(lambda: print('PYDANTIC_SETTINGS', 'pydantic_settings' in sys.modules));"
        "runpy.run_module('saucer', run_name='__main__')"
    )
    env = cli_env({"SAUCER_SYSTEM__SAVE_EXPERIENCE": "always_not", **extra})
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc, sorted(p.name for p in tmp_path.iterdir())


def test_a_run_reads_its_variables_on_either_path(tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    proc, names = _run(tmp_path / "plain", {"SAUCER_LOGS__ROOT": "plain-logs"})
    assert "plain-logs" in names and "logs" not in names
    assert "PYDANTIC_SETTINGS False" in proc.stdout
    (tmp_path / "json").mkdir()
    proc, names = _run(tmp_path / "json", {"SAUCER_LOGS": '{"root": "json-logs"}'})
    assert "json-logs" in names and "logs" not in names
    assert "PYDANTIC_SETTINGS True" in proc.stdout


def test_a_dotenv_file_is_not_read_on_either_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Settings has no env_file: a .env in the working directory was never read, and still is not.
    (tmp_path / ".env").write_text("SAUCER_SYSTEM__MAX_STEP=3\n")
    assert load_settings().system.max_step == 50
    assert Settings().system.max_step == 50
    proc, names = _run(tmp_path, {})
    assert "PYDANTIC_SETTINGS False" in proc.stdout


def _sections(settings: SettingsModel) -> dict[str, str]:
    """Each section's repr (types shown: a Path is not a str) and the fields set in it."""
    return {
        name: f"{getattr(settings, name)!r} {sorted(getattr(settings, name).model_fields_set)}"
        for name in SettingsModel.model_fields
    }


def test_a_section_not_given_is_its_validated_defaults() -> None:
    for name, info in SettingsModel.model_fields.items():
        section = info.annotation
        assert isinstance(section, type)
        made, validated = section.model_construct(), section()  # type: ignore[attr-defined]
        assert repr(made) == repr(validated), name
        assert made.model_fields_set == validated.model_fields_set == set()


@pytest.mark.parametrize("env", PLAIN_ENVIRONMENTS)
def test_the_plain_path_gives_the_whole_models_values_types_and_fields_set(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    overrides = {"system.max_step": 3, "shell": {"network": [443]}}
    fast = load_settings(overrides=overrides)
    full = Settings(**_nest(overrides))
    assert _sections(fast) == _sections(full)
    assert fast.model_fields_set == full.model_fields_set


def test_a_defaulted_section_still_validates_assignments() -> None:
    settings = load_settings()
    settings.llm.model = "m"
    assert settings.llm.model == "m"
    with pytest.raises(ValueError, match="max_step"):
        settings.system.max_step = "many"  # type: ignore[assignment]


def test_reading_the_settings_builds_only_the_sections_given(tmp_path: Path) -> None:
    code = (
        "from saucer.config import load_settings, SettingsModel\n"
        "s = load_settings(overrides={'store.url': 'memory://'})\n"
        "print(sorted(n for n, f in SettingsModel.model_fields.items() if f.annotation.__pydantic_complete__),"
        " SettingsModel.__pydantic_complete__)"
    )
    env = cli_env({})
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['store'] False"
