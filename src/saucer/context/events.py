"""Operations, the wire form of values, and the one fold.

An :class:`~saucer.store.model.Event` (defined by the store, re-exported here)
is one committed change to a session: a list of operations plus who made it
and when. Operations are plain JSON dicts::

    {"op": "set",    "name": "REQUEST", "value": "open notepad"}
    {"op": "set",    "name": "ROUND_COST", "path": [3], "value": 0.25}
    {"op": "delete", "var": "draft"}
    {"op": "incr",   "var": "retries", "by": 1}
    {"op": "append", "name": "PREVIOUS_SUBTASKS", "value": "open file"}
    {"op": "cas",    "var": "status", "expected": "idle", "value": "busy"}
    {"op": "sealed", "var": "api_key", "sealed": "..."}

``sealed`` is an operation whose values are encrypted at rest
(:mod:`saucer.store.crypto`) and that was read without the key: its target
reads as ``"<encrypted>"``, and the state remembers that it holds such
placeholders (:attr:`State.opaque`), so it is never written back as data.

``name`` targets a typed :class:`~saucer.context.names.ContextNames` entry,
``var`` a free-form context variable. Values in operations are always in
*wire form* (what :func:`to_wire` returns): JSON-canonical and owned by the
operation. :func:`apply_ops` is the only function that changes state, used for
live writes and for replay alike, so both always agree.
"""

from __future__ import annotations

import base64
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from saucer.context.names import ContextNames, stored_name
from saucer.context.wire import MAX_DEPTH, STATE_MAX_DEPTH, ValueNotStorableError, to_wire
from saucer.store.inflate import MAX_INFLATED_BYTES, inflate
from saucer.store.model import CorruptRecordError, Event, copy_json, op_key, paused_gc

__all__ = [
    "Event",
    "State",
    "Packed",
    "StoredJson",
    "ValueNotStorableError",
    "apply_ops",
    "copy_json",
    "to_wire",
    "state_from_wire",
    "state_to_wire",
    "unpack",
    "op_key",
    "ATOMIC_OPS",
    "ENCRYPTED",
    "MAX_DEPTH",
    "STATE_MAX_DEPTH",
    "PACK_OVER",
]

#: Operations whose effect does not depend on reading the value first; a batch
#: made only of these can be re-based on a newer version without a conflict.
ATOMIC_OPS = frozenset({"incr", "append"})

#: The current names (a plain dict: a test stands in for a later saucer by
#: taking a name out, as a retirement would).
_NAMES: dict[str, ContextNames] = dict(ContextNames.__members__)

#: What a value sealed at rest reads as without the store key.
ENCRYPTED = "<encrypted>"


@dataclass(slots=True)
class State:
    """Materialised durable state: typed names that were written, and vars.

    Typed values are held in their declared types (int round ids are ints);
    unset names read as their default. ``retired`` keeps the values of names
    retired since they were stored (:data:`~saucer.context.names.RETIRED`),
    in wire form, for history and time travel only.
    A state with :attr:`opaque` targets must not be stored (snapshot, prune base).
    """

    names: dict[str, Any] = field(default_factory=dict)
    vars: dict[str, Any] = field(default_factory=dict)
    retired: dict[str, Any] = field(default_factory=dict)
    #: Targets (``REQUEST``, ``vars.api_key``) whose values were sealed and read
    #: without the key: they hold :data:`ENCRYPTED`, not their values.
    opaque: set[str] = field(default_factory=set)
    #: Names whose value is still as a snapshot packed it (not in ``names``
    #: until :func:`unpack`; every reader of ``names`` unpacks what it reads).
    packed: dict[str, Packed] = field(default_factory=dict)
    #: Names in ``names`` whose packed form in the last snapshot is still a base
    #: for the next one: the fold records the operations applied to them since.
    bases: dict[str, Packed] = field(default_factory=dict)


#: A name's value whose JSON is at least this large is packed in snapshots (see :class:`Packed`).
#: Low enough that the per-round ledgers of a plan run (ROUND_STEP, ROUND_COST...: a few
#: thousand rounds) are packed too, not decoded at every open.
PACK_OVER = 16 * 1024


