"""Plans: the JSON files follower and batch modes run, and experience is saved as.

::

    {
      "task": "tidy the notes folder",
      "object": "notes/",            # optional: what the task is about (recorded)
      "close": false,                # optional: UFO's "close the app afterwards" (recorded)
      "steps": [
        "summarise what changed",    # a text step: needs an LLM agent
        {"subtask": "list the notes",
         "commands": [{"tool_name": "files.list", "parameters": {"path": "notes"},
                       "tool_type": "data_collection"}]}
      ]
    }

A command step runs offline through the dispatcher. Errors name the file and
the field (``plan.json: steps[1].commands[0].tool_name: field required``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Iterable, Literal, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError

from saucer.dispatch.messages import Command
from saucer.engine.errors import PlanError

__all__ = ["Plan", "PlanStep", "PlanCommand", "load_plan", "load_plan_folder", "parse_plan", "plan_from_rounds", "TASKS_STATUS_FILE"]

TASKS_STATUS_FILE = "tasks_status.json"


class PlanCommand(BaseModel):
    """One command of a plan step."""

    model_config = ConfigDict(extra="forbid")

    tool_name: str = Field(min_length=1)
    parameters: dict[str, Any] = Field(default_factory=dict)
    tool_type: Literal["action", "data_collection"] = "action"

    def to_command(self) -> Command:
        """A fresh :class:`Command` (new call id) for one execution."""
        return Command(tool_name=self.tool_name, parameters=self.parameters, tool_type=self.tool_type)


class PlanStep(BaseModel):
    """A step that runs commands without a model."""

    model_config = ConfigDict(extra="forbid")

    subtask: str
    commands: list[PlanCommand] = Field(min_length=1)


def _step_kind(value: Any) -> str | None:
    if isinstance(value, str):
        return "_text"
    if isinstance(value, (dict, PlanStep)):
        return "_step"
    return None


StepSpec = Annotated[
    Union[Annotated[str, Tag("_text")], Annotated[PlanStep, Tag("_step")]],
    Discriminator(
        _step_kind,
        custom_error_type="plan_step",
        custom_error_message="a step must be a text or an object with subtask and commands",
    ),
]


class Plan(BaseModel):
    """A task and its steps."""

    model_config = ConfigDict(extra="forbid")

    task: str = Field(min_length=1)
    object: str | None = None
    close: bool = False
    steps: list[StepSpec] = Field(default_factory=list)

    def step_text(self, index: int) -> str:
        """The request a step stands for (its text, or its subtask)."""
        step = self.steps[index]
        return step if isinstance(step, str) else step.subtask

    def text_steps(self) -> list[int]:
        """Indexes of the steps that need an LLM agent."""
        return [i for i, s in enumerate(self.steps) if isinstance(s, str)]


def _loc(loc: Iterable[Any]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, str) and part.startswith("_"):
            continue  # union tags
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(plan)"


def _problems(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors():
        msg = error["msg"]
        if error["type"] == "missing":
            msg = "field required"
        elif error["type"] == "extra_forbidden":
            msg = "unknown field"
        parts.append(f"{_loc(error['loc'])}: {msg[0].lower() + msg[1:]}")
    return "; ".join(parts)


def parse_plan(data: Any, source: str = "plan") -> Plan:
    """Validate plan data (a dict or a :class:`Plan`); :class:`PlanError` names ``source`` and the field."""
    if isinstance(data, Plan):
        return data
    if not isinstance(data, dict):
        raise PlanError(f"{source}: a plan is a JSON object with task and steps, not {type(data).__name__}")
    try:
        return Plan.model_validate(data)
    except ValidationError as exc:
        raise PlanError(f"{source}: {_problems(exc)}") from None


def load_plan(path: str | Path) -> Plan:
    """Read and validate a plan file."""
    p = Path(path)
    try:
        raw = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PlanError(f"plan file {p} does not exist") from None
    except IsADirectoryError:
        raise PlanError(f"{p} is a folder; a plan is a JSON file (batch_normal mode takes a folder)") from None
    except UnicodeDecodeError:
        raise PlanError(f"plan file {p} is not UTF-8 text") from None
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise PlanError(f"plan file {p} is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}") from None
    return parse_plan(data, str(p))


def load_plan_folder(folder: str | Path) -> list[tuple[Path, Plan]]:
    """Every ``*.json`` plan of a folder, sorted by name (``tasks_status.json`` excluded)."""
    p = Path(folder)
    if not p.exists():
        raise PlanError(f"plan folder {p} does not exist")
    if not p.is_dir():
        raise PlanError(f"{p} is not a folder of plans")
    files = sorted(f for f in p.glob("*.json") if f.name != TASKS_STATUS_FILE)
    if not files:
        raise PlanError(f"plan folder {p} has no *.json plans")
    return [(f, load_plan(f)) for f in files]


def plan_from_rounds(task: str, rounds: list[tuple[str, list[dict[str, Any]]]]) -> Plan:
    """A replayable plan from ``(request, commands)`` per round; rounds without commands are left out."""
    steps: list[Any] = []
    for request, commands in rounds:
        if not commands:
            continue
        steps.append(
            PlanStep(
                subtask=request or "step",
                commands=[
                    PlanCommand(
                        tool_name=c["tool_name"],
                        parameters=c.get("parameters") or {},
                        tool_type=c.get("tool_type", "action"),
                    )
                    for c in commands
                ],
            )
        )
    return Plan(task=task, steps=steps)
