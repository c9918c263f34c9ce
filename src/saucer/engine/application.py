"""UFO's application names, filled from what the desktop tool reports of the focused window.

In a session whose tools include ``desktop.windows`` (``[desktop] enabled``,
the operator modes, ``system.save_ui_tree`` with a display), after each step
that ran commands the round asks the desktop which window has the focus and
sets, in the step's own commit:

``APPLICATION_WINDOW_INFO``
    the focused window as the tool reports it: ``id``, ``title``, ``app``
    (its WM_CLASS), ``pid`` and ``bounds``;
``APPLICATION_ROOT_NAME``
    the application that window belongs to (its ``app``);
``APPLICATION_PROCESS_NAME``
    its program: the executable a ``desktop.launch`` of this session started
    with that pid, else the application's name on the accessibility bus
    (``desktop.ui_tree``, ``desktop.launch``), else its ``app``.

Nothing is changed when no window has the focus or the desktop cannot say
(the names keep their last values), and asking never fails a step. The
window handle itself (``APPLICATION_WINDOW``) is a live object, never stored.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

from saucer.context import Context, ContextNames
from saucer.dispatch.messages import Command, ResultStatus
from saucer.engine.uitree import UI_TREE_TOOL, call_one

__all__ = ["ApplicationWatch", "WINDOWS_TOOL", "LAUNCH_TOOL"]

WINDOWS_TOOL = "desktop.windows"
LAUNCH_TOOL = "desktop.launch"
_WINDOW_FIELDS = ("id", "title", "app", "pid", "bounds")


class ApplicationWatch:
    """One session's view of the desktop's focused application (see the module docs)."""

    def __init__(self) -> None:
        #: pid -> program name, from what this session's commands reported.
        self.programs: dict[int, str] = {}

    @staticmethod
    def wanted(tools: Mapping[str, Any]) -> bool:
        """Whether a session with these tools has a desktop to ask."""
        return WINDOWS_TOOL in tools

    def learn(self, commands: list[dict[str, Any]], results: list[dict[str, Any]]) -> None:
        """Remember the programs a step's successful ``launch`` and ``ui_tree`` calls named."""
        for command, result in zip(commands, results, strict=False):
            data = result.get("result")
            if result.get("status") != "success" or not isinstance(data, dict) or not isinstance(data.get("pid"), int):
                continue
            name = command.get("tool_name")
            argv = data.get("command")
            if name == LAUNCH_TOOL and isinstance(argv, list) and argv and isinstance(argv[0], str):
                self.programs[data["pid"]] = PurePath(argv[0]).name
            elif name in (LAUNCH_TOOL, UI_TREE_TOOL) and isinstance(data.get("app"), str) and data["app"]:
                self.programs.setdefault(data["pid"], data["app"])

    async def after_step(
        self, dispatcher: Any, context: Context, commands: list[dict[str, Any]], results: list[dict[str, Any]]
    ) -> None:
        """After a step that ran commands: ask for the focused window and set the application names."""
        self.learn(commands, results)
        if not commands or dispatcher is None:
            return
        answer = await call_one(dispatcher, Command(tool_name=WINDOWS_TOOL, parameters={}, tool_type="data_collection"))
        if answer.status != ResultStatus.SUCCESS or not isinstance(answer.result, dict):
            return
        windows = answer.result.get("windows")
        focused = (
            next((w for w in windows if isinstance(w, dict) and w.get("focused")), None)
            if isinstance(windows, list)
            else None
        )
        if focused is None:
            return
        info = {key: focused.get(key) for key in _WINDOW_FIELDS if key in focused}
        app = focused.get("app") if isinstance(focused.get("app"), str) else ""
        pid = focused.get("pid")
        process = (self.programs.get(pid) if isinstance(pid, int) else None) or app
        context.set(ContextNames.APPLICATION_WINDOW_INFO, info)
        context.set(ContextNames.APPLICATION_ROOT_NAME, app)
        context.set(ContextNames.APPLICATION_PROCESS_NAME, process)
