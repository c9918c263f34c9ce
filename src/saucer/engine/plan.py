"""Plans: the JSON files follower and batch modes run, and experience is saved as.

::

    {
      "task": "tidy the notes folder",
      "object": "notes/",            # optional: what the task is about (recorded)
      "close": false,                # optional: UFO's "close the app afterwards" (recorded)
      "vars": {"phase": "draft"},    # optional: context variables the session starts with
      "participants": ["user:ana"],  # optional: who else may write to it while it runs
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

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError

from saucer.context.events import to_wire
from saucer.dispatch.messages import Command
from saucer.dispatch.toolcheck import command_problem
from saucer.engine.errors import PlanError
from saucer.engine.logs import slug
from saucer.store.model import check_participants

__all__ = [
    "Plan",
    "PlanStep",
    "PlanCommand",
    "load_plan",
    "load_plan_folder",
    "parse_plan",
    "plan_from_rounds",
    "check_plan_tools",
    "PlanIdentity",
    "plan_identity",
    "load_plan_folder_with_identity",
    "initial_vars",
    "declared_participants",
]


class PlanCommand(BaseModel):
    """One command of a plan step.

    ``expect_exit`` (e.g. ``[0, 1]``) lists the exit codes that count as
    success for a tool that runs a process (the built-in ``shell.run``); it is
    passed to the tool as its ``expect_exit`` parameter. Any other exit code
    makes the command a failed result.
    """

    model_config = ConfigDict(extra="forbid")

    tool_name: str = Field(min_length=1)
    parameters: dict[str, Any] = Field({})
    tool_type: Literal["action", "data_collection"] = "action"
    expect_exit: list[int] | None = None

    def call_parameters(self) -> dict[str, Any]:
        """The parameters the tool receives (``expect_exit`` included when declared)."""
        if self.expect_exit is None:
            return self.parameters
        return {**self.parameters, "expect_exit": self.expect_exit}

    def to_command(self) -> Command:
        """A fresh :class:`Command` (new call id) for one execution."""
        return Command(tool_name=self.tool_name, parameters=self.call_parameters(), tool_type=self.tool_type)


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
    Annotated[str, Tag("_text")] | Annotated[PlanStep, Tag("_step")],
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
    steps: list[StepSpec] = Field([])
    #: Context variables the session starts with (``--var`` and ``context_vars=`` win over them).
    vars: dict[str, Any] = Field({})
    #: Who else may write to the session while it runs (its runner and its user always may).
    participants: list[Annotated[str, Field(min_length=1)]] = Field([])

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


def initial_vars(plan: Plan | None, context_vars: Mapping[str, Any] | None) -> dict[str, Any]:
    """The context variables a new session starts with: the plan's ``vars``, then ``context_vars``
    over them. Each is checked as a write would be (a name that is not a non-empty str is a
    TypeError, a value that cannot be stored a ``ValueNotStorableError`` naming it)."""
    merged = {**(plan.vars if plan is not None else {}), **dict(context_vars or {})}
    for key, value in merged.items():
        if not isinstance(key, str) or not key:
            raise TypeError(f"context variable names are non-empty strings, not {key!r}")
        to_wire(value, f"vars.{key}")
    return merged


def declared_participants(plan: Plan | None, participants: Iterable[str] | None, user: str | None) -> list[str] | None:
    """Who a new session declares may write to it: the plan's ``participants`` and
    ``participants``, with ``user`` (who submitted it) among them; None when neither names
    anyone (the session is open to every writer). Its runner always may."""
    if isinstance(participants, str):
        raise TypeError("participants are a list of names, not a str")
    named = [*(plan.participants if plan is not None else []), *(participants or [])]
    if not named:
        return None
    return check_participants([*named, *([user] if user else [])])


def _read_plan_file(p: Path) -> bytes:
    try:
        return p.read_bytes()
    except FileNotFoundError:
        raise PlanError(f"plan file {p} does not exist") from None
    except IsADirectoryError:
        raise PlanError(f"{p} is a folder; a plan is a JSON file (batch_normal mode takes a folder)") from None


def _parse_plan_bytes(raw: bytes, p: Path) -> Plan:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise PlanError(f"plan file {p} is not UTF-8 text") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PlanError(
            f"plan file {p} is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}"
        ) from None
    except RecursionError:  # the decoder's own guard, before any of it is used
        raise PlanError(f"plan file {p} nests lists or objects too deeply to be a plan") from None
    try:
        return parse_plan(data, str(p))
    except RecursionError:
        raise PlanError(f"plan file {p} nests lists or objects too deeply to be a plan") from None


def load_plan(path: str | Path) -> Plan:
    """Read and validate a plan file."""
    p = Path(path)
    return _parse_plan_bytes(_read_plan_file(p), p)


@dataclass(frozen=True)
class PlanIdentity:
    """What makes a plan *the same plan*: its resolved path and the hash of its content.

    Editing a plan, or moving it, makes it another plan; two folders with the
    same name hold different plans. ``key`` is one string for both (a
    SHA-256), usable as a store key or a queue item id.
    """

    path: str
    sha256: str

    @property
    def key(self) -> str:
        return hashlib.sha256(f"{self.path}\0{self.sha256}".encode()).hexdigest()

    def session_id(self) -> str:
        """The id of the batch session that runs this plan: ``<file stem>-<12 hex of the key>``."""
        return f"{slug(Path(self.path).stem, 40)}-{self.key[:12]}"


def plan_identity(path: str | Path, content: bytes | None = None) -> PlanIdentity:
    """The identity of the plan file at ``path`` (``content``: its bytes, when already read)."""
    p = Path(path)
    data = _read_plan_file(p) if content is None else content
    return PlanIdentity(os.path.realpath(p), hashlib.sha256(data).hexdigest())


def load_plan_folder(folder: str | Path) -> list[tuple[Path, Plan]]:
    """Every ``*.json`` plan of a folder, sorted by name."""
    return [(path, plan) for path, plan, _ in load_plan_folder_with_identity(folder)]


def load_plan_folder_with_identity(folder: str | Path) -> list[tuple[Path, Plan, PlanIdentity]]:
    """Every ``*.json`` plan of a folder, sorted by name, with its identity (from the same bytes)."""
    p = Path(folder)
    if not p.exists():
        raise PlanError(f"plan folder {p} does not exist")
    if not p.is_dir():
        raise PlanError(f"{p} is not a folder of plans")
    files = sorted(p.glob("*.json"))
    if not files:
        raise PlanError(f"plan folder {p} has no *.json plans")
    out = []
    for f in files:
        raw = _read_plan_file(f)
        out.append((f, _parse_plan_bytes(raw, f), plan_identity(f, raw)))
    return out


def check_plan_tools(plan: Plan, tools: Mapping[str, Any], source: str = "plan") -> None:
    """Check every command of ``plan`` against a dispatcher's tool list (``list_tools()``) before it runs.

    :class:`PlanError` names ``source``, the step and the command, and the
    closest known tool names: ``plan.json: steps[1].commands[0]: unknown tool
    'frobnicate' (closest: files.read)``. Text steps are for an LLM agent and
    are not checked.
    """
    problems = []
    for i, step in enumerate(plan.steps):
        if isinstance(step, str):
            continue
        for j, command in enumerate(step.commands):
            problem = command_problem(command.tool_name, command.call_parameters(), tools)
            if problem is not None:
                problems.append(f"steps[{i}].commands[{j}]: {problem}")
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise PlanError(f"{source}: {'; '.join(problems[:3])}{more}")


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
