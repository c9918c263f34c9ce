"""Property: stored history never lies, on every backend.

A hypothesis state machine makes random sequences of commits, forks (of forks),
prunes, exports/imports, deletes and time travel over one store, and keeps a
model of what every version of every session read when it was made. After
every step, for every session:

- its first readable version and its head are what the model says (a prune
  cuts exactly where asked, a fork inherits its parent's first version);
- every version from the first to the head reads exactly the state it read
  when it was made (``Context.open(at=v)``, so ``state_at``), and its history
  holds exactly the events it held (a pruned prefix aside);
- every version below the first raises :class:`VersionPrunedError` (naming the
  first readable version), never an empty or partial state; ``diff`` and
  ``fork`` follow the same rule.

The examples share one store per backend (each uses its own session ids), so
the PostgreSQL leg pays for its schema once.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from saucer.context import Context, ContextNames, prune
from saucer.context.transfer import export_session, import_session
from saucer.store import EventStore, StoreError, VersionPrunedError, open_store

# Few examples with many steps each: every step checks every version of every
# session, so the cost is in the checks, and long sequences find more.
EXAMPLES = {"memory": 60, "sqlite": 40, "postgresql": 25}
STEPS = 25

keys = st.sampled_from(["a", "b", "c"])
values = st.one_of(st.integers(-3, 3), st.text(max_size=3), st.lists(st.integers(0, 3), max_size=2))
changes = st.lists(
    st.one_of(
        st.tuples(st.just("set"), keys, values),
        st.tuples(st.just("incr"), st.just("n"), st.integers(-2, 5)),
        st.tuples(st.just("append"), st.just("log"), values),
        st.tuples(st.just("delete"), keys, st.none()),
        st.tuples(st.just("request"), st.just("REQUEST"), st.text(max_size=4)),
    ),
    min_size=1,
    max_size=3,
)

_RUN = itertools.count()


@dataclass
class _Session:
    """What the model knows of one session."""

    states: dict[int, dict[str, Any]]  # version -> plain state, for every readable version
    events: dict[int, tuple[Any, ...]]  # version -> the event as it reads (its session id: where it was made)
    first: int = 0
    head: int = 0
    parent: str | None = None  # while it still reads its parent's log
    at: int | None = None
    writer: Context | None = field(default=None, repr=False)


def _plain(ctx: Context) -> dict[str, Any]:
    return ctx._plain()


def _shown(state: dict[str, Any], key: str) -> Any:
    """What a diff shows for ``key`` at a version: its value, else a typed name's default (as ``state``
    shows it), else None (a variable not set)."""
    if key in state:
        return state[key]
    if key in ContextNames.__members__:
        default = ContextNames[key].default_value
        return getattr(default, "value", default)
    return None


def _event_key(event: Any) -> tuple[Any, ...]:
    return (
        event.session_id,
        event.version,
        event.timestamp,
        event.author,
        event.round,
        event.step,
        event.ops,
        event.meta,
    )


class HistoryMachine(RuleBasedStateMachine):
    store: EventStore  # set by the test, one per backend

    def __init__(self) -> None:
        super().__init__()
        self.prefix = f"r{next(_RUN)}-"
        self.model: dict[str, _Session] = {}
        self.ids = itertools.count()
        # Set by the rules that change the shape of history (fork, prune,
        # import, delete, reopen): the next check opens every version again.
        self.reshaped = True

    def _new_id(self) -> str:
        return f"{self.prefix}{next(self.ids)}"

    def _pick(self, data: st.DataObject) -> str:
        return data.draw(st.sampled_from(sorted(self.model)), label="session")

    def _record(self, sid: str, version: int) -> None:
        m = self.model[sid]
        m.states[version] = _plain(Context.open(self.store, sid, at=version))
        if version:
            (event,) = self.store.read(sid, version - 1, version)
            m.events[version] = _event_key(event)

    # ------------------------------------------------------------- rules

    @rule()
    def new_session(self) -> None:
        sid = self._new_id()
        writer = Context.open(self.store, sid, author="writer", snapshot_every=3)
        self.model[sid] = _Session(states={0: {}}, events={}, writer=writer)

    @precondition(lambda self: self.model)
    @rule(data=st.data(), batches=st.lists(changes, min_size=1, max_size=4))
    def commit(self, data: st.DataObject, batches: list[list[tuple[str, str, Any]]]) -> None:
        """A few commits to one session, each a batch of changes."""
        sid = self._pick(data)
        m = self.model[sid]
        ctx = m.writer
        assert ctx is not None
        for batch in batches:
            for kind, key, value in batch:
                if kind == "set":
                    ctx.update_vars(set={key: value})
                elif kind == "incr":
                    ctx.incr(key, value)
                elif kind == "append":
                    ctx.append(key, value)
                elif kind == "delete":
                    ctx.delete_var(key)
                else:
                    ctx.set(ContextNames.REQUEST, value)
            m.head = ctx.commit()
            assert _plain(ctx) == _plain(Context.open(self.store, sid))
            self._record(sid, m.head)

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def reopen_writer(self, data: st.DataObject) -> None:
        """A writer that hydrates again (from a snapshot, or a pruned log's base)."""
        self.reshaped = True
        m = self.model[self._pick(data)]
        assert m.writer is not None
        sid = m.writer.session_id
        m.writer.close()
        m.writer = Context.open(self.store, sid, author="writer", snapshot_every=3)

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def fork(self, data: st.DataObject) -> None:
        self.reshaped = True
        parent = self._pick(data)
        p = self.model[parent]
        at = data.draw(st.integers(0, p.head), label="at")
        child = self._new_id()
        if at < p.first:
            with pytest.raises(VersionPrunedError, match=f"first readable version is {p.first}"):
                Context.open(self.store, parent).fork(child, at=at)
            assert not self.store.exists(child)
            return
        writer = Context.open(self.store, parent).fork(child, at=at, author="writer")
        self.model[child] = _Session(
            states={v: s for v, s in p.states.items() if v <= at},
            events={v: e for v, e in p.events.items() if v <= at},
            first=p.first,
            head=at,
            parent=parent,
            at=at,
            writer=writer,
        )

    @staticmethod
    def _start(m: _Session) -> int:
        """The lowest version a prune of the session can cut at (a fork is cut only in its own log)."""
        return m.first if m.parent is None else max(m.first, m.at or 0)

    @precondition(lambda self: any(m.head > self._start(m) for m in self.model.values()))
    @rule(data=st.data())
    def prune(self, data: st.DataObject) -> None:
        self.reshaped = True
        sid = data.draw(
            st.sampled_from(sorted(s for s, m in self.model.items() if m.head > self._start(m))), label="session"
        )
        m = self.model[sid]
        start = self._start(m)
        keep_last = data.draw(st.integers(0, m.head - start), label="keep_last")  # the last one cuts nothing
        cut = m.head - keep_last
        first = prune(self.store, sid, keep_last=keep_last)
        if cut <= start:
            assert first == m.first
            return
        assert first == cut
        for other in self.model.values():
            if other.parent == sid:
                other.parent = None  # it got its own copy of what it reads
        m.parent = None
        m.first = cut
        m.states = {v: s for v, s in m.states.items() if v >= cut}
        m.events = {v: e for v, e in m.events.items() if v > cut}
        (base,) = self.store.read(sid, cut - 1, cut)
        assert base.author == "system" and base.meta["pruned"]["upto"] == cut
        m.events[cut] = _event_key(base)

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def export_import(self, data: st.DataObject) -> None:
        self.reshaped = True
        source = self._pick(data)
        m = self.model[source]
        exported = json.loads(json.dumps(export_session(self.store, source, {})))  # through a file
        copy = self._new_id()
        info = import_session(self.store, exported, copy)
        assert info.version == m.head and info.parent_id is None
        self.model[copy] = _Session(
            states=dict(m.states),
            events={v: (copy, *e[1:]) for v, e in m.events.items()},  # an import stands alone
            first=m.first,
            head=m.head,
            writer=Context.open(self.store, copy, author="writer", snapshot_every=3),
        )

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def delete(self, data: st.DataObject) -> None:
        self.reshaped = True
        sid = self._pick(data)
        if any(other.parent == sid for other in self.model.values()):
            with pytest.raises(StoreError, match="has forks"):
                self.store.delete_session(sid)
            return
        m = self.model.pop(sid)
        assert m.writer is not None
        m.writer.close()
        self.store.delete_session(sid)
        assert not self.store.exists(sid)

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def time_travel(self, data: st.DataObject) -> None:
        sid = self._pick(data)
        m = self.model[sid]
        v1 = data.draw(st.integers(0, m.head), label="v1")
        v2 = data.draw(st.integers(m.first, m.head), label="v2")
        ctx = Context.open(self.store, sid)
        if v1 < m.first:
            with pytest.raises(VersionPrunedError):
                ctx.diff(v1, v2)
            return
        a, b = m.states[v1], m.states[v2]
        expected = {
            k: {"before": _shown(a, k), "after": _shown(b, k)}
            for k in sorted(a.keys() | b.keys())
            if a.get(k) != b.get(k)
        }
        assert ctx.diff(v1, v2) == expected

    # --------------------------------------------------------- invariant

    @invariant()
    def every_version_reads_what_it_read(self) -> None:
        """Every session's range, lineage and log; after a reshaping step, every version's state too.

        (A commit adds a version, checked when it is made; it cannot change an
        older one, which the log check below would see anyway.)
        """
        store = self.store
        for sid, m in self.model.items():
            info = store.session_info(sid)
            assert (store.first_version(sid), info.version) == (m.first, m.head), sid
            assert (info.parent_id, info.parent_version) == ((m.parent, m.at) if m.parent else (None, None)), sid
            events = [_event_key(e) for e in store.read(sid)]
            assert events == [m.events[v] for v in range(max(m.first, 1), m.head + 1)], sid
            if not self.reshaped:
                continue
            for v in range(m.first, m.head + 1):
                assert _plain(Context.open(store, sid, at=v)) == m.states[v], (sid, v)
            for v in range(0, m.first):
                with pytest.raises(VersionPrunedError, match=f"first readable version is {m.first}"):
                    Context.open(store, sid, at=v)
        self.reshaped = False

    def teardown(self) -> None:
        for m in self.model.values():
            if m.writer is not None:
                m.writer.close()


def test_every_version_of_every_session_reads_what_it_read(store_url: str) -> None:
    backend = store_url.split(":", 1)[0]  # memory, sqlite or postgresql
    with open_store(store_url) as store:

        class Machine(HistoryMachine):
            pass

        Machine.store = store
        run_state_machine_as_test(
            Machine,
            settings=settings(
                max_examples=EXAMPLES[backend],
                stateful_step_count=STEPS,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
            ),
        )
