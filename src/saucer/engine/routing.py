"""Declarative routing between agents (AG2-style handoffs), as an alternative to ``next_agent``.

::

    graph = TransitionGraph(
        initial_agent="writer",
        transitions=[
            Transition(ContextEquals("phase", "review"), AgentTarget("reviewer")),
            Transition(Expression("${retries} < 3 and ${status} == 'retry'"), AgentTarget("writer")),
            Transition(FromAgent("reviewer"), Terminate("reviewed"), priority=-1),
        ],
        default_target=Terminate("no transition matched"),
        max_turns=20,
    )

After each step the round asks the graph where to go. Transitions are tried
by descending ``priority`` (ties: in the order given); the first whose
condition holds gives the target, else ``default_target``. Conditions read the
session's live Context, so they see values written earlier in the same step.
A key that is a ``ContextNames`` name reads that typed name, any other key a
context variable (the Context's one rule, :func:`~saucer.context.names.typed_name`);
a missing key is None. With a graph, the graph alone picks
the next agent (``agent.handoff`` and ``next_agent`` are not used); only an
``ERROR`` status ends the round regardless of it.

Targets: :class:`AgentTarget` (that agent, from its initial state),
:class:`StayTarget` (the same agent, in the state its status chose),
:class:`RevertToInitiator` (the agent that handed control to this one),
:class:`Terminate` (end the round). ``max_turns`` caps transitions per round.

Graphs serialise with :meth:`TransitionGraph.to_dict` / :meth:`TransitionGraph.from_dict`.
Custom conditions and targets register a type name with
:func:`register_condition` / :func:`register_target`; a graph naming an
unregistered type raises :class:`~saucer.engine.errors.UnknownConditionError`
when it is loaded, which fails only the session that uses it.

:class:`Expression` is compiled by :mod:`saucer.engine.expression` (no ``eval``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, is_dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from saucer.context.names import typed_name
from saucer.engine.errors import ExpressionError, GraphError, UnknownConditionError
from saucer.engine.expression import compile_expression

if TYPE_CHECKING:
    from saucer.context import Context

__all__ = [
    "RouteInput",
    "Condition",
    "Target",
    "ContextEquals",
    "FromAgent",
    "ToolCalled",
    "Always",
    "Expression",
    "AgentTarget",
    "StayTarget",
    "RevertToInitiator",
    "Terminate",
    "Transition",
    "TransitionGraph",
    "register_condition",
    "register_target",
    "condition_types",
    "target_types",
]


@dataclass(slots=True)
class RouteInput:
    """What a routing decision may look at."""

    context: Context | Mapping[str, Any]
    last_agent: str = ""
    tools: tuple[str, ...] = ()
    turn: int = 0

    def value(self, key: str) -> Any:
        """What ``key`` addresses by the Context's one rule (:func:`~saucer.context.names.typed_name`):
        a typed name's value, else a context variable's (None when unset)."""
        ctx = self.context
        if isinstance(ctx, Mapping):
            return ctx.get(key)
        if typed_name(key) is not None:
            return ctx.get(key)
        return ctx.get_var(key)


# ------------------------------------------------------------------ registries

_CONDITIONS: dict[str, type[Condition]] = {}
_TARGETS: dict[str, type[Target]] = {}


def register_condition(type_name: str) -> Callable[[type[Condition]], type[Condition]]:
    """Register a condition class under ``type_name`` (a decorator)."""

    def deco(cls: type[Condition]) -> type[Condition]:
        cls.type_name = type_name
        _CONDITIONS[type_name] = cls
        return cls

    return deco


def register_target(type_name: str) -> Callable[[type[Target]], type[Target]]:
    """Register a target class under ``type_name`` (a decorator)."""

    def deco(cls: type[Target]) -> type[Target]:
        cls.type_name = type_name
        _TARGETS[type_name] = cls
        return cls

    return deco


def condition_types() -> list[str]:
    """Registered condition type names."""
    return sorted(_CONDITIONS)


def target_types() -> list[str]:
    """Registered target type names."""
    return sorted(_TARGETS)


def _fields_of(item: Condition | Target) -> dict[str, Any]:
    """``{"type": ..., <its dataclass fields>}``: the stored form of a condition or a target."""
    data: dict[str, Any] = {"type": item.type_name}
    if is_dataclass(item):
        data.update({f.name: getattr(item, f.name) for f in fields(item)})  # type: ignore[unreachable]  # mypy takes a Protocol for no dataclass
    return data


class Condition:
    """When a transition applies. Subclasses implement :meth:`matches` and serialise their fields.

    The default :meth:`to_dict`/:meth:`from_dict` use the dataclass fields.
    """

    type_name: ClassVar[str] = ""

    def matches(self, inp: RouteInput) -> bool:
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        return _fields_of(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Condition:
        return cls(**{k: v for k, v in data.items() if k != "type"})


class Target:
    """Where a transition goes."""

    type_name: ClassVar[str] = ""

    def to_dict(self) -> dict[str, Any]:
        return _fields_of(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Target:
        return cls(**{k: v for k, v in data.items() if k != "type"})


def _load(
    kind: str, registry: Mapping[str, type[Condition]] | Mapping[str, type[Target]], data: Any, where: str
) -> Any:
    if isinstance(data, (Condition, Target)):
        return data
    if not isinstance(data, Mapping) or not isinstance(data.get("type"), str):
        raise GraphError(f"{where}: a {kind} is an object with a 'type', not {data!r:.60}")
    cls = registry.get(data["type"])
    if cls is None:
        raise UnknownConditionError(
            f"{where}: unknown {kind} type {data['type']!r}; registered: {', '.join(sorted(registry))} "
            f"(register custom ones with register_{kind}({data['type']!r}))"
        )
    try:
        return cls.from_dict(data)
    except (TypeError, ValueError) as exc:
        raise GraphError(f"{where}: bad {kind} {data['type']!r}: {exc}") from None


# ------------------------------------------------------------------ conditions


@register_condition("context_equals")
@dataclass(frozen=True)
class ContextEquals(Condition):
    """The value of ``key`` equals ``value`` (a missing key equals None)."""

    key: str
    value: Any = None

    def matches(self, inp: RouteInput) -> bool:
        return bool(inp.value(self.key) == self.value)


@register_condition("from_agent")
@dataclass(frozen=True)
class FromAgent(Condition):
    """The step was taken by agent ``name``."""

    name: str

    def matches(self, inp: RouteInput) -> bool:
        return inp.last_agent == self.name


@register_condition("tool_called")
@dataclass(frozen=True)
class ToolCalled(Condition):
    """The step ran a command of tool ``name`` (``server.tool`` or just ``tool``)."""

    name: str

    def matches(self, inp: RouteInput) -> bool:
        name = self.name
        return any(tool == name or tool.rsplit(".", 1)[-1] == name for tool in inp.tools)


@register_condition("always")
@dataclass(frozen=True)
class Always(Condition):
    """Always holds."""

    def matches(self, inp: RouteInput) -> bool:
        return True


@register_condition("expression")
class Expression(Condition):
    """A boolean expression over context values, e.g. ``${retries} < 3 and ${status} == 'ok'``."""

    __slots__ = ("text", "_fn", "keys")

    def __init__(self, text: str) -> None:
        if not isinstance(text, str) or not text.strip():
            raise ExpressionError("an Expression needs a non-empty text")
        self.text = text
        self._fn, self.keys = compile_expression(text)

    def matches(self, inp: RouteInput) -> bool:
        return bool(self.evaluate(inp))

    def evaluate(self, inp: RouteInput | Mapping[str, Any]) -> Any:
        """The expression's value (not only its truth)."""
        if not isinstance(inp, RouteInput):
            inp = RouteInput(inp)
        try:
            return self._fn(inp.value)
        except ExpressionError:
            raise
        except ZeroDivisionError:
            raise ExpressionError(f"expression {self.text!r}: division by zero") from None
        except (TypeError, ValueError) as exc:
            raise ExpressionError(f"expression {self.text!r}: {exc}") from None

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type_name, "text": self.text}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Expression:
        return cls(data["text"])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Expression) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)

    def __repr__(self) -> str:
        return f"Expression({self.text!r})"


