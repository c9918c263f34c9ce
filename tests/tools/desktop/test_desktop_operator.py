"""Operator mode adds 2 and 3 on GNOME Calculator, driven by a scripted OpenAI-compatible endpoint.

The endpoint is a real HTTP server on loopback (tests/agents/fake_openai.py).
It plays a computer-use model: it answers only when the newest message
carries a valid PNG screenshot of the whole screen, launches the calculator,
clicks 2 + 3 = by the element ids it reads in the UI-tree summary, and says
"5" once the summary shows it. The session runs through the real factory,
the real dispatcher and the real desktop server, under Xvfb.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import re
from pathlib import Path
from typing import Any

from PIL import Image
from tests.support.fake_openai import FakeOpenAI, RecordedRequest, Scripted

from saucer.config import load_settings  # noqa: E402
from saucer.engine.factory import SessionFactory  # noqa: E402
from saucer.engine.interactor import NonInteractiveInteractor  # noqa: E402
from saucer.engine.logs import read_step_log  # noqa: E402
from saucer.store.memory import MemoryStore  # noqa: E402

_LINE = re.compile(r"^\s*(e[a-z2-7]{10}) (?:button|label) '(.*?)'", re.M)


class ApprovingInteractor(NonInteractiveInteractor):
    """Says yes to sensitive steps and remembers what it was asked."""

    def __init__(self) -> None:
        super().__init__(assume_yes=True)
        self.asked: list[tuple[str, str]] = []

    def sensitive_step_asker(self, action: str, target: str) -> bool:
        self.asked.append((action, target))
        return True


class CalculatorModel:
    """The scripted model: checks each request's screenshot, then launch, clicks, answer."""

    MAX_LOOKS_AGAIN = 3

    def __init__(self) -> None:
        self.screens: list[tuple[int, int]] = []
        self.observations: list[str] = []
        self.problems: list[str] = []
        self.clicked = False
        self.looks_again = 0

    def _refuse(self, why: str) -> Scripted:
        self.problems.append(why)
        return FakeOpenAI.error(400, why)

    def __call__(self, request: RecordedRequest) -> Scripted:
        body = request.json or {}
        if not any(t["function"]["name"] == "desktop__click" for t in body.get("tools", [])):
            return self._refuse(f"no desktop__click tool offered: {request.tool_names}")
        last = request.messages[-1]
        parts = last.get("content")
        if last.get("role") != "user" or not isinstance(parts, list) or len(parts) != 2:
            return self._refuse(f"the newest message is not text + image: {str(last)[:300]}")
        text, image = parts
        url = image.get("image_url", {}).get("url", "")
        if not url.startswith("data:image/png;base64,"):
            return self._refuse(f"not a PNG data URL: {url[:60]}")
        try:
            png = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1], validate=True)))
            png.load()
        except Exception as exc:  # noqa: BLE001 - the test reports it
            return self._refuse(f"not a valid PNG: {exc}")
        self.screens.append(png.size)
        summary = text["text"]
        self.observations.append(summary)
        labels = {name: key for key, name in _LINE.findall(summary)}
        if "UI tree: not available" in summary:
            return FakeOpenAI.tool_calls(("desktop.launch", {"command": "gnome-calculator", "wait": 30}))
        if not self.clicked:
            missing = [name for name in ("2", "+", "3", "=") if name not in labels]
            if missing:
                return self._refuse(f"the tree summary has no labels {missing}: {summary[:2000]}")
            self.clicked = True
            return FakeOpenAI.tool_calls(*[("desktop.click", {"element_id": labels[n]}) for n in ("2", "+", "3", "=")])
        if re.search(r"text box .*text='5'", summary):
            return FakeOpenAI.text("The calculator shows 5.")
        # The application may not have redrawn yet (a loaded machine): look again, as a model would.
        if self.looks_again < self.MAX_LOOKS_AGAIN:
            self.looks_again += 1
            return FakeOpenAI.tool_calls(("desktop.screenshot", {}))
        boxes = [line for line in summary.splitlines() if "text box" in line]
        return self._refuse(f"no 5 in the tree after the clicks and {self.looks_again} more looks: {boxes}")


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