@dataclass(slots=True)
class Packed:
    """A large name's value as a snapshot stored it: decoded only when something reads it.

    A long session's state is mostly a few large values (``STRUCTURAL_LOGS``
    gets an entry per step); a snapshot packs each value over
    :data:`PACK_OVER` bytes of JSON on its own, so opening the session decodes
    only the small rest, and a packed value costs its decoding when it is
    first read. It is stored as a *base* (the value, zlib and base64) and
    *tails*: the operations on it since the base, one packed chunk per later
    snapshot, so a snapshot of a large value that only grew (an append per
    step) writes the new operations, not the whole value again. Operations
    made before it is unpacked are kept in ``ops``. Unpacking applies the
    tails, then ``ops``, in order, with the same fold: the value read is the
    one an eager load would give.
    """

    #: base64 of the zlib-compressed JSON of the value (its wire form) at the base.
    data: str
    #: Bytes of that JSON.
    size: int
    #: Packed lists of operations applied to the base since, oldest first.
    tails: list[str] = field(default_factory=list)
    #: Operations on the name not in ``tails`` yet (applied to the value once unpacked).
    ops: list[Mapping[str, Any]] = field(default_factory=list)
    #: (session, snapshot version) it came from, to name them if it does not decode.
    where: tuple[str, int] | None = None

    def copy(self) -> Packed:
        """An independent copy (its lists are copied; operations are never mutated)."""
        return Packed(self.data, self.size, list(self.tails), list(self.ops), self.where)

    def decode(self, name: str) -> tuple[Any, list[Mapping[str, Any]]]:
        """The base value in wire form and the operations of the tails;
        :class:`~saucer.store.CorruptRecordError` when they do not decode."""
        try:
            value = orjson.loads(_unb64z(self.data, self.size))
            ops: list[Mapping[str, Any]] = []
            for tail in self.tails:
                ops.extend(orjson.loads(_unb64z(tail)))
            return value, ops
        except (ValueError, TypeError) as exc:  # InflateError is a ValueError
            raise self._corrupt(f"the snapshot's packed value of {name} does not decode ({exc})") from None

    def whole_json(self) -> bytes | None:
        """The value's compact JSON when the packed form holds it whole (no operations since its
        base): decompressed, not decoded; None otherwise. :class:`CorruptRecordError` when it does not decompress."""
        if self.tails or self.ops:
            return None
        try:
            text = _unb64z(self.data, self.size)
        except (ValueError, TypeError) as exc:  # InflateError is a ValueError
            raise self._corrupt(f"a snapshot's packed value does not decompress ({exc})") from None
        if len(text) != self.size or text[:1] not in (b"{", b"["):  # only dicts and lists are packed
            raise self._corrupt("a snapshot's packed value is not the JSON object or array it was")
        return text

    def _corrupt(self, problem: str) -> CorruptRecordError:
        sid, version = self.where or ("?", 0)
        return CorruptRecordError(sid, version, problem)

    def entry(self) -> dict[str, Any]:
        """The stored form, after moving ``ops`` into a new tail (see :func:`state_to_wire`)."""
        if self.ops:
            self.tails = [*self.tails, _b64z(orjson.dumps(self.ops))]
            self.ops = []
        out: dict[str, Any] = {"size": self.size, "zlib": self.data}
        if self.tails:
            out["tails"] = list(self.tails)
        return out

    def stale(self) -> bool:
        """Whether the tails (and kept operations) outweigh the base: then a snapshot packs the value afresh,
        so the tails never cost more than the value itself."""
        return sum(map(len, self.tails)) + 64 * len(self.ops) > len(self.data)


class StoredJson(bytes):
    """A value's compact JSON text as a snapshot stored it, not decoded (see
    ``Context.to_dict(stored_json=True)``): what ``orjson.dumps(value, option=OPT_NON_STR_KEYS)``
    gives for the value it holds."""

    __slots__ = ()


def _b64z(blob: bytes) -> str:
    return base64.b64encode(zlib.compress(blob, 1)).decode("ascii")


def _unb64z(text: str, size: int = MAX_INFLATED_BYTES) -> bytes:
    # Capped by the size the base declares: a packed value never inflates past what it says it is.
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ValueError(f"declared size {size!r} is not a byte count")
    return inflate(base64.b64decode(text, validate=True), size)


def unpack(state: State, name: str) -> None:
    """Decode ``name``'s packed value into ``state.names`` and apply the operations kept for it (no-op if not packed).

    The packed form stays the value's base for the next snapshot (``state.bases``).
    """
    packed = state.packed.get(name)
    if packed is None:
        return
    with paused_gc():  # a large value is many containers and no cycles (see paused_gc)
        value, tail_ops = packed.decode(name)
        # Built aside and put in place at once: a reader racing this one decodes its own copy.
        aside = State(names={name: _NAMES[name].restore(value)})
        apply_ops(aside, tail_ops, owned=True)  # decoded just now, held by nothing else
        apply_ops(aside, packed.ops)  # kept by the packed value (and the next base): copied in
    if name in aside.names:
        state.names[name] = aside.names[name]
        if not aside.opaque:
            state.bases[name] = packed.copy()
    state.opaque |= aside.opaque
    state.packed.pop(name, None)


