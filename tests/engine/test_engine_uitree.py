"""system.save_ui_tree without a display: a look before each step, kept in the step's record, never failing it.

The real desktop is tested under Xvfb (tests/tools/desktop/test_desktop_plan.py);
here the dispatcher is scripted.
"""

from __future__ import annotations

import asyncio
from typing import Any

from tests.support.engine import ScriptedAgent, command_plan
from tests.support.fakes import FakeDispatcher

from saucer.dispatch.messages import Command, Result, ResultStatus
from saucer.engine import Session
from saucer.engine.logs import StepRecord, read_step_log
from saucer.engine.uitree import look
from saucer.store.memory import MemoryStore

DESKTOP = [{"name": "desktop.ui_tree"}, {"name": "desktop.screenshot"}, {"name": "files.write"}]


class DesktopFake(FakeDispatcher):
    """ui_tree and screenshot answer like the desktop server (or fail, or raise, as told)."""

    def __init__(self, tree_error: str | None = None, raises: bool = False) -> None:
        super().__init__(tools=DESKTOP)
        self.tree_error = tree_error
        self.raises = raises

    async def execute_commands(self, commands: list[Command], timeout: float | None = None) -> list[Result]:
        if self.raises:
            raise ConnectionError("the desktop server is gone")
        out = []
        for c in commands:
            self.ran.append(c)
            if c.tool_name == "desktop.ui_tree" and self.tree_error:
                out.append(Result.failure(c, self.tree_error))
            elif c.tool_name == "desktop.ui_tree":
                path = f"/art/{c.parameters['save_as']}.json"
                out.append(
                    Result(
                        status=ResultStatus.SUCCESS,
                        call_id=c.call_id,
                        result={"app": "calc", "window": "Calculator", "node_count": 9, "path": path, "tree": None},
                    )
                )
            elif c.tool_name == "desktop.screenshot":
                out.append(
                    Result(
                        status=ResultStatus.SUCCESS,
                        call_id=c.call_id,
                        result={"path": f"/art/{c.parameters['name']}.png", "width": 8, "height": 6},
                    )
                )
            else:
                out.append(Result(status=ResultStatus.SUCCESS, result={"ok": True}, call_id=c.call_id))
        return out


def _run(settings: Any, dispatcher: Any, **kw: Any) -> tuple[Session, Any]:
    session = Session(
        "ui", mode="follower", settings=settings, store=MemoryStore(), dispatcher=dispatcher, plan=command_plan(3), **kw
    )
    return session, asyncio.run(session.run())


def test_one_tree_and_one_screenshot_before_each_step(make_settings: Any) -> None:
    dispatcher = DesktopFake()
    session, result = _run(make_settings(**{"system.save_ui_tree": True}), dispatcher)
    assert result.status == "finished"
    steps = list(read_step_log(session.log_path))
    assert [[a for a in s.artifacts if not a.get("after")] for s in steps] == [
        [
            {
                "kind": "ui_tree",
                "path": f"/art/step-000{n}-tree.json",
                "app": "calc",
                "window": "Calculator",
                "nodes": 9,
            },
            {"kind": "screenshot", "path": f"/art/step-000{n}-screen.png", "width": 8, "height": 6},
        ]
        for n in (1, 2, 3)
    ]
    # After the last step of each round (each step of this plan is a round), once more, marked "after".
    last = {s.round: s.session_step for s in steps}
    for step in steps:
        n = step.session_step
        assert [a for a in step.artifacts if a.get("after")] == (
            [
                {
                    "kind": "ui_tree",
                    "path": f"/art/step-000{n}-after-tree.json",
                    "app": "calc",
                    "window": "Calculator",
                    "nodes": 9,
                    "after": True,
                },
                {
                    "kind": "screenshot",
                    "path": f"/art/step-000{n}-after-screen.png",
                    "width": 8,
                    "height": 6,
                    "after": True,
                },
            ]
            if last[step.round] == n
            else []
        )
    # The look is not one of the step's commands (the plan's experience and routing see only the plan's).
    assert all([c["tool_name"] for c in s.commands] == ["files.write"] for s in steps)
    assert [c.tool_name for c in dispatcher.ran[:5]] == [
        "desktop.ui_tree",
        "desktop.screenshot",
        "files.write",
        "desktop.ui_tree",
        "desktop.screenshot",
    ]
    assert dispatcher.ran[0].parameters == {"include_tree": False, "save_as": "step-0001-tree"}
    # The record is in the store too (the step's event meta), as written to response.log.
    events = [e for e in session.store.read(session.session_id) if e.meta.get("kind") == "step"]
    assert [e.meta["artifacts"] for e in events] == [s.artifacts for s in steps]
    assert StepRecord.from_dict(events[0].meta).artifacts == steps[0].artifacts
    markdown = (session.log_path / "output.md").read_text()
    assert "  - screenshot before the step: ![screenshot before step 1](</art/step-0001-screen.png>)" in markdown
    assert "  - UI tree before the step: [9 elements](</art/step-0003-tree.json>)" in markdown
    assert "  - UI tree after the step: [9 elements](</art/step-0003-after-tree.json>)" in markdown


