"""UFO's configuration files (saucer.ufo_config): keys mapped, ignored ones listed once, convert round-trips."""

from __future__ import annotations

import logging
import tomllib
from pathlib import Path

import pytest

from saucer.config import ConfigError
from saucer.ufo_config import UFO_FILES, convert, load_any_settings, read_ufo

# Written from UFO's documented keys (config/ufo/system.yaml and agents.yaml.template of microsoft/UFO).
SYSTEM_YAML = """\
MAX_TOKENS: 2000
MAX_RETRY: 5
TEMPERATURE: 0.3
TOP_P: 0.0
TIMEOUT: 45
CONTROL_BACKEND: ["uia"]
MAX_STEP: 30
MAX_ROUND: 3
SLEEP_TIME: 0.5
SAFE_GUARD: True
LOG_TO_MARKDOWN: False
SAVE_UI_TREE: False
SAVE_EXPERIENCE: "Always_Not"
EVA_SESSION: False
EVA_ROUND: TRUE
ASK_QUESTION: False
OMNIPARSER:
  ENDPOINT: "http://omniparser.invalid"
  BOX_THRESHOLD: 0.05
"""

AGENTS_YAML = """\
HOST_AGENT:
  VISUAL_MODE: True
  REASONING_MODEL: False
  API_TYPE: "openai"
  API_BASE: "https://api.openai.com/v1/chat/completions"
  API_KEY: "sk-ufo-test-key-0123456789"
  API_VERSION: "2025-02-01-preview"
  API_MODEL: "gpt-4o"
APP_AGENT:
  VISUAL_MODE: True
  API_TYPE: "openai"
  API_BASE: "https://api.openai.com/v1/chat/completions"
  API_KEY: "sk-ufo-test-key-0123456789"
  API_MODEL: "gpt-4o-mini"
BACKUP_AGENT:
  API_TYPE: "openai"
  API_KEY: "sk-backup-secret-9876543210"
  API_MODEL: "gpt-4-vision-preview"
EVALUATION_AGENT:
  API_TYPE: "openai"
  API_BASE: "https://api.openai.com/v1/chat/completions"
  API_KEY: "sk-ufo-test-key-0123456789"
  API_MODEL: "gpt-4o-judge"
"""