def _restore(name: str, wire: Any, owned: bool = False) -> Any:
    return _NAMES[name].restore(wire if owned else copy_json(wire))


def state_to_wire(state: State, *, pack: bool = False, whole: bool = False) -> dict[str, Any]:
    """Encode a state as JSON data; retired names' values under ``"retired"``.

    ``pack=True`` (for snapshots) puts each name whose JSON is at least
    :data:`PACK_OVER` bytes under ``"packed"`` instead of ``"names"``, as
    ``{"size": bytes, "zlib": base64, "tails": [base64, ...]}`` (see
    :class:`Packed`). A value with a packed base (read from a snapshot, or
    packed by the last one) is written as that base plus the operations since,
    without encoding it again, until they outweigh it; with ``whole`` (a
    closing snapshot, read far more often than it is extended) every packed
    value is written whole, without tails, so a reader folds nothing. Without
    ``pack`` every value is decoded and plain.
    """
    names: dict[str, Any] = {}
    packed: dict[str, Any] = {}
    for k in list(state.packed):
        entry = state.packed[k]
        if pack and not entry.stale() and not (whole and (entry.tails or entry.ops)):
            packed[k] = entry.entry()
        else:
            unpack(state, k)
    for k, v in state.names.items():
        if k in packed:
            continue
        base = state.bases.get(k) if pack else None
        if base is not None and not base.stale() and not (whole and (base.tails or base.ops)):
            packed[k] = base.entry()
            continue
        if whole and base is not None:
            # Decoded from a packed form and folded with stored operations only: wire data
            # already (its int keys restored), so dumped as it is, not checked value by value.
            blob = orjson.dumps(v, option=orjson.OPT_NON_STR_KEYS)
            state.bases[k] = fresh = Packed(_b64z(blob), len(blob))
            packed[k] = fresh.entry()
            continue
        wire = to_wire(v, k, int_keys=_NAMES[k].int_key_depth, max_depth=STATE_MAX_DEPTH)
        if pack and (wire.__class__ is dict or wire.__class__ is list) and wire:
            blob = orjson.dumps(wire)
            if len(blob) >= PACK_OVER:
                state.bases[k] = fresh = Packed(_b64z(blob), len(blob))
                packed[k] = fresh.entry()
                continue
        state.bases.pop(k, None)
        names[k] = wire
    out: dict[str, Any] = {"names": names, "vars": copy_json(state.vars)}
    if packed:
        out["packed"] = packed
    if state.retired:
        out["retired"] = copy_json(state.retired)
    return out


def state_from_wire(data: Mapping[str, Any]) -> State:
    """Decode a snapshot written by :func:`state_to_wire` (by this saucer or an older one).

    A renamed name is read under its new name, a retired one is kept aside in
    ``retired``; a name that is neither raises
    :class:`~saucer.context.names.UnknownStoredNameError` (never dropped silently).
    """
    state = State(vars=copy_json(dict(data.get("vars", {}))), retired=copy_json(dict(data.get("retired", {}))))
    sealed = data.get("sealed") or {}  # values sealed at rest, read without the key
    for k in sealed.get("vars") or {}:
        state.vars[k] = ENCRYPTED
        state.opaque.add(f"vars.{k}")
    for k in sealed.get("names") or {}:
        current = stored_name(k) if k not in _NAMES else k
        if current is not None:
            state.names[current] = ENCRYPTED
            state.opaque.add(current)
    for k in sealed.get("packed") or {}:
        current = stored_name(k) if k not in _NAMES else k
        if current is not None:
            state.names[current] = ENCRYPTED
            state.opaque.add(current)
    for k, v in data.get("names", {}).items():
        if k in _NAMES:
            state.names[k] = _restore(k, v)
            continue
        current = stored_name(k)
        if current is None:
            state.retired[k] = copy_json(v)
        else:
            state.names[current] = _restore(current, v)
    for k, entry in (data.get("packed") or {}).items():
        tails = entry.get("tails", []) if isinstance(entry, dict) else None
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("zlib"), str)
            or not isinstance(entry.get("size"), int)
            or not isinstance(tails, list)
            or not all(isinstance(t, str) for t in tails)
        ):
            raise ValueError(f"packed value of {k!r} is not {{'size': int, 'zlib': str, 'tails': [str]}}")
        current = k if k in _NAMES else stored_name(k)
        if current is None:  # retired since: kept aside in wire form, as in "names"
            value, tail_ops = Packed(entry["zlib"], entry["size"], list(tails)).decode(k)
            aside = State(retired={k: value})
            state.retired[k] = apply_ops(aside, tail_ops).retired.get(k)
        else:
            state.packed[current] = Packed(entry["zlib"], entry["size"], list(tails))
    return state