def test_on_by_default_off_when_set_and_skipped_for_an_agent_that_looks_itself(make_settings: Any) -> None:
    dispatcher = DesktopFake()
    session, _ = _run(make_settings(), dispatcher)  # the seed's default: on, exactly as when set
    steps = list(read_step_log(session.log_path))
    assert all(len([a for a in s.artifacts if not a.get("after")]) == 2 for s in steps)  # before each step
    assert any(a.get("after") for s in steps for a in s.artifacts)  # and after a round's last step
    on, _ = _run(make_settings(**{"system.save_ui_tree": True}), DesktopFake())
    assert [s.artifacts for s in steps] == [s.artifacts for s in read_step_log(on.log_path)]
    dispatcher = DesktopFake()
    session, _ = _run(make_settings(**{"system.save_ui_tree": False}), dispatcher)
    assert all(not s.artifacts for s in read_step_log(session.log_path))
    assert [c.tool_name for c in dispatcher.ran] == ["files.write"] * 3

    class Looker(ScriptedAgent):
        looks_at_desktop = True

    dispatcher = DesktopFake()
    session = Session(
        "ui",
        mode="normal",
        settings=make_settings(**{"system.save_ui_tree": True}),
        store=MemoryStore(),
        dispatcher=dispatcher,
        agents=lambda s: Looker(steps=2),
        request="go",
    )
    assert asyncio.run(session.run()).status == "finished"
    # Nothing before its steps (it looks itself); after the round's last step, the round captures the end state.
    assert [c.parameters.get("save_as") or c.parameters.get("name") for c in dispatcher.ran] == [
        "step-0002-after-tree",
        "step-0002-after-screen",
    ]


def test_a_failed_look_is_an_entry_never_a_failed_step(make_settings: Any) -> None:
    settings = make_settings(**{"system.save_ui_tree": True})
    session, result = _run(settings, DesktopFake(tree_error="no application is on the accessibility bus"))
    assert result.status == "finished"
    first = list(read_step_log(session.log_path))[0].artifacts
    assert first[0] == {"kind": "ui_tree", "error": "no application is on the accessibility bus"}
    assert first[1]["kind"] == "screenshot" and first[1]["path"].endswith("step-0001-screen.png")

    session, result = _run(settings, DesktopFake(raises=True))
    assert result.status == "failed"  # the plan's own command failed (the dispatcher is gone), not the look
    [step] = list(read_step_log(session.log_path))
    assert all(a["error"].startswith("dispatcher error: ConnectionError") for a in step.artifacts)


def test_look_bounds_what_it_keeps() -> None:
    class Chatty(DesktopFake):
        extra = 0

        async def execute_commands(self, commands: list[Command], timeout: float | None = None) -> list[Result]:
            return [Result.failure(c, "x" * 100_000) for c in commands] + [
                Result.failure(commands[0], "more")
            ] * self.extra

    view = asyncio.run(look(Chatty(), "step-0001"))
    assert [len(e["error"]) for e in view.artifacts()] == [500, 500]
    chatty = Chatty()
    chatty.extra = 1
    view = asyncio.run(look(chatty, "step-0001"))
    assert "returned 2 results for 1 command" in view.errors["ui_tree"]
    assert asyncio.run(look(None, "s")).artifacts()[0] == {"kind": "ui_tree", "error": "no command dispatcher"}


