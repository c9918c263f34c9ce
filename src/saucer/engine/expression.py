"""The small interpreter behind :class:`~saucer.engine.routing.Expression` conditions (no ``eval``).

It reads ``and``, ``or``, ``not``, comparisons (``== != < <= > >=``, ``in``, ``not in``),
``len()``, ``+ - * /``, parentheses, list literals ``[..]``, numbers, strings,
``True``/``False``/``None`` (also ``true``/``false``/``null``) and ``${key}``.
An ordering comparison between values that cannot be ordered (e.g. None < 3)
is False; arithmetic on the wrong types, or division by zero, is an
:class:`~saucer.engine.errors.ExpressionError`.

:func:`compile_expression` turns a text into a function of a lookup (key ->
value) and the keys it reads.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from typing import Any

from saucer.engine.errors import ExpressionError

__all__ = ["compile_expression", "Lookup", "Node"]

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
                assert kind is not None and value is not None  # every alternative of the pattern is named
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
            node = (lambda lhs, rhs: lambda look: lhs(look) or rhs(look))(left, right)
        return node

    def _and(self) -> Node:
        node = self._not()
        while self._is("and"):
            self._take()
            left, right = node, self._not()
            node = (lambda lhs, rhs: lambda look: lhs(look) and rhs(look))(left, right)
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
            node = (lambda f, lhs, rhs: lambda look: f(lhs(look), rhs(look)))(fn, left, right)
        return node

    def _term(self) -> Node:
        node = self._unary()
        while self._is("*", "/"):
            fn = _ARITH[self._take()[1]]
            left, right = node, self._unary()
            node = (lambda f, lhs, rhs: lambda look: f(lhs(look), rhs(look)))(fn, left, right)
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


def compile_expression(text: str) -> tuple[Node, tuple[str, ...]]:
    """``text`` compiled: a function of a lookup, and the ``${keys}`` it reads, in order.

    A text that does not parse is an :class:`~saucer.engine.errors.ExpressionError`
    naming the position.
    """
    parser = _Parser(text)
    node = parser.parse()
    return node, tuple(parser.keys)
