"""The typed names of the Context (UFO's ``ContextNames``) and their wire codecs.

Every name declares a Python type, a default and whether it is *durable*
(stored in events and snapshots) or *runtime-only* (loggers, window handles,
the task graph object: kept in memory, never stored).

Stored data outlives the code: a name that is renamed or retired goes into
:data:`RENAMED` or :data:`RETIRED` (never just deleted), so the sessions that
wrote it keep opening (:func:`stored_name`).

Durable values are stored in a JSON *wire form*. Each name knows how to turn a
wire value back into its declared type (:meth:`ContextNames.restore`), which is
how integer round ids survive storage: ``{"3": 0.5}`` on the wire is
``{3: 0.5}`` in memory, live and on replay alike.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from enum import Enum
from typing import Any, get_origin

__all__ = [
    "ContextNames",
    "WeavingMode",
    "DERIVED_LEDGERS",
    "RENAMED",
    "RETIRED",
    "UnknownStoredNameError",
    "lookup",
    "typed_name",
    "stored_name",
    "NUMBER_NAMES",
    "INT_NAMES",
    "FLOAT_NAMES",
    "LIST_NAMES",
    "DICT_NAMES",
]


class WeavingMode(str, Enum):
    """How a task graph (constellation) is being woven."""

    CREATION = "creation"
    EDITING = "editing"


_MISSING = object()


def _int_keys(value: dict[Any, Any], inner: Callable[[Any], Any] | None = None) -> dict[Any, Any]:
    # JSON turns int keys into strings; the declared type says they are ints.
    if inner is None:
        return {int(k) if isinstance(k, str) else k: v for k, v in value.items()}
    return {int(k) if isinstance(k, str) else k: inner(v) for k, v in value.items()}


def _restore_structural_logs(value: Any) -> Any:
    return _int_keys(value, _int_keys)


def _restore_weaving(value: Any) -> Any:
    return WeavingMode(value)


def _restore_float_ledger(value: Any) -> Any:
    return _int_keys(value, lambda v: None if v is None else float(v))


# name -> (type, default factory or value, durable, type check, restore)
# ``check`` validates a value at ``set``; ``restore`` maps wire form back.
_Spec = tuple[Any, Any, bool, Callable[[Any], bool], Callable[[Any], Any] | None]


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_float(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_cost(v: Any) -> bool:
    # A round's cost: a number, or None when some of it could not be priced (unknown, never 0).
    return v is None or _is_float(v)


def _is_str(v: Any) -> bool:
    return isinstance(v, str)


def _is_list(v: Any) -> bool:
    return isinstance(v, (list, tuple))


def _is_dict(v: Any) -> bool:
    return isinstance(v, dict)


def _is_any(v: Any) -> bool:
    return True


def _is_int_key(k: Any) -> bool:
    # Ledger keys are round ids: ints, or their decimal strings (JSON's form).
    if isinstance(k, str):
        digits = k[1:] if k[:1] == "-" else k
        return digits.isascii() and digits.isdigit()
    return _is_int(k)


def _is_ledger(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    def _check(v: Any) -> bool:
        return isinstance(v, dict) and all(_is_int_key(k) for k in v) and all(check(x) for x in v.values())

    return _check


def _is_structural_logs(v: Any) -> bool:
    # round id -> subtask index -> list of dict entries
    if not isinstance(v, dict):
        return False
    for round_key, sub in v.items():
        if not _is_int_key(round_key) or not isinstance(sub, dict):
            return False
        for subtask_key, entries in sub.items():
            if not _is_int_key(subtask_key) or not isinstance(entries, (list, tuple)):
                return False
            if not all(isinstance(entry, dict) for entry in entries):
                return False
    return True


def _is_logger(v: Any) -> bool:
    return v is None or isinstance(v, (logging.Logger, logging.LoggerAdapter))


def _is_weaving(v: Any) -> bool:
    if isinstance(v, WeavingMode):
        return True
    return isinstance(v, str) and v in WeavingMode._value2member_map_


_SPECS: dict[str, _Spec] = {
    "ID": (int, 0, True, _is_int, None),
    "MODE": (str, "", True, _is_str, None),
    "CURRENT_ROUND_ID": (int, 0, True, _is_int, None),
    "REQUEST": (str, "", True, _is_str, None),
    "SUBTASK": (str, "", True, _is_str, None),
    "PREVIOUS_SUBTASKS": (list, list, True, _is_list, None),
    "HOST_MESSAGE": (list, list, True, _is_list, None),
    "ROUND_RESULT": (str, "", True, _is_str, None),
    "SESSION_COST": (float, 0.0, True, _is_float, float),
    "ROUND_COST": (dict[int, float | None], dict, True, _is_ledger(_is_cost), _restore_float_ledger),
    "CURRENT_ROUND_COST": (float, 0.0, True, _is_float, float),
    "SESSION_STEP": (int, 0, True, _is_int, None),
    "ROUND_STEP": (dict[int, int], dict, True, _is_ledger(_is_int), _int_keys),
    "CURRENT_ROUND_STEP": (int, 0, True, _is_int, None),
    "ROUND_SUBTASK_AMOUNT": (dict[int, int], dict, True, _is_ledger(_is_int), _int_keys),
    "CURRENT_ROUND_SUBTASK_AMOUNT": (int, 0, True, _is_int, None),
    "APPLICATION_WINDOW": (object, None, False, _is_any, None),
    "APPLICATION_WINDOW_INFO": (Any, None, True, _is_any, None),
    "APPLICATION_PROCESS_NAME": (str, "", True, _is_str, None),
    "APPLICATION_ROOT_NAME": (str, "", True, _is_str, None),
    "CONTROL_REANNOTATION": (list, list, True, _is_list, None),
    "LOG_PATH": (str, "", True, _is_str, None),
    "LOGGER": (logging.Logger, None, False, _is_logger, None),
    "REQUEST_LOGGER": (logging.Logger, None, False, _is_logger, None),
    "EVALUATION_LOGGER": (logging.Logger, None, False, _is_logger, None),
    "STRUCTURAL_LOGS": (
        dict[int, dict[int, list[dict]]],  # type: ignore[type-arg]  # the declared type UFO's users compare with
        dict,
        True,
        _is_structural_logs,
        _restore_structural_logs,
    ),
    "TOOL_INFO": (dict, dict, True, _is_dict, None),
    "DEVICE_INFO": (list, list, True, _is_list, None),
    "CONSTELLATION": (object, None, False, _is_any, None),
    "WEAVING_MODE": (WeavingMode, WeavingMode.CREATION, True, _is_weaving, _restore_weaving),
}


class ContextNames(str, Enum):
    """The typed names of the Context; each member's value equals its name.

    ``.type`` is the declared type, ``.default_value`` a fresh default (a new
    list or dict each time), ``.durable`` whether the value is stored.
    (The properties read ``_value_`` directly: ``.value`` goes through Enum's
    descriptor machinery, and these run on every ``set``.)
    """

    ID = "ID"
    MODE = "MODE"
    CURRENT_ROUND_ID = "CURRENT_ROUND_ID"
    REQUEST = "REQUEST"
    SUBTASK = "SUBTASK"
    PREVIOUS_SUBTASKS = "PREVIOUS_SUBTASKS"
    HOST_MESSAGE = "HOST_MESSAGE"
    ROUND_RESULT = "ROUND_RESULT"
    SESSION_COST = "SESSION_COST"
    ROUND_COST = "ROUND_COST"
    CURRENT_ROUND_COST = "CURRENT_ROUND_COST"
    SESSION_STEP = "SESSION_STEP"
    ROUND_STEP = "ROUND_STEP"
    CURRENT_ROUND_STEP = "CURRENT_ROUND_STEP"
    ROUND_SUBTASK_AMOUNT = "ROUND_SUBTASK_AMOUNT"
    CURRENT_ROUND_SUBTASK_AMOUNT = "CURRENT_ROUND_SUBTASK_AMOUNT"
    APPLICATION_WINDOW = "APPLICATION_WINDOW"
    APPLICATION_WINDOW_INFO = "APPLICATION_WINDOW_INFO"
    APPLICATION_PROCESS_NAME = "APPLICATION_PROCESS_NAME"
    APPLICATION_ROOT_NAME = "APPLICATION_ROOT_NAME"
    CONTROL_REANNOTATION = "CONTROL_REANNOTATION"
    LOG_PATH = "LOG_PATH"
    LOGGER = "LOGGER"
    REQUEST_LOGGER = "REQUEST_LOGGER"
    EVALUATION_LOGGER = "EVALUATION_LOGGER"
    STRUCTURAL_LOGS = "STRUCTURAL_LOGS"
    TOOL_INFO = "TOOL_INFO"
    DEVICE_INFO = "DEVICE_INFO"
    CONSTELLATION = "CONSTELLATION"
    WEAVING_MODE = "WEAVING_MODE"

    @property
    def type(self) -> Any:
        """The declared type of the name's value."""
        return _SPECS[self._value_][0]

    @property
    def default_value(self) -> Any:
        """A fresh default value (mutable defaults are never shared)."""
        default = _SPECS[self._value_][1]
        if default is list or default is dict:
            return default()
        return copy.copy(default)

    @property
    def durable(self) -> bool:
        """True when the value is stored in events; False for runtime-only objects."""
        return _SPECS[self._value_][2]

    @property
    def derived(self) -> bool:
        """True for the ``CURRENT_ROUND_*`` names computed from a per-round ledger."""
        return self._value_ in DERIVED_LEDGERS

    def accepts(self, value: Any) -> bool:
        """Whether ``value`` matches the declared type."""
        return _SPECS[self._value_][3](value)

    @property
    def int_key_depth(self) -> int:
        """How many levels of dict keys are ints (round ids): 1 for the per-round
        ledgers, 2 for ``STRUCTURAL_LOGS``, 0 for every other name."""
        return _INT_KEY_DEPTH.get(self._value_, 0)

    def restore(self, wire: Any) -> Any:
        """Turn a stored (JSON wire form) value back into the declared type."""
        fn = _SPECS[self._value_][4]
        if fn is None or wire is None:
            return wire
        return fn(wire)


