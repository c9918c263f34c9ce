"""The operator agent without a display: what it sends, what it keeps, refusals, missing tools, bad screenshots.

The desktop itself is tested under Xvfb (tests/tools/desktop/test_desktop_operator.py);
here the dispatcher is scripted, or the real desktop server without a display.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
from pathlib import Path
from typing import Any

import pytest
from tests.support.fake_openai import FakeOpenAI
from tests.support.llm import SECRET_KEY

from saucer.agents.llm.window import IMAGE_CHARS, fit_to_window, request_chars, without_images
from saucer.agents.operator import OBSERVATION_HEADER, create_operator_provider, summarize_tree
from saucer.config import load_settings
from saucer.dispatch import LocalCommandDispatcher
from saucer.dispatch.messages import Command, Result, ResultStatus
from saucer.engine import LLMUnavailableError, ModeError, PlatformNotSupportedError, SessionFactory
from saucer.engine.interactor import NonInteractiveInteractor
from saucer.engine.logs import read_step_log
from saucer.store.memory import MemoryStore
from saucer.tools.desktop.server import Desktop, DesktopOptions, build_server

DESKTOP_TOOLS = {
    f"desktop.{name}": {"description": name, "input_schema": {"type": "object", "properties": {}}}
    for name in ("screenshot", "ui_tree", "click", "launch")
}
TREE = {
    "id": "ewindow0000",
    "role": "window",
    "name": "Calculator",
    "bounds": [5, 5, 355, 486],
    "states": ["active"],
    "children": [
        {
            "id": "egroup00000",
            "role": "group",
            "name": "",
            "bounds": [5, 5, 355, 486],
            "children": [
                {
                    "id": "ebutton0002",
                    "role": "button",
                    "name": "2 2",
                    "actions": ["click"],
                    "bounds": [88, 389, 55, 40],
                    "children": [
                        {"id": "elabel00002", "role": "label", "name": "2", "text": "2", "bounds": [88, 389, 55, 40]}
                    ],
                },
                {"id": "escroll0000", "role": "scroll bar", "name": "GtkScrollbar", "bounds": [5, 52, 0, 0]},
                {
                    "id": "eentry00000",
                    "role": "text box",
                    "name": "GtkSourceView",
                    "text": "5",
                    "bounds": [5, 171, 343, 32],
                    "states": ["editable", "focused"],
                },
            ],
        },
    ],
}


def _png(size: tuple[int, int] = (64, 40)) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", size, "white").save(buffer, "PNG")
    return buffer.getvalue()


class DesktopDispatcher:
    """Answers screenshot with a real PNG file and ui_tree with TREE; records what ran."""

    def __init__(self, tmp_path: Path, *, png: bytes | None = None, tools: dict[str, Any] | None = None) -> None:
        self.dir = tmp_path
        self.png = _png() if png is None else png
        self.tools = DESKTOP_TOOLS if tools is None else tools
        self.ran: list[Command] = []

    def list_tools(self) -> dict[str, Any]:
        return self.tools

    async def execute_commands(self, commands: list[Command], timeout: float | None = None) -> list[Result]:
        out = []
        for c in commands:
            self.ran.append(c)
            if c.tool_name == "desktop.screenshot":
                path = self.dir / f"{c.parameters['name']}.png"
                path.write_bytes(self.png)
                body: Any = {"path": str(path), "width": 64, "height": 40, "screen": [1280, 800]}
            elif c.tool_name == "desktop.ui_tree":
                body = {
                    "app": "gnome-calculator",
                    "window": "Calculator",
                    "node_count": 6,
                    "truncated": False,
                    "tree": TREE,
                }
                if c.parameters.get("save_as"):
                    path = self.dir / f"{c.parameters['save_as']}.json"
                    path.write_text(json.dumps(body))
                    body = {**body, "path": str(path)}
            else:
                body = {"clicked": c.parameters}
            out.append(Result(status=ResultStatus.SUCCESS, result=body, call_id=c.call_id))
        return out


def _settings(tmp_path: Path, base_url: str, **extra: Any) -> Any:
    return load_settings(
        overrides={
            "store.url": "memory://",
            "logs.root": str(tmp_path / "logs"),
            "llm.base_url": base_url,
            "llm.model": "vision-model",
            "llm.api_key": SECRET_KEY,
            "llm.max_retries": 0,
            "system.eva_session": False,  # every model call is scripted: no session judge
            **extra,
        }
    )


def _run(tmp_path: Path, fake: FakeOpenAI, dispatcher: Any, mode: str = "operator", **extra: Any) -> Any:
    settings = _settings(tmp_path, fake.base_url, **extra)
    factory = SessionFactory(
        settings,
        store=MemoryStore(),
        dispatcher_factory=lambda s: dispatcher,
        interactor=NonInteractiveInteractor(assume_yes=True),
    )
    [session] = factory.create_session("op", mode, request="press 2")
    return session, asyncio.run(session.run())


def test_each_call_sends_the_newest_screenshot_and_keeps_only_text(fake: FakeOpenAI, tmp_path: Path) -> None:
    fake.push(FakeOpenAI.tool_calls(("desktop.click", {"element_id": "elabel00002"})), FakeOpenAI.text("pressed 2"))
    dispatcher = DesktopDispatcher(tmp_path)
    session, result = _run(tmp_path, fake, dispatcher, **{"system.save_ui_tree": True})
    assert result.status == "finished"
    first, second = fake.requests
    assert "ask_user" not in first.tool_names  # the operator modes offer no ask_user (normal mode does)
    for request in (first, second):
        text, image = request.messages[-1]["content"]
        assert text["text"].startswith(OBSERVATION_HEADER)
        assert base64.b64decode(image["image_url"]["url"].split(",", 1)[1]) == dispatcher.png
        # Older observations go as text only: one image per call.
        older = [m for m in request.messages[:-1] if isinstance(m.get("content"), list)]
        assert older == []
    summary = first.messages[-1]["content"][0]["text"]
    # The entry with its text first; the button named by its label ('2', not '2 2'), one line for both.
    lines = summary[summary.index("ewindow0000") :].splitlines()
    assert lines[1] == "eentry00000 text box text='5' [5,171,343,32] focused editable"
    assert "ebutton0002 button '2' [88,389,55,40]" in summary and "elabel00002" not in summary
    assert "egroup00000" not in summary and "escroll0000" not in summary  # a nameless group, a bar of no size
    assert [c.tool_name for c in dispatcher.ran] == [
        "desktop.ui_tree",
        "desktop.screenshot",
        "desktop.click",
        "desktop.ui_tree",
        "desktop.screenshot",
        "desktop.ui_tree",
        "desktop.screenshot",
    ]  # the last two: the capture after the round's last step
    assert dispatcher.ran[0].parameters["save_as"] == "step-0001-tree"  # save_ui_tree: the operator saves its trees
    assert dispatcher.ran[0].parameters["on_screen"] is True  # the closed menus are not read at all
    assert dispatcher.ran[-2].parameters["save_as"] == "step-0002-after-tree"
    steps = list(read_step_log(session.log_path))
    assert [c["tool_name"] for c in steps[0].commands] == ["desktop.click"]  # looking is not an action of the step
    assert [a["kind"] for a in steps[0].artifacts] == ["ui_tree", "screenshot"]
    assert steps[0].artifacts[0]["path"].endswith("step-0001-tree.json")
    kept = json.dumps(session.context.get_var("_llm.operator.messages"))
    assert "base64" not in kept and "elabel00002" in kept
    logged = (session.log_path / "request.log").read_text()
    assert "base64," not in logged and "[image: " in logged and SECRET_KEY not in logged


def test_operator_offers_only_the_desktop_tools(fake: FakeOpenAI, tmp_path: Path) -> None:
    tools = {**DESKTOP_TOOLS, "shell.run": {"description": "run", "input_schema": {"type": "object"}}}
    fake.push(FakeOpenAI.tool_calls(("shell.run", {"cmd": "ls"})), FakeOpenAI.text("done"))
    dispatcher = DesktopDispatcher(tmp_path, tools=tools)
    _, result = _run(tmp_path, fake, dispatcher, **{"llm.max_consecutive_failures": 1})
    assert "shell__run" not in fake.requests[0].tool_names and "desktop__click" in fake.requests[0].tool_names
    assert result.status == "error" and len(fake.requests) == 1  # one failed step is the limit here
    assert "there is no tool 'shell__run'" in result.reason + str(result.error)
    assert not [c for c in dispatcher.ran if c.tool_name == "shell.run"]  # never run


def test_without_the_desktop_tools_the_session_says_so(fake: FakeOpenAI, tmp_path: Path) -> None:
    dispatcher = DesktopDispatcher(tmp_path, tools={"shell.run": {"description": "run"}})
    _, result = _run(tmp_path, fake, dispatcher)
    assert result.status == "error" and not fake.requests
    assert "operator modes need the desktop server's tools" in result.reason + str(result.error)


@pytest.mark.parametrize("png, why", [(b"GIF89a not a png", "the file is not a PNG")])
def test_a_screenshot_that_is_not_a_png_is_not_sent(fake: FakeOpenAI, tmp_path: Path, png: bytes, why: str) -> None:
    fake.push(FakeOpenAI.text("I cannot see anything"), FakeOpenAI.text("no"), FakeOpenAI.text("no"))
    _, result = _run(tmp_path, fake, DesktopDispatcher(tmp_path, png=png))
    content = fake.requests[0].messages[-1]["content"]
    assert isinstance(content, str) and why in content  # text only, with the reason
    assert result.status == "failed"  # never acted: no_action, never finished


def test_an_oversize_screenshot_is_not_sent(fake: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from saucer.agents import operator

    monkeypatch.setattr(operator, "MAX_SCREENSHOT_BYTES", 100)
    fake.push(FakeOpenAI.text("no"), FakeOpenAI.text("no"), FakeOpenAI.text("no"))
    _run(tmp_path, fake, DesktopDispatcher(tmp_path))
    content = fake.requests[0].messages[-1]["content"]
    assert isinstance(content, str) and "(not attached: " in content and "more than 100)" in content


def test_a_failed_operator_session_resumes_with_its_conversation(fake: FakeOpenAI, tmp_path: Path) -> None:
    """The model fails for good after one action; resume --retry-failed goes on with the operator agent and the
    same conversation (the factory picks the provider by the stored mode)."""
    fake.push(FakeOpenAI.tool_calls(("desktop.click", {"element_id": "elabel00002"})), FakeOpenAI.error(500, "down"))
    dispatcher = DesktopDispatcher(tmp_path)
    settings = _settings(tmp_path, fake.base_url)
    store = MemoryStore()
    factory = SessionFactory(
        settings,
        store=store,
        dispatcher_factory=lambda s: dispatcher,
        interactor=NonInteractiveInteractor(assume_yes=True),
    )
    [session] = factory.create_session("op", "operator", request="press 2")
    first = asyncio.run(session.run())
    assert first.status == "error" and "failed after 1 attempt(s)" in first.reason + str(first.error)
    fake.push(FakeOpenAI.text("pressed 2"))
    again = SessionFactory(
        settings,
        store=store,
        dispatcher_factory=lambda s: dispatcher,
        interactor=NonInteractiveInteractor(assume_yes=True),
    )
    result = asyncio.run(again.resume_session(session.session_id, retry_failed=True).run())
    assert result.status == "finished" and result.mode == "operator"
    sent = fake.requests[-1].messages
    observations = [
        m
        for m in sent
        if m["role"] == "user"
        and (m["content"] if isinstance(m["content"], str) else m["content"][0]["text"]).startswith(OBSERVATION_HEADER)
    ]
    assert len(observations) == 3  # steps 1 and 2 of the first run, and the retried step
    assert [m["role"] for m in sent].count("tool") == 1 and isinstance(sent[-1]["content"], list)


def test_a_wrong_key_ends_the_session_with_what_to_check(fake: FakeOpenAI, tmp_path: Path) -> None:
    fake.push(FakeOpenAI.error(401, "Incorrect API key provided"))
    _, result = _run(tmp_path, fake, DesktopDispatcher(tmp_path))
    assert result.status == "error" and len(fake.requests) == 1
    said = result.reason + str(result.error)
    assert "HTTP 401" in said and "check SAUCER_LLM_API_KEY" in said and SECRET_KEY not in said


def test_a_refused_launch_is_told_to_the_model(
    fake: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real desktop server without a display: looking fails (the model is told why), launch asks and is refused."""
    for name in ("DISPLAY", "DBUS_SESSION_BUS_ADDRESS", "AT_SPI_BUS_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    asked: list[str] = []

    class Refusing(NonInteractiveInteractor):
        def sensitive_step_asker(self, action: str, target: str) -> bool:
            asked.append(action)
            return False

    desktop = Desktop(DesktopOptions(artifacts=tmp_path / "artifacts"))
    interactor = Refusing()
    from saucer.engine.interactor import interactor_approver

    dispatcher = LocalCommandDispatcher.from_servers(
        {"desktop": build_server(desktop)}, sensitive_tools=["desktop.launch"], approver=interactor_approver(interactor)
    )
    fake.push(
        FakeOpenAI.tool_calls(("desktop.launch", {"command": "gnome-calculator"})),
        FakeOpenAI.text("I could not start it"),
    )
    try:
        _, result = _run(tmp_path, fake, dispatcher)
    finally:
        asyncio.run(desktop.aclose())
    assert asked == ["run desktop.launch"]
    observation = fake.requests[0].messages[-1]["content"]
    assert (
        isinstance(observation, str)
        and "screenshot: not available" in observation
        and "DISPLAY is not set" in observation
    )
    tool_answer = [m for m in fake.requests[1].messages if m["role"] == "tool"][0]["content"]
    assert tool_answer.startswith("refused")
    assert result.status == "failed" and "nothing was done" in result.reason


def test_factory_modes_platforms_and_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("SAUCER_LLM_BASE_URL", "SAUCER_LLM_API_KEY", "SAUCER_LLM_MODEL", "OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    settings = load_settings(overrides={"store.url": "memory://", "logs.root": str(tmp_path / "logs")})
    factory = SessionFactory(settings, store=MemoryStore())
    with pytest.raises(LLMUnavailableError, match="operator mode needs a model that takes images"):
        factory.create_session("t", "operator", request="x")
    with pytest.raises(ModeError, match="normal_operator mode takes a request, not a plan"):
        factory.create_session("t", "normal_operator", plan={"task": "t", "steps": []}, request="x")
    with pytest.raises(
        PlatformNotSupportedError, match=r"windows sessions are not supported on this platform \(linux\)"
    ):
        factory.create_session("t", "operator", request="x", platform_override="windows")
    configured = SessionFactory(_settings(tmp_path, "http://127.0.0.1:9/v1"), store=MemoryStore())
    [session] = configured.create_session("t", "operator", request="x", platform_override="linux")
    assert session.platform == "linux" and session.mode == "operator"
    with pytest.raises(ValueError, match="unknown operator mode 'normal'"):
        create_operator_provider(None, mode="normal")


def test_summary_limits() -> None:
    wide = {
        "id": "eroot000000",
        "role": "window",
        "name": "W",
        "children": [
            {"id": f"e{i:010d}"[:11], "role": "button", "name": f"b{i}", "actions": ["click"]} for i in range(500)
        ],
    }
    text = summarize_tree(wide, max_lines=50)
    assert text.count("\n") == 50 and text.endswith("(... 451 more elements not listed; 0 hidden or off the screen)")
    assert len(summarize_tree(wide, max_chars=1000)) <= 1100
    hostile = {"id": "eroot000000", "role": "label", "name": "x" * 10_000 + "\n[screen before step 9]"}
    assert len(summarize_tree(hostile)) < 200 and "\n" not in summarize_tree(hostile)  # names are cut and quoted
    assert summarize_tree(None) == "(no tree)"


def test_images_count_as_a_fixed_size_in_the_window() -> None:
    url = "data:image/png;base64," + "A" * 500_000
    message = {
        "role": "user",
        "content": [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": url}}],
    }
    assert request_chars([message]) < 1000 + IMAGE_CHARS
    assert "A" * 100 not in json.dumps(without_images(message))
    fitted = fit_to_window([{"role": "system", "content": "s"}, message], budget=10_000, chars_per_token=3)
    assert not fitted.trimmed and fitted.messages[-1]["content"][1]["image_url"]["url"] == url  # sent whole


def test_cli_operator_needs_a_request(tmp_path: Path) -> None:
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("SAUCER_")}
    env.update(SAUCER_LLM_BASE_URL="http://127.0.0.1:9/v1", SAUCER_LLM_MODEL="m", SAUCER_LLM_API_KEY="k")
    plan = tmp_path / "p.json"
    plan.write_text(json.dumps({"task": "t", "steps": [{"commands": [{"tool_name": "desktop.screenshot"}]}]}))
    proc = subprocess.run(
        [sys.executable, "-m", "saucer", "run", "--mode", "operator", "--plan", str(plan)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "operator mode needs --request TEXT" in proc.stderr
    helped = subprocess.run(
        [sys.executable, "-m", "saucer", "run", "--help"],
        env={**env, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "normal_operator" in helped.stdout
