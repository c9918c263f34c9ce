"""The dispatcher against MCP servers nobody on this project wrote: mcp-server-time and mcp-server-git (stdio)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from saucer.dispatch import Command, LocalCommandDispatcher, ResultStatus

pytestmark = pytest.mark.anyio

VENV_BIN = Path(sys.executable).parent


def _time_server() -> dict[str, object]:
    return {"command": str(VENV_BIN / "mcp-server-time"), "args": ["--local-timezone", "UTC"], "stderr": "discard"}


async def test_time_server_tools_calls_and_errors() -> None:
    async with LocalCommandDispatcher.from_servers({"time": _time_server()}) as dispatcher:
        tools = await dispatcher.list_tools()
        assert {"time.get_current_time", "time.convert_time"} <= set(tools)
        info = tools["time.get_current_time"]
        assert info["server"] == "time" and info["tool"] == "get_current_time" and info["description"]
        assert info["input_schema"]["required"] == ["timezone"]
        json.dumps(tools)  # goes into ContextNames.TOOL_INFO as it is

        ok, qualified_bad, bare_unknown, qualified_unknown = [
            Command(tool_name="get_current_time", parameters={"timezone": "Asia/Tokyo"}, call_id="t1"),
            Command(tool_name="time.get_current_time", parameters={"timezone": 42}, call_id="t2"),
            Command(tool_name="what_time", call_id="t3"),
            Command(tool_name="time.what_time", call_id="t4"),
        ]
        results = await dispatcher.execute_commands([ok, qualified_bad])
        assert [r.call_id for r in results] == ["t1", "t2"]
        assert results[0].status == ResultStatus.SUCCESS and results[0].namespace == "time"
        assert results[0].result["timezone"] == "Asia/Tokyo" and "datetime" in results[0].result
        assert results[1].status == ResultStatus.FAILURE and results[1].result is None
        assert "invalid parameters for tool 'time.get_current_time'" in results[1].error
        assert "timezone" in results[1].error

        [unknown] = await dispatcher.execute_commands([bare_unknown])
        assert unknown.status == ResultStatus.FAILURE and "unknown tool 'what_time'" in unknown.error
        assert "time.get_current_time" in unknown.error  # names what exists
        [unknown] = await dispatcher.execute_commands([qualified_unknown])
        assert "server 'time' has no tool 'what_time'" in unknown.error and unknown.namespace == "time"


async def test_time_server_validates_parameters_itself_too() -> None:
    """Without client-side validation the server's own isError answer becomes the failure."""
    async with LocalCommandDispatcher.from_servers({"time": _time_server()}, validate_parameters=False) as dispatcher:
        missing, bad_zone = await dispatcher.execute_commands(
            [Command(tool_name="time.get_current_time", parameters={})]
        ) + await dispatcher.execute_commands(
            [Command(tool_name="time.get_current_time", parameters={"timezone": "Mars/Olympus"})]
        )
        assert missing.status == ResultStatus.FAILURE and "timezone" in missing.error
        assert missing.error.startswith("tool 'time.get_current_time' failed:")
        assert bad_zone.status == ResultStatus.FAILURE and "Mars/Olympus" in bad_zone.error


@pytest.fixture
def git_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=Saucer Test", "-c", "user.email=test@saucer.invalid"]
    subprocess.run([*git, "init", "-q"], check=True)
    (repo / "notes.txt").write_text("first\n")
    subprocess.run([*git, "add", "notes.txt"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "first commit"], check=True)
    (repo / "notes.txt").write_text("first\nsecond\n")
    return repo


async def test_git_server_tools_calls_and_errors(git_repo: Path) -> None:
    servers = {
        "git": {
            "command": str(VENV_BIN / "mcp-server-git"),
            "args": ["--repository", str(git_repo)],
            "stderr": "discard",
        }
    }
    async with LocalCommandDispatcher.from_servers(servers) as dispatcher:
        tools = await dispatcher.list_tools()
        assert {"git.git_status", "git.git_log", "git.git_diff_unstaged"} <= set(tools)
        assert tools["git.git_status"]["tool_type"] == "data_collection"  # read-only annotation
        assert tools["git.git_commit"]["tool_type"] == "action"

        repo = str(git_repo)
        status, log, diff = await dispatcher.execute_commands(
            [
                Command(tool_name="git.git_status", parameters={"repo_path": repo}, tool_type="data_collection"),
                Command(tool_name="git_log", parameters={"repo_path": repo, "max_count": 1}),
                Command(tool_name="git.git_diff_unstaged", parameters={"repo_path": repo}),
            ]
        )
        assert status.status == ResultStatus.SUCCESS and "notes.txt" in status.result
        assert log.status == ResultStatus.SUCCESS and "first commit" in log.result
        assert diff.status == ResultStatus.SUCCESS and "+second" in diff.result

        missing, skipped = await dispatcher.execute_commands(
            [
                Command(tool_name="git.git_log", parameters={}),
                Command(tool_name="git.git_status", parameters={"repo_path": repo}),
            ]
        )
        assert missing.status == ResultStatus.FAILURE and "repo_path" in missing.error
        assert skipped.status == ResultStatus.SKIPPED

        [outside] = await dispatcher.execute_commands(
            [Command(tool_name="git.git_status", parameters={"repo_path": str(git_repo.parent)})]
        )
        assert outside.status == ResultStatus.FAILURE and "outside the allowed repository" in outside.error

        push = Command(tool_name="git.git_push", parameters={"repo_path": repo})
        [unknown] = await dispatcher.execute_commands([push])
        assert unknown.status == ResultStatus.FAILURE and "git.git_push" in unknown.error
