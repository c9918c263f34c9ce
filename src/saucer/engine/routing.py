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
A key is looked up among the context variables first, then among the typed
``ContextNames``; a missing key is None. With a graph, the graph alone picks
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

:class:`Expression` is parsed by a small interpreter (no ``eval``): ``and``,
``or``, ``not``, comparisons (``== != < <= > >=``, ``in``, ``not in``),
``len()``, ``+ - * /``, parentheses, list literals ``[..]``, numbers, strings,
``True``/``False``/``None`` (also ``true``/``false``/``null``) and ``${key}``.
An ordering comparison between values that cannot be ordered (e.g. None < 3)
is False; arithmetic on the wrong types, or division by zero, is an
:class:`~saucer.engine.errors.ExpressionError`.
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Mapping, Sequence

from saucer.context.names import ContextNames
from saucer.engine.errors import ExpressionError, GraphError, UnknownConditionError

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

_MISSING = object()
_NAMES = ContextNames.__members__


@dataclass(slots=True)
class RouteInput:
    """What a routing decision may look at."""

    context: "Context | Mapping[str, Any]"
    last_agent: str = ""
    tools: tuple[str, ...] = ()
    turn: int = 0

    def value(self, key: str) -> Any:
        """A context variable, else a typed name, else None."""
        ctx = self.context
        if isinstance(ctx, Mapping):
            return ctx.get(key)
        value = ctx.get_var(key, _MISSING)
        if value is not _MISSING:
            return value
        if key in _NAMES:
            return ctx.get(key)
        return None


# ------------------------------------------------------------------ registries

_CONDITIONS: dict[str, type["Condition"]] = {}
_TARGETS: dict[str, type["Target"]] = {}


def register_condition(type_name: str) -> Callable[[type["Condition"]], type["Condition"]]:
    """Register a condition class under ``type_name`` (a decorator)."""

    def deco(cls: type[Condition]) -> type[Condition]:
        cls.type_name = type_name
        _CONDITIONS[type_name] = cls
        return cls

    return deco


def register_target(type_name: str) -> Callable[[type["Target"]], type["Target"]]:
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


class Condition:
    """When a transition applies. Subclasses implement :meth:`matches` and serialise their fields.

    The default :meth:`to_dict`/:meth:`from_dict` use the dataclass fields.
    """

    type_name: ClassVar[str] = ""

    def matches(self, inp: RouteInput) -> bool:
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        data = {"type": self.type_name}
        data.update({k: getattr(self, k) for k in getattr(self, "__dataclass_fields__", {})})
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Condition":
        return cls(**{k: v for k, v in data.items() if k != "type"})


class Target:
    """Where a transition goes."""

    type_name: ClassVar[str] = ""

    def to_dict(self) -> dict[str, Any]:
        data = {"type": self.type_name}
        data.update({k: getattr(self, k) for k in getattr(self, "__dataclass_fields__", {})})
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Target":
        return cls(**{k: v for k, v in data.items() if k != "type"})


def _load(kind: str, registry: Mapping[str, type], data: Any, where: str) -> Any:
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
        return inp.value(self.key) == self.value


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
        for tool in inp.tools:
            if tool == name or tool.rsplit(".", 1)[-1] == name:
                return True
        return False


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
        parser = _Parser(text)
        self._fn = parser.parse()
        self.keys = tuple(parser.keys)

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
    def from_dict(cls, data: Mapping[str, Any]) -> "Expression":
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
    def from_dict(cls, data: Mapping[str, Any]) -> "TransitionGraph":
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
            default_target=_load("target", _TARGETS, default, "default_target") if default is not None else Terminate("no transition matched"),
            max_turns=data.get("max_turns"),
        )


# ------------------------------------------------------------- the interpreter

_TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<var>\$\{\s*(?P<varname>[^}\s]+)\s*\})
  | (?P<num>\d+\.\d*|\.\d+|\d+)
  | (?P<str>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")
  | (?P<op>==|!=|<=|>=|<|>|\+|-|\*|/|\(|\)|\[|\]|,)
  | (?P<name>[A-Za-z_][A-Za-z_0-9]*)
    """,
    re.VERBOSE,
)

_KEYWORDS = {"and", "or", "not", "in", "len", "True", "False", "None", "true", "false", "null"}
_CONSTS = {"True": True, "true": True, "False": False, "false": False, "None": None, "null": None}
_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\", "'": "'", '"': '"'}

Lookup = Callable[[str], Any]
Node = Callable[[Lookup], Any]


def _unescape(body: str) -> str:
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(1)), body)


def _ordered(op: Callable[[Any, Any], bool]) -> Callable[[Any, Any], bool]:
    def compare(a: Any, b: Any) -> bool:
        try:
            return op(a, b)
        except TypeError:
            return False

    return compare


def _contains(a: Any, b: Any) -> bool:
    if b is None:
        return False
    try:
        return a in b
    except TypeError:
        return False


_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "==": operator.eq,
    "!=": operator.ne,
    "<": _ordered(operator.lt),
    "<=": _ordered(operator.le),
    ">": _ordered(operator.gt),
    ">=": _ordered(operator.ge),
    "in": _contains,
    "not in": lambda a, b: not _contains(a, b),
}


def _arith(symbol: str, fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    def apply(a: Any, b: Any) -> Any:
        if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
            raise TypeError(f"cannot apply {symbol} to {type(a).__name__} and {type(b).__name__}")
        try:
            return fn(a, b)
        except TypeError:
            raise TypeError(f"cannot apply {symbol} to {type(a).__name__} and {type(b).__name__}") from None

    return apply


_ARITH = {
    "+": _arith("+", operator.add),
    "-": _arith("-", operator.sub),
    "*": _arith("*", operator.mul),
    "/": _arith("/", operator.truediv),
}


class _Parser:
    """Recursive descent over tokens, building closures (parsed once, evaluated per step)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: list[tuple[str, str, int]] = []
        self.keys: list[str] = []
        pos = 0
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if m is None:
                raise ExpressionError(f"expression {text!r}: unexpected character {text[pos]!r} at position {pos}")
            kind = m.lastgroup
            if kind == "varname":
                kind = "var"
            if kind != "ws":
                value = m.group("varname") if kind == "var" else m.group(0)
                if kind == "name":
                    if value not in _KEYWORDS:
                        raise ExpressionError(
                            f"expression {text!r}: unknown name {value!r} at position {pos} "
                            "(refer to context values as ${name})"
                        )
                    kind = "kw"
                self.tokens.append((kind, value, pos))
            pos = m.end()
        self.i = 0

    # helpers
    def _peek(self) -> tuple[str, str, int] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def _is(self, *values: str) -> bool:
        tok = self._peek()
        return tok is not None and tok[0] in ("op", "kw") and tok[1] in values

    def _take(self) -> tuple[str, str, int]:
        tok = self._peek()
        if tok is None:
            raise ExpressionError(f"expression {self.text!r}: unexpected end")
        self.i += 1
        return tok

    def _expect(self, value: str) -> None:
        tok = self._peek()
        if tok is None or tok[1] != value:
            where = f"{tok[1]!r} at position {tok[2]}" if tok else "the end"
            raise ExpressionError(f"expression {self.text!r}: expected {value!r}, found {where}")
        self.i += 1

    def parse(self) -> Node:
        node = self._or()
        tok = self._peek()
        if tok is not None:
            raise ExpressionError(f"expression {self.text!r}: unexpected {tok[1]!r} at position {tok[2]}")
        return node

    def _or(self) -> Node:
        node = self._and()
        while self._is("or"):
            self._take()
            left, right = node, self._and()
            node = (lambda l, r: lambda look: l(look) or r(look))(left, right)
        return node

    def _and(self) -> Node:
        node = self._not()
        while self._is("and"):
            self._take()
            left, right = node, self._not()
            node = (lambda l, r: lambda look: l(look) and r(look))(left, right)
        return node

    def _not(self) -> Node:
        if self._is("not"):
            self._take()
            inner = self._not()
            return lambda look: not inner(look)
        return self._comparison()

    def _comparison(self) -> Node:
        first = self._sum()
        pairs: list[tuple[Callable[[Any, Any], bool], Node]] = []
        while True:
            if self._is("==", "!=", "<", "<=", ">", ">=", "in"):
                op = self._take()[1]
            elif self._is("not") and self.i + 1 < len(self.tokens) and self.tokens[self.i + 1][1] == "in":
                self.i += 2
                op = "not in"
            else:
                break
            pairs.append((_COMPARE[op], self._sum()))
        if not pairs:
            return first
        chain = tuple(pairs)

        def compare(look: Lookup) -> bool:
            left = first(look)
            for fn, node in chain:
                right = node(look)
                if not fn(left, right):
                    return False
                left = right
            return True

        return compare

    def _sum(self) -> Node:
        node = self._term()
        while self._is("+", "-"):
            fn = _ARITH[self._take()[1]]
            left, right = node, self._term()
            node = (lambda f, l, r: lambda look: f(l(look), r(look)))(fn, left, right)
        return node

    def _term(self) -> Node:
        node = self._unary()
        while self._is("*", "/"):
            fn = _ARITH[self._take()[1]]
            left, right = node, self._unary()
            node = (lambda f, l, r: lambda look: f(l(look), r(look)))(fn, left, right)
        return node

    def _unary(self) -> Node:
        if self._is("-"):
            self._take()
            inner = self._unary()

            def neg(look: Lookup) -> Any:
                value = inner(look)
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise TypeError(f"cannot negate {type(value).__name__}")
                return -value

            return neg
        return self._primary()

    def _primary(self) -> Node:
        kind, value, pos = self._take()
        if kind == "num":
            number: Any = float(value) if "." in value else int(value)
            return lambda look: number
        if kind == "str":
            text = _unescape(value[1:-1])
            return lambda look: text
        if kind == "var":
            self.keys.append(value)
            return lambda look: look(value)
        if kind == "kw" and value in _CONSTS:
            const = _CONSTS[value]
            return lambda look: const
        if kind == "kw" and value == "len":
            self._expect("(")
            inner = self._or()
            self._expect(")")

            def length(look: Lookup) -> int:
                v = inner(look)
                if v is None:
                    return 0
                try:
                    return len(v)
                except TypeError:
                    raise TypeError(f"len() of {type(v).__name__}") from None

            return length
        if kind == "op" and value == "(":
            inner = self._or()
            self._expect(")")
            return inner
        if kind == "op" and value == "[":
            items: list[Node] = []
            if not self._is("]"):
                items.append(self._or())
                while self._is(","):
                    self._take()
                    items.append(self._or())
            self._expect("]")
            nodes = tuple(items)
            return lambda look: [n(look) for n in nodes]
        raise ExpressionError(f"expression {self.text!r}: unexpected {value!r} at position {pos}")