# --------------------------------------------------------------------- targets


@register_target("agent")
@dataclass(frozen=True)
class AgentTarget(Target):
    """Hand the next step to agent ``name`` (it starts from its initial state)."""

    name: str


@register_target("stay")
@dataclass(frozen=True)
class StayTarget(Target):
    """The same agent takes the next step."""


@register_target("revert_to_initiator")
@dataclass(frozen=True)
class RevertToInitiator(Target):
    """Back to the agent that handed control to the current one (else the initial agent)."""


@register_target("terminate")
@dataclass(frozen=True)
class Terminate(Target):
    """End the round; ``reason`` becomes ``ROUND_RESULT``."""

    reason: str = ""


# ----------------------------------------------------------------------- graph


@dataclass(frozen=True)
class Transition:
    """``when`` holds → go to ``then``. Higher ``priority`` is tried first."""

    when: Condition
    then: Target
    priority: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"when": self.when.to_dict(), "then": self.then.to_dict(), "priority": self.priority}


@dataclass
class TransitionGraph:
    """Which agent acts next, decided from the Context after each step."""

    initial_agent: str
    transitions: Sequence[Transition] = ()
    default_target: Target = field(default_factory=lambda: Terminate("no transition matched"))
    max_turns: int | None = None
    _ordered: tuple[Transition, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.initial_agent, str) or not self.initial_agent:
            raise GraphError("a TransitionGraph needs the name of its initial agent")
        if self.max_turns is not None and self.max_turns < 1:
            raise GraphError("max_turns must be at least 1")
        for i, t in enumerate(self.transitions):
            if not isinstance(t, Transition) or not isinstance(t.when, Condition) or not isinstance(t.then, Target):
                raise GraphError(f"transitions[{i}] is not a Transition(Condition, Target)")
        indexed = sorted(enumerate(self.transitions), key=lambda it: (-it[1].priority, it[0]))
        self._ordered = tuple(t for _, t in indexed)

    def route(self, inp: RouteInput) -> Target:
        """The target for this step."""
        if self.max_turns is not None and inp.turn >= self.max_turns:
            return Terminate(f"max_turns ({self.max_turns}) reached")
        for transition in self._ordered:
            if transition.when.matches(inp):
                return transition.then
        return self.default_target

    def agent_names(self) -> set[str]:
        """Agents the graph names (its initial agent and every AgentTarget)."""
        names = {self.initial_agent}
        for t in (*self.transitions, Transition(Always(), self.default_target)):
            if isinstance(t.then, AgentTarget):
                names.add(t.then.name)
        return names

    def to_dict(self) -> dict[str, Any]:
        """JSON data that :meth:`from_dict` turns back into an equal graph."""
        return {
            "initial_agent": self.initial_agent,
            "transitions": [t.to_dict() for t in self.transitions],
            "default_target": self.default_target.to_dict(),
            "max_turns": self.max_turns,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TransitionGraph:
        """A graph from :meth:`to_dict` output; unknown condition/target types raise UnknownConditionError."""
        if not isinstance(data, Mapping):
            raise GraphError(f"a transition graph is an object, not {type(data).__name__}")
        unknown = set(data) - {"initial_agent", "transitions", "default_target", "max_turns"}
        if unknown:
            raise GraphError(f"transition graph: unknown field(s) {', '.join(sorted(unknown))}")
        transitions = []
        for i, item in enumerate(data.get("transitions") or []):
            where = f"transitions[{i}]"
            if not isinstance(item, Mapping) or "when" not in item or "then" not in item:
                raise GraphError(f"{where}: a transition is an object with 'when' and 'then'")
            priority = item.get("priority", 0)
            if isinstance(priority, bool) or not isinstance(priority, int):
                raise GraphError(f"{where}.priority must be an integer")
            transitions.append(
                Transition(
                    _load("condition", _CONDITIONS, item["when"], f"{where}.when"),
                    _load("target", _TARGETS, item["then"], f"{where}.then"),
                    priority,
                )
            )
        default = data.get("default_target")
        return cls(
            initial_agent=data.get("initial_agent", ""),
            transitions=transitions,
            default_target=_load("target", _TARGETS, default, "default_target")
            if default is not None
            else Terminate("no transition matched"),
            max_turns=data.get("max_turns"),
        )
