"""What a step saw of the desktop: its UI tree and a screenshot, taken through the ``desktop`` tools.

With ``system.save_ui_tree = true`` the round calls :func:`look` before each
step (unless the agent looks for itself, as the operator agent does: its
``looks_at_desktop`` is true) and keeps what it saved in the step's record
(:attr:`~saucer.engine.logs.StepRecord.artifacts`), so ``saucer show`` can
list, for every step, the tree and the screenshot the step started from::

    [{"kind": "ui_tree", "path": ".../artifacts/step-0002-tree.json", "app": "gnome-calculator", "nodes": 95},
     {"kind": "screenshot", "path": ".../artifacts/step-0002-screen.png", "width": 1280, "height": 800}]

After the last step of a round the round looks once more (``step-0007-after-tree.json``,
``step-0007-after-screen.png``): those entries carry ``"after": true``.

Looking never fails a step: a tree that cannot be read (no window yet, no
display) is an entry with ``error`` instead of ``path``.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

from saucer.dispatch.messages import Command, Result, ResultStatus

__all__ = ["DesktopView", "look", "artifact_name", "call_one", "replayable", "UI_TREE_TOOL", "SCREENSHOT_TOOL"]

UI_TREE_TOOL = "desktop.ui_tree"
SCREENSHOT_TOOL = "desktop.screenshot"
_ERROR_CHARS = 500


def replayable(command: dict[str, Any], result: dict[str, Any] | None) -> dict[str, Any]:
    """``command`` as a plan keeps it: a desktop action on an element id also carries the element's
    ``locator`` from its result, so a later session (where the id means nothing) finds the element again."""
    answer = (result or {}).get("result")
    if not (str(command.get("tool_name", "")).startswith("desktop.") and isinstance(answer, dict)):
        return command
    locator = answer.get("locator")
    parameters = command.get("parameters") or {}
    if not isinstance(locator, dict) or "element_id" not in parameters or "locator" in parameters:
        return command
    return {**command, "parameters": {**parameters, "locator": locator}}


def artifact_name(session_step: int) -> str:
    """The artifact name prefix of a session step: ``step-0007``."""
    return f"step-{session_step:04d}"


@dataclass
class DesktopView:
    """One look at the desktop: the tools' answers (None when a call failed) and the failures."""

    tree: dict[str, Any] | None = None
    screenshot: dict[str, Any] | None = None
    errors: dict[str, str] = field(default_factory=dict)

    def artifacts(self) -> list[dict[str, Any]]:
        """The entries for :attr:`StepRecord.artifacts`: one per file saved, or the error."""
        out: list[dict[str, Any]] = []
        if self.tree is not None:
            entry: dict[str, Any] = {"kind": "ui_tree"}
            if self.tree.get("path"):
                entry["path"] = self.tree["path"]
            entry.update(
                {"app": self.tree.get("app"), "window": self.tree.get("window"), "nodes": self.tree.get("node_count")}
            )
            out.append({k: v for k, v in entry.items() if v is not None})
        elif "ui_tree" in self.errors:
            out.append({"kind": "ui_tree", "error": self.errors["ui_tree"]})
        if self.screenshot is not None:
            shot = self.screenshot
            out.append(
                {
                    "kind": "screenshot",
                    "path": shot.get("path"),
                    "width": shot.get("width"),
                    "height": shot.get("height"),
                }
            )
        elif "screenshot" in self.errors:
            out.append({"kind": "screenshot", "error": self.errors["screenshot"]})
        return out


async def call_one(dispatcher: Any, command: Command) -> Result:
    """``command``'s one result through ``dispatcher``; a failure result (never an exception) when it fails."""
    try:
        out = dispatcher.execute_commands([command])
        if inspect.isawaitable(out):
            out = await out
        results = [r if isinstance(r, Result) else Result.model_validate(r) for r in (out or [])]
    except Exception as exc:  # noqa: BLE001 - looking must not fail the step
        return Result.failure(command, f"dispatcher error: {type(exc).__name__}: {exc}")
    if len(results) != 1:
        return Result.failure(command, f"the dispatcher returned {len(results)} results for 1 command")
    return results[0]


async def look(
    dispatcher: Any,
    name: str,
    *,
    save_tree: bool = True,
    include_tree: bool = False,
    tree_parameters: dict[str, Any] | None = None,
    screenshot_parameters: dict[str, Any] | None = None,
) -> DesktopView:
    """Read the focused window's UI tree, then take a screenshot, through ``dispatcher``.

    ``name`` prefixes the artifacts (``NAME-tree.json`` when ``save_tree``,
    ``NAME-screen.png``). Each call is its own batch, so a failed tree read
    (no window yet) never skips the screenshot. Never raises, except for
    cancellation.
    """
    view = DesktopView()
    if dispatcher is None:
        view.errors.update(ui_tree="no command dispatcher", screenshot="no command dispatcher")
        return view
    parameters: dict[str, Any] = {"include_tree": include_tree, **(tree_parameters or {})}
    if save_tree:
        parameters["save_as"] = f"{name}-tree"
    tree = await call_one(
        dispatcher, Command(tool_name=UI_TREE_TOOL, parameters=parameters, tool_type="data_collection")
    )
    shot = await call_one(
        dispatcher,
        Command(
            tool_name=SCREENSHOT_TOOL,
            parameters={"name": f"{name}-screen", **(screenshot_parameters or {})},
            tool_type="data_collection",
        ),
    )
    for key, result in (("ui_tree", tree), ("screenshot", shot)):
        if result.status == ResultStatus.SUCCESS and isinstance(result.result, dict):
            setattr(view, "tree" if key == "ui_tree" else "screenshot", result.result)
        else:
            error = result.error or f"{result.status.value}: {str(result.result)[:200]}"
            view.errors[key] = error[:_ERROR_CHARS]
    return view
