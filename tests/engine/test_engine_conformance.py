"""``conforms``: isinstance against a runtime_checkable Protocol, kept per type only when the type decides it."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Protocol, runtime_checkable

from saucer.engine.conformance import conforms
from saucer.engine.interactor import UserChannel
from saucer.engine.notify import ObserverCaller


@runtime_checkable
class _Greets(Protocol):
    def greet(self) -> str: ...


@runtime_checkable
class _Flagged(Protocol):
    flag: bool


class _Plain:
    def greet(self) -> str:
        return "hi"


class _Without:
    pass


def test_answers_as_isinstance_for_plain_classes_and_repeats() -> None:
    for _ in range(3):
        assert conforms(_Plain(), _Greets)
        assert not conforms(_Without(), _Greets)


def test_an_instance_attribute_is_checked_on_the_instance_not_taken_from_its_type() -> None:
    assert not conforms(_Without(), _Greets)  # the type's answer is kept
    other = _Without()
    other.greet = lambda: "mine"  # type: ignore[attr-defined]  # an instance that has the method itself
    assert conforms(other, _Greets)
    assert not conforms(_Without(), _Greets)
    shadowed = _Plain()
    shadowed.greet = None  # type: ignore[assignment, method-assign]  # whatever isinstance says of it
    assert conforms(shadowed, _Greets) == isinstance(shadowed, _Greets)
    assert conforms(_Plain(), _Greets)


def test_slots_properties_and_getattr_are_checked_on_every_instance() -> None:
    class Slotted:
        __slots__ = ("flag",)

    unset, set_ = Slotted(), Slotted()
    set_.flag = True
    assert not conforms(unset, _Flagged)
    assert conforms(set_, _Flagged)
    assert not conforms(Slotted(), _Flagged)

    class Dynamic:
        def __init__(self, has: bool) -> None:
            self._has = has

        def __getattr__(self, name: str) -> Any:
            if name == "greet" and self._has:
                return lambda: "dyn"
            raise AttributeError(name)

    assert conforms(Dynamic(True), _Greets)
    assert not conforms(Dynamic(False), _Greets)
    assert conforms(Dynamic(True), _Greets)

    class Prop:
        def __init__(self, on: bool) -> None:
            self.on = on

        @property
        def flag(self) -> bool:
            if not self.on:
                raise AttributeError("flag")
            return True

    assert conforms(Prop(True), _Flagged)
    assert not conforms(Prop(False), _Flagged)


def test_namespaces_and_the_engine_channels_resolve_as_before() -> None:
    assert conforms(SimpleNamespace(greet=lambda: "x"), _Greets)
    assert not conforms(SimpleNamespace(), _Greets)
    asked: list[str] = []

    class Interactor:
        def first_request(self) -> str:
            asked.append("first")
            return "go"

    for _ in range(2):
        channel = UserChannel(Interactor())
        assert channel._first.__self__.__class__ is Interactor  # type: ignore[attr-defined]
    assert UserChannel(SimpleNamespace(first_request=lambda: "ns"))._first() == "ns"
    assert UserChannel(None)._first() is None

    class Observer:
        def on_step(self, session: object, record: object) -> None: ...

    assert ObserverCaller(Observer()).has("on_step")
    assert not ObserverCaller(Observer()).has("on_round_end")
    assert ObserverCaller(SimpleNamespace(on_round_end=lambda *a: None)).has("on_round_end")


def test_a_plain_class_value_decides_and_an_instance_value_still_counts() -> None:
    class Flagged:
        flag = True

    class Unflagged:
        pass

    assert conforms(Flagged(), _Flagged) and conforms(Flagged(), _Flagged)
    assert not conforms(Unflagged(), _Flagged)
    own = Unflagged()
    own.flag = False  # type: ignore[attr-defined]  # its own value: it has the member
    assert conforms(own, _Flagged)
    assert not conforms(Unflagged(), _Flagged)