# --------------------------------------------------------------------- fold


def _container(state: State, op: Mapping[str, Any]) -> tuple[dict[str, Any], str, bool]:
    name = op.get("name")
    if name is not None:
        if name in _NAMES:
            return state.names, name, True
        current = stored_name(name)  # written by an older saucer: renamed, retired, or an error
        if current is None:
            return state.retired, name, False
        return state.names, current, True
    return state.vars, op["var"], False


def _default_for(key: str, typed: bool) -> Any:
    return _NAMES[key].default_value if typed else None


def _walk(root: dict[str, Any], key: str, path: list[Any], typed: bool) -> tuple[Any, Any]:
    """Return (parent container, last key) for ``key`` + ``path``, creating dicts on the way."""
    parent: Any = root.get(key)
    if parent is None:
        parent = _default_for(key, typed) if typed else {}
        if parent is None:
            parent = {}
        root[key] = parent
    if len(path) == 1:  # a per-round ledger's entry (most paths): no slice to make
        return parent, path[0]
    for p in path[:-1]:
        nxt = parent.get(p) if isinstance(parent, dict) else parent[p]
        if nxt is None:
            nxt = {}
            parent[p] = nxt
        parent = nxt
    return parent, path[-1]


def _value(op: Mapping[str, Any], typed: bool, key: str, has_path: bool, owned: bool) -> Any:
    value = op["value"]
    if typed and not has_path:
        return _restore(key, value, owned)
    return value if owned else copy_json(value)


def apply_ops(state: State, ops: Iterable[Mapping[str, Any]], *, owned: bool = False) -> State:
    """Apply operations to ``state`` in order and return it.

    This is the fold: live writes and replay both go through it. It trusts
    its input (operations are validated when they are made). The state gets
    copies of the operations' values, unless ``owned``: the operations were
    decoded for this fold alone and nothing else holds them (nor ``state``'s
    packed values or bases, which keep operations), so their values become
    the state's own.
    """
    if owned and (state.packed or state.bases):
        raise ValueError("apply_ops(owned=True) needs a state that keeps no operations (no packed values or bases)")
    names = state.names
    packed, bases = state.packed, state.bases  # (changed in place only, never replaced)
    for op in ops:
        kind = op["op"]
        key = op.get("name")
        if key is not None and key in _NAMES:  # a current typed name (most operations): no call
            root, typed = names, True
        else:
            root, key, typed = _container(state, op)
        path = op.get("path")
        if typed and (packed or bases):
            if key in packed:
                if kind == "sealed":
                    unpack(state, key)  # it marks the state opaque: never put off
                elif path or kind == "append" or kind == "incr":
                    packed[key].ops.append(op)  # applied when the value is unpacked
                    continue
                else:  # set or deleted whole: what was packed no longer matters
                    del packed[key]
            if key in bases:
                base = bases[key]
                if kind != "sealed" and (path or kind == "append" or kind == "incr"):
                    base.ops.append(op)  # for the next snapshot's tail
                    if base.stale():
                        del bases[key]  # stale already (snapshots are far apart): keep no more operations
                else:
                    del bases[key]
        if kind == "set" or kind == "cas":
            if path:
                parent, last = _walk(root, key, path, typed)
                parent[last] = _value(op, typed, key, True, owned)
            else:
                root[key] = _value(op, typed, key, False, owned)
        elif kind == "delete":
            if path:
                parent, last = _walk(root, key, path, typed)
                parent.pop(last, None)
            else:
                root.pop(key, None)
        elif kind == "incr":
            by = op["by"]
            if path:
                parent, last = _walk(root, key, path, typed)
                parent[last] = (parent.get(last) or 0) + by
            else:
                current = root.get(key)
                if current is None:
                    current = _default_for(key, typed)
                    if current is None:
                        current = 0
                root[key] = current + by
        elif kind == "append":
            if path:
                parent, last = _walk(root, key, path, typed)
                seq = parent.get(last)
                if seq is None:
                    seq = parent[last] = []
            else:
                seq = root.get(key)
                if seq is None:
                    seq = root[key] = _default_for(key, typed) or []
            seq.append(op["value"] if owned else copy_json(op["value"]))
        elif kind == "sealed":  # encrypted at rest, read without the key
            if path:
                parent, last = _walk(root, key, path, typed)
                parent[last] = ENCRYPTED
            else:
                root[key] = ENCRYPTED
            state.opaque.add(key if typed else op_key(op))
        else:
            raise ValueError(f"unknown operation {kind!r}")
    return state
