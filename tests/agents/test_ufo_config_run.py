"""A UFO config.yaml and agents.yaml, passed to --config, run sessions with the settings they map to."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.fake_openai import FakeOpenAI, RecordedRequest

KEY = "sk-ufo-run-" + "x7" * 10

# Written from UFO's documented keys (legacy ufo/config/config.yaml and config/ufo/agents.yaml).
CONFIG_YAML = """\
MAX_STEP: 6
MAX_ROUND: 2
SLEEP_TIME: 0
EVA_SESSION: False
EVA_ROUND: False
SAVE_EXPERIENCE: "always_not"
LOG_TO_MARKDOWN: True
SAVE_UI_TREE: False
MAX_TOKENS: 777
TEMPERATURE: 0.25
CONTROL_BACKEND: "uia"
SAFE_GUARD: True
"""


def _agents_yaml(base_url: str) -> str:
    return (
        "HOST_AGENT:\n"
        "  VISUAL_MODE: False\n"
        '  API_TYPE: "openai"\n'
        f'  API_BASE: "{base_url}/chat/completions"\n'
        f'  API_KEY: "{KEY}"\n'
        '  API_VERSION: "2025-02-01-preview"\n'
        '  API_MODEL: "ufo-host-model"\n'
    )


def _saucer(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SAUCER_", "OPENAI_"))}
    env.update(COLUMNS="200", NO_COLOR="1")
    return subprocess.run(
        [sys.executable, "-m", "saucer", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=120,
    )


def _ufo(tmp_path: Path, fake: FakeOpenAI) -> Path:
    folder = tmp_path / "ufo" / "config"
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(CONFIG_YAML)
    (folder / "agents.yaml").write_text(_agents_yaml(fake.base_url))
    return folder


def test_a_request_runs_on_the_model_agents_yaml_names(fake: FakeOpenAI, tmp_path: Path) -> None:
    calls: list[RecordedRequest] = []

    def respond(request: RecordedRequest) -> Any:
        calls.append(request)
        if len(calls) == 1:
            return fake.tool_calls(("shell.run", {"command": "echo from-ufo-config"}))
        return fake.text("done")

    fake.responder = respond
    _ufo(tmp_path, fake)
    (tmp_path / "ws").mkdir()
    run = _saucer("run", "--request", "say hello", "--config", "ufo/config", "--workspace", "ws", "--yes", cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    first = calls[0]
    assert first.json["model"] == "ufo-host-model"
    assert first.json["max_tokens"] == 777 and first.json["temperature"] == 0.25
    assert first.headers["authorization"] == f"Bearer {KEY}"
    # The keys without a counterpart are listed once, on one line of stderr.
    ignored = [line for line in run.stderr.splitlines() if "without a counterpart" in line]
    assert len(ignored) == 1 and "CONTROL_BACKEND" in ignored[0] and "HOST_AGENT.API_VERSION" in ignored[0]
    assert KEY not in run.stdout + run.stderr
    sid = re.search(r"running session (\S+)", run.stdout).group(1)  # type: ignore[union-attr]
    log_dir = next((tmp_path / "logs").rglob(sid))
    assert (log_dir / "output.md").is_file()  # LOG_TO_MARKDOWN
    assert not (log_dir / "experience.json").exists()  # SAVE_EXPERIENCE always_not
    assert (
        not (log_dir / "evaluation.log").exists() or not (log_dir / "evaluation.log").read_text().strip()
    )  # EVA_SESSION off


def test_a_plan_stops_at_ufos_max_round(fake: FakeOpenAI, tmp_path: Path) -> None:
    _ufo(tmp_path, fake)
    steps = [
        {"subtask": f"s{i}", "commands": [{"tool_name": "shell.run", "parameters": {"command": f"echo {i}"}}]}
        for i in range(3)
    ]
    (tmp_path / "plan.json").write_text(json.dumps({"task": "three", "steps": steps}))
    run = _saucer("run", "--plan", "plan.json", "--config", "ufo/config/config.yaml", "--workspace", ".", cwd=tmp_path)
    assert "max_round (2) reached" in run.stdout + run.stderr, run.stdout + run.stderr
    rows = json.loads(_saucer("sessions", "--json", cwd=tmp_path).stdout)
    assert rows[0]["status"] == "stopped" and rows[0]["rounds"] == 2
    assert not fake.requests  # command steps need no model
