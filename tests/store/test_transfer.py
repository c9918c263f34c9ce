"""Export and import: every session round-trips (pruned ones and forks included);
an import checks everything before it writes, and writes all or nothing."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from saucer.context import Context, ContextNames, prune
from saucer.context.transfer import export_session, import_session
from saucer.store import EventStore, InvalidSessionIdError, SessionExistsError, open_store


@pytest.fixture
def store(store_url: str) -> Iterator[EventStore]:
    with open_store(store_url) as s:
        yield s


def _fill(store: EventStore, sid: str, n: int) -> Context:
    ctx = Context.open(store, sid, author="writer", snapshot_every=4)
    for i in range(n):
        ctx.set(ContextNames.CURRENT_ROUND_ID, i // 3)
        ctx.current_round_cost += 0.5
        ctx.add_to_structural_logs({"Round": i // 3, "SubtaskIndex": 0, "Action": f"a{i}"})
        ctx.update_vars(set={"i": i, "nested": {"list": [i, (i, "t")]}}, delete=["gone"] if i % 4 else [])
        ctx.incr("n")
        ctx.commit(step=i, meta={"note": f"step {i}"})
    return ctx


def _readable(store: EventStore, sid: str) -> dict[int, Any]:
    return {v: Context.open(store, sid, at=v)._plain() for v in range(store.first_version(sid), store.head(sid) + 1)}


def _log(store: EventStore, sid: str) -> list[tuple[Any, ...]]:
    return [(e.version, e.timestamp, e.author, e.round, e.step, e.ops, e.meta) for e in store.read(sid)]


def _round_trip(store: EventStore, sid: str, new: str) -> dict[str, Any]:
    data = json.loads(json.dumps(export_session(store, sid, {})))  # through a file
    info = import_session(store, data, new)
    assert info.session_id == new and info.version == store.head(sid) and info.parent_id is None
    assert store.first_version(new) == store.first_version(sid)
    assert _readable(store, new) == _readable(store, sid)
    assert _log(store, new) == _log(store, sid)
    # Typed values come back in their types (int round ids, float ledgers).
    assert Context.open(store, new).to_dict() == Context.open(store, sid).to_dict()
    return data


def test_plain_pruned_forked_and_empty_sessions_round_trip(store: EventStore) -> None:
    _fill(store, "plain", 9).close()
    data = _round_trip(store, "plain", "plain2")
    assert data["base"] == {"version": 0, "state": {"names": {}, "vars": {}}}
    assert data["lineage"] == [{"session_id": "plain", "from": 1, "to": 9}]

    fork = Context.open(store, "plain").fork("fork", at=5)
    fork.update_vars(set={"forked": True})
    fork.commit()
    fork.close()
    data = _round_trip(store, "fork", "fork2")
    assert data["lineage"] == [{"session_id": "plain", "from": 1, "to": 5}, {"session_id": "fork", "from": 6, "to": 6}]
    assert store.session_info("fork2").meta["forked_from"] == "plain"

    prune(store, "plain", keep_last=3)  # "fork" gets its own copy
    data = _round_trip(store, "plain", "pruned2")
    assert data["base"]["version"] == 6 and data["events"][0]["meta"]["pruned"]["upto"] == 6
    assert data["base"]["state"]["vars"]["i"] == 5
    _round_trip(store, "fork", "fork3")
    # An export of an import is the same export (ids aside).
    again = json.loads(json.dumps(export_session(store, "pruned2", {})))
    assert again["events"] == [{**e, "session_id": "pruned2"} for e in data["events"]] and again["base"] == data["base"]

    Context.open(store, "empty").close()
    _round_trip(store, "empty", "empty2")
    prune(store, "pruned2", keep_last=0)  # only a base event left
    _round_trip(store, "pruned2", "pruned3")
    # A fork of a pruned session starts where its parent does.
    Context.open(store, "pruned3").fork("late-fork", at=9).close()
    _round_trip(store, "late-fork", "late-fork2")


def test_an_export_written_before_base_existed_still_imports(store: EventStore) -> None:
    _fill(store, "s", 6).close()
    prune(store, "s", keep_last=2)
    data = export_session(store, "s", {})
    del data["base"], data["lineage"]
    import_session(store, data, "old")
    assert _readable(store, "old") == _readable(store, "s")


def test_an_export_written_before_a_rename_or_a_retirement_still_imports(
    store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    from saucer.context import events as events_module
    from saucer.context import names as names_module

    ctx = Context.open(store, "named")
    ctx.set(ContextNames.REQUEST, "open notepad")
    ctx.set(ContextNames.LOG_PATH, "/tmp/logs")
    ctx.commit()
    ctx.close()
    data = export_session(store, "named", {})
    for op in data["events"][0]["ops"]:
        if op.get("name") == "REQUEST":
            op["name"] = "USER_REQUEST"  # what the older saucer called it
    monkeypatch.setitem(names_module.RENAMED, "USER_REQUEST", "REQUEST")
    monkeypatch.delitem(events_module._NAMES, "LOG_PATH")  # this saucer retired LOG_PATH
    monkeypatch.delitem(names_module._BY_KEY, "LOG_PATH")
    monkeypatch.setitem(names_module.RETIRED, "LOG_PATH", "retired")
    import_session(store, data, "named-copy")
    copy_ctx = Context.open(store, "named-copy")
    assert copy_ctx.get(ContextNames.REQUEST) == "open notepad"
    assert copy_ctx.retired == {"LOG_PATH": "/tmp/logs"}
    monkeypatch.delitem(names_module.RENAMED, "USER_REQUEST")
    with pytest.raises(ValueError, match="'USER_REQUEST', not a stored ContextNames name"):
        import_session(store, data, "named-copy-2")


def _bad(data: dict[str, Any], change: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    out = copy.deepcopy(data)
    change(out)
    return out


def test_an_import_checks_everything_before_it_writes_anything(store: EventStore) -> None:
    _fill(store, "s", 5).close()
    good = json.loads(json.dumps(export_session(store, "s", {})))
    deep: Any = 1
    for _ in range(300):
        deep = [deep]

    def set_op(i: int, **fields: Any) -> Callable[[dict[str, Any]], Any]:
        return lambda d: d["events"][i]["ops"].append(fields)

    cases: list[tuple[Callable[[dict[str, Any]], Any], str]] = [
        (
            set_op(3, op="set", var="deep", value=deep),
            r"'events\[3\]\.ops\[7\]\.value\[0\]\[0\].*nest more than 100 levels",
        ),
        (set_op(4, op="set", var="x", value=float("nan")), "not a finite number"),
        (set_op(2, op="frobnicate", var="x"), "events\\[2\\].ops\\[.*\\].op"),
        (set_op(2, op="set", name="NOT_A_NAME", value=1), "not a stored ContextNames name"),
        (set_op(2, op="set", name="LOGGER", value=1), "not a stored ContextNames name"),
        (set_op(2, op="set", name="REQUEST", value=5), "not a REQUEST value"),
        (set_op(2, op="set", var="x"), "value' is missing"),
        (set_op(2, op="incr", var="i", by="one"), "by' must be a finite number"),
        (set_op(2, op="append", var="i", value=1), "cannot be replayed"),
        (set_op(2, op="set", var="x", value=1, extra=True), "unknown fields: extra"),
        (lambda d: d["events"][1].update(version=7), "events\\[1\\].version' is 7, expected 2"),
        (lambda d: d["events"][1].update(author="a\x00b"), "author"),
        (lambda d: d["events"][1].update(step=2**70), "step' must be a 64-bit int"),
        (lambda d: d["events"][1].update(timestamp=float("inf")), "timestamp"),
        (lambda d: d["events"][1].update(meta={"m": deep}), "events\\[1\\].meta"),
        (lambda d: d["base"].update(version=3), "events\\[0\\].version' is 1, expected 3"),
        (lambda d: d.update(events="nope"), "'events' must be a list"),
        (lambda d: d.update(format="other"), "not a saucer session export"),
    ]
    for change, message in cases:
        with pytest.raises(ValueError, match=message):
            import_session(store, _bad(good, change), "copy")
        assert not store.exists("copy"), message
    with pytest.raises(InvalidSessionIdError):
        import_session(store, good, "bad id")
    # Pruned exports: the base event must set the base state.
    prune(store, "s", keep_last=2)
    pruned = json.loads(json.dumps(export_session(store, "s", {})))
    with pytest.raises(ValueError, match="does not set the state of 'base.state'"):
        import_session(store, _bad(pruned, lambda d: d["base"]["state"]["vars"].update(i=99)), "copy")
    assert not store.exists("copy")
    import_session(store, pruned, "copy")
    with pytest.raises(SessionExistsError):
        import_session(store, pruned, "copy")
    assert _readable(store, "copy") == _readable(store, "s")


def test_an_import_keeps_each_events_summary_delta_and_gives_older_exports_what_their_meta_meant(
    store: EventStore,
) -> None:
    from saucer.store.summary import SummaryDelta

    store.create_session("e", meta={"status": "running"})
    end = {"kind": "session_end", "session_status": "finished", "summary": {"rounds": 2, "steps": 3, "cost": 0.5}}
    store.append("e", 0, [], author="a", step=3, meta={"kind": "step", "cost": 0.25})  # no delta: counts no cost
    store.append("e", 1, [], author="a", meta=end, summary=SummaryDelta("finished", final_rounds=2, final_cost=0.5))
    data = export_session(store, "e", {"names": {}, "vars": {}})
    assert [e["summary"] for e in data["events"]] == [
        None,
        {"status": "finished", "final_rounds": 2, "final_cost": 0.5},
    ]
    row = store.list_sessions(ids=["e"])[0]
    copy_row = store.list_sessions(ids=[import_session(store, data, "e-copy").session_id])[0]
    assert (copy_row.status, copy_row.rounds, copy_row.steps, copy_row.cost) == (row.status, 2, 3, 0.5)
    older = copy.deepcopy(data)  # as saucer wrote exports before events carried their delta
    for event in older["events"]:
        del event["summary"]
    old_row = store.list_sessions(ids=[import_session(store, older, "e-old").session_id])[0]
    assert (old_row.status, old_row.rounds, old_row.steps, old_row.cost) == ("finished", 2, 3, 0.5)
    bad = copy.deepcopy(data)
    bad["events"][1]["summary"] = "finished"
    with pytest.raises(ValueError, match=r"events\[1\].summary"):
        import_session(store, bad, "e-bad")
    assert not store.exists("e-bad")
