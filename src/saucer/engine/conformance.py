"""Whether an object has a ``runtime_checkable`` Protocol's members, answered once per type when the type decides.

::

    if conforms(interactor, _FirstRequest): ...

``isinstance`` against a ``runtime_checkable`` Protocol looks up every member
of the protocol on every call (and walks the protocol's bases to list them):
about 15 µs each, and a session checks its interactor and observer against
some fifteen of them when it is made. :func:`conforms` gives the same answer
and keeps it per (type, protocol) when the object's type alone decides it:
each member is, on the type, absent, a plain function or a plain value (not a
descriptor), the type has no
``__getattr__`` nor its own ``__getattribute__``, and the object's own ``__dict__`` holds none of them. An
object whose own attributes or slots, properties or other descriptors could
make the answer differ from its type's is checked with ``isinstance`` every
time, as is anything after its type's answer was kept but its own
``__dict__`` now holds a member. (A class changed after its answer was kept
keeps that answer: classes are not expected to gain or lose methods at run
time.)
"""

from __future__ import annotations

import inspect
import types
import weakref
from collections.abc import Callable
from typing import Any, TypeGuard, TypeVar, cast

__all__ = ["conforms"]

_MISSING = object()
_T = TypeVar("_T")

#: type -> protocol -> whether the type's instances conform (only types that decide it alone).
_answers: weakref.WeakKeyDictionary[type, dict[type, bool]] = weakref.WeakKeyDictionary()
#: protocol -> the names of its members.
_members: dict[type, frozenset[str]] = {}


def _members_of(protocol: type) -> frozenset[str]:
    names = _members.get(protocol)
    if names is None:
        own = vars(protocol)
        names = frozenset(n for n in own if not n.startswith("_")) | frozenset(own.get("__annotations__", {}))
        _members[protocol] = names
    return names


def _type_decides(cls: type, names: frozenset[str]) -> bool:
    if any("__getattr__" in vars(k) or "__getattribute__" in vars(k) for k in cls.__mro__[:-1]):
        return False
    for name in names:
        found = inspect.getattr_static(cls, name, _MISSING)
        if found is _MISSING or isinstance(found, types.FunctionType):
            continue
        if any("__get__" in vars(k) for k in type(found).__mro__):  # a descriptor: the instance may decide
            return False
    return True


def _own_member(obj: object, names: frozenset[str]) -> bool:
    try:
        own: dict[str, Any] = vars(obj)
    except TypeError:  # no __dict__ (slots): its type's descriptors decide
        return False
    return bool(own) and any(name in own for name in names)


def conforms(obj: object, checked: Callable[..., _T]) -> TypeGuard[_T]:
    """``isinstance(obj, checked)`` for a ``runtime_checkable`` Protocol, kept per type when the type decides it.

    (``checked`` is typed as a callable: a type checker refuses a Protocol where a ``type[...]`` is expected.)
    """
    protocol = cast(type, checked)
    names = _members_of(protocol)
    if _own_member(obj, names):
        return isinstance(obj, protocol)
    cls = type(obj)
    try:
        known = _answers.get(cls)
    except TypeError:  # a type that cannot be weakly referenced
        return isinstance(obj, protocol)
    if known is not None:
        answer = known.get(protocol)
        if answer is not None:
            return answer
    answer = isinstance(obj, protocol)
    if _type_decides(cls, names):
        _answers.setdefault(cls, {})[protocol] = answer
    return answer
