"""Start-up of the reading commands: the store's settings without the settings model when they
can only be the defaults, and no module loaded that a command does not use (issue 21)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from tests.support.cli import cli_env

from saucer.cli import common
from saucer.config import DEFAULT_CONFIG_FILE, Settings, StoreSettings, load_settings


def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for var in list(os.environ):
        if var.upper().startswith("SAUCER_"):
            monkeypatch.delenv(var)


def test_the_shortcut_knows_the_settings_model() -> None:
    assert set(common.SETTINGS_SECTIONS) == set(Settings.model_fields)
    assert common.CONFIG_FILE == DEFAULT_CONFIG_FILE
    default = StoreSettings()
    assert (default.url, default.encrypt, default.key_file) == (common.DEFAULT_STORE, [], None)


def test_defaults_are_what_the_settings_say(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _clean_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    settings = load_settings()
    assert common.store_settings(None) == (settings.store.url, settings.store.encrypt, settings.store.key_file)
    assert common.store_settings("sqlite:///x.db") == ("sqlite:///x.db", [], None)
    monkeypatch.setenv("SAUCER_STORE_URL", "sqlite:///from-env.db")  # --store's own variable: typer reads it
    monkeypatch.setenv("SAUCER_TEST_SOMETHING", "1")  # no section of the settings
    assert common._default_settings_apply(None)


@pytest.mark.parametrize(
    "var, value, expected",
    [
        ("SAUCER_STORE__ENCRYPT", '["vars.api_*"]', (["vars.api_*"], None)),
        ("saucer_store__key_file", "/k", ([], "/k")),  # the settings read variables without case
        ("SAUCER_STORE", '{"encrypt": ["REQUEST"]}', (["REQUEST"], None)),
    ],
)
def test_a_settings_variable_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, var: str, value: str, expected: tuple
) -> None:
    _clean_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(var, value)
    assert not common._default_settings_apply(None)
    assert common.store_settings("memory://")[1:] == expected


def test_a_settings_file_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _clean_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "saucer.toml").write_text('[store]\nurl = "sqlite:///in-file.db"\nencrypt = ["vars.k"]\n')
    assert common.store_settings(None) == ("sqlite:///in-file.db", ["vars.k"], None)
    other = tmp_path / "other.toml"
    other.write_text('[store]\nkey_file = "/key"\n')
    (tmp_path / "saucer.toml").unlink()
    assert common.store_settings(None, other) == (common.DEFAULT_STORE, [], "/key")


def test_a_broken_settings_file_is_still_reported(run_cli, tmp_path: Path) -> None:
    (tmp_path / "saucer.toml").write_text("[store\n")
    proc = run_cli("sessions", "--store", "memory://")
    assert proc.returncode == 2 and "saucer.toml is not valid TOML" in proc.stderr, proc.stderr
    (tmp_path / "saucer.toml").unlink()
    proc = run_cli("sessions", "--store", "memory://", env={"SAUCER_STORE__LEASE_TTL": "-1"})
    assert proc.returncode == 2 and "SAUCER_STORE__LEASE_TTL" in proc.stderr, proc.stderr


_PROBE = """
import sys
from saucer.cli.app import app
try:
    app(sys.argv[1:], standalone_mode=False)
finally:
    sys.stdout.flush()
    heavy = ("saucer.config", "pydantic_settings", "asyncio", "saucer.engine", "saucer.queue", "saucer.service", "saucer.ui")
    print("LOADED", sorted(m for m in heavy if m in sys.modules), file=sys.stderr)
"""


@pytest.mark.parametrize("argv", [["sessions"], ["sessions", "--json"], ["state", "s1"], ["state", "s1", "--json"]])
def test_reading_commands_load_only_what_they_use(tmp_path: Path, argv: list[str]) -> None:
    from saucer.context import Context

    url = f"sqlite:///{tmp_path / 's.db'}"
    ctx = Context.open(url, "s1", author="agent:Follower", meta={"task": "t", "mode": "follower"})
    from saucer.context import ContextNames

    ctx.set(ContextNames.REQUEST, "hello")
    ctx.commit()
    ctx.close()
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, *argv, "--store", url],
        cwd=tmp_path,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "LOADED []" in proc.stderr, proc.stderr


def _short_of_whole_dump(value: object, width: int) -> str:
    """What ``short`` showed when it dumped the whole value before cutting it."""
    import orjson

    from saucer.cli.output import visible

    if isinstance(value, str):
        text = value
    else:
        try:
            text = orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS, default=str).decode()
        except TypeError:
            text = repr(value)
    text = visible(text)
    return text if len(text) <= width else text[: width - 1] + "…"


def test_short_formats_only_what_it_shows_and_shows_the_same() -> None:
    import datetime
    import random

    import orjson

    from saucer.cli.inspect import short

    rnd = random.Random(21)

    def text() -> str:
        return "".join(
            rnd.choice(["a", "é", "€", "𝄞", "\n", "\x1b", "\x85", '"', "\\", " ", "中"])
            for _ in range(rnd.randint(0, 30))
        )

    def value(depth: int = 0) -> object:
        r = rnd.random()
        if depth > 2 or r < 0.3:
            return rnd.choice(
                [
                    None,
                    True,
                    False,
                    rnd.randint(-(10**6), 10**6),
                    rnd.random(),
                    text(),
                    datetime.date(2020, 1, 2),
                    (1, "x"),
                    0,
                    0.0,
                ]
            )
        if r < 0.65:
            return {
                rnd.choice([text(), rnd.randint(0, 99), None, True, 1.5]): value(depth + 1)
                for _ in range(rnd.randint(0, 6))
            }
        return [value(depth + 1) for _ in range(rnd.randint(0, 6))]

    values = [value() for _ in range(1500)]
    values += [
        {i: [{"x": "y" * 50, str(i): "𝄞" * i}] for i in range(3000)},
        list(range(10**5)),
        {"a": {}},
        [[]],
        {1: [2, {3: "x" * 900}]},
    ]
    from saucer.context.events import StoredJson

    for v in values:
        stored = (
            None if isinstance(v, str) else StoredJson(orjson.dumps(v, option=orjson.OPT_NON_STR_KEYS, default=str))
        )
        for width in (1, 2, 5, 60, 80, 200):
            assert short(v, width) == _short_of_whole_dump(v, width), (v, width)
            if stored is not None:  # a value the state table shows from its stored text
                assert short(stored, width) == short(v, width), (v, width)


def test_a_reading_command_holds_the_collector_off_only_while_it_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gc

    from saucer.cli import common as cli_common

    seen: list[bool] = []

    @cli_common.one_shot
    def reading() -> None:
        seen.append(gc.isenabled())
        raise ValueError("a mistake")

    with pytest.raises(ValueError):
        reading()
    assert seen == [False] and gc.isenabled()


# -- a one-step run (issue 29): what it starts with, and what it does not load


_RUN_PROBE = """
import gc
import sys
from saucer.cli.app import app
try:
    app(sys.argv[1:], standalone_mode=False)