#: Names whose dict keys are round ids (ints): how many levels deep. Any other
#: name refuses int dict keys, since JSON would silently turn them into strings.
_INT_KEY_DEPTH: dict[str, int] = {
    "ROUND_COST": 1,
    "ROUND_STEP": 1,
    "ROUND_SUBTASK_AMOUNT": 1,
    "STRUCTURAL_LOGS": 2,
}

#: Derived name -> the per-round ledger it reads, keyed by ``CURRENT_ROUND_ID``.
DERIVED_LEDGERS: dict[str, str] = {
    "CURRENT_ROUND_STEP": "ROUND_STEP",
    "CURRENT_ROUND_COST": "ROUND_COST",
    "CURRENT_ROUND_SUBTASK_AMOUNT": "ROUND_SUBTASK_AMOUNT",
}


def lookup(name: Any) -> ContextNames:
    """The member for ``name`` (a member or its name); KeyError naming it when there is none."""
    try:
        return _BY_KEY[name]
    except (KeyError, TypeError):
        raise KeyError(f"unknown context name {name!r}; see ContextNames for the valid names") from None


# A str-valued Enum member hashes and compares as its value, so these work for members and names.
_BY_KEY: dict[str, ContextNames] = {m.value: m for m in ContextNames}


def typed_name(key: Any) -> ContextNames | None:
    """THE rule for what a key addresses in a Context, applied by every method that takes one:
    a :class:`ContextNames` member, or a string equal to a member's name (``"REQUEST"``,
    ``"PREVIOUS_SUBTASKS"``), is that typed name; any other string is a free context variable
    (None). So ``append("PREVIOUS_SUBTASKS", x)`` appends to the typed list, as
    ``set("REQUEST", ...)`` sets the typed request, and no context variable can take a typed name.
    """
    return _BY_KEY.get(key) if isinstance(key, str) else None


