"""Operator sessions on four applications, by a scripted model that uses only what its observations show,
and the experience of one of them replayed as a follower plan in a new session.

The model (a real HTTP endpoint, tests/agents/fake_openai.py) launches the
application, finds the text to type into in the tree summary (within its
first 40 lines and 3,000 characters) by its role and state, types into it by
the id it read there, and finishes once the next summary shows the typed
text on that element's line. Nothing of the application is hard-coded in the
model but its command and the text to type.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support.desktop import CASES, EDITABLE, FOLDER, Case, need
from tests.support.fake_openai import FakeOpenAI, RecordedRequest, Scripted

from saucer.config import load_settings  # noqa: E402
from saucer.engine.factory import SessionFactory  # noqa: E402
from saucer.engine.interactor import NonInteractiveInteractor  # noqa: E402
from saucer.engine.logs import read_step_log  # noqa: E402
from saucer.store.memory import MemoryStore  # noqa: E402
from saucer.tools.desktop.virtual import VirtualDesktop  # noqa: E402

_TREE_HEAD = re.compile(r"^UI tree of the focused .*:$", re.M)


@pytest.fixture(scope="module")
def virtual_desktop() -> Iterator[VirtualDesktop]:
    """One Xvfb and bus for the module, with private XDG folders."""
    need(*(c.package for c in CASES.values()))
    FOLDER.mkdir(exist_ok=True)
    with VirtualDesktop(private_home=True) as desktop:
        yield desktop


class TypingModel:
    """Launch, type into the editable element the summary lists, finish when the summary shows the text."""

    MAX_LOOKS_AGAIN = 5

    def __init__(self, case: Case) -> None:
        self.case = case
        self.launched = False
        self.element: str | None = None
        self.observations: list[str] = []
        self.problems: list[str] = []
        self.looks_again = 0

    def _refuse(self, why: str) -> Scripted:
        self.problems.append(why)
        return FakeOpenAI.error(400, why)

    def __call__(self, request: RecordedRequest) -> Scripted:
        last = request.messages[-1]
        parts = last.get("content")
        if last.get("role") != "user" or not isinstance(parts, list) or parts[1].get("type") != "image_url":
            return self._refuse(f"the newest message is not an observation with a screenshot: {str(last)[:300]}")
        text = parts[0]["text"]
        self.observations.append(text)
        if not self.launched:
            self.launched = True
            return FakeOpenAI.tool_calls(("desktop.launch", {"command": list(self.case.command), "wait": 40}))
        head = _TREE_HEAD.search(text)
        if head is None:
            return self._refuse(f"no UI tree in the observation: {text[:1500]}")
        summary = text[head.end() + 1 :]
        if self.element is None:
            found = EDITABLE.search(summary)
            if found is None:
                return self._refuse(f"no editable element in the summary: {summary[:3000]}")
            before = summary[: found.end()]
            if before.count("\n") >= 40 or len(before) >= 3000:
                return self._refuse(f"the editable element is not in the first 40 lines / 3,000 characters: {summary}")
            self.element = found.group(1)
            return FakeOpenAI.tool_calls(("desktop.type_text", {"element_id": self.element, "text": self.case.typed}))
        line = next((line for line in summary.splitlines() if line.startswith(self.element + " ")), "")
        if "text='" in line and self.case.typed in line:
            return FakeOpenAI.text(f"Typed {self.case.typed!r}; the field shows it.")
        if self.looks_again < self.MAX_LOOKS_AGAIN:  # the application may redraw late on a loaded machine
            self.looks_again += 1
            return FakeOpenAI.tool_calls(("desktop.screenshot", {"scale": 0.25}))
        return self._refuse(f"the typed text is not on the element's line {line!r}: {summary[:3000]}")


def _settings(tmp_path: Path, base_url: str, **extra: Any) -> Any:
    return load_settings(
        overrides={
            "store.url": "memory://",
            "logs.root": str(tmp_path / "logs"),
            "llm.base_url": base_url,
            "llm.model": "vision-model",
            "llm.api_key": "sk-operator-test",
            "llm.max_retries": 0,
            "llm.context_window": 32768,
            "system.eva_session": False,  # the scripted model answers the agent only, not a session judge
            **extra,
        }
    )


def _operate(tmp_path: Path, case: Case, **extra: Any) -> tuple[Any, Any, TypingModel]:
    model = TypingModel(case)
    with FakeOpenAI() as fake:
        fake.responder = model
        factory = SessionFactory(
            _settings(tmp_path, fake.base_url, **extra),
            store=MemoryStore(),
            interactor=NonInteractiveInteractor(assume_yes=True),
            workspace=tmp_path,
        )
        [session] = factory.create_session(
            f"type-{case.app}", "operator", platform_override="linux", request=f"Type {case.typed!r} into {case.app}."
        )
        result = asyncio.run(session.run())
    return session, result, model


@pytest.mark.parametrize("name", list(CASES))
def test_an_operator_session_types_into_each_application(
    desktop_env: dict[str, str], tmp_path: Path, name: str
) -> None:
    session, result, model = _operate(tmp_path, CASES[name])
    assert not model.problems, model.problems
    assert result.status == "finished", result
    steps = list(read_step_log(session.log_path))
    tools = [[c["tool_name"] for c in s.commands] for s in steps]
    assert tools[:2] == [["desktop.launch"], ["desktop.type_text"]] and tools[-1] == []
    assert all(r["status"] == "success" for s in steps for r in s.results)
    typed = next(
        r["result"]
        for s in steps
        for c, r in zip(s.commands, s.results, strict=False)
        if c["tool_name"] == "desktop.type_text"
    )
    assert typed["element"]["id"] == model.element and typed["locator"]["app"] == CASES[name].app


def test_an_operator_sessions_experience_replays_in_a_new_session(desktop_env: dict[str, str], tmp_path: Path) -> None:
    case = CASES["mousepad"]
    experience = tmp_path / "experience"
    session, result, model = _operate(
        tmp_path / "operator", case, **{"system.save_experience": "always", "system.experience_dir": str(experience)}
    )
    assert not model.problems and result.status == "finished", (model.problems, result)
    [plan_file] = experience.glob("*.json")
    plan = json.loads(plan_file.read_text())
    commands = [c for step in plan["steps"] for c in step["commands"]]
    [typing] = [c for c in commands if c["tool_name"] == "desktop.type_text"]
    assert typing["parameters"]["element_id"] == model.element
    locator = typing["parameters"]["locator"]
    assert locator["app"] == "mousepad" and locator["role"] == "text" and locator["path"][0] == "frame"

    # A new session: a new desktop server and a new Mousepad, where the saved id means nothing.
    settings = load_settings(
        overrides={
            "store.url": "memory://",
            "logs.root": str(tmp_path / "replay-logs"),
            "desktop.enabled": True,
            "system.save_ui_tree": True,
        }
    )
    factory = SessionFactory(
        settings, store=MemoryStore(), interactor=NonInteractiveInteractor(assume_yes=True), workspace=tmp_path
    )
    [replay] = factory.create_session("replay", "follower", plan=plan_file, platform_override="linux")
    outcome = asyncio.run(replay.run())
    assert outcome.status == "finished", outcome
    steps = list(read_step_log(replay.log_path))
    results = {c["tool_name"]: r for s in steps for c, r in zip(s.commands, s.results, strict=False)}
    assert all(r["status"] == "success" for r in results.values()), results
    found = results["desktop.type_text"]["result"]["element"]
    assert found["id"] != model.element and found["role"] == "text"  # found again by its locator
    after = [a for a in steps[-1].artifacts if a.get("after") and a["kind"] == "ui_tree"]
    tree = json.loads(Path(after[0]["path"]).read_text())["tree"]
    texts = [n.get("text") for n in _nodes(tree) if n["role"] == "text"]
    assert case.typed in texts, texts


def _nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("children", ()):
        yield from _nodes(child)