finally:
    sys.stdout.flush()
    unused = (
        "saucer.ufo_config",  # no settings file to read
        "saucer.engine.routing",  # no transition graph
        "saucer.engine.expression",
        "saucer.engine.pool",  # one session, not a batch
        "saucer.engine.approvals",  # no command that needs approval
        "saucer.engine.meta",  # types only
        "saucer.tools.shellparse",  # no shell command line to check
        "tree_sitter",
    )
    print("LOADED", sorted(m for m in unused if m in sys.modules), file=sys.stderr)
    print("COLLECTOR", gc.isenabled(), gc.get_freeze_count() > 0, file=sys.stderr)
"""
_PLAN = (
    '{"task": "one", "steps": [{"subtask": "s", "commands": '
    '[{"tool_name": "files.write", "parameters": {"path": "a", "content": "x"}}]}]}'
)


def test_a_one_step_run_loads_only_what_it_uses(tmp_path: Path) -> None:
    (tmp_path / "plan.json").write_text(_PLAN)
    proc = subprocess.run(
        [sys.executable, "-c", _RUN_PROBE, "run", "--plan", "plan.json", "--store", "sqlite:///s.db"],
        cwd=tmp_path,
        env=cli_env({"SAUCER_SYSTEM__SAVE_EXPERIENCE": "always_not"}),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "a").read_text() == "x"
    assert "LOADED []" in proc.stderr, proc.stderr
    # What the run started with is frozen out of the collector's way, and the collector is on again.
    assert "COLLECTOR True True" in proc.stderr, proc.stderr


def test_what_a_run_needs_later_is_still_loaded_when_needed(cli_here, tmp_path: Path) -> None:
    """The same run, with a sensitive shell command refused by nobody at the terminal: the parser of
    command lines and the approvals are loaded when the command comes."""
    (tmp_path / "plan.json").write_text(
        '{"task": "one", "steps": [{"subtask": "s", "commands": '
        '[{"tool_name": "shell.run", "parameters": {"command": "rm -f nothing"}}]}]}'
    )
    proc = cli_here("run", "--plan", "plan.json", "--store", "sqlite:///s.db", "--no-input", "--approval-timeout", "0")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "sensitive pattern 'rm *'" in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def test_settings_without_a_file_skip_the_ufo_reader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _clean_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    overrides = {"store.url": "memory://", "system.max_step": 7}
    assert common.settings_for(None, overrides) == load_settings(None, overrides)
    # A saucer.toml is read by the reader that also knows UFO's key names.
    (tmp_path / "saucer.toml").write_text("MAX_STEP = 12\n")
    assert common.settings_for(None).system.max_step == 12
    (tmp_path / "saucer.toml").unlink()
    (tmp_path / "saucer.toml").symlink_to(tmp_path / "nowhere.toml")  # a dangling link: no file, as before
    assert common.settings_for(None) == load_settings()


def test_a_run_that_fails_to_start_leaves_the_collector_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gc

    from saucer.cli import running
    from saucer.config import ConfigError

    _clean_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SAUCER_SYSTEM__MAX_STEP", "none")
    made_before: list[object] = []  # a container the collector tracks, until something freezes it
    with pytest.raises(ConfigError):
        running._run_settings(None, "memory://")
    assert gc.isenabled()
    assert any(o is made_before for o in gc.get_objects()), "a start that failed froze the heap"
    gc.disable()
    try:  # a caller's choice to keep it off is kept too
        with pytest.raises(ConfigError):
            running._run_settings(None, "memory://")
        assert not gc.isenabled()
    finally:
        gc.enable()