#: Names by the kind of value they hold, for the checks of the atomic operations.
NUMBER_NAMES = frozenset(m.value for m in ContextNames if m.type in (int, float))
INT_NAMES = frozenset(m.value for m in ContextNames if m.type is int or m.type == dict[int, int])
FLOAT_NAMES = frozenset(
    m.value for m in ContextNames if m.type is float or m.type in (dict[int, float], dict[int, float | None])
)
LIST_NAMES = frozenset(m.value for m in ContextNames if m.type is list)
DICT_NAMES = frozenset(m.value for m in ContextNames if m.type is dict or get_origin(m.type) is dict)


# ------------------------------------------------------- renamed and retired

#: Names renamed since a saucer stored them: ``old name -> new name``. Events
#: and snapshots holding the old name are read under the new one (a rename
#: keeps the type; chains such as ``A -> B -> C`` are followed).
RENAMED: dict[str, str] = {}

#: Names retired from :class:`ContextNames`: ``name -> why`` (a sentence for
#: readers). Their stored values stay in the log: ``history`` lists them, a
#: state at a version keeps them aside as *retired* (``Context.retired``,
#: ``saucer state`` shows them so), and opening a session that wrote one never
#: fails. They are not in ``to_dict()``, and can no longer be written.
RETIRED: dict[str, str] = {}


class UnknownStoredNameError(KeyError):
    """A stored operation or snapshot names a typed name this code does not know."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(
            f"stored name {name!r} is not a ContextNames member; if it was renamed or retired, "
            "record it in saucer.context.names.RENAMED or RETIRED"
        )

    def __str__(self) -> str:
        return str(self.args[0])


def stored_name(name: str) -> str | None:
    """The current name a stored typed name is read under: itself, its new name
    if it was renamed, or None if it was retired. :class:`UnknownStoredNameError`
    for a name that is none of these."""
    seen = 0
    while name not in _BY_KEY:
        if name in RETIRED:
            return None
        new = RENAMED.get(name)
        if new is None or seen > len(RENAMED):
            raise UnknownStoredNameError(name)
        name, seen = new, seen + 1
    return name
