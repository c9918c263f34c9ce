"""The written contracts of the Context: its operations and the meta it writes, one definition each.

An operation is a JSON object naming what it changes (its :class:`Target`: a
typed ``name``, or a context variable ``var``, and maybe a ``path`` inside the
value) and how (``op``). Every value in an operation is in wire form (what
:func:`~saucer.context.wire.to_wire` returns), hence :data:`Json`. These are
the operations a Context writes; the fold (:func:`~saucer.context.events.apply_ops`)
also reads what older records and the store's encryption (``sealed``) hold,
so it takes any mapping.

The meta a Context writes itself: an event of a serialised commit carries
``meta["serialised"]`` (:class:`SerialisedRecord`); a session made by a fork
carries :class:`ForkOrigin` in its meta, one made by an import :class:`ImportOrigin`.
Every other key of an event's meta is the caller's (the engine's).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, NotRequired, Protocol, Required, TypedDict, TypeGuard, TypeVar

from saucer.context.names import ContextNames

__all__ = [
    "Json",
    "Key",
    "Target",
    "SetOp",
    "DeleteOp",
    "IncrOp",
    "AppendOp",
    "CasOp",
    "Op",
    "OpKind",
    "EventMeta",
    "SERIALISED",
    "SerialisedRecord",
    "serialised_record",
    "ForkOrigin",
    "ImportOrigin",
    "Change",
    "Recorder",
    "Reloader",
]

#: A value in wire form: JSON data (dicts with str keys, lists, str, int, float, bool, None).
Json = Any

OpKind = Literal["set", "delete", "incr", "append", "cas"]

#: What a key of a Context is: a typed name (a :class:`ContextNames` member or its name) or a
#: context variable's name (a TypeVar, so that a mapping keyed by either kind alone is taken too).
Key = TypeVar("Key", bound="ContextNames | str")


class Target(TypedDict, total=False):
    """What an operation changes: a typed ``name`` or a context variable ``var`` (exactly one), and a
    ``path`` of keys inside its value (a per-round ledger: ``[round]``; the structural logs: ``[round, subtask]``)."""

    name: str
    var: str
    path: list[int | str]


class SetOp(Target):
    """Set the target to ``value``."""

    op: Required[Literal["set"]]
    value: Required[Json]


class DeleteOp(Target):
    """Delete the target (a context variable, or an entry at ``path``)."""

    op: Required[Literal["delete"]]


class IncrOp(Target):
    """Add ``by`` to the number at the target (atomic: re-based onto concurrent writers)."""

    op: Required[Literal["incr"]]
    by: Required[int | float]


class AppendOp(Target):
    """Append ``value`` to the list at the target (atomic: re-based onto concurrent writers)."""

    op: Required[Literal["append"]]
    value: Required[Json]


class CasOp(Target):
    """Set the target to ``value`` if it holds ``expected`` (checked again when re-based)."""

    op: Required[Literal["cas"]]
    expected: Required[Json]
    value: Required[Json]


#: An operation a Context writes.
Op = SetOp | DeleteOp | IncrOp | AppendOp | CasOp

#: An event's meta: JSON data. Its keys are the committer's (the engine's), but for
#: :data:`SERIALISED`, which a Context adds itself.
EventMeta = dict[str, Any]

#: The key of an event's meta under which a serialised commit records how it was ordered.
SERIALISED = "serialised"


class SerialisedRecord(TypedDict):
    """``meta["serialised"]`` of a serialised commit's event (see :func:`~saucer.context.rebase.serialised_meta`)."""

    #: The version its changes were made on.
    based_on: int
    #: The concurrent versions written since, which it follows in the log.
    ordered_after: list[int]
    #: The keys those versions changed, in log order.
    changed: list[str]
    #: Its compare-and-sets that no longer held, and operations that no longer applied.
    dropped: NotRequired[list[str]]


def serialised_record(meta: Mapping[str, Any] | None) -> SerialisedRecord | None:
    """The :class:`SerialisedRecord` of an event's meta, or None when its commit was not re-based."""
    record = None if meta is None else meta.get(SERIALISED)
    return record if _is_record(record) else None


def _is_record(value: object) -> TypeGuard[SerialisedRecord]:
    return isinstance(value, dict) and isinstance(value.get("based_on"), int)


class ForkOrigin(TypedDict):
    """The meta of a session made by :meth:`~saucer.context.Context.fork`: where it branched."""

    forked_from: str
    at: int


class ImportOrigin(TypedDict, total=False):
    """The keys :func:`~saucer.context.transfer.import_session` adds to an imported session's meta."""

    #: The session id the export was taken from.
    imported_from: Required[str]
    #: The first readable version, for an export of a pruned session.
    pruned_to: int


class Change(TypedDict):
    """One key of a diff: its value before and after (wire form; a name's default when unset)."""

    before: Json
    after: Json


class Recorder(Protocol):
    """Takes a Context's new operations: applies them and keeps them pending (see ``Committer.record``)."""

    def __call__(self, ops: list[Op]) -> None: ...


class Reloader(Protocol):
    """Loads a Context's committed state at ``upto`` (the head when None), dropping what is pending."""

    def __call__(self, upto: int | None = None) -> None: ...
