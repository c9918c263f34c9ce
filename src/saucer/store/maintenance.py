"""Store-wide upkeep of stored records: which formats they are in, rewriting
old ones in the newest format, and re-sealing encrypted values with a new key.

None of this is needed for reading (old records are upcast on read, see
:mod:`saucer.store.upcast`). Each session's records are rewritten in batches,
each one transaction, so an interrupted run loses nothing and the next run
goes on where it stopped: it only picks records still in an old format (or
still sealed with the old key).
"""

from __future__ import annotations

import base64
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from saucer.store.base import EventStore
from saucer.store.crypto import ENCRYPTED, SNAPSHOT_SECTIONS, KeyRing, StoreKeyError, target_of
from saucer.store.model import Event, StoreError
from saucer.store.sealed import SealedStore
from saucer.store.upcast import FORMAT_VERSION

__all__ = ["SessionFormats", "format_census", "rewrite_old_records", "RekeyReport", "rekey"]

#: Events rewritten per transaction.
BATCH = 500
#: Seconds ``rekey`` pauses after writing each session (a fault point for the tests that kill it; unset: none).
PAUSE_ENV = "SAUCER_REKEY_PAUSE"


def _backend(store: EventStore) -> EventStore:
    """The store that holds the bytes (under a :class:`~saucer.store.sealed.SealedStore`: its backend)."""
    return store.inner if isinstance(store, SealedStore) else store


@dataclass
class SessionFormats:
    """How many of a session's own events and snapshots are in each format version."""

    session_id: str
    events: Counter[int] = field(default_factory=Counter)
    snapshots: Counter[int] = field(default_factory=Counter)

    @property
    def old(self) -> int:
        """How many of its records are older than :data:`FORMAT_VERSION`."""
        return sum(n for v, n in (self.events + self.snapshots).items() if v < FORMAT_VERSION)


def format_census(store: EventStore, session_ids: Iterable[str] | None = None) -> list[SessionFormats]:
    """The format versions each session's own records are in (``saucer store migrate --check``)."""
    raw = _backend(store)
    ids = [i.session_id for i in raw.sessions()] if session_ids is None else list(session_ids)
    out = []
    for sid in sorted(ids):
        events, snaps = raw.record_formats(sid)
        out.append(SessionFormats(sid, Counter(events.values()), Counter(snaps.values())))
    return out


def rewrite_old_records(
    store: EventStore,
    session_ids: Iterable[str] | None = None,
    *,
    progress: Callable[[str, int], Any] | None = None,
    on_error: Callable[[str, StoreError], Any] | None = None,
) -> int:
    """Rewrite every own event and snapshot older than :data:`FORMAT_VERSION` in that
    format (``saucer store migrate --rewrite``); return how many records were rewritten.

    Resumable: each batch of a session is one transaction, and a run picks only
    the records still old. ``progress(session_id, rewritten)`` after each session.
    A session that cannot be read (a damaged record in the middle of its log) is
    left as it is and reported to ``on_error`` (raised without it); the others go on.
    """
    raw = _backend(store)
    ids = [i.session_id for i in raw.sessions()] if session_ids is None else list(session_ids)
    total = 0
    for sid in sorted(ids):
        try:
            done = _rewrite_session(raw, sid)
        except StoreError as exc:
            if on_error is None:
                raise
            on_error(sid, exc)
            continue
        total += done
        if progress is not None:
            progress(sid, done)
    return total


def _rewrite_session(raw: EventStore, sid: str) -> int:
    """One session's old records, rewritten; how many."""
    events, snaps = raw.record_formats(sid)
    old = sorted(v for v, f in events.items() if f < FORMAT_VERSION)
    done = 0
    for start in range(0, len(old), BATCH):
        chunk = set(old[start : start + BATCH])
        batch = [e for e in raw.read_own(sid, min(chunk) - 1, max(chunk)) if e.version in chunk]
        raw.rewrite_events(sid, batch)
        done += len(batch)
    for version in sorted(v for v, f in snaps.items() if f < FORMAT_VERSION):
        snap = raw.own_snapshot(sid, version)
        if snap is not None and snap.version == version:
            raw.save_snapshot(snap)  # decoded (upcast) and stored again in the current format
            done += 1
    return done


# ------------------------------------------------------------------ rekey


@dataclass
class RekeyReport:
    """What :func:`rekey` did."""

    sessions: int = 0
    events: int = 0
    snapshots: int = 0
    values: int = 0


def _key_id(token: str) -> bytes:
    try:
        return base64.b64decode(token, validate=True)[:8]
    except ValueError:
        return b""


