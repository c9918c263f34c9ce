"""Helpers of the LLM agent tests: the API key that must never leak, their tool table, a session over a fake model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.fakes import FakeDispatcher

from saucer.agents.llm.client import ModelSettings

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


def llm_dispatcher(fail: tuple[str, ...] = (), tools: dict[str, Any] | None = None) -> FakeDispatcher:
    """The suite's fake dispatcher offering the LLM tests' tool table (``fail``: tools whose commands fail)."""
    return FakeDispatcher(fail=fail, tools=TOOL_INFO if tools is None else tools)


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
        dispatcher=dispatcher if dispatcher is not None else llm_dispatcher(),
        interactor=interactor if interactor is not None else NonInteractiveInteractor(),
    )
