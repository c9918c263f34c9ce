"""Helpers of the LLM agent tests (a module with its own name: ``conftest`` is ambiguous across test folders)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from saucer.agents.llm.client import ModelSettings
from saucer.dispatch.messages import Command, Result, ResultStatus

#: The API key of the tests: it must never appear in a log, a record or an error.
SECRET_KEY = "sk-test-DO-NOT-LOG-4f2b9c"

TOOL_INFO = {
    "shell.run": {
        "description": "Run a shell command",
        "input_schema": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
    },
    "files.read": {
        "description": "Read a file",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        "tool_type": "data_collection",
    },
    "files.delete": {
        "description": "Delete a file",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        "sensitive": True,
    },
}


class FakeDispatcher:
    """Records commands; answers from ``outcomes[tool_name]`` (a Result factory) or succeeds."""

    def __init__(self, tool_info: dict[str, Any] | None = None, outcomes: dict[str, Any] | None = None) -> None:
        self.tool_info = TOOL_INFO if tool_info is None else tool_info
        self.outcomes = outcomes or {}
        self.commands: list[Command] = []

    def list_tools(self) -> dict[str, Any]:
        return self.tool_info

    async def execute_commands(self, commands: list[Command], timeout: float | None = None) -> list[Result]:
        out = []
        for c in commands:
            self.commands.append(c)
            outcome = self.outcomes.get(c.tool_name)
            if outcome == "fail":
                out.append(Result.failure(c, f"{c.tool_name} failed: no such file"))
            else:
                out.append(
                    Result(
                        status=ResultStatus.SUCCESS, result={"ok": c.tool_name, "args": c.parameters}, call_id=c.call_id
                    )
                )
        return out


def app_settings(tmp_path: Path, **system: Any) -> Any:
    from saucer.config import load_settings

    # These tests script every model call: the session's judge (eva_session, on by default as in the
    # seed) is off unless a test turns it on, so it asks the model nothing they did not script.
    overrides: dict[str, Any] = {
        "store.url": "memory://",
        "logs.root": str(tmp_path / "logs"),
        "system.eva_session": False,
    }
    overrides.update({f"system.{k}": v for k, v in system.items()})
    return load_settings(overrides=overrides)


def make_session(
    tmp_path: Path,
    model_settings: ModelSettings,
    *,
    request: str = "list the files",
    dispatcher: Any = None,
    interactor: Any = None,
    task: str = "llm-test",
    **system: Any,
) -> Any:
    from saucer.agents.llm import create_agent_provider
    from saucer.engine.interactor import NonInteractiveInteractor
    from saucer.engine.session import Session

    settings = app_settings(tmp_path, **system)
    return Session(
        task,
        mode="normal",
        settings=settings,
        request=request,
        agents=create_agent_provider(model_settings),
        dispatcher=dispatcher if dispatcher is not None else FakeDispatcher(),
        interactor=interactor if interactor is not None else NonInteractiveInteractor(),
    )