def test_without_desktop_tools_it_is_skipped_said_once_and_recorded(make_settings: Any, caplog: Any) -> None:
    """The default cannot apply without a desktop: no look is attempted, one warning line, and the
    session's start and end events (and its result) say what was skipped and why."""
    import logging

    from saucer.engine import defaults

    defaults._SAID.clear()
    settings = make_settings()
    assert settings.system.save_ui_tree is True
    with caplog.at_level(logging.WARNING, logger="saucer.engine"):
        first, result = _run(settings, FakeDispatcher())  # files only: no desktop.ui_tree
        second, _ = _run(settings, FakeDispatcher())
    assert result.status == "finished"
    assert all(not s.artifacts for s in read_step_log(first.log_path))
    lines = [r.getMessage() for r in caplog.records if "save_ui_tree" in r.getMessage()]
    assert lines == [f"system.save_ui_tree is on but skipped: {defaults.NO_DESKTOP}"]  # once for both sessions
    events = list(first.store.read(first.session_id))
    start = next(e for e in events if e.meta.get("kind") == "session_start")
    end = next(e for e in events if e.meta.get("kind") == "session_end")
    assert start.meta["skipped"] == end.meta["skipped"] == {"save_ui_tree": defaults.NO_DESKTOP}
    assert result.skipped == {"save_ui_tree": defaults.NO_DESKTOP}


class WindowsFake(FakeDispatcher):
    """A desktop whose focused window is the calculator once it is launched."""

    def __init__(self) -> None:
        super().__init__(tools=[{"name": "desktop.windows"}, {"name": "desktop.launch"}, {"name": "files.write"}])
        self.launched = False

    async def execute_commands(self, commands: list[Command], timeout: float | None = None) -> list[Result]:
        out = []
        for c in commands:
            self.ran.append(c)
            if c.tool_name == "desktop.launch":
                self.launched = True
                out.append(
                    Result(
                        status=ResultStatus.SUCCESS,
                        call_id=c.call_id,
                        result={
                            "pid": 42,
                            "command": ["/usr/bin/gnome-calculator"],
                            "running": True,
                            "ready": True,
                            "app": "gnome-calculator",
                            "windows": ["Calculator"],
                            "log": "/x.log",
                        },
                    )
                )
            elif c.tool_name == "desktop.windows":
                windows = [
                    {
                        "id": "0x1",
                        "title": "Terminal",
                        "app": "xterm",
                        "pid": 7,
                        "bounds": [0, 0, 9, 9],
                        "focused": False,
                    }
                ]
                if self.launched:
                    windows.append(
                        {
                            "id": "0x2",
                            "title": "Calculator",
                            "app": "Gnome-calculator",
                            "pid": 42,
                            "bounds": [0, 0, 365, 496],
                            "focused": True,
                        }
                    )
                out.append(
                    Result(status=ResultStatus.SUCCESS, call_id=c.call_id, result={"windows": windows, "focused": None})
                )
            else:
                out.append(Result(status=ResultStatus.SUCCESS, result={"ok": True}, call_id=c.call_id))
        return out


def test_application_names_come_from_the_focused_window(make_settings: Any) -> None:
    from saucer.context import ContextNames
    from saucer.engine.plan import parse_plan

    plan = parse_plan(
        {
            "task": "calc",
            "steps": [
                {
                    "subtask": "write",
                    "commands": [{"tool_name": "files.write", "parameters": {"path": "a", "content": "b"}}],
                },
                {
                    "subtask": "start",
                    "commands": [{"tool_name": "desktop.launch", "parameters": {"command": "gnome-calculator"}}],
                },
            ],
        },
        "plan",
    )
    dispatcher = WindowsFake()
    store = MemoryStore()
    session = Session("calc", mode="follower", settings=make_settings(), store=store, dispatcher=dispatcher, plan=plan)
    assert asyncio.run(session.run()).status == "finished"
    # After each step one windows call, never one of the step's commands.
    assert [c.tool_name for c in dispatcher.ran] == [
        "files.write",
        "desktop.windows",
        "desktop.launch",
        "desktop.windows",
    ]
    steps = [e for e in store.read(session.session_id) if e.meta.get("kind") == "step"]
    assert all("APPLICATION_WINDOW_INFO" not in str(op) for op in steps[0].ops)  # nothing focused yet: unchanged
    ctx = session.context
    assert ctx.get(ContextNames.APPLICATION_WINDOW_INFO) == {
        "id": "0x2",
        "title": "Calculator",
        "app": "Gnome-calculator",
        "pid": 42,
        "bounds": [0, 0, 365, 496],
    }
    assert ctx.get(ContextNames.APPLICATION_ROOT_NAME) == "Gnome-calculator"
    assert ctx.get(ContextNames.APPLICATION_PROCESS_NAME) == "gnome-calculator"  # the launched executable
    # Without a desktop in its tools a session asks nothing.
    plain = FakeDispatcher()
    asyncio.run(
        Session(
            "p", mode="follower", settings=make_settings(), store=MemoryStore(), dispatcher=plain, plan=command_plan(1)
        ).run()
    )
    assert [c.tool_name for c in plain.ran] == ["files.write"]