def test_operator_mode_adds_2_and_3(desktop_env: dict[str, str], tmp_path: Path) -> None:
    model = CalculatorModel()
    interactor = ApprovingInteractor()
    with FakeOpenAI() as fake:
        fake.responder = model
        settings = _settings(tmp_path, fake.base_url, **{"system.save_ui_tree": True})
        factory = SessionFactory(settings, store=MemoryStore(), interactor=interactor, workspace=tmp_path)
        [session] = factory.create_session(
            "calculator", "operator", request="Add 2 and 3 on the calculator.", platform_override="linux"
        )
        result = asyncio.run(session.run())
        requests = list(fake.requests)
    assert not model.problems, model.problems
    assert result.status == "finished", result
    looks = model.looks_again  # extra looks while the application redrew (0 on an idle machine)
    assert session.platform == "linux" and result.steps == 3 + looks
    assert model.screens == [(1280, 800)] * (3 + looks)  # every call carried the whole screen
    assert [a for a, _ in interactor.asked] == ["run desktop.launch"]  # launch is sensitive: asked once
    assert "text='5'" in model.observations[-1]
    # Only the desktop tools are offered in operator mode.
    assert {name.split("__")[0] for name in requests[0].tool_names} == {"desktop"}

    steps = list(read_step_log(session.log_path))
    assert [[c["tool_name"] for c in s.commands] for s in steps] == [
        ["desktop.launch"],
        ["desktop.click"] * 4,
        *[["desktop.screenshot"]] * looks,
        [],
    ]
    assert all(r["status"] == "success" for s in steps for r in s.results)
    # Each step keeps what it saw: the tree (save_ui_tree) and the screenshot, as artifacts.
    for step in steps:
        kinds = {a["kind"]: a for a in step.artifacts if not a.get("after")}
        shot = kinds["screenshot"]
        assert Image.open(shot["path"]).size == (1280, 800) == (shot["width"], shot["height"])
        assert Path(shot["path"]).name == f"step-{step.session_step:04d}-screen.png"
    assert "error" in {a["kind"]: a for a in steps[0].artifacts}["ui_tree"]  # nothing was open yet
    # After the round's last step the desktop is captured once more, listed like the others.
    after = {a["kind"]: a for a in steps[-1].artifacts if a.get("after")}
    assert Path(after["screenshot"]["path"]).name == f"step-{steps[-1].session_step:04d}-after-screen.png"
    assert [s.session_step for s in steps if any(a.get("after") for a in s.artifacts)] == [steps[-1].session_step]
    last_tree = json.loads(Path(after["ui_tree"]["path"]).read_text())
    texts = [n.get("text") for n in _nodes(last_tree["tree"]) if n["role"] == "text box"]
    assert "5" in texts
    # The conversation the Context keeps, and request.log, hold no image data.
    log = (session.log_path / "request.log").read_text()
    assert "base64," not in log and "[image: " in log
    history = json.dumps(session.context.get_var("_llm.operator.messages"))
    assert "base64," not in history and "[screen before step 3]" in history


def _nodes(node: dict[str, Any]) -> Any:
    yield node
    for child in node.get("children", ()):
        yield from _nodes(child)


def test_normal_operator_offers_the_shell_and_files_too(desktop_env: dict[str, str], tmp_path: Path) -> None:
    """normal_operator mixes the desktop tools with shell and files; the model answers at once (no action)."""
    with FakeOpenAI() as fake:
        fake.push(FakeOpenAI.text("nothing to do"), FakeOpenAI.text("still nothing"), FakeOpenAI.text("no"))
        settings = _settings(tmp_path, fake.base_url, **{"llm.no_action_retries": 2})
        factory = SessionFactory(settings, store=MemoryStore(), interactor=ApprovingInteractor(), workspace=tmp_path)
        [session] = factory.create_session("mixed", "normal_operator", request="Look around.")
        result = asyncio.run(session.run())
        requests = list(fake.requests)
    assert result.status == "failed" and "no action: the model answered without calling a tool" in result.reason
    servers = {name.split("__")[0] for name in requests[0].tool_names}
    assert {"desktop", "shell", "files"} <= servers
    assert len(requests) == 3 and all(isinstance(r.messages[-1]["content"], list) for r in requests)
