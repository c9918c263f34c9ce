"""Settings: defaults < saucer.toml < SAUCER_* < overrides, and errors that name the key and its source."""

from __future__ import annotations

from pathlib import Path

import pytest

from saucer.config import ConfigError, Settings, SettingsModel, load_settings


@pytest.fixture(autouse=True)
def clean_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    import os

    for var in list(os.environ):
        if var.startswith("SAUCER_"):
            monkeypatch.delenv(var)


def test_defaults() -> None:
    s = load_settings()
    # The seed's defaults (README: "Defaults, the seed's and saucer's").
    assert s.system.max_step == 50 and s.system.max_round == 10
    assert s.system.eva_session is True and s.system.eva_round is False
    assert s.system.save_experience == "ask" and s.system.log_to_markdown is True
    assert s.system.save_ui_tree is True and s.system.sleep_time == 0.0
    assert s.store.url == "sqlite:///.saucer/saucer.db" and s.store.durability == "step"
    assert s.store.lease_ttl == 30.0 and s.store.snapshot_every == 100
    assert s.mcp.servers == {} and s.logs.root == Path("logs")
    assert s.llm.api_key is None and s.service.host == "127.0.0.1"
    assert s.config_file is None


def test_precedence_flags_over_env_over_file_over_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "saucer.toml").write_text(
        '[system]\nmax_step = 10\nmax_round = 4\neva_round = true\n[store]\nurl = "memory://file"\n'
    )
    s = load_settings()
    assert (s.system.max_step, s.system.max_round, s.system.eva_round, s.store.url) == (10, 4, True, "memory://file")
    assert s.config_file == Path("saucer.toml")
    monkeypatch.setenv("SAUCER_SYSTEM__MAX_STEP", "20")
    monkeypatch.setenv("SAUCER_STORE__URL", "memory://env")
    s = load_settings()
    assert (s.system.max_step, s.system.max_round, s.store.url) == (20, 4, "memory://env")
    s = load_settings(overrides={"system.max_step": 30, "store": {"url": "memory://flag"}, "system.max_round": None})
    assert (s.system.max_step, s.system.max_round, s.store.url) == (30, 4, "memory://flag")  # None = flag not given
    assert s.system.eva_round is True  # untouched keys keep the file's value


def test_explicit_config_file_and_short_env_aliases(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    other = tmp_path / "conf" / "team.toml"
    other.parent.mkdir()
    other.write_text('[llm]\nmodel = "from-file"\ntemperature = 0.5\n[logs]\nroot = "runs"\n')
    (tmp_path / "saucer.toml").write_text("[system]\nmax_step = 99\n")
    s = load_settings(other)
    assert s.system.max_step == 50  # ./saucer.toml is not read when a file is given
    assert s.llm.model == "from-file" and s.logs.root == Path("runs") and s.config_file == other
    monkeypatch.setenv("SAUCER_LLM_MODEL", "short-form")
    monkeypatch.setenv("SAUCER_LLM_API_KEY", "sk-secret")
    monkeypatch.setenv("SAUCER_STORE_URL", "memory://alias")
    s = load_settings(other)
    assert s.llm.model == "short-form" and s.store.url == "memory://alias"
    assert s.llm.api_key.get_secret_value() == "sk-secret" and "sk-secret" not in repr(s)
    monkeypatch.setenv("SAUCER_LLM__MODEL", "nested-form")
    assert load_settings(other).llm.model == "nested-form"  # the __ form wins over the short one
    monkeypatch.setenv("SAUCER_TEST_POSTGRES_URL", "postgresql://x")  # not a setting: ignored
    load_settings(other)


@pytest.mark.parametrize(
    "toml, message",
    [
        ("[system]\nmax_stpe = 3\n", "saucer.toml: unknown key 'system.max_stpe'"),
        ("[sytem]\nmax_step = 3\n", "saucer.toml: unknown key 'sytem'"),
        ('[system]\nmax_step = "many"\n', "saucer.toml: system.max_step: input should be a valid integer"),
        (
            "[system]\nmax_step = 0\n",
            "saucer.toml: system.max_step: input should be greater than or equal to 1 (got 0)",
        ),
        (
            '[system]\nsave_experience = "sometimes"\n',
            "saucer.toml: system.save_experience: input should be 'always', 'ask', 'auto' or 'always_not'",
        ),
        ('[store]\ndurability = "fast"\n', "saucer.toml: store.durability"),
        ("[system\nmax_step = 3\n", "config file saucer.toml is not valid TOML"),
        ('[mcp.servers.tools]\ncommand = "x"\nbogus = 1\n', "saucer.toml: unknown key 'mcp.servers.tools.bogus'"),
    ],
)
def test_file_errors_name_the_key_and_the_file(tmp_path: Path, toml: str, message: str) -> None:
    (tmp_path / "saucer.toml").write_text(toml)
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert message in str(info.value)
    assert "\n" not in str(info.value).strip()


def test_env_and_override_errors_name_their_source(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAUCER_SYSTEM__MAX_STEP", "lots")
    with pytest.raises(
        ConfigError, match="environment variable SAUCER_SYSTEM__MAX_STEP: input should be a valid integer"
    ):
        load_settings()
    monkeypatch.delenv("SAUCER_SYSTEM__MAX_STEP")
    monkeypatch.setenv("SAUCER_SYSTEM__MAX_STPE", "3")
    with pytest.raises(
        ConfigError, match="environment variable SAUCER_SYSTEM__MAX_STPE: unknown key 'system.max_stpe'"
    ):
        load_settings()
    monkeypatch.delenv("SAUCER_SYSTEM__MAX_STPE")
    with pytest.raises(
        ConfigError, match=r"override system.max_round: input should be greater than or equal to 0 \(got -1\)"
    ):
        load_settings(overrides={"system.max_round": -1})
    with pytest.raises(ConfigError, match="overrides: unknown key 'system.turbo'"):
        load_settings(overrides={"system.turbo": True})


def test_missing_explicit_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file .*nope.toml does not exist"):
        load_settings(tmp_path / "nope.toml")


def test_mcp_servers_are_validated_by_the_dispatchers_model(tmp_path: Path) -> None:
    (tmp_path / "saucer.toml").write_text(
        '[mcp.servers.time]\ncommand = "mcp-server-time"\nargs = ["--local-timezone", "UTC"]\n'
    )
    server = load_settings().mcp.servers["time"]
    assert getattr(server, "command", None) == "mcp-server-time" or server["command"] == "mcp-server-time"


def test_settings_model_is_typed_and_validates_assignment() -> None:
    s = load_settings()
    assert isinstance(s, SettingsModel)  # a plain SettingsModel when nothing is read; Settings derives from it
    assert issubclass(Settings, SettingsModel)
    with pytest.raises(ValueError):
        s.system.max_step = "x"  # type: ignore[assignment]
    with pytest.raises(ValueError):
        s.system = "x"  # type: ignore[assignment]


def test_mcp_isolate_from_file_and_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_settings().mcp.isolate is False  # the built-in tools run in-process by default
    (tmp_path / "saucer.toml").write_text('[mcp]\nisolate = ["shell"]\n')
    assert load_settings().mcp.isolate == ["shell"]
    monkeypatch.setenv("SAUCER_MCP__ISOLATE", "true")
    assert load_settings().mcp.isolate is True
    (tmp_path / "saucer.toml").write_text('[mcp]\nisolate = ["time"]\n')
    monkeypatch.delenv("SAUCER_MCP__ISOLATE")
    with pytest.raises(ConfigError, match=r"mcp\.isolate.*'shell' or 'files' \(got 'time'\)"):
        load_settings()
