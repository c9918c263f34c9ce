"""Secrets never stored: an endpoint (and a tool) that echo the API key leave no trace of it anywhere saucer writes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.fake_openai import FakeOpenAI, RecordedRequest

KEY = "sk-test-" + "Zq8" * 12
SERVICE_TOKEN = "svc-token-4f9a8b7c6d5e4f3a"


def _echoing(fake: FakeOpenAI) -> None:
    """Every reply quotes the request's Authorization header; the first also has the shell print a token."""
    calls = {"n": 0}

    def respond(request: RecordedRequest) -> Any:
        calls["n"] += 1
        header = request.headers.get("authorization", "")
        content = f"you sent Authorization: {header} (key {header.removeprefix('Bearer ')})"
        if calls["n"] == 1:
            return fake.tool_calls(("shell.run", {"command": "cat deploy.env"}), content=content)
        return fake.text(content)

    fake.responder = respond


def _saucer(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "saucer", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=120,
    )


def test_an_echoed_key_and_token_are_in_no_log_store_export_or_output(fake: FakeOpenAI, tmp_path: Path) -> None:
    _echoing(fake)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SAUCER_", "OPENAI_"))}
    env.update(
        SAUCER_LLM_BASE_URL=fake.base_url,
        SAUCER_LLM_MODEL="gpt-4o-mini",
        SAUCER_LLM_API_KEY=KEY,
        SAUCER_SERVICE_TOKENS=f"ci={SERVICE_TOKEN}",  # a secret of this environment, that a file holds too
        COLUMNS="200",
        NO_COLOR="1",
    )
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "deploy.env").write_text(f"DEPLOY_TOKEN={SERVICE_TOKEN}\n")
    run = _saucer("run", "--request", "show me the environment", "--workspace", "ws", "--yes", cwd=tmp_path, env=env)
    assert fake.requests and fake.requests[0].headers["authorization"] == f"Bearer {KEY}"  # the key was used
    session_id = re.search(r"running session (\S+)", run.stdout).group(1)  # type: ignore[union-attr]
    exported = _saucer("export", session_id, cwd=tmp_path, env=env)
    assert exported.returncode == 0, exported.stderr

    outputs = {"run": run.stdout + run.stderr, "export": exported.stdout}
    files = {
        str(p.relative_to(tmp_path)): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and "ws" not in p.parts
    }
    assert any(name.endswith("saucer.db") for name in files)
    assert any(name.endswith("request.log") for name in files)
    for secret in (KEY, SERVICE_TOKEN, KEY.removeprefix("sk-")):
        for name, text in outputs.items():
            assert secret not in text, f"{secret[:12]}... printed by saucer {name}"
        for name, data in files.items():
            assert secret.encode() not in data, f"{secret[:12]}... stored in {name}"
    request_log = next(data for name, data in files.items() if name.endswith("request.log")).decode()
    assert "Authorization: Bearer ***" in request_log  # what the endpoint echoed, redacted
    assert "DEPLOY_TOKEN=***" in exported.stdout  # what the tool printed, redacted in the store