def _reseal_ops(event: Event, old: KeyRing, new: KeyRing) -> tuple[Event, int]:
    count = 0
    ops = []
    for op in event.ops:
        if op.get("op") == "sealed" and _key_id(op["sealed"]) != new.id:
            target = target_of(op)
            op = {**op, "sealed": new.seal(event.session_id, target, old.open(event.session_id, target, op["sealed"]))}
            count += 1
        ops.append(op)
    meta, sealed_meta = _reseal_meta(event.session_id, f"meta@{event.version}", event.meta, old, new)
    count += sealed_meta
    return (replace(event, ops=ops, meta=meta) if count else event), count


def _reseal_meta(
    session_id: str, target: str, meta: dict[str, Any], old: KeyRing, new: KeyRing
) -> tuple[dict[str, Any], int]:
    """A meta sealed by :meth:`Sealer.seal_meta` with its tokens (rest, plan, listing's request) under ``new``."""
    out, count = dict(meta), 0

    def reseal(token: str, where: str) -> str:
        nonlocal count
        if _key_id(token) == new.id:
            return token
        count += 1
        return new.seal(session_id, where, old.open(session_id, where, token))

    if isinstance(meta.get("sealed"), str) and meta["sealed"] != ENCRYPTED:
        out["sealed"] = reseal(meta["sealed"], target)
        if isinstance(meta.get("request"), str):
            out["request"] = reseal(meta["request"], f"{target}.request")
    plan = meta.get("plan")
    if isinstance(plan, dict) and set(plan) == {"sealed"} and isinstance(plan["sealed"], str):
        out["plan"] = {"sealed": reseal(plan["sealed"], f"{target}.plan")}
    return (out if count else meta), count


def _reseal_state(session_id: str, state: dict[str, Any], old: KeyRing, new: KeyRing) -> tuple[dict[str, Any], int]:
    sealed = state.get("sealed") or {}
    count = 0
    out: dict[str, dict[str, str]] = {}
    for section, prefix in SNAPSHOT_SECTIONS:
        tokens = dict(sealed.get(section) or {})
        for k, token in tokens.items():
            if _key_id(token) != new.id:
                tokens[k] = new.seal(session_id, prefix + k, old.open(session_id, prefix + k, token))
                count += 1
        if tokens:
            out[section] = tokens
    return ({**state, "sealed": out} if count else state), count


def rekey(
    store: EventStore, old_key: bytes, new_key: bytes, *, progress: Callable[[str, int], Any] | None = None
) -> RekeyReport:
    """Re-seal every value sealed with ``old_key`` with ``new_key`` (``saucer store rekey``).

    Every own event and snapshot of every session, and its meta, is read as
    stored; what holds values sealed with the old key is rewritten, ONE
    transaction per session, so a session is always wholly under one key,
    whatever kill happens when. Values already under the new key are left
    alone, so an interrupted rekey is finished by running it again with the
    same keys; a value under a third key is a :class:`StoreKeyError` (nothing
    of that session is written). ``SAUCER_REKEY_PAUSE`` (seconds) pauses after
    each session is written: a fault point for the tests that kill it.
    """
    if old_key == new_key:
        raise StoreKeyError("the new store key is the same as the old one")
    old, new = KeyRing(old_key), KeyRing(new_key)
    raw = _backend(store)
    report = RekeyReport()
    pause = float(os.environ.get(PAUSE_ENV) or 0)
    for info in sorted(raw.sessions(), key=lambda i: i.session_id):
        sid = info.session_id
        events_at, snaps = raw.record_formats(sid)
        versions = sorted(events_at)
        events: list[Event] = []
        for start in range(0, len(versions), BATCH):  # read in batches, written in one transaction
            chunk = versions[start : start + BATCH]
            for event in raw.read_own(sid, chunk[0] - 1, chunk[-1]):
                event, count = _reseal_ops(event, old, new)
                if count:
                    events.append(event)
                    report.values += count
        snapshots = []
        for version in sorted(snaps):
            snap = raw.own_snapshot(sid, version)
            if snap is None or snap.version != version:
                continue
            state, count = _reseal_state(sid, snap.state, old, new)
            if count:
                snapshots.append(replace(snap, state=state))
                report.values += count
        stored = raw.row(sid)
        meta, count = _reseal_meta(sid, "meta", stored.meta, old, new) if stored is not None else ({}, 0)
        report.values += count
        if events or snapshots or count:
            # ONE transaction per session: killed at any point, a session is wholly under one key.
            raw.rewrite_events(sid, events, snapshots, meta if count else None)
            if pause:
                time.sleep(pause)
        report.events += len(events)
        report.snapshots += len(snapshots)
        changed = len(events) + len(snapshots) + bool(count)
        report.sessions += bool(changed)
        if progress is not None:
            progress(sid, changed)
    return report