@pytest.fixture(autouse=True)
def _clean(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    import os

    for var in list(os.environ):
        if var.startswith("SAUCER_"):
            monkeypatch.delenv(var)
    import saucer.ufo_config as module

    module._REPORTED.clear()


def _ufo_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "config" / "ufo"
    folder.mkdir(parents=True)
    (folder / "system.yaml").write_text(SYSTEM_YAML)
    (folder / "agents.yaml").write_text(AGENTS_YAML)
    return folder


def test_ufo_keys_map_to_saucer_settings(tmp_path: Path) -> None:
    s = load_any_settings(_ufo_folder(tmp_path))
    sy = s.system
    assert (sy.max_step, sy.max_round, sy.sleep_time) == (30, 3, 0.5)
    assert (sy.eva_session, sy.eva_round, sy.save_experience) == (False, True, "always_not")
    assert (sy.log_to_markdown, sy.save_ui_tree) == (False, False)
    llm = s.llm
    assert (llm.max_tokens, llm.max_retries, llm.temperature, llm.timeout, llm.ask_user) == (2000, 5, 0.3, 45, False)
    # UFO gives the whole endpoint; the OpenAI client adds /chat/completions itself.
    assert llm.base_url == "https://api.openai.com/v1" and llm.model == "gpt-4o"
    assert llm.api_key is not None and llm.api_key.get_secret_value() == "sk-ufo-test-key-0123456789"
    assert llm.judge_model == "gpt-4o-judge"


def test_a_folder_is_read_in_ufos_order_and_lower_case_keys_count(tmp_path: Path) -> None:
    folder = tmp_path / "ufo"
    folder.mkdir()
    (folder / "config.yaml").write_text("max_step: 11\nmax_round: 2\n")
    (folder / "config_dev.yaml").write_text("MAX_STEP: 12\n")  # a later file wins, as in UFO
    assert UFO_FILES.index("config.yaml") < UFO_FILES.index("config_dev.yaml")
    s = load_any_settings(folder)
    assert (s.system.max_step, s.system.max_round) == (12, 2)
    assert load_any_settings(folder / "config.yaml").system.max_step == 11  # one file alone


def test_unknown_keys_are_listed_once_as_ignored_not_an_error(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    folder = _ufo_folder(tmp_path)
    with caplog.at_level(logging.WARNING, logger="saucer.config"):
        load_any_settings(folder)
        load_any_settings(folder)  # a second load in the same process says nothing again
    warnings = [r.getMessage() for r in caplog.records if "without a counterpart" in r.getMessage()]
    assert len(warnings) == 1, warnings
    line = warnings[0]
    assert "\n" not in line
    for key in ("TOP_P", "CONTROL_BACKEND", "SAFE_GUARD", "OMNIPARSER", "HOST_AGENT.VISUAL_MODE", "BACKUP_AGENT"):
        assert key in line
    assert "APP_AGENT.API_MODEL" in line  # saucer's agents share one model: the app agent's differs, so it is dropped
    assert "MAX_STEP" not in line and "HOST_AGENT.API_KEY" not in line
    assert "sk-" not in line


def test_wrong_values_name_the_ufo_key_the_file_and_the_setting(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text('MAX_STEP: "many"\n')
    with pytest.raises(
        ConfigError, match=r"config.yaml: MAX_STEP \(saucer's system.max_step\): input should be a valid integer"
    ):
        load_any_settings(tmp_path / "config.yaml")
    (tmp_path / "k.yaml").write_text("HOST_AGENT:\n  API_KEY: [1, 2]\n")
    with pytest.raises(ConfigError) as info:
        load_any_settings(tmp_path / "k.yaml")
    assert "HOST_AGENT.API_KEY (saucer's llm.api_key)" in str(info.value) and "1, 2" not in str(info.value)
    (tmp_path / "bad.yaml").write_text("MAX_STEP: [\n")
    with pytest.raises(ConfigError, match=r"bad.yaml is not valid YAML at line 2"):
        load_any_settings(tmp_path / "bad.yaml")
    (tmp_path / "list.yaml").write_text("- MAX_STEP\n")
    with pytest.raises(ConfigError, match="must hold a mapping of UFO keys, not a list"):
        load_any_settings(tmp_path / "list.yaml")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="has none of UFO's files"):
        load_any_settings(tmp_path / "empty")
    with pytest.raises(ConfigError, match="does not exist"):
        load_any_settings(tmp_path / "missing.yaml")


def test_api_types_saucer_cannot_call_are_ignored_and_say_why(tmp_path: Path) -> None:
    (tmp_path / "agents.yaml").write_text(
        'HOST_AGENT:\n  API_TYPE: "azure_ad"\n  API_BASE: "https://x.invalid"\n  API_MODEL: "gpt-4o"\n'
        'APP_AGENT:\n  API_TYPE: "aoai"\n  API_BASE: "https://res.openai.azure.com"\n  API_KEY: "k"\n'
        '  API_MODEL: "gpt-4o"\n  API_DEPLOYMENT_ID: "my-deployment"\n'
    )
    ufo = read_ufo(tmp_path / "agents.yaml")
    assert "not an OpenAI-compatible endpoint" in ufo.ignored["HOST_AGENT.API_TYPE"][0]
    assert "HOST_AGENT.API_MODEL" in ufo.ignored
    s = load_any_settings(tmp_path / "agents.yaml")  # the app agent's Azure endpoint, through its v1 API
    assert s.llm.base_url == "https://res.openai.azure.com/openai/v1" and s.llm.model == "my-deployment"
    (tmp_path / "ollama.yaml").write_text(
        'APP_AGENT:\n  API_TYPE: "ollama"\n  API_BASE: "http://localhost:11434"\n  API_MODEL: "llama3.1"\n'
    )
    assert load_any_settings(tmp_path / "ollama.yaml").llm.base_url == "http://localhost:11434/v1"


def test_empty_max_round_is_no_limit(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("MAX_ROUND:\nMAX_STEP:\n")
    s = load_any_settings(tmp_path / "config.yaml")
    assert s.system.max_round == 0 and s.system.max_step == 50  # an empty MAX_STEP leaves saucer's default
    assert "max_round = 0" in convert(tmp_path / "config.yaml")
    (tmp_path / "saucer.toml").write_text("")
    with pytest.raises(ConfigError, match="is not UFO's YAML"):
        convert(tmp_path / "saucer.toml")
    (tmp_path / "d.yaml").write_text('APP_AGENT:\n  API_MODEL: "m"\n  API_DEPLOYMENT_ID: "dep"\n')
    assert "APP_AGENT.API_DEPLOYMENT_ID" in read_ufo(tmp_path / "d.yaml").ignored  # only an aoai agent uses it


def test_convert_round_trips(tmp_path: Path) -> None:
    folder = _ufo_folder(tmp_path)
    text = convert(folder)
    tomllib.loads(text)  # valid TOML
    (tmp_path / "saucer.toml").write_text(text)
    from_yaml = load_any_settings(folder)
    from_toml = load_any_settings(tmp_path / "saucer.toml")
    assert from_toml.model_dump() == from_yaml.model_dump()
    # One comment per key without a counterpart, saying why; secrets of ignored keys are not copied.
    comments = [line for line in text.splitlines() if line.startswith("# ") and " -- " in line]
    assert len(comments) == len(read_ufo(folder).ignored)
    assert any(line.startswith("# TOP_P = 0.0  -- saucer sends no top_p") for line in comments)
    assert "sk-backup-secret" not in text
    assert 'model = "gpt-4o"  # HOST_AGENT.API_MODEL' in text


def test_saucer_toml_takes_ufo_key_names(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "saucer.toml").write_text("[system]\nMAX_STEP = 7\n")
    assert load_any_settings().system.max_step == 7  # ./saucer.toml, as saucer reads it by default
    (tmp_path / "top.toml").write_text('MAX_ROUND = 2\nCONTROL_BACKEND = ["uia"]\n[SYSTEM]\nEva_Round = true\n')
    with caplog.at_level(logging.WARNING, logger="saucer.config"):
        s = load_any_settings(tmp_path / "top.toml")
    assert (s.system.max_round, s.system.eva_round) == (2, True)
    assert any("CONTROL_BACKEND" in r.getMessage() for r in caplog.records)
    # Anything else unknown in saucer's own file is still an error naming it.
    (tmp_path / "typo.toml").write_text("[system]\nmax_stpe = 3\n")
    with pytest.raises(ConfigError, match="unknown key 'system.max_stpe'"):
        load_any_settings(tmp_path / "typo.toml")
    (tmp_path / "both.toml").write_text("MAX_STEP = 3\n[system]\nmax_step = 4\n")
    with pytest.raises(ConfigError, match="also set as system.max_step"):
        load_any_settings(tmp_path / "both.toml")


def test_precedence_env_over_ufo_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _ufo_folder(tmp_path)
    monkeypatch.setenv("SAUCER_SYSTEM__MAX_STEP", "9")
    s = load_any_settings(folder, {"system.max_round": 4})
    assert (s.system.max_step, s.system.max_round, s.system.sleep_time) == (9, 4, 0.5)


def test_the_readme_conversion_is_what_saucer_config_convert_prints(tmp_path: Path) -> None:
    """docs/coming-from-ufo.md: its two YAML files, converted by the real command, give its TOML block."""
    import os
    import re
    import subprocess
    import sys

    section = (Path(__file__).resolve().parents[1] / "docs" / "coming-from-ufo.md").read_text()
    files = re.findall(r"```yaml\n# (config/ufo/\w+\.yaml)\n(.*?)```", section, re.S)
    assert [name for name, _ in files] == ["config/ufo/system.yaml", "config/ufo/agents.yaml"]
    for name, body in files:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(body)
    [shown] = re.findall(r"```toml\n(.*?)```", section, re.S)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAUCER_")}
    proc = subprocess.run(
        [sys.executable, "-m", "saucer", "config", "convert", "config/ufo/"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == shown
    (tmp_path / "saucer.toml").write_text(proc.stdout)
    assert (
        load_any_settings(tmp_path / "saucer.toml").model_dump()
        == load_any_settings(tmp_path / "config/ufo").model_dump()
    )
    assert (
        "## The wire protocol" in section and "(how-to/aip-devices.md)" in section
    )  # the wire protocol: where AIP devices are described


def test_convert_errors_are_one_line(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    (tmp_path / "bad.yaml").write_text("MAX_STEP: [\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAUCER_")}
    proc = subprocess.run(
        [sys.executable, "-m", "saucer", "config", "convert", "bad.yaml"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0 and proc.stdout == ""
    assert (
        proc.stderr.strip().startswith("error: config file bad.yaml is not valid YAML")
        and "Traceback" not in proc.stderr
    )
    assert len(proc.stderr.strip().splitlines()) == 1
